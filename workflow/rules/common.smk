# Validation at start-up and the names every rule shares.
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)  # the cudalab package sits next to the Snakefile

from snakemake.exceptions import WorkflowError

from cudalab import config as cudalab_config
from cudalab.cli import plan_lines, slurm_submit_line
from cudalab.experiments import REGISTRY

try:
    cudalab_config.validate(config, source="config")
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
    for line in plan_lines(config):
        print(line, file=sys.stderr)


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
        print(slurm_submit_line(_jobs, len(EXPERIMENTS)), file=sys.stderr)
        start_pending_watch()  # reports jobs PENDING for good (doctor.smk)
