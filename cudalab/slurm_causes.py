"""Why a Slurm job ended badly, in Slurm's own words: out of memory, time limit, refused.

A job killed for memory is not always FAILED-with-a-reason: with cgroups its state is
OUT_OF_MEMORY (the job's or one step's, in sacct) and its Slurm log says "Detected 1
oom-kill event(s)"; with jobacct_gather's OverMemoryKill the step ends "CANCELLED" and the
log says "StepId=42.0 exceeded memory limit (380469248 > 268435456), being killed". The
executor plugin reports the job as FAILED either way, and the rule's own log ends mid-line.
`job_cause` reads both places (sacct where accounting answers, the Slurm log always) and
says OOM with the memory asked (ReqMem) and used (MaxRSS, or the log's number).

Slurm commands go through a `Reader` (cudalab.slurm_limits), so tests feed saved text.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from cudalab.slurm_limits import Reader, run_cmd
from cudalab.slurm_units import mem_mb

__all__ = ["Reader", "mem_mb", "run_cmd"]  # re-exported: the seam of cudalab.failures

SACCT_FORMAT = "JobID,State,ReqMem,MaxRSS,Elapsed,Timelimit"
_OOM_LINE = re.compile(r"oom[-_ ]kill|out of memory|exceeded (job )?memory limit", re.I)
_EXCEEDED = re.compile(r"exceeded memory limit \((\d+) > (\d+)\)")
_JOB_ID = re.compile(r"SLURM-job '(\d+)'")
BAD_STATES = ("OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL")


@dataclass
class JobCause:
    job_id: str
    states: list[str] = field(default_factory=list)  # sacct: the job's, then its steps'
    oom: bool = False
    asked_mb: int | None = None  # ReqMem
    used_mb: int | None = None  # the largest MaxRSS of its steps (or the log's number)
    used_from: str = "MaxRSS"
    lines: list[str] = field(default_factory=list)  # Slurm's own lines about it

    def text(self) -> str:
        """One line for the console ('' where Slurm says nothing beyond the failure)."""
        if self.oom:
            state = "OUT_OF_MEMORY" if "OUT_OF_MEMORY" in self.states else "killed for memory"
            asked = f"asked {self.asked_mb} MB (slurm.mem_mb)" if self.asked_mb else ""
            used = f"used {self.used_mb} MB ({self.used_from})" if self.used_mb else ""
            fix = (f"raise slurm.mem_mb above {self.used_mb}" if self.used_mb
                   else "raise slurm.mem_mb")
            if self.used_mb and self.asked_mb and self.used_mb <= self.asked_mb:
                # MaxRSS is sampled (JobAcctGatherFrequency): the peak the kernel killed
                # came after the last sample, above what was asked
                used = (f"{self.used_mb} MB at the last sample ({self.used_from}) before "
                        "the kill, its peak above what was asked")
                fix = f"raise slurm.mem_mb above {self.asked_mb}"
            sizes = ", ".join(x for x in (asked, used) if x)
            return (f"Slurm job {self.job_id} ran out of memory (OOM, {state}"
                    f"{': ' + sizes if sizes else ''}); fix: {fix}")
        bad = next((s for s in self.states if s.split()[0] in BAD_STATES), "")
        if bad.startswith("TIMEOUT"):
            return (f"Slurm job {self.job_id} hit its time limit (TIMEOUT); fix: raise "
                    "slurm.runtime_min (finished points are kept)")
        if bad:
            return f"Slurm job {self.job_id} ended {bad}"
        return ""


def parse_sacct(text: str, cause: JobCause) -> None:
    """`sacct -P -n -j ID -o SACCT_FORMAT` (the job and its steps) into cause."""
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 4:
            continue
        cause.states.append(f[1])
        cause.oom |= f[1].startswith("OUT_OF_MEMORY")
        cause.asked_mb = cause.asked_mb or mem_mb(f[2])
        used = mem_mb(f[3])
        if used is not None and used > (cause.used_mb or 0):
            cause.used_mb = used


def parse_log(text: str, cause: JobCause) -> None:
    """Slurm's memory lines of a job's log (slurmstepd / srun) into cause."""
    seen = []
    for line in (x.strip() for x in text.splitlines()):
        if _OOM_LINE.search(line) and line not in seen:
            seen.append(line)
            m = _EXCEEDED.search(line)
            if m:
                used, limit = int(m[1]) // 2**20, int(m[2]) // 2**20
                if used > (cause.used_mb or 0):
                    cause.used_mb, cause.used_from = used, "Slurm's log"
                cause.asked_mb = cause.asked_mb or limit
    if seen:
        cause.oom = True
        cause.lines = seen[:3]


def job_cause(job_id: str, slurm_log: Path | None = None, read: Reader = run_cmd,
              wait_s: float = 3.0) -> JobCause:
    """What Slurm knows of an ended job: sacct (where it answers; slurmdbd may take a moment
    to have the steps) and the job's Slurm log."""
    cause = JobCause(job_id)
    end = time.monotonic() + wait_s
    while True:  # '' at once without accounting; the steps' rows come a moment late
        text = read(["sacct", "-P", "-n", "-j", job_id, "-o", SACCT_FORMAT])
        if not text.strip() or f"{job_id}." in text or time.monotonic() >= end:
            break
        time.sleep(0.5)
    parse_sacct(text, cause)
    if slurm_log is not None:
        try:
            parse_log(slurm_log.read_text(errors="replace"), cause)
        except OSError:
            pass
    return cause


def slurm_job_id(message: str) -> str:
    """The job id in the executor plugin's failure message ('' if none)."""
    m = _JOB_ID.search(message or "")
    return m[1] if m else ""


def refusal(message: str) -> str:
    """sbatch's error where the plugin says the submission was refused ('' otherwise)."""
    m = re.search(r"SLURM sbatch failed\. The error message was '(.*?)'", message or "", re.S)
    if not m:
        return ""
    return re.sub(r"^sbatch: error: (Batch job submission failed: )?", "", m[1].strip())
