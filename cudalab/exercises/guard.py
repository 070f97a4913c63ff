"""The timing guard of a judged kernel, around the harness's own timer.

The harness times with CUDA events on the legacy default stream (queued behind the hold
kernel where it can). GuardedTimer keeps that timer and adds, per sample: a synchronize of
the whole context before the sample ends (work the events did not cover is waited for
there, never left to run into the next sample), the host's wall-clock time of the sample and
of its launch calls, and a heartbeat for the watchdog of the parent process. A sample whose
wall-clock time exceeds its events' time and its launch calls by more than a floor (and by
more than half the events' time) had work outside the timed region: the verdict says so and
ranks the kernel by the wall-clock time instead.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from cudalab.harness import MAX_BATCH

HEARTBEAT = "cudalab-exercise-beat"
# Host-side time a synchronised sample costs beyond its events and launch calls: the hold
# kernel's release, the event's wake-up, the context synchronize (tens of microseconds).
ESCAPE_FLOOR_S = 2e-4


def beat() -> None:
    """Tell the parent's watchdog that the GPU answered (one line on stdout)."""
    print(HEARTBEAT, flush=True)
    sys.stdout.flush()


class GuardedTimer:
    """A harness Timer wrapping the harness's own (and its queued variant)."""

    def __init__(self, inner: Any, synchronize: Callable[[], None],
                 samples: list[tuple[float, float, float, int]] | None = None,
                 before: Callable[[], None] | None = None,
                 after: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.synchronize = synchronize
        self.samples: list[tuple[float, float, float, int]] = [] if samples is None else samples
        # outside the sample's events and wall clock: fresh inputs and output, a spot check
        self.before, self.after = before, after

    @property
    def max_batch(self) -> int:
        return int(getattr(self.inner, "max_batch", MAX_BATCH))

    def queued(self) -> tuple[Any, str]:
        q = getattr(self.inner, "queued", None)
        if q is None:
            return None, f"{self.inner.name} timer has no queued variant"
        timer, why = q()
        return (None, why) if timer is None else (
            GuardedTimer(timer, self.synchronize, self.samples, self.before, self.after), "")

    def time(self, fn: Callable[[], Any], reps: int) -> float:
        calls = [0.0]

        def counted() -> None:
            t = time.perf_counter()
            fn()
            calls[0] += time.perf_counter() - t

        if self.before is not None:
            self.before()
        w0 = time.perf_counter()
        dt = self.inner.time(counted, reps)
        self.synchronize()
        wall = time.perf_counter() - w0
        self.samples.append((dt, wall, calls[0], reps))
        if self.after is not None:
            self.after()
        beat()
        return dt


def guard_summary(samples: list[tuple[float, float, float, int]]) -> dict[str, Any]:
    """Per launch: the events' time, the wall-clock time, and the time neither the events
    nor the launch calls explain; suspect where that is above the floor."""
    if not samples:
        return {"suspect": False, "samples": 0}
    event = statistics.median(dt / r for dt, _, _, r in samples)
    wall = statistics.median((w - c) / r for _, w, c, r in samples)
    unexplained = statistics.median(w - c - dt for dt, w, c, _ in samples)
    per_sample = statistics.median(dt for dt, _, _, _ in samples)
    suspect = unexplained > max(ESCAPE_FLOOR_S, 0.5 * per_sample)
    return {"suspect": bool(suspect), "samples": len(samples), "event_s": event,
            "wall_s": wall, "unexplained_per_sample_s": unexplained}
