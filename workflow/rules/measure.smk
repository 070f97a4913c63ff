# One job per experiment: the job walks the experiment's whole grid in one process (one
# CUDA context, one compile per kernel variant). Finished points are kept in
# results/raw/<experiment>/ and a rerun measures only what is missing.
SLURM = config["slurm"]


def gpu_count(wildcards):
    return 1 if needs_gpu(wildcards.experiment) else 0


def gpu_model(wildcards):
    # only GPU jobs name a model: the plugin turns gpu_model=x into --gpus=x:<gpu>,
    # which would read --gpus=x:0 for a CPU-only experiment
    return SLURM["gpu_model"] if needs_gpu(wildcards.experiment) else ""


rule measure:
    input:
        # rewritten at start-up when the finished job must run again (runner.mark_stale)
        marker=f"{RESULTS}/raw/{{experiment}}/{cudalab_runner.RERUN_MARKER}",
        doctor=doctor_first,  # under Slurm: the doctor's job passed (workflow/rules/doctor.smk)
    output:
        f"{RESULTS}/raw/{{experiment}}/_manifest.json",
    params:
        fingerprint=lambda w: measure_fingerprint(w.experiment),
        results=RESULTS,
    log:
        f"{RESULTS}/logs/measure_{{experiment}}.log",
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS) or "none",
    # Under --profile slurm each measure job is one sbatch allocation: gpu -> --gpus=N
    # (--gpus=<gpu_model>:N), runtime -> -t (minutes), mem_mb -> --mem,
    # cpus_per_task -> --cpus-per-task, slurm_partition -> -p, slurm_account -> -A,
    # constraint -> -C. Empty settings in config.yaml's slurm: block are left out (the
    # cluster's defaults apply). Locally only gpu counts (profiles/default caps it at 1).
    # slurm.modules, loaded with --sdm env-modules (set in profiles/slurm)
    envmodules:
        *SLURM["modules"]
    resources:
        gpu=gpu_count,
        runtime=SLURM["runtime_min"],
        mem_mb=SLURM["mem_mb"],
        cpus_per_task=SLURM["cpus_per_task"],
        **{k: v for k, v in {
            "slurm_partition": SLURM["partition"],
            "slurm_account": SLURM["account"],
            "constraint": SLURM["constraint"],
        }.items() if v},
        **({"gpu_model": gpu_model} if SLURM["gpu_model"] else {}),
    conda:
        CONDA_ENV
    # On failure the log's last lines go to Snakemake's output (and the Slurm log) too.
    shell:
        "{CUDALAB} measure {wildcards.experiment} --config {CONFIG_JSON}"
        " --results {params.results} > {log} 2>&1"
        " || {{ rc=$?; tail -n 5 {log} >&2; exit $rc; }}"
