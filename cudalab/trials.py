"""Trials: a point measured several times in one job, its device buffers moved in between.

The samples of one measurement agree with each other far better than two processes agree:
where a point's buffers land (DRAM pages, L2 slices) is fixed for one allocation and moves
with the next, and the host's state moves too. So the runner measures each timed point in
`measurement.trials` trials (default 3), with the time budget and the sample cap shared out
between them. The first trial is the whole measure() call. Before each later one every
device allocation in the job's cache moves to a fresh one (allocate, copy device to device,
then free the old one when the point is done, so no trial reuses an address), and an
experiment's own allocations are retired, not freed, until the point is done. A later trial
keeps the host inputs and CPU references, runs the verification launch and copy again, takes
the first trial's Check (same kernel, same inputs, copied contents) and warms up and samples
again, with less of both (trial_warmup, trial_min_samples): its median only has to show how
far the trials differ. A point whose first trial was timed by a host timer (compare's host
classes, which never gate) stops after host_trials trials. The point's result is the median
trial's (its numbers stay consistent with its own samples), with what only the first trial
measured (matmul's end-to-end split); the record keeps every trial's median and their
spread, which `cudalab compare` takes as the between-run noise of the point.

Each GPU job also measures its resolution floor once (measure_floor): the trial-to-trial
spread of an empty and of a tiny kernel under the same harness, in seconds, the smallest
difference between two trials this device and harness can tell from noise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from cudalab import compare
from cudalab.experiments.base import Result
from cudalab.experiments.job_cache import JobCache
from cudalab.gpu_errors import gpu_error_kind
from cudalab.harness import Harness, Settings, Trial
from cudalab.kernel_sources import FLOOR_SOURCE

FLOOR_TINY_N = 256  # elements the tiny kernel updates: one block, one cache line per warp
FLOOR_MIN_TRIALS = 3


def trial_settings(s: Settings, later: bool = False) -> Settings:
    """One trial's share: the budget and the sample cap split, the minimum kept (a trial is
    a measurement of its own). A `later` trial (after a point's first) warms up
    trial_warmup times and needs trial_min_samples (each at most the first trial's)."""
    n = max(1, s.trials)
    out = replace(s, budget_s=s.budget_s / n,
                  max_samples=max(s.min_samples, math.ceil(s.max_samples / n)))
    if later:
        out = replace(out, warmup=min(s.warmup, s.trial_warmup),
                      min_samples=min(s.min_samples, s.trial_min_samples))
    return out


def trials_after_first(first: Result, s: Settings) -> int:
    """How many trials a point takes, seen its first: host_trials where a host timer timed
    it (its class never gates, so only its spread is wanted), else trials."""
    timer = first.timing.timer if first.timing is not None else ""
    if compare.CLASS_OF_METHOD.get(timer) in compare.HOST_CLASSES:
        return max(1, min(s.trials, s.host_trials))
    return s.trials


def measure_trials(measure: Callable[[], Result], harness: Harness,
                   cache: JobCache | None = None, cuda: Any = None
                   ) -> tuple[Result, list[dict[str, Any]]]:
    """The median trial's result and every trial's summary. `cache` and `cuda` (the pycuda
    driver; None for a CPU point): the device buffers moved before each later trial. An
    untimed result (a compile), a wrong answer or a trial without samples ends the trials:
    it is the point's result."""
    whole = harness.settings
    n = max(1, whole.trials)
    state = Trial()
    harness.trial = state if n > 1 else None
    if cache is not None:
        cache.holding = n > 1
    done: list[Result] = []
    info: list[dict[str, Any]] = []
    try:
        i = 0
        while i < n:
            t0 = time.perf_counter()
            moved = kept = 0
            if i and cache is not None and cuda is not None:
                moved, kept = cache.replace_device(cuda)
            harness.settings = trial_settings(whole, later=i > 0) if n > 1 else whole
            state.begin(i)
            r = _one_trial(measure, i, cache)
            done.append(r)
            info.append({"trial_s": time.perf_counter() - t0, "moved": moved,
                         "kept_in_place": kept, "checks_reused": state.reused})
            if r.timing is None or not r.timing.samples_s or (r.check and not r.check.passed):
                return r, summaries(done, info)
            if i == 0:
                n = trials_after_first(r, whole) if n > 1 else n
            i += 1
    finally:
        harness.settings = whole
        harness.trial = None
        if cache is not None:
            cache.holding = False
            cache.release_retired()
    order = sorted(range(len(done)), key=lambda i: done[i].timing.stats()["median"])
    return with_first_trial(done[order[len(order) // 2]], done[0]), summaries(done, info)


def with_first_trial(chosen: Result, first: Result) -> Result:
    """The chosen trial's result with what only the first trial measured: its phases where
    the chosen has none, and the metrics the chosen lacks (matmul's end-to-end split is
    measured once, Harness.later_trial)."""
    if chosen is first:
        return chosen
    return replace(chosen, phases=chosen.phases or first.phases,
                   metrics=first.metrics | chosen.metrics)


def _one_trial(measure: Callable[[], Result], number: int, cache: JobCache | None) -> Result:
    """measure(); a later trial that ran out of GPU memory (earlier trials' allocations are
    still held, so none is reused) frees them and runs once more."""
    try:
        return measure()
    except Exception as exc:
        if number == 0 or cache is None or gpu_error_kind(exc) != "out of GPU memory":
            raise
    cache.release_retired()
    return measure()


def summaries(done: list[Result], info: list[dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(done):
        if r.timing is None:
            continue
        st = r.timing.stats()
        out.append({"median": st["median"], "n": r.timing.n, "cv": st["cv"],
                    "stop_reason": r.timing.stop_reason, "wall_s": r.timing.wall_s,
                    **(info[i] if info and i < len(info) else {})})
    return out


def spread(trials: list[dict[str, Any]]) -> float:
    """The trials' relative spread: (largest - smallest median) / their median; NaN with
    fewer than two trials."""
    meds = sorted(t["median"] for t in trials if t.get("median", 0) > 0)
    if len(meds) < 2:
        return math.nan
    return (meds[-1] - meds[0]) / meds[len(meds) // 2]


# -- the job's resolution floor ---------------------------------------------------------------
def measure_floor(gpu: Any, harness: Harness) -> dict[str, Any]:
    """The trial-to-trial spread, in seconds, of an empty kernel and of a tiny one (256
    floats updated in place, its buffer moved between trials as the points' are), each timed
    in max(trials, 3) trials with the points' harness and share of it. floor_s is the larger
    spread. Raises where the kernels cannot compile or run (the caller records why)."""
    whole = harness.settings
    n = max(whole.trials, FLOOR_MIN_TRIALS)
    per = trial_settings(replace(whole, trials=n))
    cuda = gpu.cuda
    kernel = gpu.compile(FLOOR_SOURCE)
    empty, tiny = kernel.function("floor_empty"), kernel.function("floor_tiny")
    empty.prepare("i")
    tiny.prepare("Pi")
    buf = cuda.mem_alloc(4 * FLOOR_TINY_N)
    held = [buf]  # every trial's buffer lives until the end: no trial reuses an address
    cuda.memset_d32(buf, 0, FLOOR_TINY_N)
    meds: dict[str, list[float]] = {"empty": [], "tiny": []}
    timer_name = ""
    try:
        for i in range(n):
            if i:
                new = cuda.mem_alloc(4 * FLOOR_TINY_N)
                cuda.memcpy_dtod(new, buf, 4 * FLOOR_TINY_N)
                buf = new
                held.append(buf)
            launches = {"empty": lambda: empty.prepared_call((1, 1), (1, 1, 1), 0),
                        "tiny": _tiny_launch(tiny, buf)}
            for name, fn in launches.items():
                t = harness.measure(fn, gpu.event_timer(), asynchronous=True, settings=per)
                meds[name].append(t.stats()["median"])
                timer_name = t.timer
    finally:
        for a in held:
            a.free()
    return floor_summary(meds, timer_name)


def _tiny_launch(func: Any, buf: Any) -> Callable[[], None]:
    return lambda: func.prepared_call((1, 1), (FLOOR_TINY_N, 1, 1), buf, FLOOR_TINY_N)


def floor_summary(meds: dict[str, list[float]], timer: str) -> dict[str, Any]:
    """floor_s and, per kernel, the median of its trial medians and their range (seconds)."""
    out: dict[str, Any] = {"trials": len(meds["empty"]), "timer": timer}
    for name, m in meds.items():
        a = np.asarray(m, dtype=float)
        out[f"{name}_s"] = float(np.median(a)) if a.size else math.nan
        out[f"{name}_spread_s"] = float(a.max() - a.min()) if a.size > 1 else math.nan
    spreads = [out["empty_spread_s"], out["tiny_spread_s"]]
    out["floor_s"] = max(spreads) if all(math.isfinite(x) for x in spreads) else math.nan
    return out


def not_measured_floor(why: str) -> dict[str, Any]:
    return {"floor_s": math.nan, "note": why}
