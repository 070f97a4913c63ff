# One job per experiment: the job walks the experiment's whole grid in one process (one
# CUDA context, one compile per kernel variant). Finished points are kept in
# results/raw/<experiment>/ and a rerun measures only what is missing.
from cudalab import slurm_request

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
    # slurm.modules, loaded with --sdm env-modules (set in profiles/slurm)
    envmodules:
        *SLURM["modules"]
    # one sbatch allocation per job (cudalab/slurm_request.py says which flags)
    resources:
        **slurm_request.resources(
            SLURM, gpu_count, gpu_model if SLURM["gpu_model"] else None),
    conda:
        CONDA_ENV
    # On failure the log's last lines go to Snakemake's output (and the Slurm log) too.
    shell:
        "{CUDALAB} measure {wildcards.experiment:q} --config {CONFIG_JSON:q}"
        " --results {params.results:q} > {log:q} 2>&1"
        " || {{ rc=$?; tail -n 5 {log:q} >&2; exit $rc; }}"
