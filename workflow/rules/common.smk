# Validation at start-up and the names every rule shares.
import json
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

try:  # the installed package, the same one every job runs (README: pip install -e .)
    import cudalab  # noqa: F401
except ImportError:
    raise WorkflowError(f"cudalab is not installed for {sys.executable}: run "
                        f"`pip install -e .` in {workflow.basedir} first") from None

from cudalab import config as cudalab_config
from cudalab import gpu_slots as cudalab_gpu_slots
from cudalab import runner as cudalab_runner
from cudalab import slurm_request
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
# Where a run measures: results/ itself, or results/gpu/<model>/ per model of a GPU-model
# sweep (cudalab/sweep.py). Each folder is a complete run folder: raw/, logs/, results.csv,
# figures/; the report is drawn from the first and sets the others beside it.
FOLDERS = cudalab_sweep.folders(config, RESULTS)
GPU_MODELS = cudalab_sweep.gpu_models(config)
# A local run keeps every usable GPU busy: Snakemake starts as many GPU jobs at once as there
# are GPUs, and each job locks one and pins itself to it (cudalab/gpu_slots.py). A `gpu`
# given by hand (--resources gpu=N, a profile) wins; under Slurm the allocation decides.
_LOCAL = workflow.executor_plugin is None or workflow.executor_plugin.name != "slurm"
if _LOCAL and "gpu" not in workflow.global_resources:
    workflow.global_resources["gpu"] = cudalab_gpu_slots.local_gpu_count(config)
MEASURED = FOLDERS[0]
TABLE = f"{MEASURED}/results.csv"
CLAIMS = f"{MEASURED}/claims.json"  # judged once with the table (aggregate)
REPORT = f"{RESULTS}/report.html"
# The validated config (defaults filled, --configfile / --config applied) that the jobs'
# `cudalab` commands read: one meaning for every step. Written in onstart by the main process
# (never while Snakemake parses the workflow: a dry run writes nothing).
CONFIG_JSON = f"{RESULTS}/config.json"
# Every job runs cudalab with the interpreter that runs Snakemake, by its path: a `python`
# first on PATH (a site's Python module) may lack cudalab's packages. Under --sdm conda, the
# env's own cudalab entry point (envs/cudalab.post-deploy.sh installs it there).
_CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
CUDALAB = "cudalab" if _CONDA else f"{shlex.quote(sys.executable)} -m cudalab.cli"
CONDA_ENV = "../../envs/cudalab.yaml"
# With --sdm env-modules (profiles/slurm), Snakemake runs `module purge && module load X;
# <command>`: a module that fails to load does not stop the command (`;`). The measure
# command is preceded by a check that every slurm.modules entry is in LOADEDMODULES; the
# doctor fails its table instead (--require-modules). A global, not a param: switching
# executors must not change what Snakemake compares to decide a rerun.
_ENV_MODULES = DeploymentMethod.ENV_MODULES in workflow.deployment_settings.deployment_method
MODULES_GUARD = slurm_request.modules_guard(config["slurm"]["modules"] if _ENV_MODULES else [])
REQUIRE_MODULES = "--require-modules" if _ENV_MODULES and config["slurm"]["modules"] else ""


def folder_regex(folders):
    return "|".join(map(re.escape, folders)) or "none"


def needs_gpu(experiment):
    return any(p.gpu for p in REGISTRY[experiment].grid(config))


def measure_fingerprint(experiment):
    """Rerun a measure job when its block (or a block its grid reads) or the harness
    settings change."""
    return cudalab_runner.job_fingerprint(config, experiment)


def rerun_token(folder, experiment, shard=None):
    """A measure param that changes, so Snakemake reruns the finished job, exactly when it
    must run again (runner.rerun_reasons: damaged records, GPU points a GPU-less run left
    unmeasured). Read only: the job writes the token it ran with to raw/<e>/_rerun.txt, and
    while the job is not stale the token is that file's text, so it equals what Snakemake
    recorded and triggers nothing; a stale job gets a token of its reasons and its manifest,
    new after every run that leaves it stale. shard: the same for one shard's job
    (measure.smk), with its own manifest and marker."""
    raw = Path(folder, "raw", experiment)
    why = cudalab_runner.rerun_reasons(Path(folder), experiment, shard)
    if why:
        try:
            manifest = (raw / (shard.manifest if shard else "_manifest.json")).read_bytes()
        except OSError:
            manifest = b""
        return "stale " + cudalab_config.block_hash([why, manifest.decode(errors="replace")])
    try:
        return Path(rerun_marker(folder, experiment, shard)).read_text().strip() or "fresh"
    except OSError:
        return "fresh"


def rerun_marker(folder, experiment, shard=None):
    """Where a measure job writes the token it ran with (rerun_token)."""
    name = f"_rerun-{shard.tag}.txt" if shard else cudalab_runner.RERUN_MARKER
    return f"{folder}/raw/{experiment}/{name}"


def measure_jobs():
    """(experiment, folder) of every measure job: one per experiment, per folder."""
    return [(e, f) for f in FOLDERS for e in EXPERIMENTS]


def job_label(experiment, folder):
    model = cudalab_sweep.model_of(folder, RESULTS)
    return f"{experiment}@{model}" if model else experiment


# The GPU request of cudalab's jobs comes from the config alone, so that every job and its
# doctor ask the same: --set-resources measure:gpu=2 gave every measure job two GPUs, the
# CPU-only ones too, and not the doctor (half applied: every job failed).
GPU_RESOURCES = ("gpu", "gpu_model", "gres", "gpus")
GPU_RULES = ("measure", "doctor", "exercise_judge", "exercise_baseline")


def gpu_override_problem():
    """Why a --set-resources of a GPU request on cudalab's jobs is refused ('' if none)."""
    given = workflow.resource_settings.overwrite_resources or {}
    bad = [f"{rule}:{key}" for rule in GPU_RULES if rule in given
           for key in GPU_RESOURCES if key in given[rule].keys()]
    if not bad:
        return ""
    return (f"cudalab: --set-resources {', '.join(bad)} is refused (nothing was submitted): "
            "the GPU request of cudalab's jobs comes from the config, the same for each job "
            "and its doctor: one GPU per job with GPU points (a job measures on one GPU, a "
            "second would sit idle), none for a CPU-only experiment. Set slurm.gpu_model, "
            "slurm.gpu_models or slurm.constraint in config.yaml instead; --set-resources of "
            "runtime, mem_mb or cpus_per_task still apply.")


FIT = None  # the request against sinfo (main process only)
if workflow.is_main_process and gpu_override_problem():
    raise WorkflowError(gpu_override_problem())
if workflow.is_main_process:  # not again inside every (Slurm) job
    from cudalab import site as cudalab_site

    # the request against sinfo, asked once: printed in the plan, enforced in onstart
    FIT = cudalab_site.check_fit(config)
    # `snakemake exercises` runs the class alone; Snakemake parses the workflow before it
    # sets its targets (run_targets), so the command line says it here
    _CLASS_ONLY = bool(config["exercises"]["submissions"]) and "exercises" in sys.argv[1:]
    for line in plan_lines(config, FIT, _CLASS_ONLY) + [f"note: {n}" for n in _notes]:
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
    # why a finished job runs again (rerun_token): said once, here
    for _e, _f in measure_jobs():
        for _line in cudalab_runner.rerun_reasons(Path(_f), _e):
            print(f"cudalab: {job_label(_e, _f)}: {_line}", file=sys.stderr)


def _write_config_json():
    text = json.dumps(config, indent=1, sort_keys=True)
    path = Path(CONFIG_JSON)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def finished(experiment, folder, shard=None):
    """Whether the measure job of (experiment, folder) is done: its manifest is there, was
    written under these settings, and nothing of it must be measured again (rerun_reasons).
    Under Slurm the settings are compared without what this machine makes of them (a login
    node without the compute nodes' GPU would find every static-analysis job stale).
    shard: the same for the job of one shard of its grid (its own manifest; measure.smk)."""
    name = shard.manifest if shard else "_manifest.json"
    m = cudalab_runner.results.read_json(Path(folder, "raw", experiment, name))
    if m is None:
        return False
    key = "fingerprint" if _LOCAL or "config_fingerprint" not in m else "config_fingerprint"
    want = cudalab_runner.job_fingerprint(config, experiment, machine=key == "fingerprint")
    return m.get(key) == want and not cudalab_runner.rerun_reasons(Path(folder), experiment,
                                                                    shard)


def jobs_to_run():
    """(experiment, folder) of the measure jobs this run starts, from the config and what
    is on disk (the project reads no Snakemake internals). Only these are measure jobs of
    the run (measure.smk: todo_regex): a finished job is never queued again, not even when
    a doctor it once waited for runs again. To measure a finished experiment again, remove
    its manifest."""
    return [(e, folder) for e, folder in measure_jobs() if not finished(e, folder)]


def todo_regex(todo):
    """The measure rule's `folder` constraint: each folder followed by its experiments that
    are to run (a lookahead), so Snakemake plans no job for a finished one."""
    by_folder = {}
    for e, folder in todo:
        by_folder.setdefault(folder, []).append(e)
    return "|".join(f"{re.escape(f)}(?=/raw/(?:{folder_regex(es)})/)"
                    for f, es in by_folder.items()) or "(?!)"


def forced():
    """Whether the command line forces jobs to run again (--forcerun/-R, --forceall/-F,
    --force/-f): then every measure job is one of the run, as Snakemake plans it (read from
    sys.argv: Snakemake parses the workflow before it sets its DAG settings)."""
    flags = ("-R", "--forcerun", "-F", "--forceall", "-f", "--force")
    return any(a in flags or a.startswith(("--forcerun=", "--forceall=")) for a in sys.argv[1:])


# decided once, in the main process (a Slurm job's own Snakemake runs the job it was given)
TO_RUN = jobs_to_run() if workflow.is_main_process and not forced() else measure_jobs()


def _slurm_jobs():
    """(name, GPU request) of every job this run submits with sbatch, the doctors first
    (one per folder that has a measure job to run), then a class's judges and baseline
    where `exercises` is a target (exercises.smk), and the measure jobs not rerun."""
    # `snakemake exercises` submits a class's jobs and no measure job
    targets = run_targets()
    judged = class_slurm_jobs(_gpu_flag) if "exercises" in targets else []
    if targets == {"exercises"}:
        return judged, 0
    todo = TO_RUN
    folders = [f for f in FOLDERS if any(f == folder for _, folder in todo)]
    out = []
    for f in folders if SLURM["doctor"] else []:
        w = SimpleNamespace(tag=cudalab_sweep.doctor_tag(f, RESULTS))  # as the wildcards
        out.append((w.tag, _gpu_flag(doctor_gpus(w), doctor_model(w))))
    for e, f in todo:
        w = SimpleNamespace(folder=f, experiment=e)
        out.append((job_label(e, f), _gpu_flag(gpu_count(w), gpu_model(w))))
    return out + judged, len(measure_jobs()) - len(todo)


def run_targets():
    """The rules and files named on the command line (none: `all`), known once the DAG is
    built."""
    return set(getattr(workflow.dag_settings, "targets", None) or ()) or {"all"}


def closing_lines():
    """onsuccess: where this run's products are, only those it was asked for and that are
    there: the report and slides (`all`), a class's leaderboard (`exercises`)."""
    targets = run_targets()
    wanted = [("report written to", REPORT), ("slides (one per lesson) in", SLIDES_DECK)]
    wanted = wanted if "all" in targets else []
    if CLASS_RUN and "exercises" in targets:
        wanted.append(("class leaderboard written to", CLASS_INDEX))  # exercises.smk
    return [f"cudalab: {what} {Path(path).resolve()}" for what, path in wanted
            if Path(path).exists()]


def _gpu_flag(gpus, model):
    return (f"--gpus={model}:{gpus}" if model else f"--gpus={gpus}") if gpus else ""


def watch_failures():
    """In onstart: each failed job's cause on the console when Snakemake reports it, not
    only at the end of the run (cudalab/failures.py: FailureNow)."""
    import logging

    from cudalab import failures as cudalab_failures

    _FAILURE_NOW[:] = [cudalab_failures.FailureNow(Path.cwd())]
    logging.getLogger("snakemake.logging").addHandler(_FAILURE_NOW[0])


_FAILURE_NOW = []  # the handler, once onstart added it (doctor.smk: stop after a failure)


def slurm_fit():
    """The request as sbatch will get it: the plan's check (FIT), again where the command
    line gives another QOS (--slurm-qos: the plugin puts it after the config's, so it wins)."""
    forced = getattr(workflow.executor_settings, "qos", None) or ""
    if not forced or forced == config["slurm"]["qos"] or FIT is None or not FIT.checked:
        return FIT
    from cudalab import site as cudalab_site

    return cudalab_site.check_fit({**config, "slurm": {**config["slurm"], "qos": forced}})


onstart:
    _write_config_json()
    watch_failures()
    drop_leftover_doctor_flags()  # doctor.smk
    if CLASS_RUN and "exercises" in run_targets():  # what is judged, where it is written
        print(class_line(), file=sys.stderr)  # exercises.smk
    guard_interrupts()  # doctor.smk: a second Ctrl-C cannot leave jobs or flags behind
    # Under Slurm: never submit what cannot start, say how many sbatch jobs this run submits
    # and watch them for a PENDING reason that never clears (doctor.smk).
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        from cudalab.site import slurm_missing, slurm_not_answering

        # no sbatch here, or a controller that does not answer: say so, submit nothing
        _why = slurm_missing(plugin_installed=True) or (FIT and slurm_not_answering(FIT))
        if _why:
            raise WorkflowError(_why)
        _fit = slurm_fit()
        if _fit is not None and not _fit.fits:
            raise WorkflowError(
                "cudalab: the slurm: request cannot fit this cluster (sinfo, sacctmgr), so "
                "its jobs would wait for ever; nothing was submitted:\n"
                + "\n".join(f"  - {p}" for p in _fit.problems)
                + "\nFix the slurm: block in config.yaml (`cudalab site` suggests one)."
            )
        print(slurm_submit_line(*_slurm_jobs()), file=sys.stderr)
        start_pending_watch()
    elif any(map(needs_gpu, EXPERIMENTS)):
        if cudalab_gpu_slots.problem(config):
            raise WorkflowError("cudalab: " + cudalab_gpu_slots.problem(config))
        print(cudalab_gpu_slots.summary_line(config), file=sys.stderr)
        if shard_line():  # measure.smk
            print(shard_line(), file=sys.stderr)
