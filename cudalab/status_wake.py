"""Let the Slurm executor plugin see a job's end when it happens, not at its next poll.

The executor plugin (snakemake-executor-plugin-slurm 2.8) checks its jobs' states in a
thread that sleeps between checks: `slurm-init-seconds-before-status-checks` after a check
that saw a job COMPLETE, else 10 s more than the last sleep, up to 180 s (hard-coded). A
failed job does not reset the wait. So a failure was seen up to 3 minutes late, and the
exit waited for the sleep under way too (Snakemake's shutdown joins that thread): measured
on the one-node test cluster with the shipped profile, the cause came 15 s after the
failure and the exit 23 s after the last job ended (25 s on a site's cluster).

`install(executor)` gives that executor a `sleep` that waits the plugin's own time, in
slices of SLICE_S, and returns early when
  * the executor shuts down (its `wait` flag is off: the run ends by success, failure or
    Ctrl-C), so the exit no longer waits for the sleep; or
  * `wake()` was called: cudalab's watcher (cudalab/pending.py) polls squeue and wakes it
    when a job the executor still counts as running has left the queue, so the plugin
    checks at once and Snakemake reports the job (its cause on the console) within seconds.
The plugin's polling and back-off are otherwise unchanged; a wake costs one status query,
rate-limited by max-status-checks-per-second as every check is.

A run that does not keep going (`keep-going: false`) after a failure: `stop_after(name)`
asks for the stop; the sleep that follows the plugin's check (the plugin has put its
still-running jobs back on its list by then, so the stop cancels them all) stops the run as
Ctrl-C does. Snakemake alone would wait for every running job to end first.

The stop is a SIGINT sent to the main thread itself: Snakemake's scheduler sleeps there on a
semaphore, and only a signal delivered to that thread interrupts the sleep. One sent to the
process may be handed to any thread; the handler then waits until something else wakes the
main thread (seen once in CI: the stop came 2 minutes late, when the plugin's next check
did). A stop the run has not taken after STOP_RETRY_S is sent again.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from cudalab import interrupts

SLICE_S = 0.5
STOP_WAIT_S = 120.0  # after a stop: no check until the run has cancelled its jobs
STOP_RETRY_S = 5.0  # a stop the run has not taken by then is sent again


def interrupt_run() -> None:
    """Stop this Snakemake run as Ctrl-C does (it cancels the run's Slurm jobs): SIGINT to
    the main thread, so that it wakes from whatever it waits on."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


class Waker:
    """The executor's wakeable sleep, and the stop after a failure."""

    def __init__(self, executor: Any, stop_run: Callable[[], None] = interrupt_run,
                 stop_taken: Callable[[], bool] = interrupts.stopping) -> None:
        self.executor, self.stop_run, self.stop_taken = executor, stop_run, stop_taken
        self.woken = threading.Event()
        self.failed: list[str] = []  # the failures that stop the run (keep-going off)
        self.stopping = False
        self.stop_sent = 0.0  # when the stop was last sent (monotonic)

    async def sleep(self) -> None:
        """The plugin's wait between status checks, cut short by wake() or shutdown."""
        duration = float(self.executor.next_seconds_between_status_checks)
        # jobs still running: stop now (with none, Snakemake ends the run by itself, and a
        # SIGINT then would cut its closing steps short)
        if self.failed and not self.stopping and self.executor.wait and self.active_ids():
            self.stopping = True
            self._send_stop()
        if self.stopping:  # no more checks: one now would call the cancelled jobs failed
            duration = STOP_WAIT_S
        end = time.monotonic() + duration
        while (left := end - time.monotonic()) > 0:
            if not self.executor.wait or (self.woken.is_set() and not self.stopping):
                break
            if self.stopping and time.monotonic() - self.stop_sent >= STOP_RETRY_S \
                    and not self.stop_taken():
                self._send_stop()
            await asyncio.sleep(min(SLICE_S, left))
        self.woken.clear()

    def _send_stop(self) -> None:
        self.stop_sent = time.monotonic()
        self.stop_run()

    def wake(self) -> None:
        """Check the jobs' states now (called from the watcher's thread)."""
        self.woken.set()

    def stop_after(self, name: str) -> None:
        """A job failed in a run that does not keep going: stop at the next sleep."""
        self.failed.append(name)
        self.woken.set()

    def active_ids(self) -> set[str]:
        """The Slurm job ids the executor still waits for (those of the check under way
        are off its list while it runs: seen at the next poll)."""
        with self.executor.lock:
            return {str(j.external_jobid) for j in self.executor.active_jobs}


def install(executor: Any, stop_run: Callable[[], None] = interrupt_run,
            stop_taken: Callable[[], bool] = interrupts.stopping) -> Waker | None:
    """Give a remote executor the wakeable sleep (None where it is not the plugin this
    was written for: then its own sleep stays, and only the speed-up is lost)."""
    needed = ("wait", "lock", "active_jobs", "next_seconds_between_status_checks")
    if not inspect.iscoroutinefunction(getattr(executor, "sleep", None)) or \
            not all(hasattr(executor, a) for a in needed):
        return None
    waker = Waker(executor, stop_run, stop_taken)
    executor.sleep = waker.sleep  # looked up on the instance at every wait
    return waker


def executor_of(workflow: Any) -> Any:
    """The running executor of a Snakemake 9 workflow (None before the scheduler exists)."""
    return getattr(getattr(workflow, "scheduler", None), "_executor", None)
