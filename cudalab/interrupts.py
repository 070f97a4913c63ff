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
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

GRACE_S = 20.0  # scancel (<= 60 s when slurmctld is slow, usually well under a second)
# plus onerror's wait for the doctor jobs to end (<= 30 s)


RETRY_S = 0.1
MAX_DEFER_S = 5.0


def _in_event_loop() -> bool:
    """Whether this (the main) thread is inside a running asyncio loop."""
    import asyncio

    return asyncio._get_running_loop() is not None


def _signal_again() -> None:
    """SIGINT to the main thread again in RETRY_S (a daemon timer; sent to the process,
    another thread might get it while the main thread sleeps on)."""
    timer = threading.Timer(RETRY_S, signal.pthread_kill,
                            (threading.main_thread().ident, signal.SIGINT))
    timer.daemon = True
    timer.start()


class OnceInterrupt:
    """A SIGINT handler: raise KeyboardInterrupt once, then ignore repeats for grace_s."""

    def __init__(self, grace_s: float = GRACE_S,
                 emit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 shield: Callable[[], None] | None = None,
                 busy: Callable[[], bool] = _in_event_loop,
                 later: Callable[[], None] = _signal_again) -> None:
        self.grace_s, self.clock = grace_s, clock
        self.shield = shield or _shield_children
        self.busy, self.later = busy, later
        self.emit = emit or (lambda line: print(line, file=sys.stderr, flush=True))
        self.first: float | None = None
        self.deferred: float | None = None  # when a first SIGINT was put off
        self.ignored = 0

    def __call__(self, signum: int, frame: Any) -> None:
        now = self.clock()
        if self.first is None or now - self.first > self.grace_s:
            # Inside one of Snakemake's asyncio runs (a finished job's outputs are checked
            # in one) a KeyboardInterrupt breaks the loop: Snakemake's teardown then fails
            # ("Cannot close a running event loop") and the process hangs at exit (seen).
            # Put it off until the run is over, RETRY_S at a time, at most MAX_DEFER_S.
            self.deferred = self.deferred if self.deferred is not None else now
            if self.busy() and now - self.deferred < MAX_DEFER_S:
                self.later()
                return
            self.deferred = None
            self.first = now
            self.shield()
            raise KeyboardInterrupt
        self.ignored += 1
        left = self.grace_s - (now - self.first)
        self.emit("cudalab: stopping: cancelling this run's jobs and removing the doctors' "
                  f"flags; Ctrl-C again after {left:.0f} s forces the stop (jobs may then "
                  "be left queued: squeue --me)")


def _shield_children() -> None:
    """Block SIGINT in this (the main) thread: the commands it starts from now on (the
    plugin's `scancel`, the doctors' `squeue`) inherit the mask, so a second Ctrl-C, which the
    terminal (or `timeout -s INT`) sends to the whole process group, cannot kill them half
    way ("Unable to cancel jobs with scancel (exit code -2)", jobs left queued: seen). The
    process still gets SIGINT through its other threads (install() keeps one)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


_INSTALLED: list[OnceInterrupt] = []


def install(grace_s: float = GRACE_S) -> OnceInterrupt:
    """Make this process's SIGINT handler a OnceInterrupt (call from the main thread), with
    a thread that leaves SIGINT unblocked, so repeats still reach the handler once the main
    thread blocks it."""
    handler = OnceInterrupt(grace_s)
    signal.signal(signal.SIGINT, handler)
    if not _INSTALLED:
        threading.Thread(target=threading.Event().wait, name="cudalab-sigint",
                         daemon=True).start()
    _INSTALLED[:] = [handler]
    return handler


def interrupted() -> bool:
    """Whether this run got a SIGINT (Ctrl-C, or the pending watcher's own stop)."""
    return any(h.first is not None for h in _INSTALLED)


def stopping() -> bool:
    """Whether a SIGINT has come, even one put off until Snakemake's event loop is done
    (interrupted() is true only once it is raised): a local job dying now died of it."""
    return any(h.first is not None or h.deferred is not None for h in _INSTALLED)


def stopped_line(jobs: Iterable[tuple[str, Path]], started: float) -> str:
    """The closing line of a run you stopped: what it kept. jobs: (label, raw folder of one
    measure job); a job is finished where its manifest is there, and every record written
    since `started` stays for the next run, which measures only what is missing."""
    return (f"cudalab: stopped by you (Ctrl-C). {kept(jobs, started)} Nothing failed: the "
            "same command again submits only what is missing (no finished experiment, no "
            "doctor for a GPU without work).")


def failure_stop_line(failed: Iterable[str], jobs: Iterable[tuple[str, Path]],
                      started: float) -> str:
    """The closing line of a run that does not keep going, stopped after a failure (its
    other jobs cancelled as Ctrl-C cancels them)."""
    return (f"cudalab: stopped after a failure ({', '.join(failed)}): keep-going is off, so "
            f"the run's other Slurm jobs were cancelled at once. {kept(jobs, started)} Fix "
            "the cause above and run the same command again: it submits only what is "
            "missing.")


def kept(jobs: Iterable[tuple[str, Path]], started: float) -> str:
    """What a stopped run kept: finished experiment jobs (their manifest is there) and the
    point records written since `started`."""
    jobs = list(jobs)
    done = [label for label, raw in jobs if (raw / "_manifest.json").is_file()]
    written = sum(1 for _, raw in jobs for p in raw.glob("*.json")
                  if not p.name.startswith("_") and _mtime(p) >= started)
    # a lesson split over GPUs (cudalab/shards.py): its shards finished by this run
    shards = sum(1 for _, raw in jobs for p in raw.glob("_shard-*.json") if _mtime(p) >= started)
    return (f"kept: {len(done)} of {len(jobs)} experiment job(s) finished"
            f"{' (' + ', '.join(done) + ')' if done else ''}, "
            + (f"{shards} shard job(s) of split lessons finished, " if shards else "")
            + f"and {written} point record(s) this run wrote in raw/.")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
