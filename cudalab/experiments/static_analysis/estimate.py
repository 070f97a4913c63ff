"""How long the static-analysis job takes, from this machine's own build times.

The job's builds run on every core, longest first (builds.Builder), so its time is the
makespan of that schedule: each build the cache already holds costs HIT_S, every other one
the CPU time its last build of the same (file, flags, arch) took here (the cache's entries
keep it), else the mean of that file's recorded builds, else DEFAULT_BUILD_S. Each point then
costs POINT_S (the occupancy curve and its record), and the job JOB_START_S to start. CPU
times do not depend on how busy the machine was when they were measured; the machine's load
now is counted once, by slowdown(): a job's threads share the cores with everything else
that wants one.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cudalab import build_cache
from cudalab.experiments.static_analysis.builds import (
    DEFAULT_BUILD_S,
    HIT_S,
    Builder,
    Need,
    workers,
)
from cudalab.resources import CUDA_DIR

# Measured on the project's 2-core machine (a default job: 140 points).
POINT_S = 0.01  # one point's occupancy curve and fsynced record, beyond its build
JOB_START_S = 3.0  # the job's interpreter, imports and grid


def needs(points: Iterable[Any]) -> list[Need]:
    """The distinct builds of a grid, in grid order."""
    return list(dict.fromkeys((p.params["file"], p.params["flags"], p.params["arch"])
                              for p in points))


def build_seconds(todo: list[Need], nvcc: str | None, cache_on: bool,
                  cuda_dir: Path = CUDA_DIR) -> list[float]:
    """Each build's expected seconds on this machine (see the module's docstring)."""
    cache = build_cache.BuildCache(build_cache.root(cache_on))
    if nvcc is None:  # every point fails at once naming the missing nvcc
        return [0.0 for _ in todo]
    builder = Builder(nvcc, 0, cache, cuda_dir)
    known = cache.measured_seconds()
    per_file: dict[str, list[float]] = {}
    for (file, _, _), s in known.items():
        per_file.setdefault(file, []).append(s)
    out = []
    for need in todo:
        try:
            hit = cache.get(builder.key(need)) is not None
        except OSError:  # the file is gone: its points will say so, at once
            hit = False
        if hit:
            out.append(HIT_S)
        elif need in known:
            out.append(known[need])
        elif need[0] in per_file:
            out.append(sum(per_file[need[0]]) / len(per_file[need[0]]))
        else:
            out.append(DEFAULT_BUILD_S)
    return out


def makespan(seconds: list[float], n_workers: int) -> float:
    """Wall time of running these jobs on n_workers, longest first, each on the worker that
    frees first (how Builder.prefetch schedules them)."""
    free = [0.0] * max(1, n_workers)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + s)
    return max(free)


LOAD_ENV = "CUDALAB_PLAN_LOAD"  # a number: the load the plan assumes (tests pin it to 0)


def load_now() -> float:
    """The machine's 1-minute load average (0 where the system has none), or the number in
    $CUDALAB_PLAN_LOAD: two plans of one config then print the same times."""
    pinned = os.environ.get(LOAD_ENV, "").strip()
    try:
        return max(0.0, float(pinned)) if pinned else os.getloadavg()[0]
    except (AttributeError, OSError, ValueError):
        return 0.0


def slowdown(load: float, busy: int, cores: int) -> float:
    """How much longer CPU work takes when `busy` threads of ours join `load` runnable
    others on `cores` cores: each gets cores / (load + busy) of a core once they outnumber
    the cores."""
    return max(1.0, (load + busy) / max(1, cores))


def job_seconds(points: list[Any], nvcc: str | None, cache_on: bool = True,
                n_workers: int | None = None, load: float | None = None) -> float:
    """The static-analysis job's expected wall time at the given load (None: the load now)."""
    w = n_workers or workers()
    todo = needs(points)
    cpu = build_seconds(todo, nvcc, cache_on)
    busy = min(w, sum(1 for s in cpu if s > HIT_S)) or 1
    scale = slowdown(load_now() if load is None else load, busy, w)
    return (JOB_START_S + makespan(cpu, w) + POINT_S * len(points)) * scale
