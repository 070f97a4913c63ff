# Class mode (docs/exercises.md): included by the Snakefile only when exercises.submissions
# names a folder. `snakemake exercises` (or --profile slurm) judges every submission in a
# job of its own (one Slurm job each, with the measure jobs' GPU request), the course's
# kernels and cuBLAS in one more, and writes results/class/<exercise>/index.html.
# A job's verdict is its own file: a submission that fails, crashes or hangs gets its verdict
# and never stops the run or touches another student's records.
from cudalab import jail as cudalab_jail
from cudalab.exercises import classroom as cudalab_classroom
from cudalab.exercises.source import NAME_PATTERN as STUDENT_PATTERN

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


rule exercises:
    input:
        f"{CLASS_DIR}/index.html",


def class_slurm_jobs(gpu_flag):
    """(name, GPU request) of the class jobs a run submits: each submission without its
    verdict, and the baseline, each with one GPU (the rules' resources below)."""
    gpu = gpu_flag(1, SLURM["gpu_model"])
    todo = [s for s in sorted(SUBMISSIONS)
            if not Path(CLASS_DIR, "verdicts", f"{s}.json").exists()]
    base = [] if Path(CLASS_DIR, "baseline.json").exists() else ["exercise_baseline"]
    return [(f"exercise_judge {s}", gpu) for s in todo] + [(b, gpu) for b in base]


rule exercise_judge:
    input:
        src=lambda w: str(SUBMISSIONS[w.student]),
    output:
        f"{CLASS_DIR}/verdicts/{{student}}.json",
    log:  # a folder of their own: a student named like a class job (baseline, report)
        # cannot write over that job's log
        f"{CLASS_DIR}/logs/students/{{student}}.log",
    wildcard_constraints:
        student=STUDENT_PATTERN,
    envmodules:
        *SLURM["modules"]
    resources:
        **slurm_request.resources(SLURM, 1, SLURM["gpu_model"] or None),
    conda:
        CONDA_ENV
    shell:
        "{MODULES_GUARD}{CUDALAB} exercise judge {input.src:q}"
        " --student {wildcards.student:q} {CLASS_FLAGS} --out {output:q} > {log:q} 2>&1"


rule exercise_baseline:
    output:
        f"{CLASS_DIR}/baseline.json",
    log:
        f"{CLASS_DIR}/logs/baseline.log",
    envmodules:
        *SLURM["modules"]
    resources:
        **slurm_request.resources(SLURM, 1, SLURM["gpu_model"] or None),
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
