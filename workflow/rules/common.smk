# Validation at start-up and the names every rule shares.
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)  # the cudalab package sits next to the Snakefile

from snakemake.exceptions import WorkflowError

from cudalab import config as cudalab_config
from cudalab import runner as cudalab_runner
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
# The validated config (defaults filled, --configfile / --config applied) that the jobs'
# `cudalab` commands read: one meaning for every step. Written by the main process only.
CONFIG_JSON = f"{RESULTS}/config.json"
# The rules run the cudalab CLI of this checkout (also inside a --sdm conda env, which does
# not install the package): PYTHONPATH names the folder the Snakefile sits in.
CUDALAB = (f"PYTHONPATH={shlex.quote(workflow.basedir)}${{PYTHONPATH:+:$PYTHONPATH}} "
           "python -m cudalab.cli")
CONDA_ENV = "../../envs/cudalab.yaml"


def needs_gpu(experiment):
    return any(p.gpu for p in REGISTRY[experiment].grid(config))


def measure_fingerprint(experiment):
    """Rerun a measure job when its block (or a block its grid reads) or the harness
    settings change."""
    return cudalab_runner.job_fingerprint(config, experiment)


def _write_config_json():
    text = json.dumps(config, indent=1, sort_keys=True)
    path = Path(CONFIG_JSON)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _mark_stale_jobs():
    """A finished job whose records are damaged, or whose GPU points a GPU-less run left
    unmeasured, must run again: runner.mark_stale updates its rerun marker (an input of the
    measure rule), so Snakemake reruns it; the intact records are reused from the cache."""
    for e in EXPERIMENTS:
        for line in cudalab_runner.mark_stale(Path(RESULTS), e):
            print(f"cudalab: {e}: {line}", file=sys.stderr)


def jobs_to_run():
    """(experiment, gpus) of the measure jobs this run starts: no manifest, or one written
    under other settings (what the fingerprint param makes Snakemake rerun)."""
    out = []
    for e in EXPERIMENTS:
        m = cudalab_runner.results.read_json(Path(RESULTS, "raw", e, "_manifest.json"))
        if m is None or m.get("fingerprint", measure_fingerprint(e)) != measure_fingerprint(e):
            out.append((e, int(needs_gpu(e))))
    return out


if workflow.is_main_process:  # not again inside every (Slurm) job
    for line in plan_lines(config):
        print(line, file=sys.stderr)
    _write_config_json()
    _mark_stale_jobs()


onstart:
    # Under Slurm, say how many sbatch jobs this run submits (--forcerun is not foreseen).
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        print(slurm_submit_line(jobs_to_run(), len(EXPERIMENTS)), file=sys.stderr)
