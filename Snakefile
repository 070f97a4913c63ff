# cudalab: config.yaml -> one job per experiment (pycuda kernels, timing harness)
#          -> results/results.csv -> seaborn figures -> results/report.html
# Run:  snakemake            (local; profiles/default is picked up by itself)
#       snakemake --profile profiles/slurm   (one Slurm job per experiment)
from snakemake.utils import min_version

min_version("9.0")


include: "workflow/rules/common.smk"
include: "workflow/rules/doctor.smk"
include: "workflow/rules/measure.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/slides.smk"
if config["exercises"]["submissions"]:  # a class's submissions (docs/exercises.md)
    include: "workflow/rules/exercises.smk"


rule all:
    input:
        REPORT,
        SLIDES_DECK,
    default_target: True


onsuccess:
    remove_doctor_flags()  # doctor.smk
    for _line in closing_lines():  # common.smk: only what this run was asked for
        print(f"\n{_line}")
    # last: how to measure what a GPU-less run left out ('' when nothing was)
    for _folder in FOLDERS:
        _left = cudalab_runner.not_measured_summary(Path(_folder), EXPERIMENTS)
        if _left:
            print(_left + "\n")


onerror:
    # The jobs that failed and the end of each one's log, read from Snakemake's own log of
    # this run (`log`: its "Error in rule" blocks), not guessed from results/logs/ mtimes;
    # the doctor's table only where the doctor job is among them (cudalab/failures.py).
    from cudalab import failures as cudalab_failures

    # the doctors' flags must not outlive a stopped run (Ctrl-C comes here too): the next
    # run checks the node again before its measure jobs
    remove_doctor_flags()  # doctor.smk

    _by_you = stopped_by_you()  # doctor.smk: Ctrl-C, not a failure ('' otherwise)
    # a local job the Ctrl-C killed too did not fail: it is left out
    if not _by_you or cudalab_failures.failed_jobs(log, stopped=True):
        print("\n" + cudalab_failures.summary(log, Path(RESULTS) / "logs", _STARTED,
                                              Path(RESULTS) / "doctor", pending_cancelled(),
                                              stopped=bool(_by_you)),
              file=sys.stderr)
    _after_failure = stopped_by_failure()  # doctor.smk: keep-going off, a job failed
    print(
        f"\n{_by_you or _after_failure}\n" if _by_you or _after_failure else
        "\ncudalab: the run stopped. Points already measured are kept in results/raw/ "
        "and a rerun measures only what is missing. Logs: results/logs/ "
        "(and .snakemake/slurm_logs/ under Slurm). If Snakemake says the directory is "
        "locked (a killed run leaves its lock), run `snakemake --unlock` once, then the "
        "same command again.\n"
    )
