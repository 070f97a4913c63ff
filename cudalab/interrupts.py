"""Ctrl-C that stops a run cleanly even when it comes twice.

Snakemake stops on the first SIGINT (KeyboardInterrupt): it cancels the run's jobs
(`scancel` under Slurm) and calls the workflow's onerror, which removes the doctors' flags.
A second SIGINT raised while that runs escapes it, and the run ends with jobs still queued
and flags that let the next run's measure jobs skip the doctor. A second one is common:
a user presses Ctrl-C twice, and `timeout -s INT` sends the signal to the command and then
to its whole process group, so Snakemake gets it twice (seen in CI: a traceback in
`_fork_exec` and the flags left). The workflow installs `install()` in onstart (the main
process only): the first SIGINT stops the run as before; more within GRACE_S only say that
the run is stopping; one after that forces the stop as Python's default handler does (the
workflow also removes the flags at exit, so even a forced stop leaves none).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Any

GRACE_S = 20.0  # scancel (<= 60 s when slurmctld is slow, usually well under a second)
# plus onerror's wait for the doctor jobs to end (<= 30 s)


class OnceInterrupt:
    """A SIGINT handler: raise KeyboardInterrupt once, then ignore repeats for grace_s."""

    def __init__(self, grace_s: float = GRACE_S,
                 emit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s, self.clock = grace_s, clock
        self.emit = emit or (lambda line: print(line, file=sys.stderr, flush=True))
        self.first: float | None = None
        self.ignored = 0

    def __call__(self, signum: int, frame: Any) -> None:
        now = self.clock()
        if self.first is None or now - self.first > self.grace_s:
            self.first = now
            raise KeyboardInterrupt
        self.ignored += 1
        left = self.grace_s - (now - self.first)
        self.emit("cudalab: stopping: cancelling this run's jobs and removing the doctors' "
                  f"flags; Ctrl-C again after {left:.0f} s forces the stop (jobs may then "
                  "be left queued: squeue --me)")


def install(grace_s: float = GRACE_S) -> OnceInterrupt:
    """Make this process's SIGINT handler a OnceInterrupt (call from the main thread)."""
    handler = OnceInterrupt(grace_s)
    signal.signal(signal.SIGINT, handler)
    return handler
