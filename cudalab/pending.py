"""Report Slurm jobs PENDING for a reason that will not clear by itself.

Snakemake's Slurm executor waits for such a job for ever and prints nothing; Slurm knows
why (`squeue` %r): the request exceeds what the partition allows (PartitionConfig, e.g.
more CPUs than any node has), the time limit is above the partition's, the nodes it needs
are down or reserved (ReqNodeNotAvail), the account or QOS is invalid. A daemon thread in
the Snakemake process polls `squeue --me` every POLL_S seconds for this run's jobs (the
work directory and the plugin's `rule_...` comment) and prints one line per stuck job, once
per reason. It is started by the workflow under the Slurm executor (workflow/rules/
doctor.smk) and stops with the process (or stop()).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable

POLL_S = float(os.environ.get("CUDALAB_PENDING_POLL_S", "15"))
# Slurm's reason codes that no amount of waiting changes -> what the user should do
STUCK = {
    "PartitionConfig": "the request exceeds the partition's limits or nodes (cpus_per_task, "
                       "mem_mb, GPUs): compare with `cudalab site`",
    "PartitionTimeLimit": "runtime_min is above the partition's time limit (`cudalab site`)",
    "PartitionNodeLimit": "the partition does not allow this many nodes",
    "PartitionDown": "the partition is down: ask the admins or pick another partition",
    "PartitionInactive": "the partition is inactive: pick another partition",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved",
    "InvalidQOS": "the QOS is not valid for this account",
    "InvalidAccount": "slurm.account is not valid (sacctmgr show assoc user=$USER)",
    "BadConstraints": "slurm.constraint names a feature no node has",
    "DependencyNeverSatisfied": "a job it depends on failed",
    "JobHeldAdmin": "an administrator holds the job",
}
FORMAT = "%i|%T|%r|%k|%Z"


def stuck_jobs(squeue_out: str, workdir: str) -> list[tuple[str, str, str]]:
    """(job id, rule comment, reason) of this run's PENDING jobs with a stuck reason."""
    out = []
    for line in squeue_out.splitlines():
        f = line.strip().split("|")
        if len(f) < 5 or f[1] != "PENDING" or not f[3].startswith("rule_"):
            continue
        if os.path.realpath(f[4]) != os.path.realpath(workdir):
            continue
        code = f[2].split(",")[0].split(" ")[0].strip("()")
        if code in STUCK:
            out.append((f[0], f[3], f[2]))
    return out


def message(job_id: str, comment: str, reason: str) -> str:
    code = reason.split(",")[0].split(" ")[0].strip("()")
    return (f"cudalab: Slurm job {job_id} ({comment}) is PENDING, reason {reason}: "
            f"{STUCK[code]}. It will not start by itself: press Ctrl-C (or scancel "
            f"{job_id}), fix the slurm: block in config.yaml and run again.")


class PendingWatch(threading.Thread):
    def __init__(self, workdir: str, poll_s: float = POLL_S,
                 emit: Callable[[str], None] | None = None) -> None:
        super().__init__(name="cudalab-pending-watch", daemon=True)
        self.workdir, self.poll_s = workdir, poll_s
        self.emit = emit or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stopped = threading.Event()
        self.seen: set[tuple[str, str]] = set()

    def poll(self) -> None:
        try:
            p = subprocess.run(["squeue", "--me", "-h", "-t", "PENDING", "-o", FORMAT],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return  # a busy controller: try again next time
        for job_id, comment, reason in stuck_jobs(p.stdout, self.workdir):
            if (job_id, reason) not in self.seen:
                self.seen.add((job_id, reason))
                self.emit(message(job_id, comment, reason))

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            self.poll()

    def stop(self) -> None:
        self.stopped.set()


def start(workdir: str) -> PendingWatch | None:
    """Start watching (None where squeue is missing or CUDALAB_PENDING_POLL_S=0)."""
    if shutil.which("squeue") is None or POLL_S <= 0:
        return None
    watch = PendingWatch(workdir)
    watch.start()
    return watch
