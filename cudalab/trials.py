"""Trials: a point measured several times in one job, each time from scratch.

Opt-in (measurement.trials, default 1): each trial redoes the whole measure() call, inputs
and check included, which tripled the time of experiments with large inputs on an H100.

The samples of one measurement agree with each other far better than two processes agree:
where a point's buffers land (DRAM pages, L2 slices) is fixed for one allocation and moves
with the next, and the host's state moves too. So the runner measures each timed point in
`measurement.trials` trials, each a whole measure() call (the experiment allocates its
buffers again, checks the output again, warms up and samples again), with the time budget
and the sample cap shared out between them. The point's result is the median trial's (its
numbers stay consistent with its own samples); the record keeps every trial's median and
their spread, which `cudalab compare` takes as the between-run noise of the point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cudalab.experiments.base import Result
from cudalab.harness import Harness, Settings


def trial_settings(s: Settings) -> Settings:
    """One trial's share: the budget and the sample cap split, the minimum kept (a trial is
    a measurement of its own)."""
    n = max(1, s.trials)
    return replace(s, budget_s=s.budget_s / n,
                   max_samples=max(s.min_samples, math.ceil(s.max_samples / n)))


def measure_trials(measure: Callable[[], Result], harness: Harness
                   ) -> tuple[Result, list[dict[str, Any]]]:
    """The median trial's result and every trial's summary. An untimed result (a compile),
    a wrong answer or a trial without samples ends the trials: it is the point's result."""
    whole = harness.settings
    harness.settings = trial_settings(whole) if whole.trials > 1 else whole
    done: list[Result] = []
    try:
        for _ in range(max(1, whole.trials)):
            r = measure()
            done.append(r)
            if r.timing is None or not r.timing.samples_s or (r.check and not r.check.passed):
                return r, summaries(done)
    finally:
        harness.settings = whole
    order = sorted(range(len(done)), key=lambda i: done[i].timing.stats()["median"])
    return done[order[len(order) // 2]], summaries(done)


def summaries(done: list[Result]) -> list[dict[str, Any]]:
    out = []
    for r in done:
        if r.timing is None:
            continue
        st = r.timing.stats()
        out.append({"median": st["median"], "n": r.timing.n, "cv": st["cv"],
                    "stop_reason": r.timing.stop_reason, "wall_s": r.timing.wall_s})
    return out


def spread(trials: list[dict[str, Any]]) -> float:
    """The trials' relative spread: (largest - smallest median) / their median; NaN with
    fewer than two trials."""
    meds = sorted(t["median"] for t in trials if t.get("median", 0) > 0)
    if len(meds) < 2:
        return math.nan
    return (meds[-1] - meds[0]) / meds[len(meds) // 2]
