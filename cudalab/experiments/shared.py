"""Helpers several experiments share: launch geometry, the job's buffer set, labels, the
peak-bandwidth line of the memory figures.

The peak DRAM bandwidth travels one way: the runner puts the device's theoretical peaks in
every GPU record's `work` (experiments with vs_device_peak), the table carries it as
`peak_mem_gbps`, and the figures read that column.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext


def grid_size(n: int, threads: int) -> int:
    """Blocks of `threads` needed to cover n elements: ceil(n / threads)."""
    return (n + threads - 1) // threads


def buffer_set(ctx: RunContext, key: Any, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The job's one set of buffers (points are ordered by size, so one set at a time stays
    in memory): made on first use of `key`; the previous set's device allocations are freed
    first."""
    return ctx.cache.one_per_slot("buffers", key, make)


def size_label(n: Any) -> str:
    """50,000 or 2^24 (exact powers of two as powers)."""
    n = int(n)
    if n >= 1024 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return f"{n:,}"


def bytes_label(n: Any) -> str:
    """4 KiB, 16 MiB, 1 GiB (binary units), else the byte count."""
    n = int(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def peak_of(d: pd.DataFrame) -> float:
    """The theoretical DRAM bandwidth (GB/s) of the rows' GPU; NaN where unknown."""
    if "peak_mem_gbps" not in d:
        return math.nan
    v = pd.to_numeric(d["peak_mem_gbps"], errors="coerce").dropna()
    return float(v.iloc[0]) if len(v) else math.nan


def peak_line(ax: Any, d: pd.DataFrame) -> None:
    peak = peak_of(d)
    if math.isfinite(peak):
        ax.axhline(peak, ls="--", color="0.3", lw=1)
        ax.annotate(f"theoretical DRAM bandwidth {peak:.0f} GB/s", (0.01, peak),
                    xycoords=("axes fraction", "data"), va="bottom", fontsize=8, color="0.3")
