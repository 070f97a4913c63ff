# One job per experiment (per experiment and GPU model in a sweep): the job walks the
# experiment's whole grid in one process (one CUDA context, one compile per kernel variant).
# Finished points are kept in <folder>/raw/<experiment>/ and a rerun measures only what is
# missing. `folder` is results (no sweep: results/raw/<experiment>/) or results/gpu/<model>.
SLURM = config["slurm"]


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
        experiment=folder_regex(EXPERIMENTS),
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
        "{{ {MODULES_GUARD}"
        "{CUDALAB} measure {wildcards.experiment:q} --config {CONFIG_JSON:q}"
        " --results {wildcards.folder:q}; }} > {log:q} 2>&1"
        " && printf '%s\\n' {params.token:q} > {params.marker:q}"
        " || {{ rc=$?; tail -n 5 {log:q} >&2; exit $rc; }}"
