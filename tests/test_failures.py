"""The last screen of a run that stopped names the jobs that failed and shows the end of each
one's log; the doctor's table only where the doctor job failed (cudalab/failures.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cudalab import failures, pending

TRACEBACK = "\n".join(["Traceback (most recent call last):"]
                      + [f'  File "x.py", line {i}, in f' for i in range(30)]
                      + ["KeyError: 'm_counted'"])
DOCTOR_TABLE = ("cudalab doctor: FAILED (pycuda, GPU(s)): the grid would not run here\n\n"
                "| status | check | value | what to do |\n| --- | --- | --- | --- |\n"
                "| FAIL | pycuda | ModuleNotFoundError | pip install -e '.[gpu]' |\n")


def block(rule: str, jobid: int, output: str, log: str | None) -> str:
    """An 'Error in rule' block as Snakemake 9 writes it to its log."""
    lines = [f"Error in rule {rule}:", "    message: None", f"    jobid: {jobid}",
             "    input: results/results.csv, results/figures/a.png", f"    output: {output}"]
    if log:
        lines.append(f"    log: {log} (check log file(s) for error details)")
    lines += ["    shell:", "        python -m cudalab.cli report > x 2>&1",
              "        (command exited with non-zero exit code)"]
    return "\n".join(lines)


def smk_log(tmp: Path, *blocks: str) -> list[str]:
    p = tmp / ".snakemake" / "log" / "run.snakemake.log"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("Building DAG of jobs...\nrule measure:\n    jobid: 3\n"
                 "    wildcards: experiment=matmul\n" + "\n".join(blocks)
                 + "\nExiting because a job execution failed. Look above for error messages\n")
    return [str(p)]


def workdir(tmp: Path, started: float) -> Path:
    """results/ of a GPU-less run: the doctor wrote its FAILED table (locally the run goes
    on), the report job's log holds a traceback."""
    logs = tmp / "results" / "logs"
    logs.mkdir(parents=True)
    (logs / "report.log").write_text(TRACEBACK + "\n")
    (logs / "doctor.log").write_text(DOCTOR_TABLE)
    (logs / "measure_matmul.log").write_text("matmul: 12 grid points\n")
    (tmp / "results" / "doctor").mkdir()
    (tmp / "results" / "doctor" / "doctor.md").write_text(DOCTOR_TABLE)
    for p in [*logs.iterdir(), tmp / "results" / "doctor" / "doctor.md"]:
        os.utime(p, (started + 1, started + 1))
    return tmp


def test_a_failed_report_job_is_named_with_its_log_tail_and_the_doctor_is_not_blamed(
        tmp_path: Path) -> None:
    started = time.time() - 60
    wd = workdir(tmp_path, started)
    log = smk_log(wd, block("html_report", 1, "results/report.html",
                            "results/logs/report.log"))
    out = failures.summary(log, Path("results/logs"), started,
                           Path("results/doctor/doctor.md"), workdir=wd)
    assert out.startswith("cudalab: 1 job(s) failed: html_report\n")
    assert "--- html_report: results/logs/report.log (last 15 lines) ---" in out
    assert out.rstrip().endswith("KeyError: 'm_counted'")
    assert "line 16, in f" in out and "line 15, in f" not in out  # the tail only
    assert "doctor" not in out and "FAILED" not in out


def test_the_doctors_table_is_shown_when_the_doctor_job_failed(tmp_path: Path) -> None:
    started = time.time() - 60
    wd = workdir(tmp_path, started)
    log = smk_log(wd, block("doctor", 2, "results/doctor/ok", "results/logs/doctor.log"))
    out = failures.summary(log, wd / "results" / "logs", started,
                           wd / "results" / "doctor" / "doctor.md", workdir=wd)
    assert out.startswith("cudalab: 1 job(s) failed: doctor\n")
    assert "| FAIL | pycuda |" in out and "no measure job was submitted" in out
    assert out.count("| FAIL | pycuda |") == 1  # the table once, not also as the log's tail
    # a table from before this run blames nothing: the log's tail is shown instead
    os.utime(wd / "results" / "doctor" / "doctor.md", (started - 5, started - 5))
    out = failures.summary(log, wd / "results" / "logs", started,
                           wd / "results" / "doctor" / "doctor.md", workdir=wd)
    assert "no measure job was submitted" not in out
    assert "--- doctor: results/logs/doctor.log" in out


def test_several_failed_jobs_of_one_rule_are_told_apart(tmp_path: Path) -> None:
    started = time.time() - 60
    wd = workdir(tmp_path, started)
    (wd / "results" / "logs" / "measure_atomics.log").write_text("boom atomics\n")
    log = smk_log(wd,
                  block("measure", 4, "results/raw/matmul/_manifest.json",
                        "results/logs/measure_matmul.log"),
                  block("measure", 5, "results/raw/atomics/_manifest.json",
                        "results/logs/measure_atomics.log"),
                  block("measure", 5, "results/raw/atomics/_manifest.json",
                        "results/logs/measure_atomics.log"),  # a retry: the same job
                  block("figures", 6, "results/figures/x.png", None))
    out = failures.summary(log, wd / "results" / "logs", started, None, workdir=wd)
    first = out.splitlines()[0]
    assert first == ("cudalab: 3 job(s) failed: measure (results/raw/matmul/_manifest.json), "
                     "measure (results/raw/atomics/_manifest.json), figures")
    assert "matmul: 12 grid points" in out and out.count("boom atomics") == 1
    assert "--- figures: no log file" in out


def test_parse_reads_wildcards_where_snakemake_writes_them() -> None:
    text = block("measure", 3, "results/raw/matmul/_manifest.json", "a.log, b.log")
    text = text.replace("    jobid: 3", "    jobid: 3\n    wildcards: experiment=matmul")
    (job,) = failures.parse_failed(text + "\nRemoving output files of failed job measure\n")
    assert job.name == "measure (experiment=matmul)" and job.logs == ["a.log", "b.log"]


def test_without_snakemakes_log_the_logs_of_this_run_with_a_traceback(tmp_path: Path) -> None:
    started = time.time() - 60
    wd = workdir(tmp_path, started)
    old = wd / "results" / "logs" / "old.log"
    old.write_text(TRACEBACK)
    os.utime(old, (started - 100, started - 100))  # an earlier run's: not this one's
    for log in (None, [], str(wd / "missing.log")):
        out = failures.summary(log, wd / "results" / "logs", started, None, workdir=wd)
        assert "names no failed job" in out and "report.log" in out
        assert "old.log" not in out and "measure_matmul" not in out
    (wd / "results" / "logs" / "report.log").write_text("fine\n")
    out = failures.summary(None, wd / "results" / "logs", started, None, workdir=wd)
    assert "no job log of this run holds a traceback" in out


def test_the_log_snakemake_gives_onerror_is_read(tmp_path: Path) -> None:
    """A real Snakemake run whose jobs fail: its onerror hook gets the log this module
    parses (guards against a change of Snakemake's format)."""
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "Snakefile").write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(root)!r})
        from pathlib import Path
        from cudalab import failures
        STARTED = time.time()
        rule all:
            input: expand("out/{{x}}.txt", x=["a", "b"]), "ok.txt"
        rule fine:
            output: "ok.txt"
            log: "results/logs/fine.log"
            shell: "echo fine > {{log}}; touch {{output}}"
        rule make:
            output: "out/{{x}}.txt"
            log: "results/logs/make_{{x}}.log"
            shell: "echo 'boom {{wildcards.x}}' > {{log}}; exit 3"
        onerror:
            print(failures.summary(log, Path("results/logs"), STARTED, None))
    """))
    r = subprocess.run([sys.executable, "-m", "snakemake", "-c1", "-k"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    out = r.stdout[r.stdout.find("cudalab: "):]  # onerror prints to stdout
    assert out.startswith("cudalab: 2 job(s) failed: make (out/"), r.stdout + r.stderr
    assert "boom a" in out and "boom b" in out and "fine.log" not in out


SLURM_LOG = """
SNAKEMAKE
=========
  Date: 2026-11-25 13:29:51
Building DAG of jobs...
[Wed Nov 25 13:29:52 2026]
rule measure:
    output: results/raw/matmul/_manifest.json
Shell command: { python -m cudalab.cli measure matmul; } > results/logs/measure_matmul.log 2>&1
Activating environment modules: cuda/0.0-missing
Lmod has detected the following error: The following module(s) are unknown: "cuda/0.0-missing"
cudalab: module cuda/0.0-missing is not loaded in this job (LOADEDMODULES=)
RuleException:
CalledProcessError in file "/tmp/x/workflow/rules/measure.smk", line 52:
Command 'module purge && module load cuda/0.0-missing; set -euo pipefail; { _ok=1; ...' died
[Wed Nov 25 13:29:55 2026]
Error in rule measure:
    message: None
    jobid: 0
Shutting down, this might take some time.
"""


def test_a_slurm_jobs_log_shows_what_its_command_printed(tmp_path: Path) -> None:
    """Under Slurm the executor plugin's log of the job repeats Snakemake's banner and error
    block: the summary shows the command's own lines (Lmod's error, the module check)."""
    log = tmp_path / ".snakemake" / "slurm_logs" / "rule_measure" / "results_matmul" / "3.log"
    log.parent.mkdir(parents=True)
    log.write_text(SLURM_LOG)
    out = failures.tail(log)
    assert out.splitlines() == [
        "Activating environment modules: cuda/0.0-missing",
        'Lmod has detected the following error: The following module(s) are unknown: '
        '"cuda/0.0-missing"',
        "cudalab: module cuda/0.0-missing is not loaded in this job (LOADEDMODULES=)"]
    other = tmp_path / "plain.log"
    other.write_text(SLURM_LOG)
    assert "Shutting down" in failures.tail(other), "other logs: their last lines"


def test_cancelled_pending_jobs_lead_the_summary(tmp_path: Path) -> None:
    line = "cudalab: cancelled Slurm job 7 (rule_doctor_wildcards_doctor): PENDING with reason"
    log = smk_log(tmp_path, block("doctor", 2, "results/doctor/doctor_h100.ok", None))
    out = failures.summary(log, tmp_path / "results" / "logs", time.time(),
                           tmp_path / "results" / "doctor", [line], workdir=tmp_path)
    assert out.splitlines()[0] == line
    assert "cudalab: 1 job(s) failed: doctor" in out


def test_a_job_that_can_never_start_stops_the_run(monkeypatch) -> None:
    # the executor plugin may never see the cancelled job (sacct's "CANCELLED by 0"): the
    # watcher stops the run itself, once, and only for a reason that never clears
    stops, lines = [], []
    watch = pending.PendingWatch("/tmp", emit=lines.append, stop_run=lambda: stops.append(1))
    monkeypatch.setattr(watch, "cancel", lambda job_id: True)
    watch.act("12", "rule_doctor_wildcards_doctor", "ReqNodeNotAvail, Reserved for maintenance")
    assert stops == [] and "may not start by itself" in lines[-1]  # may clear: reported only
    watch.act("13", "rule_measure_wildcards_results_matmul", "PartitionTimeLimit")
    assert stops == [1] and lines[-1].startswith("cudalab: cancelled Slurm job 13")
    assert watch.cancelled == [lines[-1]]
    monkeypatch.setattr(watch, "cancel", lambda job_id: False)  # scancel failed: no stop
    watch.act("14", "rule_measure_wildcards_results_sobel", "PartitionConfig")
    assert stops == [1] and "is PENDING" in lines[-1]


def test_the_default_stop_is_sigint_to_this_process(monkeypatch) -> None:
    sent = []
    monkeypatch.setattr(pending.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    pending.interrupt_run()
    assert sent == [(os.getpid(), signal.SIGINT)]


# What Snakemake printed when a Ctrl-C reached a local job too (seen in CI: the test's SIGINT
# to Snakemake's process group came as `aggregate` had just started)
DIED_OF_CTRL_C = ("Terminating processes on user request, this might take some time.\n"
                  "RuleException:\nCalledProcessError in file \"workflow/rules/aggregate.smk\", "
                  "line 24:\nCommand 'set -euo pipefail;  python -m cudalab.cli aggregate > "
                  "results/logs/aggregate.log 2>&1' died with <Signals.SIGINT: 2>.\n"
                  "[Fri Nov 27 16:13:03 2026]\n")


def test_a_local_job_the_ctrl_c_killed_is_not_a_failure_of_a_stopped_run(tmp_path: Path):
    """Stopped by Ctrl-C, the local job that died of the same SIGINT is left out of the
    failed jobs (it runs again next time); a job that failed on its own, before, is not.
    In a run nobody stopped, a job killed by a signal is a failure like any other."""
    log = smk_log(tmp_path, block("report", 9, "results/report.html", "results/logs/report.log"),
                  DIED_OF_CTRL_C + block("aggregate", 5, "results/results.csv",
                                         "results/logs/aggregate.log"))
    jobs = failures.failed_jobs(log)
    assert [(j.rule, j.signal) for j in jobs] == [("report", ""), ("aggregate", "SIGINT")]
    assert [j.rule for j in failures.failed_jobs(log, stopped=True)] == ["report"]
    said = failures.summary(log, tmp_path / "results" / "logs", 0.0, workdir=tmp_path,
                            stopped=True)
    assert "1 job(s) failed: report" in said and "aggregate" not in said
    only_stopped = smk_log(tmp_path, DIED_OF_CTRL_C + block(
        "aggregate", 5, "results/results.csv", "results/logs/aggregate.log"))
    assert failures.failed_jobs(only_stopped, stopped=True) == []
    assert "1 job(s) failed: aggregate" in failures.summary(
        only_stopped, tmp_path / "results" / "logs", 0.0, workdir=tmp_path)


def test_a_job_error_during_the_stop_is_said_as_stopped_not_failed(tmp_path: Path):
    """Snakemake reports the local job the Ctrl-C killed as a job error: the live line says
    it was stopped, counts no failure and does not start the stop after a failure."""
    said: list[str] = []
    woken: list[str] = []
    stopping = [False]
    handler = failures.FailureNow(tmp_path, out=said.append, stopping=lambda: stopping[0])
    handler.on_failure = woken.append
    rec = logging.LogRecord("snakemake", logging.ERROR, __file__, 1, "x", None, None)
    rec.event, rec.rule_name, rec.rule_msg, rec.log = "job_error", "aggregate", "", []
    stopping[0] = True
    handler.emit(rec)
    assert said[-1].startswith("cudalab: aggregate stopped at ") and "Ctrl-C" in said[-1]
    assert handler.failed == [] and woken == []
    stopping[0] = False
    handler.emit(rec)
    assert said[-1].startswith("cudalab: aggregate failed at ")
    assert handler.failed == ["aggregate"] and woken == ["aggregate"]
