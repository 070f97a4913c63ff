"""The last screen of a run that stopped: which jobs failed, and the end of each one's log.

Which jobs failed is read from Snakemake's own log of the run (the file its `onerror` hook
is given): Snakemake writes one "Error in rule <name>:" block per failed job, with the job's
log files under it. That is Snakemake's own record of this run, so it is right however the
jobs ran (locally, under Slurm, with --keep-going) and whatever state results/logs/ was in
before. Log files' mtimes cannot tell a failed job from one that succeeded, so they are only
a fallback, where Snakemake's log is missing or holds no such block: the logs written since
the run started that hold a traceback.

The doctor's table is shown only when the doctor job itself failed in this run: locally it
writes a FAILED table for a GPU-less machine and the run goes on, so a table alone blames
nothing.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cudalab import interrupts, slurm_causes

TAIL_LINES = 15  # per failed job: a traceback's last frames and its message
_RULE = re.compile(r"^Error in rule (?P<rule>[A-Za-z_][A-Za-z0-9_]*):\s*$")
_FIELD = re.compile(r"^\s+(?P<key>[a-z_]+): (?P<value>.*)$")
_LOG_NOTE = " (check log file(s) for error details)"
_PLUGIN_NOTE = "For further error details see"
_DIED = re.compile(r"died with <Signals\.(?P<signal>SIG[A-Z0-9]+): \d+>")
# what a Ctrl-C (or the stop it starts) kills a running local job with
_STOP_SIGNALS = frozenset({"SIGINT", "SIGTERM"})


@dataclass
class FailedJob:
    rule: str
    jobid: str = ""
    wildcards: str = ""  # "experiment=matmul", where Snakemake's block names them
    logs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    name: str = ""  # what the summary calls it (set by parse_failed)
    message: str = ""  # Snakemake's (the executor's) message: sbatch's refusal, Slurm state
    # the signal a local job's command died of ("SIGINT": Ctrl-C reached it too), from the
    # RuleException Snakemake prints before the job's block
    signal: str = ""


def snakemake_logs(log: str | Iterable[str] | None) -> list[Path]:
    """The `log` Snakemake gives onerror (a path, or a list of paths since Snakemake 8)."""
    if not log:
        return []
    paths = [log] if isinstance(log, (str, os.PathLike)) else list(log)
    return [Path(p) for p in paths if p]


def parse_failed(text: str) -> list[FailedJob]:
    """The failed jobs named in a Snakemake log, in the order they failed (one per job)."""
    jobs: list[FailedJob] = []
    current: FailedJob | None = None
    died = ""  # the signal of the last RuleException before the next job's block
    for line in text.splitlines():
        m = _RULE.match(line)
        if m:
            current = FailedJob(m["rule"], signal=died)
            jobs.append(current)
            died = ""
            continue
        if (d := _DIED.search(line)):
            died = d["signal"]
        if current is None:
            continue
        f = _FIELD.match(line)
        if not f:
            # the block ends at the next unindented line, except the executor plugin's
            # unindented note inside its message (after a refused sbatch's call)
            if line and not line[0].isspace() and not line.startswith(_PLUGIN_NOTE):
                current = None
            continue
        key, value = f["key"], f["value"].strip()
        if key == "message":
            current.message = value
        elif key == "log":
            current.logs = _paths(value.removesuffix(_LOG_NOTE.strip()))
        elif key == "output":
            current.outputs = _paths(value)
        elif key == "jobid":
            current.jobid = value
        elif key == "wildcards":
            current.wildcards = value
    seen: dict[tuple[str, str, tuple[str, ...]], FailedJob] = {}
    for i, j in enumerate(jobs):  # a retried job is one job; a block without id is its own
        seen.setdefault((j.rule, j.jobid or f"#{i}", tuple(j.outputs)), j)
    out = list(seen.values())
    rules = [j.rule for j in out]
    for j in out:
        # the blocks of Snakemake 9 name no wildcards: jobs of one rule are told apart by
        # their first output
        what = j.wildcards or (j.outputs[0] if rules.count(j.rule) > 1 and j.outputs else "")
        j.name = f"{j.rule} ({what})" if what else j.rule
    return out


def _paths(value: str) -> list[str]:
    return [p.strip() for p in value.split(", ") if p.strip()]


def failed_jobs(log: str | Iterable[str] | None, stopped: bool = False) -> list[FailedJob]:
    """The failed jobs Snakemake's log of this run names ([] when it names none). stopped:
    the run was stopped by Ctrl-C, so a local job that died of the stop's signal did not
    fail (it runs again next time) and is left out."""
    jobs: list[FailedJob] = []
    for path in snakemake_logs(log):
        try:
            jobs += parse_failed(path.read_text(errors="replace"))
        except OSError:
            continue
    return [j for j in jobs if not (stopped and j.signal in _STOP_SIGNALS)]


def logs_with_traceback(log_dir: Path, since: float) -> list[Path]:
    """The fallback: job logs written since `since` that hold a Python traceback."""
    if not log_dir.is_dir():
        return []
    found = []
    for p in sorted(log_dir.glob("*.log"), key=lambda q: q.stat().st_mtime):
        try:
            if p.stat().st_mtime >= since and "Traceback (most recent call last)" in \
                    p.read_text(errors="replace"):
                found.append(p)
        except OSError:
            continue
    return found


def tail(path: Path, n: int = TAIL_LINES) -> str:
    """The last n lines of a file, or why there are none. Of a Slurm job's log (the
    executor plugin's, under .snakemake/slurm_logs/) only what the rule's command printed:
    the job's own Snakemake repeats the error block that is already on the console."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(the log file was not written)"
    except OSError as exc:
        return f"(cannot read the log: {exc})"
    if "slurm_logs" in path.parts:
        lines = command_output(lines) or lines
    if not lines:
        return "(the log is empty)"
    return "\n".join(lines[-n:])


_STAMP = re.compile(r"^\[\w{3} \w{3} +\d+ [\d:]+ \d{4}\]$")


def command_output(lines: list[str]) -> list[str]:
    """What the failed command printed in a Slurm job's log: the lines after its `Shell
    command:` line (and Snakemake's module note) up to the job's error report (Snakemake
    9 opens it with a `RuleException:` block before `Error in rule`)."""
    end = next((i for i, x in enumerate(lines) if _RULE.match(x) or x == "RuleException:"),
               len(lines))
    start = max((i for i, x in enumerate(lines[:end]) if x.startswith("Shell command:")),
                default=-1) + 1
    if start == 0:
        return []
    return [x for x in lines[start:end] if x.strip() and not _STAMP.match(x.strip())]


def _resolve(p: str, workdir: Path) -> Path:
    path = Path(p)
    return path if path.is_absolute() else workdir / path


def summary(log: str | Iterable[str] | None, log_dir: Path, started: float,
            doctor_table: Path | None = None, pending: Iterable[str] = (),
            workdir: Path | None = None, n: int = TAIL_LINES, stopped: bool = False) -> str:
    """The failure summary: the jobs that failed, each with the tail of its log; the
    doctor's table where a doctor job is among them (`doctor_table`: its file, or the folder
    of the doctors' tables, <tag>.md beside each doctor's <tag>.ok flag); and the jobs the
    pending watcher cancelled (their reason: Slurm's own log of them says nothing).
    stopped: by Ctrl-C (failed_jobs)."""
    workdir = workdir or Path.cwd()
    jobs = failed_jobs(log, stopped)
    parts: list[str] = [f"cudalab: {line}" if not line.startswith("cudalab:") else line
                        for line in pending]
    if jobs:
        parts.append(f"cudalab: {len(jobs)} job(s) failed: "
                     + ", ".join(j.name for j in jobs))
        for j in jobs:
            table_path = _doctor_table(j, doctor_table, workdir)
            if table_path is not None:
                # its table says what is missing and what to do (its log is the same table)
                table = doctor_section(table_path, started)
                if table:
                    parts.append(table)
                    continue
            why = cause(j.message, j.logs, workdir)
            if why:
                parts.append(f"--- {j.name}: {why}")
            if slurm_causes.refusal(j.message):
                continue  # it never ran: its logs are empty
            if not j.logs and not why:
                parts.append(f"--- {j.name}: no log file (Snakemake's message above says "
                             "why it failed)")
            for p in j.logs:
                parts.append(f"--- {j.name}: {p} (last {n} lines) ---\n"
                             f"{tail(_resolve(p, workdir), n)}")
    elif not parts:
        found = logs_with_traceback(_resolve(str(log_dir), workdir), started)
        if found:
            parts.append("cudalab: Snakemake's log names no failed job; these job logs of "
                         "this run hold a traceback:")
            parts += [f"--- {p} (last {n} lines) ---\n{tail(p, n)}" for p in found]
        else:
            parts.append("cudalab: no job log of this run holds a traceback; Snakemake's "
                         "messages above say what stopped the run.")
    return "\n".join(s for s in parts if s)


def slurm_log(logs: Iterable[str], workdir: Path) -> Path | None:
    """The executor plugin's Slurm log among a job's logs (None: not a Slurm job)."""
    found = [p for p in (_resolve(x, workdir) for x in logs) if "slurm_logs" in p.parts]
    return found[0] if found else None


def cause(message: str, logs: Iterable[str], workdir: Path,
          read: slurm_causes.Reader = slurm_causes.run_cmd) -> str:
    """Slurm's word on a failed job ('' where it has none): sbatch refused it, it ran out
    of memory (with the memory asked and used), hit its time limit."""
    refused = slurm_causes.refusal(message)
    if refused:
        return (f"refused by sbatch: {refused} (nothing ran; the plan's Slurm check and "
                "`cudalab site` say what this cluster allows)")
    log = slurm_log(logs, workdir)
    job_id = slurm_causes.slurm_job_id(message) or (log.stem if log is not None else "")
    if not job_id.isdigit():
        return ""
    key = (str(workdir), job_id, str(log))
    if key not in _CAUSES:  # an ended job's cause does not change: asked once
        _CAUSES[key] = slurm_causes.job_cause(job_id, log, read).text()
    return _CAUSES[key]


# the causes already read (work dir, Slurm job id, its log): the closing summary repeats what
# FailureNow said without asking sacct again (up to 3 s a job while slurmdbd has no steps)
_CAUSES: dict[tuple[str, str, str], str] = {}


class FailureNow(logging.Handler):
    """Says why a job failed the moment Snakemake reports it (a --keep-going run may go on
    for hours after): Slurm's word (refused by sbatch, OOM with the memory asked and used,
    TIMEOUT) and the end of the job's logs. Added to Snakemake's logger (its JOB_ERROR
    records) by the workflow's onstart; `failed` counts every failure, refused ones too."""

    def __init__(self, workdir: Path, out: Callable[[str], None] | None = None,
                 read: slurm_causes.Reader = slurm_causes.run_cmd, n: int = TAIL_LINES,
                 stopping: Callable[[], bool] = interrupts.stopping):
        super().__init__(logging.ERROR)
        self.workdir, self.read, self.n, self.stopping = workdir, read, n, stopping
        self.out = out or (lambda text: print(text, file=sys.stderr, flush=True))
        self.failed: list[str] = []
        # called with the job's name once its cause is out (a run that does not keep going
        # stops then: cudalab/status_wake.py)
        self.on_failure: Callable[[str], None] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if getattr(event, "value", event) != "job_error":
            return
        try:
            failed = len(self.failed)
            self.out(self.report(getattr(record, "rule_name", "?"),
                                 str(getattr(record, "rule_msg", "") or ""),
                                 [str(x).removesuffix(_LOG_NOTE)
                                  for x in getattr(record, "log", None) or []]))
            if self.on_failure is not None and len(self.failed) > failed:
                self.on_failure(self.failed[-1])
        except Exception:  # noqa: BLE001 - never break Snakemake's own logging
            self.handleError(record)

    def report(self, rule: str, message: str, logs: list[str]) -> str:
        log = slurm_log(logs, self.workdir)
        name = f"{rule} ({log.parent.name})" if log is not None else rule
        if self.stopping():  # Ctrl-C reaches the local jobs too: not their failure
            return (f"cudalab: {name} stopped at {time.strftime('%H:%M:%S')} by the Ctrl-C "
                    "(it runs again next time)")
        self.failed.append(name)
        why = cause(message, logs, self.workdir, self.read)
        lines = [f"cudalab: {name} failed at {time.strftime('%H:%M:%S')}"
                 + (f": {why}" if why else "")]
        if not slurm_causes.refusal(message):
            lines += [f"--- {p} (last {self.n} lines) ---\n"
                      f"{tail(_resolve(p, self.workdir), self.n)}" for p in logs]
        return "\n".join(lines)


def _doctor_table(job: FailedJob, where: Path | None, workdir: Path) -> Path | None:
    """The table of a failed doctor job (None for other jobs)."""
    if job.rule != "doctor" or where is None:
        return None
    path = _resolve(str(where), workdir)
    if path.suffix == ".md":
        return path
    flag = next((o for o in job.outputs if o.endswith(".ok")), "doctor.ok")
    return path / (Path(flag).stem + ".md")


def doctor_section(table: Path, started: float) -> str:
    """The doctor's table, where this run wrote it (an older one would mislead)."""
    try:
        if table.stat().st_mtime < started:
            return ""
        jobs = "judge job" if table.stem == "doctor_class" else "measure job"  # a class's
        return (f"{table.read_text().rstrip()}\n(the doctor's table: {table}; no {jobs} "
                "was submitted)")
    except OSError:
        return ""
