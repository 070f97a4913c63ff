# `cudalab doctor` runs first, as one short job per GPU the run asks for (one, or one per
# model of a GPU-model sweep), with the measure jobs' GPU request and modules and a small
# allocation; each measure job waits for the doctor of its GPU. Under Slurm, when a GPU
# experiment could not run (no GPU, no pycuda, a module that does not load, nvcc missing)
# the run stops with the doctor's table and no measure job is submitted; locally it only
# writes its table (a run without a GPU goes on). `slurm: {doctor: false}` turns it off.
# Also here: the watcher that cancels Slurm jobs PENDING for a reason that never clears.
import atexit
import os
import time as _time

from cudalab import interrupts as cudalab_interrupts
from cudalab import pending as cudalab_pending
from cudalab import status_wake as cudalab_status_wake

_SLURM = config["slurm"]
ANY_GPU = any(needs_gpu(e) for e in EXPERIMENTS)
# A class run's judges (exercises.smk) have a doctor of their own, with their GPU request:
# they always need a GPU (and nvcc), whatever the grid needs; in a sweep they run on the
# first model, so that every entry of the leaderboard is timed on the same GPU.
CLASS_RUN = bool(config["exercises"]["submissions"])
CLASS_DOCTOR = "doctor_class"
CLASS_MODEL = _SLURM["gpu_model"] or (GPU_MODELS[0] if GPU_MODELS else "")
# doctor (results/doctor/doctor.md, results/logs/doctor.log), or doctor_<model> in a sweep
DOCTOR_TAGS = sorted({cudalab_sweep.doctor_tag(f, RESULTS) for f in FOLDERS}
                     | ({CLASS_DOCTOR} if CLASS_RUN else set()))
DOCTOR_TABLE = f"{RESULTS}/doctor/{{tag}}.md"
_STARTED = _time.time()
# the run's directory (--directory): Snakemake goes back to where it was started before the
# process exits, so what runs at exit finds the flags by this absolute path
_WORKDIR = os.getcwd()
_WATCH = []
_WAKER = []  # the executor's wakeable sleep (cudalab/status_wake.py), under Slurm
_FLAGS_REMOVED = []  # set once remove_doctor_flags ran: it runs at most once per run


def doctor_first(wildcards):
    """The measure rule's input: the flag of its GPU's doctor. The same locally and under
    Slurm (and in dry runs), so switching executors never changes a measure job's inputs."""
    if not _SLURM["doctor"]:
        return []
    return ancient(f"{RESULTS}/doctor/{cudalab_sweep.doctor_tag(wildcards.folder, RESULTS)}.ok")


def doctor_model(wildcards):
    """The GPU model the doctor asks for: the sweep's model, else slurm.gpu_model."""
    if wildcards.tag == CLASS_DOCTOR:
        return CLASS_MODEL
    model = wildcards.tag.removeprefix("doctor").removeprefix("_")
    return model or (_SLURM["gpu_model"] if ANY_GPU else "")


def doctor_gpus(wildcards):
    return 1 if ANY_GPU or wildcards.tag != "doctor" else 0


def doctor_needs(wildcards, what):
    """--need-gpu / --need-nvcc: what the grid needs (a sweep's CPU-only grid asks for the
    model's GPU and needs none); the class doctor's judges need both."""
    if wildcards.tag == CLASS_DOCTOR:
        return "yes"
    need = ANY_GPU or (what == "nvcc" and any(REGISTRY[e].needs_nvcc for e in EXPERIMENTS))
    return "yes" if need else "no"


def start_pending_watch():
    """Called in onstart under Slurm: cancel jobs stuck in PENDING (cudalab/pending.py);
    a job's end wakes the plugin's status check, and where keep-going is off, a failure
    stops the run at once, its other jobs cancelled (cudalab/status_wake.py)."""
    waker = cudalab_status_wake.install(cudalab_status_wake.executor_of(workflow))
    if waker is not None:
        _WAKER.append(waker)
        if not workflow.execution_settings.keep_going and _FAILURE_NOW:  # common.smk
            _FAILURE_NOW[0].on_failure = waker.stop_after
    _WATCH.append(cudalab_pending.start(os.getcwd(), waker))


def doctor_flags():
    """The doctors' flags on disk: temp(), so removed once their measure jobs ended; one
    that is there before the doctor ran is left from a run that was stopped."""
    return sorted(Path(_WORKDIR, RESULTS, "doctor").glob("*.ok"))


def drop_leftover_doctor_flags():
    """In onstart: a flag left from a stopped run must not let measure jobs start unchecked.
    onerror removes them (Ctrl-C too, once the run's doctor jobs have ended); one left by a
    killed Snakemake is removed here, and the run stops before any job (Snakemake has
    planned the run by now: the doctor can no longer be added to it)."""
    left = doctor_flags()
    for p in left:
        p.unlink()
    if left:  # jobs are about to start, and a measure job among them would skip its doctor
        raise WorkflowError(
            f"cudalab: {', '.join(map(str, left))} was left by a run that was killed, so the "
            "doctor would not run before the measure jobs; it is removed now: run the same "
            "command again (the doctor then runs first)")


def remove_doctor_flags():
    """In onerror and onsuccess, and at exit: no flag outlives a run. Under Slurm a doctor
    job cancelled by Ctrl-C may still write its flag as it ends: wait for the run's doctor
    jobs first."""
    if _FLAGS_REMOVED:
        return
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        cudalab_pending.wait_for_jobs(_WORKDIR, "rule_doctor")
    for flag in doctor_flags():
        flag.unlink(missing_ok=True)
    _FLAGS_REMOVED.append(True)


def guard_interrupts():
    """In onstart (the main process): a second Ctrl-C must not cut short the cancelling of
    the run's jobs or the removal of the doctors' flags (cudalab/interrupts.py), and the
    flags go at exit even when a forced stop skipped onerror."""
    cudalab_interrupts.install()
    atexit.register(at_exit)


def at_exit():
    """At exit: the flags go even where onerror did not run, and a Ctrl-C still gets its
    closing line there. Snakemake skips onerror when the KeyboardInterrupt hits one of its
    input or resource functions (it wraps it in an InputFunctionException; seen when the
    Ctrl-C came as a job finished)."""
    hooks_ran = bool(_FLAGS_REMOVED)  # onsuccess and onerror remove the flags first
    remove_doctor_flags()
    if hooks_ran or not cudalab_interrupts.interrupted():
        return
    os.chdir(_WORKDIR)  # the closing line reads the manifests by relative paths
    line = stopped_by_failure() or stopped_by_you()
    if line:
        print(f"\n{line} (Snakemake's KeyboardInterrupt message above is that stop.)\n",
              file=sys.stderr, flush=True)


def stopped_by_you():
    """In onerror: the closing line of a run stopped by Ctrl-C (what it kept), '' where it
    failed or the pending watcher stopped it."""
    if not cudalab_interrupts.interrupted() or pending_cancelled() or stopped_by_failure():
        return ""
    jobs = [(job_label(e, f), Path(f, "raw", e)) for e, f in measure_jobs()]
    return cudalab_interrupts.stopped_line(jobs, _STARTED)


def stopped_by_failure():
    """In onerror: the closing line of a run without keep-going that a failure stopped
    ('' otherwise)."""
    failed = [name for w in _WAKER for name in w.failed if w.stopping]
    if not failed:
        return ""
    jobs = [(job_label(e, f), Path(f, "raw", e)) for e, f in measure_jobs()]
    return cudalab_interrupts.failure_stop_line(failed, jobs, _STARTED)


def pending_cancelled():
    """What the watcher cancelled, for the closing summary."""
    return [line for w in _WATCH if w is not None for line in w.cancelled]


rule doctor:
    output:
        temp(f"{RESULTS}/doctor/{{tag}}.ok"),
    params:
        modules=_SLURM["modules"],  # a list: `:q` quotes each name
        need_gpu=lambda w: doctor_needs(w, "gpu"),
        need_nvcc=lambda w: doctor_needs(w, "nvcc"),
        gpu_index=config["gpu_index"],
        table=DOCTOR_TABLE,
        table_json=DOCTOR_TABLE.replace(".md", ".json"),
    log:
        f"{RESULTS}/logs/{{tag}}.log",
    wildcard_constraints:
        tag=folder_regex(DOCTOR_TAGS),
    envmodules:
        *_SLURM["modules"]
    # a short check (1 CPU, <= 4 GB, <= 10 min) with the measure jobs' GPU request
    resources:
        **slurm_request.resources(
            _SLURM, doctor_gpus,
            doctor_model if ANY_GPU or GPU_MODELS or CLASS_MODEL else None, small=True),
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} doctor --config '' --modules {params.modules:q} --need-gpu {params.need_gpu}"
        " --need-nvcc {params.need_nvcc} --gpu-index {params.gpu_index} {REQUIRE_MODULES}"
        " --gate slurm --md {params.table:q} --json {params.table_json:q} > {log:q} 2>&1"
        " && touch {output:q}"

