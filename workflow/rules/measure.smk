# One job per experiment (per experiment and GPU model in a sweep): the job walks the
# experiment's whole grid in one process (one CUDA context, one compile per kernel variant).
# Finished points are kept in <folder>/raw/<experiment>/ and a rerun measures only what is
# missing. `folder` is results (no sweep: results/raw/<experiment>/) or results/gpu/<model>.
# A local run of several GPUs splits a large lesson into shards (cudalab/shards.py): a
# measure_shard job per shard, each on its own GPU, then merge_shards writes the lesson's
# _manifest.json from theirs. With one GPU, under Slurm or with max_shards: 1, none is split.
from cudalab import shards as cudalab_shards

SLURM = config["slurm"]


def _run_gpus():
    """The GPUs a local run's shards may spread over: the GPU jobs it starts at once
    (common.smk; --resources gpu=N may lower it), never more than the GPUs its jobs can
    lock and pin (gpu_slots); 1 under Slurm."""
    if not _LOCAL:
        return 1
    given = workflow.global_resources["gpu"]
    n, why = cudalab_gpu_slots.shardable_gpu_count(config)
    if why and config["max_shards"] > 1:
        print(f"cudalab: no lesson is split over the GPUs: {why}", file=sys.stderr)
    return min(int(getattr(given, "value", given)), n)


# experiment -> its shard count (1: one measure job, the measure rule), from the grid alone
SHARDS = {e: cudalab_shards.shard_count(REGISTRY[e].grid(config), _run_gpus(),
                                        config["max_shards"], REGISTRY[e].all_gpus)
          for e in EXPERIMENTS}
WHOLE = [e for e in EXPERIMENTS if SHARDS[e] == 1]
SHARDED = [e for e in EXPERIMENTS if SHARDS[e] > 1]


def shard_jobs_to_run():
    """(experiment, folder, shard) of the shard jobs this run starts: those of the sharded
    lessons still to run (TO_RUN) whose own manifest is not finished, so a resumed run never
    measures a finished shard again (every shard where the command line forces jobs)."""
    redo = not workflow.is_main_process or forced()
    return [(e, f, s) for e, f in TO_RUN if e in SHARDED
            for s in cudalab_shards.all_shards(SHARDS[e]) if redo or not finished(e, f, s)]


SHARD_TO_RUN = shard_jobs_to_run()


def shard_todo_regex(todo):
    """measure_shard's `folder` constraint: a folder followed by one of its shard jobs to run
    (a lookahead, as todo_regex), so Snakemake plans no job for a finished shard."""
    return "|".join(f"{re.escape(f)}(?=/raw/{re.escape(e)}/_shard-{s.tag}\\.json$)"
                    for e, f, s in todo) or "(?!)"


def shard_line():
    """The start-up line naming the lessons split over GPUs ('' if none)."""
    if not SHARDED:
        return ""
    return ("cudalab: lessons split over the GPUs (max_shards: "
            f"{config['max_shards']}): " + ", ".join(f"{e} in {SHARDS[e]} shards" for e in SHARDED))


def shard_of(wildcards):
    return cudalab_shards.Shard.parse(wildcards.shard)


def shard_manifests(wildcards):
    """merge_shards' input: the manifests of the lesson's shards."""
    return [f"{wildcards.folder}/raw/{wildcards.experiment}/{s.manifest}"
            for s in cudalab_shards.all_shards(SHARDS[wildcards.experiment])]


def gpu_count(wildcards):
    """A sweep's jobs ask for their model's GPU; otherwise only experiments with GPU points."""
    model = cudalab_sweep.model_of(wildcards.folder, RESULTS)
    if _LOCAL and REGISTRY[wildcards.experiment].all_gpus and needs_gpu(wildcards.experiment):
        # it measures between GPUs: every GPU Snakemake may hand out, so it runs alone
        given = workflow.global_resources["gpu"]
        return int(getattr(given, "value", given))
    return 1 if model or needs_gpu(wildcards.experiment) else 0


def gpu_model(wildcards):
    # only GPU jobs name a model: the plugin turns gpu_model=x into --gpus=x:<gpu>,
    # which would read --gpus=x:0 for a CPU-only experiment
    model = cudalab_sweep.model_of(wildcards.folder, RESULTS)
    return model or (SLURM["gpu_model"] if needs_gpu(wildcards.experiment) else "")


def measure_shell(extra):
    """A measure job's command (the measure and measure_shard rules'): the modules' guard,
    the log, the rerun marker once it ended well, the log's last lines on failure. extra: more
    arguments of `cudalab measure` (a shard's)."""
    return ("{{ {MODULES_GUARD}"
            "{CUDALAB} measure {wildcards.experiment:q}" + extra +
            " --config {CONFIG_JSON:q} --results {wildcards.folder:q}; }} > {log:q} 2>&1"
            " && printf '%s\\n' {params.token:q} > {params.marker:q}"
            " || {{ rc=$?; tail -n 5 {log:q} >&2; exit $rc; }}")


rule measure:
    input:
        doctor=doctor_first,  # the doctor of this job's GPU passed (workflow/rules/doctor.smk)
    output:
        "{folder}/raw/{experiment}/_manifest.json",
    params:
        fingerprint=lambda w: measure_fingerprint(w.experiment),
        # changes when the finished job must run again (common.smk: rerun_token)
        token=lambda w: rerun_token(w.folder, w.experiment),
        marker=lambda w: f"{w.folder}/raw/{w.experiment}/{cudalab_runner.RERUN_MARKER}",
    log:
        "{folder}/logs/measure_{experiment}.log",
    wildcard_constraints:
        # only the jobs still to run (common.smk: jobs_to_run)
        folder=todo_regex(TO_RUN),
        experiment=folder_regex(WHOLE),
    # slurm.modules, loaded with --sdm env-modules (set in profiles/slurm)
    envmodules:
        *SLURM["modules"]
    # one sbatch allocation per job (cudalab/slurm_request.py says which flags)
    resources:
        **slurm_request.resources(
            SLURM, gpu_count, gpu_model if SLURM["gpu_model"] or GPU_MODELS else None),
    conda:
        CONDA_ENV
    # MODULES_GUARD (common.smk) fails the job when a module did not load. On failure the
    # log's last lines go to Snakemake's output (and the Slurm log) too.
    shell:
        measure_shell("")


# One shard of a lesson's grid (cudalab/shards.py): the measure rule's job for its points,
# on a GPU of its own (its own ceilings and resolution floor), with its own manifest, rerun
# token and marker.
rule measure_shard:
    input:
        doctor=doctor_first,
    output:
        "{folder}/raw/{experiment}/_shard-{shard}.json",
    params:
        fingerprint=lambda w: measure_fingerprint(w.experiment),
        token=lambda w: rerun_token(w.folder, w.experiment, shard_of(w)),
        marker=lambda w: rerun_marker(w.folder, w.experiment, shard_of(w)),
    log:
        "{folder}/logs/measure_{experiment}_shard-{shard}.log",
    wildcard_constraints:
        folder=shard_todo_regex(SHARD_TO_RUN),
        experiment=folder_regex(SHARDED),
        shard=r"[1-9][0-9]*of[1-9][0-9]*",
    envmodules:
        *SLURM["modules"]
    resources:
        gpu=1,  # only local runs split a lesson: one GPU a shard, locked by the job
    conda:
        CONDA_ENV
    shell:
        measure_shell(" --shard {wildcards.shard:q}")


localrules:
    merge_shards,


# The lesson's manifest from its shards' (cudalab merge-shards): what aggregate, the report
# and a rerun's planning (common.smk: finished) read, as for a lesson of one job.
rule merge_shards:
    input:
        shard_manifests,
    output:
        "{folder}/raw/{experiment}/_manifest.json",
    params:
        shards=lambda w: SHARDS[w.experiment],
    log:
        "{folder}/logs/merge_{experiment}.log",
    wildcard_constraints:
        folder=todo_regex(TO_RUN),
        experiment=folder_regex(SHARDED),
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} merge-shards {wildcards.experiment:q} --count {params.shards}"
        " --config {CONFIG_JSON:q} --results {wildcards.folder:q} > {log:q} 2>&1"
