# Validation at start-up and the names every rule shares.
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)  # the cudalab package sits next to the Snakefile

from snakemake.exceptions import WorkflowError

from cudalab import config as cudalab_config
from cudalab.cli import plan_lines, slurm_submit_line
from cudalab.experiments import REGISTRY

# One meaning for a config: `snakemake --configfile my.yaml` runs my.yaml alone, as
# `cudalab plan my.yaml` shows it, not my.yaml deep-merged into config.yaml (Snakemake's own
# behaviour, which would add the default grid to mine). Several --configfile files merge with
# each other and --config KEY=VALUE goes on top, as in Snakemake. The files are re-read with
# cudalab's loader, which also refuses duplicate keys.
_CONFIG_FILES = [str(f) for f in workflow.overwrite_configfiles] or [
    f for f in workflow.configfiles if Path(f).exists()]
_notes = []
try:
    _given = cudalab_config.from_files(_CONFIG_FILES, workflow.config_settings.config)
    config.clear()
    config.update(_given)
    cudalab_config.validate(config, source=", ".join(_CONFIG_FILES) or "config",
                            notes=_notes)
except cudalab_config.ConfigError as exc:
    raise WorkflowError(str(exc)) from None

RESULTS = "results"
EXPERIMENTS = cudalab_config.enabled_experiments(config)
TABLE = f"{RESULTS}/results.csv"
REPORT = f"{RESULTS}/report.html"


def needs_gpu(experiment):
    return any(p.gpu for p in REGISTRY[experiment].grid(config))


def measure_fingerprint(experiment):
    """Rerun a measure job when its block (or a block its grid reads) or the harness
    settings change."""
    blocks = [config["experiments"].get(b) for b in REGISTRY[experiment].reads_blocks]
    return cudalab_config.block_hash(
        [config["experiments"][experiment], *blocks, config["measurement"], config["telemetry"]]
    )


if workflow.is_main_process:  # not again inside every (Slurm) job
    for line in plan_lines(config) + [f"note: {n}" for n in _notes]:
        print(line, file=sys.stderr)
    # A killed run leaves Snakemake's lock behind and the next run stops with LockException.
    if any(Path(".snakemake", "locks").glob("*.lock")) and "--unlock" not in sys.argv:
        print("note: .snakemake/locks/ holds a lock: if no other Snakemake is running in this "
              "directory, a killed run left it: run `snakemake --unlock` once, then the same "
              "command again", file=sys.stderr)
    import importlib.util

    if importlib.util.find_spec("pycuda") is None and any(map(needs_gpu, EXPERIMENTS)):
        print("note: pycuda (the GPU extra) is not installed here: GPU points need it where "
              "they run (pip install -e '.[gpu]'; under Slurm only the compute nodes); "
              "README: Troubleshooting the pycuda build", file=sys.stderr)

# issue 9: report.baselines must be readable result folders, checked before any job runs
if workflow.is_main_process:
    from cudalab import compare as cudalab_compare

    for _baseline in config["report"]["baselines"]:
        try:
            cudalab_compare.load_points(Path(_baseline), "report.baselines:")
        except cudalab_compare.CompareError as exc:
            raise WorkflowError(str(exc)) from None


onstart:
    # The executor is known only now (after parsing): under Slurm, say how many sbatch
    # jobs this run submits (only experiments with something left to measure).
    _plugin = workflow.executor_plugin
    if _plugin is not None and _plugin.name == "slurm":
        _jobs = sorted(
            (j.wildcards.experiment, int(j.resources.get("gpu", 0) or 0))
            for j in workflow.dag.needrun_jobs()
            if j.rule.name == "measure"
        )
        # issue 9: a GPU-model sweep's jobs (sweep.smk), named experiment@model
        _jobs += sorted(
            (f"{j.wildcards.experiment}@{j.wildcards.gpu_model}", f"{j.wildcards.gpu_model}:1")
            for j in workflow.dag.needrun_jobs()
            if j.rule.name == "measure_gpu_model"
        )
        print(slurm_submit_line(_jobs, len(EXPERIMENTS) * max(1, len(GPU_MODELS))),
              file=sys.stderr)
        start_pending_watch()  # reports jobs PENDING for good (doctor.smk)
