"""The one timing harness every experiment uses (nvbench-style measurement loop).

warm-up -> timed chunks of samples -> stop when the coefficient of variation of the clean
samples is below the target (after `min_samples` clean ones), when the time budget is spent,
or at `max_samples`. Every sample is kept; samples of a chunk an observer flagged as
throttled are left out of the statistics (nvbench's rule) and counted.

Samples shorter than `min_sample_s` are taken as a batch of launches and the mean per launch
is recorded (CUDA documents events as resolving about 0.5 us; on an H100 their timestamps
step by 32 ns, and the batch averages the GPU's launch-to-launch jitter); work timed one call
after the other (not queued) is batched up to `min_sample_sync_s`, so the host's jitter
averages out.
For an `asynchronous` fn (it only enqueues GPU work) the harness times the batch with the
launches already queued behind a held stream (gpu.QueuedEventTimer), so the host's launch
cost (~12 us per pycuda launch) stays out of the kernel time; where that cannot be done it
says why in the timing's `method_note`.

Profile mode (a `Profiler` given to the Harness: cudalab.profiler's child under Nsight
Compute) takes no timing at all: measure() runs fn `warmup` times, then `profiler.runs`
times inside the profiler's range, and returns a one-sample Timing whose timer is PROFILE_TIMER. The
parent job's timings are never taken under the profiler.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

# Largest batch of one sample: a queued batch must stay well below the driver's limit of
# pending launches (~1000), else the launch call blocks behind the held stream.
MAX_BATCH = 4096
QUEUED_MAX_BATCH = 256
# The timer name of a profile-mode Timing: one run under a profiler, not a measurement.
PROFILE_TIMER = "profile_run"


@dataclass(frozen=True)
class Settings:
    warmup: int = 3
    min_samples: int = 10
    max_samples: int = 200
    target_cv: float = 0.02
    budget_s: float = 0.5
    min_sample_s: float = 1e-4
    # Shortest sample of work timed one call after the other (not queued): the host's jitter
    # (a pageable copy's staging, a CPU matmul, a launch) is in every call, and a longer
    # batch averages it. Seen on an H100: pageable copies' run-to-run agreement within 5 %
    # went from 4 to 14 of 20 points, their median sample CV from 10.7 % to 2.9 %.
    min_sample_sync_s: float = 2e-3
    cold_l2: bool = False
    # Measurements of each point, its device buffers moved to fresh allocations between
    # them (cudalab.trials: the runner's loop).
    trials: int = 3
    # A trial after a point's first needs only a median stable enough to show how far the
    # trials' medians differ: fewer samples, and one warm-up (the verification launch on
    # the moved buffers ran just before). Each trial still has 1/trials of budget_s.
    trial_min_samples: int = 5
    trial_warmup: int = 1
    # Trials of a point whose timer makes it host-bound (compare's host classes, which
    # never gate): 2, the fewest that give its spread.
    host_trials: int = 2

    @classmethod
    def from_config(cls, block: dict[str, Any]) -> Settings:
        return cls(**{k: block[k] for k in cls.__dataclass_fields__ if k in block})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Timer(Protocol):
    """Times `reps` calls of fn and returns the elapsed seconds. A timer may also offer
    `max_batch` (largest reps per call) and `queued()` -> (timer or None, why not): the
    variant that keeps host launch cost out, used for asynchronous fns."""

    name: str

    def time(self, fn: Callable[[], Any], reps: int) -> float: ...


class Profiler(Protocol):
    """Brackets the profiled runs of fn in profile mode. begin() opens the profiler's range
    and returns whether this measure() is profiled (only a point's first is: later ones,
    such as a copy phase, would mix other work into its counters); fn then runs `runs`
    times, with mark() before every run after the first; end() closes the range, and is
    called only when begin() returned True."""

    runs: int

    def begin(self) -> bool: ...

    def mark(self) -> None: ...

    def end(self) -> None: ...


class HoldTimeout(RuntimeError):
    """A queued sample was not released in time (the host blocked): the sample is void."""


class WallTimer:
    """Host clock, for CPU work (and anything synchronous)."""

    name = "perf_counter"

    def time(self, fn: Callable[[], Any], reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return time.perf_counter() - t0


class Observer(Protocol):
    """Per-chunk hooks (Kernel Tuner's observer idea). after_batch returns what it saw,
    with a boolean 'throttled' if the samples of that chunk should be flagged."""

    def before_batch(self) -> None: ...

    def after_batch(self) -> dict[str, Any]: ...


@dataclass
class Timing:
    """All samples of one measured quantity, with their summary statistics (of the clean,
    i.e. not throttled, samples)."""

    samples_s: list[float]
    batch: int  # launches per sample (samples are per launch)
    timer: str  # the method: cuda_event_queued | cuda_event | perf_counter | ...
    stop_reason: str  # converged | budget | max_samples
    throttled: list[bool] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0  # host time the whole measurement took, warm-up included
    settings: dict[str, Any] = field(default_factory=dict)  # the harness settings used
    method_note: str = ""  # why the method is not the one asked for (fallback), if so
    min_samples: int = 0  # clean samples a trustworthy statistic needs

    @property
    def n(self) -> int:
        return len(self.samples_s)

    @property
    def clean(self) -> list[float]:
        flags = self.throttled or [False] * self.n
        return [x for x, th in zip(self.samples_s, flags, strict=True) if not th]

    @property
    def note(self) -> str:
        """Why the statistics need care ('' when they do not)."""
        parts = [self.method_note] if self.method_note else []
        n_clean = len(self.clean)
        if n_clean == 0 and self.n:
            parts.append(f"all {self.n} samples throttled: statistics from throttled samples")
        elif n_clean < self.min_samples:
            parts.append(f"too few clean samples: {n_clean} < min_samples {self.min_samples}")
        return "; ".join(parts)

    def stats(self) -> dict[str, float]:
        return summarize(self.clean or self.samples_s)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(self.stats())
        d["n"] = self.n
        d["n_clean"] = len(self.clean)
        d["n_throttled"] = int(sum(self.throttled))
        d["timing_note"] = self.note
        d["harness"] = {**self.settings, "method": self.timer}
        del d["settings"]
        return d


def summarize(samples: Sequence[float]) -> dict[str, float]:
    a = np.asarray(samples, dtype=float)
    if a.size == 0:
        nan = math.nan
        return {"median": nan, "iqr": nan, "cv": nan, "min": nan, "mean": nan, "std": nan}
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    mean = float(a.mean())
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return {
        "median": float(med),
        "iqr": float(q3 - q1),
        "cv": std / mean if mean > 0 else math.nan,
        "min": float(a.min()),
        "mean": mean,
        "std": std,
    }


def choose_timer(timer: Timer, asynchronous: bool) -> tuple[Timer, str]:
    """The timer an fn is measured with, and why it is not the queued one (if so)."""
    if not asynchronous:
        return timer, ""
    queued = getattr(timer, "queued", None)
    if queued is None:
        return timer, f"{timer.name} timer has no queued variant"
    q, why = queued()
    return (q, "") if q is not None else (timer, f"queued timing unavailable: {why}")


@dataclass
class Trial:
    """Which trial of a point is running (cudalab.trials) and the first trial's checks.

    A later trial runs the same kernel on the same inputs, the device buffers' contents
    copied to fresh allocations: its output is the first trial's, so the first trial's
    Check stands for it and the check itself (a float64 comparison of up to 2^26 elements)
    is not redone. Checks are matched by their order in the trial and by `key` (the check
    function's code and the output's shape): a trial that calls them in another order
    checks again."""

    number: int = 0  # 0: the first trial, whose checks run and are kept
    checks: list[tuple[Any, Any]] = field(default_factory=list)
    reused: int = 0  # checks this trial took from the first
    _call: int = 0

    def begin(self, number: int) -> None:
        self.number, self._call, self.reused = number, 0, 0

    def check(self, key: Any, run: Callable[[], Any]) -> Any:
        """run()'s Check on the first trial (kept); the kept one on later trials."""
        i, self._call = self._call, self._call + 1
        if self.number > 0 and i < len(self.checks) and self.checks[i][0] == key:
            self.reused += 1
            return self.checks[i][1]
        result = run()
        if self.number == 0:
            self.checks.append((key, result))
        return result


class Harness:
    def __init__(
        self,
        settings: Settings,
        observers: Sequence[Observer] = (),
        flush_l2: Callable[[], None] | None = None,
        profiler: Profiler | None = None,
    ) -> None:
        self.settings = settings
        self.observers = list(observers)
        self.flush_l2 = flush_l2
        self.profiler = profiler
        self.trial: Trial | None = None  # set by cudalab.trials while a point has trials

    @property
    def later_trial(self) -> bool:
        """Whether a trial after a point's first is running: what a point measures once
        (matmul's end-to-end split) is measured in its first trial only."""
        return self.trial is not None and self.trial.number > 0

    def measure(
        self,
        fn: Callable[[], Any],
        timer: Timer,
        *,
        batchable: bool = True,
        settings: Settings | None = None,
        asynchronous: bool = False,
    ) -> Timing:
        """Time fn() under the stop rule. `batchable=False` for work that must not be
        repeated back-to-back inside one sample (e.g. it allocates). `asynchronous=True`
        declares that fn only enqueues GPU work on the default stream (launches through
        prepared_call, async copies; no host sync, no allocation, no pageable copy): it is
        then timed with its launches queued ahead (see gpu.QueuedEventTimer)."""
        s = settings or self.settings
        if self.profiler is not None:
            return self._profile_run(fn, timer, s, self.profiler)
        wall0 = time.perf_counter()
        chosen, note = choose_timer(timer, asynchronous)
        try:
            t = self._measure_with(fn, chosen, batchable, s, queued=chosen is not timer)
        except HoldTimeout as exc:
            # the void sample is discarded with its measurement: methods are never mixed
            t = self._measure_with(fn, timer, batchable, s, queued=False)
            note = f"queued timing fell back to {timer.name}: {exc}"
        t.method_note = note
        t.wall_s = time.perf_counter() - wall0
        return t

    @staticmethod
    def _profile_run(fn: Callable[[], Any], timer: Timer, s: Settings,
                     profiler: Profiler) -> Timing:
        """Profile mode: fn as warm-up, as often as the timings warm up (module load,
        first-touch, library handles, the L2's content stay outside the profiled range),
        then profiler.runs times inside it, through the point's own timer (its stream and
        synchronisation). The sample is no timing and is discarded."""
        wall0 = time.perf_counter()
        for _ in range(max(1, s.warmup)):
            fn()
        profiled = profiler.begin()
        try:
            dt = timer.time(fn, 1)
            for _ in range(profiler.runs - 1 if profiled else 0):
                profiler.mark()
                timer.time(fn, 1)
        finally:
            if profiled:
                profiler.end()
        return Timing(samples_s=[dt], batch=1, timer=PROFILE_TIMER, stop_reason="profiled",
                      settings=s.as_dict(), min_samples=1,
                      wall_s=time.perf_counter() - wall0,
                      method_note="profile mode: one run under the profiler, not a timing")

    def _measure_with(self, fn: Callable[[], Any], timer: Timer, batchable: bool,
                      s: Settings, queued: bool) -> Timing:
        cold = s.cold_l2 and self.flush_l2 is not None
        for _ in range(s.warmup):
            fn()
        batch = 1
        if batchable and not cold and s.min_sample_s > 0:
            shortest = s.min_sample_s if queued else max(s.min_sample_s, s.min_sample_sync_s)
            batch = self._calibrate(fn, timer, shortest)
        t = Timing(samples_s=[], batch=batch, timer=timer.name, stop_reason="max_samples",
                   settings=s.as_dict(), min_samples=s.min_samples)
        t_start = time.perf_counter()
        # Chunks grow so short samples do not pay an NVML read each, long ones are checked often.
        chunk = max(1, min(s.min_samples, 10))
        while t.n < s.max_samples:
            self._chunk(fn, timer, t, min(chunk, s.max_samples - t.n), cold)
            stop = stop_rule(t, s, time.perf_counter() - t_start)
            if stop:
                t.stop_reason = stop
                break
            chunk = min(chunk * 2, 100)
        return t

    def _chunk(self, fn: Callable[[], Any], timer: Timer, t: Timing, n: int,
               cold: bool) -> None:
        """n samples between the observers' reads; appended to t with their throttle flag."""
        for o in self.observers:
            o.before_batch()
        t_chunk = time.time()
        new = []
        for _ in range(n):
            if cold:
                self.flush_l2()
            new.append(timer.time(fn, t.batch) / t.batch)
        info: dict[str, Any] = {"t": t_chunk, "t_end": time.time(), "n": len(new)}
        for o in self.observers:
            info.update(o.after_batch())
        t.chunks.append(info)
        t.samples_s += new
        t.throttled += [bool(info.get("throttled", False))] * len(new)

    @staticmethod
    def _calibrate(fn: Callable[[], Any], timer: Timer, min_sample_s: float) -> int:
        """Smallest power-of-two batch whose sample lasts at least min_sample_s (timed with
        the same timer, hence the same method, as the samples)."""
        limit = int(getattr(timer, "max_batch", MAX_BATCH))
        batch = 1
        while batch < limit:
            if timer.time(fn, batch) >= min_sample_s:
                break
            batch *= 2
        return min(batch, limit)


def stop_rule(t: Timing, s: Settings, elapsed_s: float) -> str:
    """'' to go on, else why to stop: the clean samples' CV is at most target_cv (with at
    least min_samples clean), or the budget is spent (with at least min_samples in all)."""
    clean = t.clean
    if len(clean) >= s.min_samples and summarize(clean)["cv"] <= s.target_cv:
        return "converged"
    if t.n >= s.min_samples and elapsed_s >= s.budget_s:
        return "budget"
    return ""
