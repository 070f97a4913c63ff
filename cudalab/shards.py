"""One lesson's grid over several GPUs: its points split into shards, one measure job each.

A local run with several GPUs runs one measure job per lesson at once, one per GPU; the
longest lesson then bounds the wall time (on 4 H200s, matmul's job took 79 s of the
101 s in which lessons were measured, and two GPUs sat idle three quarters of it).
Where the config's `max_shards` is above 1 (the default is 8; 1 keeps one job per lesson)
and the run's GPUs are all one model, a lesson with GPU
points and a grid of at least 2 × MIN_POINTS_PER_SHARD points is split into k shards,
k = min(GPUs, the config's `max_shards`, points // MIN_POINTS_PER_SHARD).
Each shard is a measure job of its own (`cudalab measure E --shard i/k`): it locks its own
GPU, measures its GPU's ceilings and resolution floor for its own records, walks its points
and writes raw/<E>/_shard-<i>of<k>.json. `cudalab merge-shards` then writes the lesson's
_manifest.json from them, so the table, the report and compare see one lesson, and every
record names the GPU that measured it.

The split is deterministic (it reads the grid alone, never what is on disk, so a resumed
run has the same shards): the points sorted by an estimate of their work (the product of
their numeric parameters, largest first) are dealt out in snake order (1..k, k..1, ...), so
every shard gets as many points (± 1) and as many large ones as small ones.

The shards of a lesson need mostly the same kernels: each build is done once, under a lock
of its key (build_lock), and each shard starts its walk at its own place (walk_order), so
they build different kernels at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cudalab.experiments.base import Point
from cudalab.gpu_slots import lock_dir

# fewer points than this a shard: its set-up (a process, a CUDA context, the ceilings and
# the floor: 2-3 s) weighs too much against what it measures (on an H200 the default grid's
# points take 0.1-1 s each)
MIN_POINTS_PER_SHARD = 16
MANIFEST = "_manifest.json"  # the lesson's manifest (the measure rule's output)
BUILD_LOCKS = 64  # lock files the shards' kernel builds are striped over
_TAG = re.compile(r"([1-9][0-9]{0,2})(?:of|/)([1-9][0-9]{0,2})")


class ShardError(ValueError):
    """A shard that cannot be: its message names what was given and what is allowed."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1 .. count
    count: int

    @property
    def tag(self) -> str:
        return f"{self.index}of{self.count}"

    @property
    def manifest(self) -> str:
        """Its job manifest's file name in raw/<experiment>/."""
        return f"_shard-{self.tag}.json"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """'2of4' or '2/4'."""
        m = _TAG.fullmatch(text.strip())
        if not m or int(m.group(1)) > int(m.group(2)):
            raise ShardError(f"--shard {text!r}: allowed: i/k or iofk with 1 <= i <= k <= 999")
        return cls(int(m.group(1)), int(m.group(2)))


def all_shards(count: int) -> list[Shard]:
    return [Shard(i, count) for i in range(1, count + 1)]


def estimate(point: Point) -> float:
    """The point's work, roughly: the product of its positive numeric parameters (a list's
    items count each); 1 where it has none. Only the order of points matters."""
    work = 1.0
    for value in point.params.values():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                work *= float(v)
    return work if math.isfinite(work) else math.inf


def split(points: Sequence[Point], count: int) -> list[list[Point]]:
    """The points dealt into `count` shards (largest estimate first, snake order); each
    shard keeps its points in grid order."""
    if count < 1:
        raise ShardError(f"shard count {count}: allowed: 1 or more")
    order = {p.point_id: i for i, p in enumerate(points)}
    ranked = sorted(points, key=lambda p: (-estimate(p), p.point_id))
    out: list[list[Point]] = [[] for _ in range(count)]
    for n, p in enumerate(ranked):
        turn, pos = divmod(n, count)
        out[pos if turn % 2 == 0 else count - 1 - pos].append(p)
    return [sorted(s, key=lambda p: order[p.point_id]) for s in out]


def points_of(points: Sequence[Point], shard: Shard) -> list[Point]:
    return split(points, shard.count)[shard.index - 1]


def walk_order(points: Sequence[Point], shard: Shard) -> list[Point]:
    """A shard's points in the order its job walks them: grid order, from (i-1)/k of the way
    in round to the start, so the shards of a lesson reach its kernels in different orders
    and build different ones at once (each build once: gpu.build_lock)."""
    start = (shard.index - 1) * len(points) // shard.count
    return [*points[start:], *points[:start]]


@contextlib.contextmanager
def build_lock(key: str) -> Iterator[None]:
    """One build of a kernel (its source, options and target: `key`) at a time among this
    user's jobs on this machine: of the shards that need it, one builds it and fills
    pycuda's cache, the others wait and find it there (a cold matmul job spent 109 of its
    143 s building). BUILD_LOCKS files in the GPU lock folder (gpu_slots.lock_dir), the key
    picking one; the kernel releases the lock of a job that ends, killed or not."""
    stripe = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % BUILD_LOCKS
    fd = os.open(lock_dir() / f"build-{stripe:02d}.lock",
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def shard_count(points: Sequence[Point], gpus: int, max_shards: int,
                all_gpus: bool = False) -> int:
    """How many measure jobs a lesson gets: 1 unless the run has several GPUs, the lesson
    has GPU points, does not need every GPU at once, and its grid is large enough."""
    if gpus < 2 or all_gpus or not any(p.gpu for p in points):
        return 1
    return max(1, min(gpus, max_shards, len(points) // MIN_POINTS_PER_SHARD))


def merge(name: str, grid: Sequence[Point], shards: Iterable[dict[str, Any]]
          ) -> dict[str, Any]:
    """The lesson's manifest from its shards' (in shard order): every point's status in
    grid order, the counts summed, the span of the jobs; the shards' own manifests (their
    GPU, telemetry, ceilings, floor) kept whole under "shards". Top-level provenance, seed
    and fingerprints are the first shard's (the fingerprints are the same in all)."""
    parts = list(shards)
    if not parts:
        raise ShardError(f"{name}: no shard manifests to merge")
    first = parts[0]
    statuses: dict[str, str] = {}
    for m in parts:
        if m.get("fingerprint") != first.get("fingerprint"):
            raise ShardError(f"{name}: shard {m.get('shard')} was measured under other "
                             f"settings than shard {first.get('shard')}: run it again")
        statuses |= m.get("points") or {}
    missing = [p.point_id for p in grid if p.point_id not in statuses]
    if missing:
        raise ShardError(f"{name}: the shards lack {len(missing)} point(s) of the grid, "
                         f"e.g. {missing[0]}")
    counts: dict[str, int] = {}
    for m in parts:
        for status, n in (m.get("counts") or {}).items():
            counts[status] = counts.get(status, 0) + int(n)
    phases = sorted((ph for m in parts for ph in m.get("phases") or []),
                    key=lambda ph: ph.get("t_start", 0))
    return {
        "experiment": name, "job_id": "+".join(str(m.get("job_id")) for m in parts),
        "t_start": min(m["t_start"] for m in parts), "t_end": max(m["t_end"] for m in parts),
        "points": {p.point_id: statuses[p.point_id] for p in grid}, "phases": phases,
        "telemetry": {"nvidia_smi": "per shard", "nvml": "per shard",
                      "reason": f"measured in {len(parts)} shards: each one's under shards"},
        "telemetry_dir": "", "provenance": first.get("provenance") or {},
        "seed": first.get("seed"), "harness": first.get("harness"),
        "fingerprint": first.get("fingerprint"),
        "config_fingerprint": first.get("config_fingerprint"),
        "counts": counts, "shards": parts,
    }
