"""Rules a JSON schema cannot express, checked in the same pass as the schema.

Cross-field rules (min_samples <= max_samples, each experiment's check_config, no grid
point twice), the installed toolkit (the nvcc to run, the architectures it can build) and
the size guards (point count against `max_points`, GPU memory of the largest point against
the GPU's). They run even when the schema found problems, on a best-effort basis: a rule
that trips over a malformed value (already reported by the schema) is skipped.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from cudalab import limits, safe_io
from cudalab.keys import key_path, show

if TYPE_CHECKING:
    from cudalab.experiments.base import Point

# A point may use this share of the GPU's memory: the CUDA context, pycuda's and cuBLAS'
# workspaces and the L2-flush buffer take the rest.
GPU_MEMORY_SHARE = 0.9
# Host-side overhead of one grid point beyond its timed samples (the reference run measured
# a median of 0.26 s): the run-time estimate is points x (budget_s + this).
POINT_OVERHEAD_S = 0.3
# A run without a GPU, on the project's 2-core machine, in seconds at no other load (runs at
# loads 3-6 divided by estimate.slowdown): each GPU job still starts (interpreter, imports,
# its grid marked not measured; the matmul job's CPU points run), then aggregate, figures
# and report. Default run from a clean export: cold (empty build cache) 76 s at load ~1
# (the compiles 43 s of it), warm 43 s; at loads 3-6, 129 s cold and 135 s warm.
NO_GPU_JOB_S = 1.4
REPORT_S = 28.0
# The plan warns about a run longer than this (and, limits.MANY_JOBS, about many jobs).
LONG_RUN_S = 4 * 3600
# Exceptions a rule may raise on a value the schema has already rejected.
_MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
              OverflowError, OSError)


def cross_field_problems(config: dict[str, Any], schema_failed: bool,
                         notes: list[str] | None = None) -> list[str]:
    notes = [] if notes is None else notes
    grids = _grids(config)  # expanded once: a long grid is the costly part of validation
    rules: list[Callable[[], list[str]]] = [
        lambda: _strings(config),
        lambda: _samples(config),
        lambda: _constraint(config),
        lambda: _profile(config),
        lambda: limits.cross_problems(config),
        lambda: _baselines(config),
        lambda: _experiment_rules(config, schema_failed, grids),
        lambda: _toolkit(config, notes),
        lambda: _sizes(config, notes, grids),
    ]
    msgs: list[str] = []
    for rule in rules:
        try:
            msgs += rule()
        except _MALFORMED:
            if not schema_failed:
                raise  # a valid config must never trip a rule: that is a bug
    return msgs


# -- strings: what can reach a shell line, an sbatch line, a path or a log ---------------------
# A control character in any value or key: a newline splits a shell command or an sbatch line
# (and a log line), NUL ends a C string early, ESC rewrites the terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
CONTROL_WORDS = "holds a control character (newline, tab, ...); allowed: one line of text"


def _strings(config: dict[str, Any]) -> list[str]:
    msgs: list[str] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(config, ())]
    while stack:  # iterative: the YAML reader bounds size and depth, --config adds little
        value, path = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and _CONTROL.search(k):
                    msgs.append(f"{key_path(path)}: the key {show(k)} {CONTROL_WORDS}")
                stack.append((v, (*path, k)))
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
        elif isinstance(value, str) and _CONTROL.search(value):
            msgs.append(f"{key_path(path)}: {show(value)} {CONTROL_WORDS}")
    return sorted(msgs)


def _constraint(config: dict[str, Any]) -> list[str]:
    """Slurm's feature expression: the schema checks its characters, this its brackets."""
    c = (config.get("slurm") or {}).get("constraint")
    if not isinstance(c, str):
        return []
    depth: list[str] = []
    for ch in c:
        if ch in "[(":
            depth.append(ch)
        elif ch in "])" and (not depth or depth.pop() != "[("["])".index(ch)]):
            depth = ["x"]
            break
    if depth:
        return [f"slurm.constraint: {c!r} has brackets that do not pair; allowed: node "
                f"features joined by & | , with [ ] and ( ) in pairs, e.g. [a100|h100]&nvlink"]
    return []


def _profile(config: dict[str, Any]) -> list[str]:
    """ncu's regex: metrics compile now (not after both ncu passes ran), and two ncu runs
    of up to timeout_s each fit a job's wall-clock limit."""
    prof = config.get("profile") or {}
    msgs = []
    for i, m in enumerate(prof.get("metrics") or []):
        if isinstance(m, str) and m.startswith("regex:"):
            try:
                re.compile(m[len("regex:"):])
            except re.error as exc:
                msgs.append(f"profile.metrics[{i}]: {m!r} is not a valid regular expression "
                            f"({exc}); allowed: regex:<expression>")
    runtime = (config.get("slurm") or {}).get("runtime_min")
    timeout = prof.get("timeout_s")
    if prof.get("ncu") is True and isinstance(runtime, int) and isinstance(timeout, int) \
            and 2 * timeout >= runtime * 60:
        msgs.append(f"profile.timeout_s: {timeout} s per ncu run, and a job makes two (time "
                    f"pass, counters pass): they do not fit slurm.runtime_min ({runtime} min), "
                    f"a job's wall-clock limit under Slurm; allowed: timeout_s < "
                    f"{runtime * 30} s, or raise slurm.runtime_min")
    return msgs


def _baselines(config: dict[str, Any]) -> list[str]:
    """Every report.baselines entry is a result folder (looked at, not read: the report
    reads it), each bad one named."""
    from pathlib import Path

    msgs = []
    for i, b in enumerate((config.get("report") or {}).get("baselines") or []):
        if not isinstance(b, str) or _CONTROL.search(b):
            continue  # the schema or _strings says so
        folder = Path(b)
        if why := safe_io.special_problem(folder):  # a name too long, a FIFO, a link loop
            msgs.append(f"report.baselines[{i}]: {why}")
            continue
        try:  # a name the system refuses (longer than 255 bytes) raises, not False
            if not folder.is_dir():
                what = "does not exist" if not folder.exists() else "is not a folder"
            elif not ((folder / "results.csv").is_file()
                      or any(folder.glob("raw/*/*.json"))):
                what = "holds no results (no results.csv, no raw/<experiment>/<point>.json)"
            else:
                continue
        except OSError as exc:
            what = f"cannot be looked at ({exc.strerror})"
        msgs.append(f"report.baselines[{i}]: {show(b, 200)} {what}; allowed: a run's results/ "
                    f"folder or reports/reference/<gpu>/ (relative to where snakemake runs)")
    return msgs


def _blocks(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Enabled experiment blocks that are mappings of a known experiment."""
    from cudalab.experiments import REGISTRY

    exps = config.get("experiments")
    if not isinstance(exps, dict):
        return {}
    return {n: b for n, b in exps.items()
            if n in REGISTRY and isinstance(b, dict) and b.get("enabled", True) is not False}


def _samples(config: dict[str, Any]) -> list[str]:
    m = config.get("measurement")
    if not isinstance(m, dict):
        return []
    lo, hi = m.get("min_samples"), m.get("max_samples")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        return [f"measurement.min_samples: {lo} is larger than max_samples ({hi}); "
                f"allowed: min_samples <= max_samples"]
    return []


def _grids(config: dict[str, Any]) -> dict[str, list[Point]]:
    """The grid of every enabled experiment whose block can be expanded (one malformed
    block, already reported by the schema, leaves the others' grids to check)."""
    from cudalab.experiments import REGISTRY

    grids = {}
    for name in _blocks(config):
        try:
            grids[name] = REGISTRY[name].grid(config)
        except _MALFORMED:
            continue
    return grids


def _experiment_rules(config: dict[str, Any], schema_failed: bool,
                      grids: dict[str, list[Point]]) -> list[str]:
    """Each experiment's check_config, then: no two grid points alike (e.g. matmul sizes
    256 and [256, 256, 256])."""
    from cudalab.experiments import REGISTRY

    msgs = []
    for name, block in _blocks(config).items():
        try:
            msgs += [f"experiments.{name}.{m}" for m in REGISTRY[name].check_config(block)]
        except _MALFORMED:
            if not schema_failed:
                raise
        if name in grids and not grids[name]:
            msgs.append(f"experiments.{name}: the grid has 0 points (no combination of its "
                        f"axes and variants gives a point), so nothing would run; add values "
                        f"to its lists, or set `enabled: false`")
        if len(grids.get(name, [])) > _max_points(config):
            continue  # refused for its size (_sizes): naming its repeats would be noise
        counts = Counter(p.point_id for p in grids.get(name, []))
        dups = sorted(i for i, c in counts.items() if c > 1)
        if dups:
            msgs.append(f"experiments.{name}: the grid has the same point more than once "
                        f"({', '.join(dups[:5])}); list each size/value once")
    return msgs


def _max_points(config: dict[str, Any]) -> int:
    limit = config.get("max_points", 5000)
    return limit if isinstance(limit, int) else 5000


# -- the toolkit ---------------------------------------------------------------------------
def _toolkit(config: dict[str, Any], notes: list[str]) -> list[str]:
    """Each enabled experiment's own check of the tools its jobs run (Experiment.toolchain:
    static analysis' nvcc and the architectures it can build)."""
    from cudalab.experiments import REGISTRY

    return [m for name, block in _blocks(config).items()
            for m in REGISTRY[name].toolchain(block, notes)]


# -- size guards -----------------------------------------------------------------------------
def _sizes(config: dict[str, Any], notes: list[str], grids: dict[str, list[Point]]
           ) -> list[str]:
    """Refuse a grid above max_points, and points that cannot fit the GPU's memory."""
    from cudalab.experiments import REGISTRY

    total = sum(len(g) for g in grids.values())
    limit = _max_points(config)
    msgs = []
    if isinstance(limit, int) and total > limit:
        per = ", ".join(f"{n} {len(g)}" for n, g in grids.items())
        msgs.append(f"experiments: the grid has {total} points ({per}), more than max_points "
                    f"({limit}); make the grid smaller, or raise max_points to run it")
    mem, source = gpu_memory(config)
    if mem is None and any(p.gpu for g in grids.values() for p in g):
        notes.append("GPU memory not checked: unknown here (set gpu_memory_gb, or run on the "
                     "GPU machine where nvidia-smi reports it)")
    if mem is None:
        return msgs
    room = GPU_MEMORY_SHARE * mem
    for name, pts in grids.items():
        too_big = [(REGISTRY[name].gpu_bytes(p), p) for p in pts if p.gpu]
        too_big = sorted((b, p.point_id) for b, p in too_big if b > room)
        if too_big:
            b, pid = too_big[-1]
            msgs.append(f"experiments.{name}: {len(too_big)} point(s) need more GPU memory "
                        f"than the GPU has, the largest {pid} needs {gb(b)}; allowed: up to "
                        f"{gb(room)} ({GPU_MEMORY_SHARE:.0%} of the {gb(mem)} from {source})")
    return msgs


def gpu_memory(config: dict[str, Any]) -> tuple[float | None, str]:
    """(bytes, where that came from) of the GPU the run uses; (None, "") if unknown."""
    given = config.get("gpu_memory_gb")
    if isinstance(given, (int, float)) and not isinstance(given, bool) and given > 0:
        return float(given) * 1e9, "gpu_memory_gb"
    smi = nvidia_smi_memory()
    return (smi, "nvidia-smi") if smi else (None, "")


@lru_cache(maxsize=1)
def nvidia_smi_memory() -> float | None:
    """Total memory in bytes of the smallest GPU nvidia-smi lists (None without one): with
    several GPUs the job may get any of them."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    mib = [float(x) for x in out.stdout.split() if x.replace(".", "", 1).isdigit()]
    return min(mib) * 2**20 if out.returncode == 0 and mib else None


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def point_seconds(config: dict[str, Any], experiment: Any) -> float:
    """About how long one point of `experiment` takes. A timed point samples until its
    budget runs out or, at the least, min_samples samples in its first trial and
    trial_min_samples in each later one, of the shortest sample (work that cannot be queued
    is batched up to min_sample_sync_s: the upper side is counted), plus warm-up and the
    host's set-up. An untimed point (a compile) costs what its experiment says."""
    if experiment.point_cost_s is not None:
        return float(experiment.point_cost_s)
    m = config["measurement"]
    shortest = max(m["min_sample_s"], m["min_sample_sync_s"])
    later = max(0, m.get("trials", 1) - 1)  # trials after the first
    samples = m["min_samples"] + later * min(m["min_samples"], m.get("trial_min_samples", 5))
    warmups = m["warmup"] + later * min(m["warmup"], m.get("trial_warmup", 1))
    sampling = max(m["budget_s"], samples * shortest)
    return sampling + warmups * shortest + POINT_OVERHEAD_S


def job_seconds(config: dict[str, Any], grids: dict[str, list[Point]]
                ) -> tuple[dict[str, float], dict[str, float]]:
    """Each job's expected seconds: (timed jobs by points x point_seconds, jobs that
    estimate themselves, e.g. static analysis from the build times measured here)."""
    from cudalab.experiments import REGISTRY

    timed, own = {}, {}
    for n, g in grids.items():
        s = REGISTRY[n].estimate_seconds(config, g)
        if s is None:
            timed[n] = len(g) * point_seconds(config, REGISTRY[n])
        else:
            own[n] = s
    return timed, own


def visible_gpu() -> bool:
    from cudalab.experiments.static_analysis.archs import visible_gpu_archs

    return bool(visible_gpu_archs())


def load_note(load: float, cores: int) -> str:
    """Where the machine is busier than its cores, that the estimate counts it."""
    if load <= cores:
        return ""
    return f"; counts the load now, {load:.1f} on {cores} cores"


def no_gpu_line(config: dict[str, Any], grids: dict[str, list[Point]],
                timed: dict[str, float]) -> str:
    """The plan's time for this run here, without a GPU: the GPU jobs only start (they run
    beside the compiles), then aggregate, figures and report; all of it scaled by the load."""
    from cudalab.experiments import REGISTRY
    from cudalab.experiments.static_analysis import builds, estimate

    idle = [s for n, g in grids.items() if n not in timed
            and (s := REGISTRY[n].estimate_seconds(config, g, load=0.0)) is not None]
    gpu_jobs = sum(1 for n in timed if any(p.gpu for p in grids[n]))
    load, cores = estimate.load_now(), builds.workers()
    here = ((max([*idle, NO_GPU_JOB_S * gpu_jobs]) + REPORT_S)
            * estimate.slowdown(load, 1, cores))
    return (f"  here, without a GPU: about {_duration(here)} (the GPU points are not "
            f"measured; the compiles run beside them){load_note(load, cores)}")


def plan_estimate(config: dict[str, Any]) -> list[str]:
    """The plan's size lines: points, a run-time estimate, the largest point's GPU memory,
    warnings for a run of many hours or many sbatch jobs, and each experiment's own warnings
    (e.g. a long CPU reference)."""
    from cudalab import sweep
    from cudalab.experiments import REGISTRY

    grids = {n: REGISTRY[n].grid(config) for n in _blocks(config)}
    pts = [(n, p) for n, g in grids.items() for p in g]
    timed, own = job_seconds(config, grids)
    seconds = sum(timed.values()) + sum(own.values())
    m = config["measurement"]
    lines = [f"  size: {len(pts)} grid points (max_points {config['max_points']}); "
             f"run time about {_duration(seconds)} (a timed point: the larger of budget_s "
             f"{m['budget_s']} s and min_samples {m['min_samples']} x the shortest sample, "
             f"plus {POINT_OVERHEAD_S} s"
             + "".join(f"; {n} about {_duration(s)} from this machine's build times"
                       for n, s in own.items()) + ")"]
    if not visible_gpu():
        lines.append(no_gpu_line(config, grids, timed))
    need = [(REGISTRY[n].gpu_bytes(p), n, p.point_id) for n, p in pts if p.gpu]
    b, name, pid = max(need, default=(0, "", ""))
    mem, source = gpu_memory(config)
    have = f"; the GPU has {gb(mem)} ({source})" if mem else "; GPU memory unknown here"
    lines.append(f"  largest GPU point: {name} {pid} needs about {gb(b)}{have}" if b else
                 "  GPU memory of the points: not declared")
    if seconds > LONG_RUN_S:
        lines.append(f"  warning: this run takes about {_duration(seconds)} "
                     f"({len(pts)} points); check measurement.min_samples, "
                     f"min_sample_sync_s and budget_s, and the grids")
    n = sweep.job_counts(config, list(grids), 0)  # the same count as the plan's first line
    if n.total > limits.MANY_JOBS:
        lines.append(f"  warning: under Slurm this run submits {n.total} sbatch jobs "
                     f"({len(grids)} experiments x {n.models} GPU models, and "
                     f"{n.doctors} doctor job(s)); a site may limit jobs per user")
    for n in grids:
        lines += [f"  warning: experiments.{n}: {w}"
                  for w in REGISTRY[n].plan_warnings(config["experiments"][n])]
    return lines + [f"  warning: {w}" for w in limits.warnings(config)]


def _duration(s: float) -> str:
    if s < 120:
        return f"{math.ceil(s)} s"
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"
