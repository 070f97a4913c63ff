"""Cancel Slurm jobs PENDING for a reason that never clears, and say why.

Snakemake's Slurm executor waits for such a job for ever and prints nothing; Slurm knows
why (`squeue` %r): the request exceeds what the partition allows (PartitionConfig, e.g.
more CPUs than any node has), the time limit is above the partition's, the account or QOS
is invalid, or the job asks for a GPU type no node has (ReqNodeNotAvail). A daemon thread in
the Snakemake process polls `squeue --me` every POLL_S seconds for this run's jobs (the
work directory and the plugin's `rule_...` comment). A QOS or association limit reason
(QOSMaxWallDurationPerJobLimit, AssocGrpCpuLimit, ...) never clears where the job's request
alone exceeds the limit (cudalab/slurm_limits.py reads it from sacctmgr); one that other
jobs hold for now (a Grp or per-user limit) only waits. A job whose reason never clears is
cancelled (`scancel`) with one line saying the reason, the limit and the fix, and the run is
stopped as Ctrl-C stops it (SIGINT to the Snakemake process: its other jobs are cancelled,
the closing summary leads with that line, exit 1). Waiting for Snakemake to see the job
CANCELLED is not enough: on a cluster with accounting the executor plugin reads states from
sacct, which says "CANCELLED by <uid>", a state the plugin (2.8) does not know, so it waits
for ever (seen on Slurm 22.05 with slurmdbd). A reason that may clear by itself
(a partition down, nodes drained or reserved, an admin hold) is reported once, not
cancelled. It is started by the workflow under the Slurm executor (workflow/rules/
doctor.smk) and stops with the process (or stop()).

The same poll sees a job end: a job the executor plugin still counts as running that has
left the queue wakes the plugin's status check (cudalab/status_wake.py), so Snakemake
reports it, with its cause, within seconds, and the run ends then when nothing else runs.
One `squeue --me` call every POLL_S (2) seconds, against the plugin's back-off to 180 s;
an exit is wanted within 5 s of the last job, and the poll is most of that wait.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from cudalab import slurm_limits
from cudalab.status_wake import Waker

POLL_S = float(os.environ.get("CUDALAB_PENDING_POLL_S", "2"))
# Slurm's reason codes that no amount of waiting changes -> what the user should do
NEVER_CLEARS = {
    "PartitionConfig": "the request exceeds the partition's limits or nodes (cpus_per_task, "
                       "mem_mb, GPUs): lower slurm.cpus_per_task / slurm.mem_mb to what "
                       "`cudalab site` lists",
    "PartitionTimeLimit": "slurm.runtime_min is above the partition's time limit: lower it "
                          "to the limit `cudalab site` lists",
    "PartitionNodeLimit": "the partition does not allow this many nodes",
    "InvalidQOS": "the QOS is not valid for this account: set slurm.qos to one that "
                  "`sacctmgr show assoc user=$USER format=Account,QOS` lists",
    "InvalidAccount": "slurm.account is not valid (sacctmgr show assoc user=$USER)",
    "BadConstraints": "slurm.constraint names a feature no node has",
    "QOSNotAllowed": "the partition does not allow this QOS (scontrol show partition: "
                     "AllowQos): pick another slurm.partition or slurm.qos",
    "AccountNotAllowed": "the partition does not allow this account (scontrol show "
                         "partition: AllowAccounts): pick another slurm.partition or "
                         "slurm.account",
    "DependencyNeverSatisfied": "a job it depends on failed",
    # ReqNodeNotAvail where the GPU type it asks for is on no node of the cluster
    "NoSuchGpuType": "no node of this cluster has the GPU type it asks for: set "
                     "slurm.gpu_model (or gpu_models) to a model `cudalab site` lists",
}
# reasons that may clear (an admin brings nodes back, releases a hold): reported only
MAY_CLEAR = {
    "PartitionDown": "the partition is down: ask the admins or pick another partition",
    "PartitionInactive": "the partition is inactive: pick another partition",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved",
    "JobHeldAdmin": "an administrator holds the job",
}
STUCK = {**NEVER_CLEARS, **MAY_CLEAR}
FORMAT = "%i|%T|%r|%k|%Z"
_GPU_TYPE = re.compile(r"gpu:([A-Za-z0-9_.-]+):\d+")


def reason_code(reason: str) -> str:
    return reason.split(",")[0].split(" ")[0].strip("()")


def stuck_jobs(squeue_out: str, workdir: str) -> list[tuple[str, str, str]]:
    """(job id, rule comment, reason) of this run's PENDING jobs with a stuck reason."""
    out = []
    for line in squeue_out.splitlines():
        f = line.strip().split("|")
        if len(f) < 5 or f[1] != "PENDING" or not f[3].startswith("rule_"):
            continue
        if os.path.realpath(f[4]) != os.path.realpath(workdir):
            continue
        code = reason_code(f[2])
        if code in STUCK or slurm_limits.is_limit_reason(code):
            out.append((f[0], f[3], f[2]))
    return out


def ended_jobs(squeue_out: str, active: set[str]) -> set[str]:
    """The jobs the executor waits for that are no longer queued, running or completing
    (squeue's default states): they ended."""
    queued = {line.split("|")[0].strip() for line in squeue_out.splitlines() if "|" in line}
    return active - queued


def message(job_id: str, comment: str, reason: str, cancelled: bool = False,
            code: str = "", what: str = "") -> str:
    """The line of a stuck job; `what` says why (STUCK's text of its reason by default)."""
    what = what or STUCK[code or reason_code(reason)]
    if cancelled:
        return (f"cudalab: cancelled Slurm job {job_id} ({comment}): PENDING with reason "
                f"{reason}, which never clears: {what}. Fix the slurm: block in config.yaml "
                "and run the same command again.")
    return (f"cudalab: Slurm job {job_id} ({comment}) is PENDING, reason {reason}: "
            f"{what}. It may not start by itself: press Ctrl-C (or scancel {job_id}), fix "
            "the slurm: block in config.yaml and run again.")


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def missing_gpu_type(job_id: str) -> str:
    """The GPU type the job asks for when no node of the cluster has it ('' otherwise):
    ReqNodeNotAvail then never clears."""
    from cudalab import site

    info = _run(["scontrol", "show", "job", "-o", job_id])
    wanted = set(_GPU_TYPE.findall(" ".join(re.findall(r"TresPer\w+=(\S+)", info))))
    if not wanted:
        return ""
    try:
        have = set(site.gpu_models(site.read_sinfo(timeout_s=20)))
    except site.SiteError:
        return ""
    return ", ".join(sorted(wanted - have))


def scancel(job_id: str) -> bool:
    try:
        return subprocess.run(["scancel", job_id], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def interrupt_run() -> None:
    """Stop this Snakemake run as Ctrl-C does (its handler cancels the run's Slurm jobs)."""
    os.kill(os.getpid(), signal.SIGINT)


class PendingWatch(threading.Thread):
    def __init__(self, workdir: str, poll_s: float = POLL_S,
                 emit: Callable[[str], None] | None = None,
                 stop_run: Callable[[], None] = interrupt_run,
                 read: slurm_limits.Reader | None = None,
                 cancel: Callable[[str], bool] = scancel,
                 waker: Waker | None = None) -> None:
        super().__init__(name="cudalab-pending-watch", daemon=True)
        self.workdir, self.poll_s, self.stop_run = workdir, poll_s, stop_run
        # the seam: Slurm's commands (tests feed saved squeue/scontrol/sacctmgr text)
        self.read = read or (lambda cmd: _run(cmd))
        self.cancel, self.waker = cancel, waker
        self.emit = emit or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stopped = threading.Event()
        self.seen: set[tuple[str, str]] = set()
        self.cancelled: list[str] = []  # the lines of the jobs it cancelled

    def act(self, job_id: str, comment: str, reason: str) -> None:
        """Cancel a job that can never start; report one that may."""
        code, what = reason_code(reason), ""
        if code == "ReqNodeNotAvail":
            gpu = missing_gpu_type(job_id)
            if gpu:
                code, reason = "NoSuchGpuType", f"ReqNodeNotAvail (GPU type {gpu})"
        if slurm_limits.is_limit_reason(code):
            what = slurm_limits.never_clears(code, job_id, self.read)
            if not what:  # a shared limit that others' jobs (or your own) hold for now
                self.emit(f"cudalab: Slurm job {job_id} ({comment}) is PENDING, reason "
                          f"{reason}: it waits until other jobs under that limit end "
                          "(squeue -t PENDING -o '%i %r'); not cancelled")
                return
        if (code in NEVER_CLEARS or what) and self.cancel(job_id):
            line = message(job_id, comment, reason, cancelled=True, code=code, what=what)
            self.cancelled.append(line)
            self.emit(line)
            self.stop_run()  # the run cannot finish: stop it now, not when Snakemake notices
            return
        self.emit(message(job_id, comment, reason, code=code))

    def poll(self) -> None:
        # the queue's jobs of every state that is not final (squeue's default)
        out = self.read(["squeue", "--me", "-h", "-o", FORMAT])
        if self.waker is not None and ended_jobs(out, self.waker.active_ids()):
            self.waker.wake()  # the plugin checks now: Snakemake reports the end in seconds
        for job_id, comment, reason in stuck_jobs(out, self.workdir):
            if (job_id, reason) not in self.seen:
                self.seen.add((job_id, reason))
                self.act(job_id, comment, reason)

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            self.poll()

    def stop(self) -> None:
        self.stopped.set()


def wait_for_jobs(workdir: str, comment_prefix: str, timeout_s: float = 30,
                  poll_s: float = 1) -> bool:
    """Wait until none of the run's jobs whose comment starts with `comment_prefix` is in
    squeue (pending, running or completing): a job cancelled by Ctrl-C may still be
    writing its outputs. False when they are still there after timeout_s."""
    import time

    if shutil.which("squeue") is None:
        return True
    end = time.monotonic() + timeout_s
    while True:
        out = _run(["squeue", "--me", "-h", "-t", "PENDING,RUNNING,COMPLETING,CONFIGURING",
                    "-o", FORMAT])
        mine = [f for f in (line.strip().split("|") for line in out.splitlines())
                if len(f) >= 5 and f[3].startswith(comment_prefix)
                and os.path.realpath(f[4]) == os.path.realpath(workdir)]
        if not mine:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(poll_s)


def start(workdir: str, waker: Waker | None = None) -> PendingWatch | None:
    """Start watching (None where squeue is missing or CUDALAB_PENDING_POLL_S=0)."""
    if shutil.which("squeue") is None or POLL_S <= 0:
        return None
    watch = PendingWatch(workdir, waker=waker)
    watch.start()
    return watch
