# A GPU-model sweep (cudalab/sweep.py). slurm.gpu_models: [a100, h100] measures
# every experiment once per model, each job its own allocation with --gpus=<model>:1, into
# results/gpu/<model>/ (a complete run folder per model). results.csv and the report are of
# the first model (MEASURED); the report compares it with the other models' folders.
import re

from cudalab import sweep as cudalab_sweep

GPU_MODELS = cudalab_sweep.gpu_models(config)
MEASURED = cudalab_sweep.measured_folder(config, RESULTS)


def measure_manifests():
    """What aggregate waits for: one manifest per experiment, or per (experiment, model)."""
    if not GPU_MODELS:
        return expand(f"{RESULTS}/raw/{{experiment}}/_manifest.json", experiment=EXPERIMENTS)
    return expand(f"{RESULTS}/gpu/{{model}}/raw/{{experiment}}/_manifest.json",
                  model=GPU_MODELS, experiment=EXPERIMENTS)


rule measure_gpu_model:
    input:
        # rewritten at start-up when the finished job must run again (runner.mark_stale)
        marker=f"{RESULTS}/gpu/{{gpu_model}}/raw/{{experiment}}/{cudalab_runner.RERUN_MARKER}",
        doctor=doctor_first,  # the doctor's job passed (doctor.smk)
    output:
        f"{RESULTS}/gpu/{{gpu_model}}/raw/{{experiment}}/_manifest.json",
    params:
        fingerprint=lambda w: measure_fingerprint(w.experiment),
        results=lambda w: cudalab_sweep.model_folder(RESULTS, w.gpu_model),
    log:
        f"{RESULTS}/logs/measure_{{experiment}}_{{gpu_model}}.log",
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS) or "none",
        gpu_model="|".join(map(re.escape, GPU_MODELS)) or "none",
    envmodules:  # slurm.modules, as in rule measure
        *SLURM["modules"]
    # the site settings of rule measure, and always one GPU of this model
    resources:
        **slurm_request.resources(SLURM, 1, lambda w: w.gpu_model),
    conda:
        CONDA_ENV
    # On failure the log's last lines go to Snakemake's output (and the Slurm log) too.
    shell:
        "{CUDALAB} measure {wildcards.experiment:q} --config {CONFIG_JSON:q}"
        " --results {params.results:q} > {log:q} 2>&1"
        " || {{ rc=$?; tail -n 5 {log:q} >&2; exit $rc; }}"
