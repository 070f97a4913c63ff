"""The block-rate probe (cuda/vector_add/block_rate.cu): how many blocks per nanosecond the
GPU starts and retires, GPU-wide, when a block does (almost) nothing.

Why it is part of vector_add: small blocks are slower at the same total work. Two causes
compete. Latency hiding says an SM then holds too few resident warps to cover the memory
latency; a fixed cost per block says every block costs the GPU a roughly constant time to
launch and retire, so the time follows the number of blocks. The probe measures the second
directly: an empty kernel and a kernel whose threads each load one int, over several block
counts and every block size of the grid. The slope of time against blocks is the block rate;
vector add at the same block size then takes about blocks / rate where the fixed cost
limits it, and much longer where something else (too few warps in flight) does.

The rows are vector_add's points of variant `block_rate` (params kind, threads, blocks);
rates() fits them, the lesson's claim and fact read it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments import shared
from cudalab.experiments.base import Check, Launch, Point, Result
from cudalab.experiments.lesson import col, ok

if TYPE_CHECKING:
    from cudalab.experiments.base import Experiment, RunContext

VARIANT = "block_rate"
KINDS = ["empty", "one_load"]
KERNEL_FILE = "vector_add/block_rate.cu"
FUNCTION = {"empty": "block_empty", "one_load": "block_one_load"}
# The one-load probe reads a 256 MiB int buffer (a power of two: the index wraps with a
# mask), far larger than any L2, so its loads go to DRAM like vector add's.
BUFFER_INTS = 1 << 26
MAX_BLOCKS = 1 << 22  # a probe of 2^22 blocks of one warp still ends within milliseconds
DEFAULT_BLOCKS = [4096, 16384, 65536, 262144, 1048576]
NO_CHECK = ("the empty probe has no output to check: it times blocks that do nothing "
            "(the one-load probe is checked)")

SCHEMA: dict[str, Any] = {
    "probe_blocks": {
        "type": "array", "uniqueItems": True, "minItems": 0,
        "items": {"type": "integer", "minimum": 1, "maximum": MAX_BLOCKS},
        "default": DEFAULT_BLOCKS,
        "description": "block counts of the block-rate probe (empty and one-load kernels at "
        "every block size of `threads`); its block rate is the slope of time against "
        "blocks, so give at least two counts well above one wave; [] : no probe",
    },
    "probe_kinds": {
        "type": "array", "items": {"enum": KINDS}, "minItems": 1, "uniqueItems": True,
        "default": KINDS,
        "description": "probe kernels: empty blocks, and blocks whose threads load one int "
        "each (the claim on small blocks reads one_load)",
    },
}


def points(name: str, block: dict[str, Any]) -> list[Point]:
    """The probe's points: kind x threads x blocks (none where probe_blocks is empty)."""
    return [Point(name, VARIANT, {"kind": k, "threads": t, "blocks": b})
            for k in block.get("probe_kinds", KINDS) for t in sorted(block["threads"])
            for b in sorted(block.get("probe_blocks", []))]


def gpu_bytes(point: Point) -> int:
    return 4 * BUFFER_INTS + 4 if point.params["kind"] == "one_load" else 0


def _buffers(ctx: RunContext) -> dict[str, Any]:
    cuda = ctx.gpu.cuda
    a_d = cuda.mem_alloc(4 * BUFFER_INTS)
    cuda.memcpy_htod(a_d, np.arange(BUFFER_INTS, dtype=np.int32))  # value = index: no -1
    return {"a_d": a_d, "sink_d": cuda.mem_alloc(4)}


def measure(exp: Experiment, ctx: RunContext, point: Point) -> Result:
    """One probe point timed through the harness: `blocks` blocks of `threads` threads."""
    kind, t, blocks = (point.params[k] for k in ("kind", "threads", "blocks"))
    kernel = ctx.gpu.compile(KERNEL_FILE)
    func = kernel.function(FUNCTION[kind])
    grid, blk = (blocks, 1), (t, 1, 1)
    launch_of = Launch(grid, blk)
    metrics: dict[str, Any] = {"blocks": blocks}
    if kind == "empty":
        func.prepare("i")
        timing = ctx.harness.measure(lambda: func.prepared_call(grid, blk, np.int32(0)),
                                     ctx.gpu.event_timer(), asynchronous=True)
        return Result(timing, math.nan, math.nan, None, _rate(metrics, timing, blocks),
                      kernel=kernel, no_check_reason=NO_CHECK, launch=launch_of)
    bufs = shared.buffer_set(ctx, (VARIANT,), lambda: _buffers(ctx))
    a_d, sink_d = bufs["a_d"], bufs["sink_d"]
    mask = np.uint32(BUFFER_INTS - 1)
    func.prepare("PIiP")
    loaded = blocks * t

    def verify() -> Check:
        """One launch whose flag is the last element it loads: sink[0] must hold it."""
        cuda = ctx.gpu.cuda
        flag = (loaded - 1) & (BUFFER_INTS - 1)
        cuda.memset_d32(sink_d, 0xFFFFFFFF, 1)
        func.prepared_call(grid, blk, a_d, mask, np.int32(flag), sink_d)
        ctx.gpu.synchronize()
        got = np.empty(1, np.int32)
        cuda.memcpy_dtoh(got, sink_d)
        found = int(got[0]) == flag
        return Check(0.0 if found else 1.0, 0.0, "flag_found",
                     detail="" if found else f"sink holds {int(got[0])}, not {flag}")

    def launch() -> None:  # flag -1: no element holds it, so no thread stores
        func.prepared_call(grid, blk, a_d, mask, np.int32(-1), sink_d)

    check, timing = exp.verify_then_time(ctx, launch, verify, asynchronous=True,
                                         check_each_trial=False)
    return Result(timing, math.nan, 4.0 * loaded, check, _rate(metrics, timing, blocks),
                  kernel=kernel, working_set=4.0 * min(loaded, BUFFER_INTS), launch=launch_of)


def _rate(metrics: dict[str, Any], timing: Any, blocks: int) -> dict[str, Any]:
    """blocks / median time (launch included): the point's own rate, before any fit."""
    med = timing.stats()["median"] if timing is not None else math.nan
    return {**metrics, "blocks_per_ns": blocks / (med * 1e9) if med > 0 else math.nan}


# -- reading the rows --------------------------------------------------------------------------
def probe_rows(d: pd.DataFrame) -> pd.DataFrame:
    """The probe's measured rows (ok, with a time)."""
    p = ok(d[d["variant"] == VARIANT]) if "variant" in d else d.iloc[:0]
    return p[col(p, "time_median_s").notna() & col(p, "p_blocks").notna()]


def fit_rate(blocks: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(blocks per ns, fixed seconds) of the least-squares line time = fixed + blocks / rate;
    NaN where fewer than two block counts or the slope is not positive."""
    b, s = np.asarray(blocks, float), np.asarray(seconds, float)
    if len(np.unique(b)) < 2:
        return math.nan, math.nan
    slope, fixed = np.polyfit(b, s, 1)
    if not slope > 0:
        return math.nan, float(fixed)
    return 1.0 / (slope * 1e9), float(fixed)


def rates(d: pd.DataFrame) -> pd.DataFrame:
    """Per probe kind and block size: rate (blocks per ns, GPU-wide), fixed (s), counts
    (block counts fitted). Empty where the run has no probe rows."""
    p = probe_rows(d)
    out = []
    if p.empty:
        return pd.DataFrame(out, columns=["kind", "threads", "rate", "fixed", "counts"])
    for (kind, t), g in p.groupby([p["p_kind"].astype(str), col(p, "p_threads")]):
        rate, fixed = fit_rate(col(g, "p_blocks").to_numpy(), col(g, "time_median_s").to_numpy())
        out.append({"kind": kind, "threads": int(t), "rate": rate, "fixed": fixed,
                    "counts": int(g["p_blocks"].nunique())})
    return pd.DataFrame(out, columns=["kind", "threads", "rate", "fixed", "counts"])


def rate_at(r: pd.DataFrame, kind: str, threads: int) -> float:
    """The fitted rate of `kind` at `threads` (NaN: not measured)."""
    hit = r[(r["kind"] == kind) & (r["threads"] == threads)]["rate"] if len(r) else []
    return float(hit.iloc[0]) if len(hit) else math.nan


def is_probe(d: pd.DataFrame) -> pd.Series:
    """A flip's mask: the probe's rows."""
    return d["variant"] == VARIANT


def plot(df: pd.DataFrame) -> Any:
    """Probe time against block count, one line per block size, one panel per kind."""
    import matplotlib.pyplot as plt

    p = probe_rows(df)
    if p.empty:
        return None
    kinds = [k for k in KINDS if (p["p_kind"].astype(str) == k).any()]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4.6), squeeze=False,
                             sharey=True, layout="constrained")
    r = rates(df)
    threads = sorted(col(p, "p_threads").dropna().astype(int).unique())
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(threads), 1)))
    for ax, kind in zip(axes[0], kinds):
        sub = p[p["p_kind"].astype(str) == kind]
        for colour, t in zip(colours, threads):
            g = sub[col(sub, "p_threads") == t].sort_values("p_blocks")
            if g.empty:
                continue
            rate = rate_at(r, kind, t)
            label = f"{t} threads" + (f": {rate:.3g} blocks/ns" if math.isfinite(rate) else "")
            ax.plot(col(g, "p_blocks"), col(g, "time_median_s") * 1e6, "o-", color=colour,
                    label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(xlabel="blocks launched (log scale)", title=f"{kind.replace('_', '-')} blocks")
        ax.legend(title="block size: fitted rate", fontsize=8)
    axes[0][0].set_ylabel("kernel time (µs, log scale)")
    fig.suptitle("Block-rate probe: time against the number of blocks")
    return fig
