# Validation at start-up and the names every rule shares.
import json
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

try:  # the installed package, the same one every job runs (README: pip install -e .)
    import cudalab  # noqa: F401
except ImportError:
    raise WorkflowError(f"cudalab is not installed for {sys.executable}: run "
                        f"`pip install -e .` in {workflow.basedir} first") from None

from cudalab import config as cudalab_config
from cudalab import runner as cudalab_runner
from cudalab import sweep as cudalab_sweep
from cudalab.cli import plan_lines, slurm_submit_line
from cudalab.experiments import REGISTRY

# One meaning for a config: `snakemake --configfile my.yaml` runs my.yaml alone, as
# `cudalab plan my.yaml` shows it, not my.yaml deep-merged into config.yaml (Snakemake's own
# behaviour, which would add the default grid to mine). Several --configfile files merge with
# each other and --config KEY=VALUE goes on top, as in Snakemake. The files are re-read with
# cudalab's loader, which also refuses duplicate keys and bounds size, nesting and aliases.
# config.yaml is read here, not by a `configfile:` directive: Snakemake's own YAML reader
# would meet a hostile file first (a deeply nested one ends in its RecursionError).
_CONFIG_FILES = [str(f) for f in workflow.overwrite_configfiles] or ["config.yaml"]
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
# The validated config (defaults filled, --configfile / --config applied) that the jobs'
# `cudalab` commands read: one meaning for every step. Written by the main process only.
CONFIG_JSON = f"{RESULTS}/config.json"
# Every job runs cudalab with the interpreter that runs Snakemake, by its path: a `python`
# first on PATH (a site's Python module) may lack cudalab's packages. Under --sdm conda, the
# env's own cudalab entry point (envs/cudalab.post-deploy.sh installs it there).
_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
CUDALAB = "cudalab" if _CONDA else f"{shlex.quote(sys.executable)} -m cudalab.cli"
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


def measure_jobs():
    """(experiment, label, results folder, gpus) of every measure job: one per experiment,
    or one per (experiment, GPU model) in a GPU-model sweep (sweep.smk)."""
    models = cudalab_sweep.gpu_models(config)
    if not models:
        return [(e, e, RESULTS, int(needs_gpu(e))) for e in EXPERIMENTS]
    return [(e, f"{e}@{m}", cudalab_sweep.model_folder(RESULTS, m), f"{m}:1")
            for m in models for e in EXPERIMENTS]


def _mark_stale_jobs():
    """A finished job whose records are damaged, or whose GPU points a GPU-less run left
    unmeasured, must run again: runner.mark_stale updates its rerun marker (an input of the
    measure rules), so Snakemake reruns it; the intact records are reused from the cache."""
    for e, label, folder, _ in measure_jobs():
        for line in cudalab_runner.mark_stale(Path(folder), e):
            print(f"cudalab: {label}: {line}", file=sys.stderr)


def jobs_to_run():
    """(label, gpus) of the measure jobs this run starts: no manifest, or one written under
    other settings (what the fingerprint param makes Snakemake rerun)."""
    out = []
    for e, label, folder, gpus in measure_jobs():
        m = cudalab_runner.results.read_json(Path(folder, "raw", e, "_manifest.json"))
        if m is None or m.get("fingerprint", measure_fingerprint(e)) != measure_fingerprint(e):
            out.append((label, gpus))
    return out


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

if workflow.is_main_process:
    _write_config_json()
    _mark_stale_jobs()


onstart:
    # Under Slurm, say how many sbatch jobs this run submits (--forcerun is not foreseen).
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        print(slurm_submit_line(jobs_to_run(), len(measure_jobs())), file=sys.stderr)
        start_pending_watch()  # reports jobs PENDING for good (doctor.smk)
