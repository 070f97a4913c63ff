# Class mode (docs/exercises.md): included by the Snakefile only when exercises.submissions
# names a folder. `snakemake exercises` (or --profile slurm) judges every submission in a
# job of its own (one Slurm job each, with the measure jobs' GPU request), the course's
# kernels and cuBLAS in one more, and writes results/class/<exercise>/index.html.
# A job's verdict is its own file: a submission that fails, crashes or hangs gets its verdict
# and never stops the run or touches another student's records.
from cudalab import jail as cudalab_jail
from cudalab.exercises import classroom as cudalab_classroom

CLASS = config["exercises"]
SANDBOX = CLASS["sandbox"] or "off"  # YAML reads an unquoted off as false
# Untrusted code is compiled and judged in a sandbox (docs/exercises.md): without one, the
# run stops here, before any job, unless the config says `sandbox: optional` or `off`.
try:
    cudalab_jail.use(SANDBOX)
except cudalab_jail.SandboxUnavailable as exc:
    raise WorkflowError(f"exercises.sandbox is {SANDBOX}: {exc}") from None
CLASS_DIR = f"{RESULTS}/class/{CLASS['exercise']}"
# Read once at parse time (nothing is written, no file opened): only names that passed the
# strict pattern become jobs; the rest are listed as rejected by the report. A folder that
# is no class folder (missing, a file, a link loop, /, the repository) stops the run here.
try:
    SUBMISSIONS, _REJECTED = cudalab_classroom.discover(Path(CLASS["submissions"]))
except cudalab_classroom.ClassFolderError as exc:
    raise WorkflowError(f"exercises.submissions: {exc}") from None
CLASS_FLAGS = (f"--exercise {shlex.quote(CLASS['exercise'])}"
               f" --timeout {float(CLASS['launch_timeout_s']):g}"
               + (" --sanitize" if CLASS["sanitize"] else "")
               + f" --sandbox {shlex.quote(SANDBOX)}")


CLASS_INDEX = f"{CLASS_DIR}/index.html"


rule exercises:
    input:
        CLASS_INDEX,


def judged(path, src=None):
    """Whether a class job's output is a verdict to keep: there, newer than the submission
    it judged, and not `compiled` for want of a GPU (a GPU run judges those again)."""
    v = cudalab_runner.results.read_json(Path(path))
    if v is None:
        return False
    try:
        if src is not None and Path(src).stat().st_mtime > Path(path).stat().st_mtime:
            return False
    except OSError:
        return False
    entries = v.get("baselines", [v])
    return not any(e.get("status") == "compiled" and "no GPU here" in e.get("message", "")
                   for e in entries if isinstance(e, dict))


# decided once, in the main process, as for the measure jobs (common.smk: TO_RUN): only the
# submissions still to judge are jobs, so the class doctor running again never queues a
# judged one again (a Slurm job's own Snakemake runs the job it was given)
_MAIN = workflow.is_main_process and not forced()  # common.smk: --forcerun etc.
TO_JUDGE = [s for s in sorted(SUBMISSIONS)
            if not (_MAIN and judged(f"{CLASS_DIR}/verdicts/{s}.json", SUBMISSIONS[s]))]
BASELINE_TODO = not (_MAIN and judged(f"{CLASS_DIR}/baseline.json"))


def class_doctor(wildcards):
    """The judges' input: the class doctor's flag (doctor.smk), unless slurm.doctor is off."""
    return ancient(f"{RESULTS}/doctor/{CLASS_DOCTOR}.ok") if SLURM["doctor"] else []


def class_slurm_jobs(gpu_flag):
    """(name, GPU request) of the class jobs a run submits: the class doctor, each
    submission to judge and the baseline if it is to run, each with one GPU."""
    gpu = gpu_flag(1, CLASS_MODEL)
    jobs = [(f"exercise_judge {s}", gpu) for s in TO_JUDGE]
    jobs += [("exercise_baseline", gpu)] if BASELINE_TODO else []
    return ([(CLASS_DOCTOR, gpu)] if jobs and SLURM["doctor"] else []) + jobs


def class_line():
    """What a class run judges and where its leaderboard goes (said in onstart)."""
    kept = len(SUBMISSIONS) - len(TO_JUDGE)
    on = f"on GPU model {CLASS_MODEL}" if CLASS_MODEL else "on any GPU"
    return (f"cudalab: this class run judges {len(TO_JUDGE)} of {len(SUBMISSIONS)} "
            f"submission(s) of {CLASS['submissions']} for exercise {CLASS['exercise']} {on}"
            + (f" ({kept} judged before, kept)" if kept else "")
            + (f", {len(_REJECTED)} entr{'y' if len(_REJECTED) == 1 else 'ies'} rejected"
               if _REJECTED else "")
            + ("; the course's kernels and cuBLAS as the baseline" if BASELINE_TODO else "")
            + f". Leaderboard: {CLASS_INDEX} (leaderboard.csv, anonymous.html and students/ "
            "beside it)")


rule exercise_judge:
    input:
        src=lambda w: str(SUBMISSIONS[w.student]),
        doctor=class_doctor,  # the judges' GPU passed the doctor (doctor.smk)
    output:
        f"{CLASS_DIR}/verdicts/{{student}}.json",
    log:  # a folder of their own: a student named like a class job (baseline, report)
        # cannot write over that job's log
        f"{CLASS_DIR}/logs/students/{{student}}.log",
    wildcard_constraints:
        # only the submissions still to judge (TO_JUDGE: names source.NAME_PATTERN passed)
        student="|".join(map(re.escape, TO_JUDGE)) or "(?!)",
    envmodules:
        *SLURM["modules"]
    resources:
        **slurm_request.resources(SLURM, 1, CLASS_MODEL or None),
    conda:
        CONDA_ENV
    shell:
        "{MODULES_GUARD}{CUDALAB} exercise judge {input.src:q}"
        " --student {wildcards.student:q} {CLASS_FLAGS} --out {output:q} > {log:q} 2>&1"


rule exercise_baseline:
    input:
        doctor=class_doctor,
    output:
        # a wildcard only so that a baseline already judged is no job of the run
        "{class_dir}/baseline.json",
    log:
        "{class_dir}/logs/baseline.log",
    wildcard_constraints:
        class_dir=re.escape(CLASS_DIR) if BASELINE_TODO else "(?!)",
    envmodules:
        *SLURM["modules"]
    resources:
        **slurm_request.resources(SLURM, 1, CLASS_MODEL or None),
    conda:
        CONDA_ENV
    shell:
        "{MODULES_GUARD}{CUDALAB} exercise baseline {CLASS_FLAGS} --out {output:q}"
        " > {log:q} 2>&1"


localrules:
    exercise_report,


rule exercise_report:
    input:
        verdicts=expand(f"{CLASS_DIR}/verdicts/{{student}}.json", student=sorted(SUBMISSIONS)),
        baseline=f"{CLASS_DIR}/baseline.json",
    output:
        f"{CLASS_DIR}/index.html",
    params:
        submissions=CLASS["submissions"],
        verdicts=f"{CLASS_DIR}/verdicts",
        out=CLASS_DIR,
        exercise=CLASS["exercise"],
    log:
        f"{CLASS_DIR}/logs/report.log",
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} exercise report --exercise {params.exercise:q}"
        " --submissions {params.submissions:q} --verdicts {params.verdicts:q}"
        " --baseline {input.baseline:q} --out {params.out:q} > {log:q} 2>&1"
