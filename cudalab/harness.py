"""The one timing harness every experiment uses (nvbench-style measurement loop).

warm-up -> timed chunks of samples -> stop when the coefficient of variation is below the
target (after `min_samples`), when the time budget is spent, or at `max_samples`.
Every sample is kept. Samples shorter than `min_sample_s` are taken as a batch of back-to-back
launches and the mean per launch is recorded (CUDA events resolve about 0.5 us).
Observers (telemetry) are called around every chunk so throttled samples can be flagged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class Settings:
    warmup: int = 3
    min_samples: int = 10
    max_samples: int = 200
    target_cv: float = 0.02
    budget_s: float = 0.5
    min_sample_s: float = 1e-4
    cold_l2: bool = False

    @classmethod
    def from_config(cls, block: dict[str, Any]) -> Settings:
        return cls(**{k: block[k] for k in cls.__dataclass_fields__ if k in block})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Timer(Protocol):
    """Times `reps` back-to-back calls of fn and returns the elapsed seconds."""

    name: str

    def time(self, fn: Callable[[], Any], reps: int) -> float: ...


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
    """All samples of one measured quantity, with their summary statistics."""

    samples_s: list[float]
    batch: int  # launches per sample (samples are per launch)
    timer: str
    stop_reason: str  # converged | budget | max_samples
    throttled: list[bool] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0  # host time the whole measurement took, warm-up included

    @property
    def n(self) -> int:
        return len(self.samples_s)

    def stats(self) -> dict[str, float]:
        return summarize(self.samples_s)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(self.stats())
        d["n"] = self.n
        d["n_throttled"] = int(sum(self.throttled))
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


class Harness:
    def __init__(
        self,
        settings: Settings,
        observers: Sequence[Observer] = (),
        flush_l2: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.observers = list(observers)
        self.flush_l2 = flush_l2

    def measure(
        self,
        fn: Callable[[], Any],
        timer: Timer,
        *,
        batchable: bool = True,
        settings: Settings | None = None,
        asynchronous: bool = False,  # fn only enqueues GPU work (the timing helper uses it)
    ) -> Timing:
        """Time fn() under the stop rule. `batchable=False` for work that must not be
        repeated back-to-back inside one sample (e.g. it allocates)."""
        s = settings or self.settings
        wall0 = time.perf_counter()
        cold = s.cold_l2 and self.flush_l2 is not None
        for _ in range(s.warmup):
            fn()
        batch = 1
        if batchable and not cold and s.min_sample_s > 0:
            batch = self._calibrate(fn, timer, s.min_sample_s)
        samples: list[float] = []
        throttled: list[bool] = []
        chunks: list[dict[str, Any]] = []
        t_start = time.perf_counter()
        # Chunks grow so short samples do not pay an NVML read each, long ones are checked often.
        chunk = max(1, min(s.min_samples, 10))
        stop = "max_samples"
        while len(samples) < s.max_samples:
            for o in self.observers:
                o.before_batch()
            t_chunk = time.time()
            new = []
            for _ in range(min(chunk, s.max_samples - len(samples))):
                if cold:
                    self.flush_l2()
                new.append(timer.time(fn, batch) / batch)
            info: dict[str, Any] = {"t": t_chunk, "t_end": time.time(), "n": len(new)}
            for o in self.observers:
                info.update(o.after_batch())
            chunks.append(info)
            samples += new
            throttled += [bool(info.get("throttled", False))] * len(new)
            if len(samples) >= s.min_samples:
                if summarize(samples)["cv"] <= s.target_cv:
                    stop = "converged"
                    break
                if time.perf_counter() - t_start >= s.budget_s:
                    stop = "budget"
                    break
            chunk = min(chunk * 2, 100)
        return Timing(
            samples_s=samples,
            batch=batch,
            timer=timer.name,
            stop_reason=stop,
            throttled=throttled,
            chunks=chunks,
            wall_s=time.perf_counter() - wall0,
        )

    @staticmethod
    def _calibrate(fn: Callable[[], Any], timer: Timer, min_sample_s: float) -> int:
        """Smallest power-of-two batch whose sample lasts at least min_sample_s."""
        batch = 1
        while batch < 4096:
            if timer.time(fn, batch) >= min_sample_s:
                break
            batch *= 2
        return batch
