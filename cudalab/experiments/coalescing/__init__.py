"""Global-memory coalescing: copies with shifted and strided reads, and matrix transpose.

Copy variants (float32, n elements, reads b, writes a):
  memcpy     cudaMemcpy device to device     (the ceiling a copy is compared with)
  copy       a[i] = b[i]                     (one thread per element: the coalesced reference)
  copy_vec4  a[i] = b[i], a float4 per access, grid-stride over one full wave of blocks
  offset     a[i] = b[(i + offset) % n]      offset 0 ... 32 floats
  stride     a[i] = b[(i * stride) % n]      stride 1 ... 32 floats
Transpose variants (size x size float32): naive (coalesced reads, strided writes), tiled
(through a 32 x 32 shared-memory tile: both coalesced, but 32-way bank conflicts when the
tile is read by column) and padded (the tile is 32 x 33: no bank conflicts); memcpy of the
same bytes at every transpose size.

Declared work: the bytes the kernel asks for, 8 per element (4 read + 4 written), so GB/s is
the *effective* bandwidth; sectors a warp's read touches (metric read_sectors) show how much
more the memory system really moves. Every point also reports m_pct_of_memcpy: its GB/s as %
of cudaMemcpy of the same bytes, timed in the same job. The working set (both arrays) is
declared, so a matrix that fits in L2 is compared with the L2 ceiling. Every output is
compared exactly (bit for bit) with the numpy gather / transpose of the same input, after
poisoning it with NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments import base, shared
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.coalescing import lesson
from cudalab.experiments.coalescing.lesson import LESSON, memcpy_gbps_at
from cudalab.experiments.coalescing.slot import SLOT, mismatches
from cudalab.experiments.shared import peak_line, peak_of, size_label

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

COPY_VARIANTS = ["memcpy", "copy", "copy_vec4", "offset", "stride"]
TRANSPOSE_VARIANTS = ["transpose_naive", "transpose_tiled", "transpose_padded"]
VARIANTS = COPY_VARIANTS + TRANSPOSE_VARIANTS
TRANSPOSE_LABEL = {"transpose_naive": "naive", "transpose_tiled": "shared-memory tile",
                   "transpose_padded": "shared-memory tile + 1 padding",
                   "memcpy": "cudaMemcpy (same bytes)"}
TILE, BLOCK_ROWS = lesson.TILE, 8  # transpose tile edge and thread rows per block
KERNEL_NAME = {"copy": "copy_coalesced", "copy_vec4": "copy_vec4", "offset": "copy_offset",
               "stride": "copy_stride", **{v: v for v in TRANSPOSE_VARIANTS}}
MAX_N = 1 << 29  # 2 GiB per array


def gather_index(n: int, offset: int = 0, stride: int = 1) -> np.ndarray:
    """Which element of b each a[i] reads: (i * stride + offset) % n (one of them is 0/1)."""
    i = np.arange(n, dtype=np.int64)
    return (i * stride + offset) % n


def read_sectors(offset: int = 0, stride: int = 1) -> int:
    """32-byte sectors one warp's 32 float reads touch (warp start aligned to 128 bytes):
    4 when coalesced, 5 when misaligned, 4 x stride up to 32 when strided."""
    return len({((i * stride + offset) * 4) // 32 for i in range(32)})


def stride_mask(n: int) -> int:
    """n - 1 when n is a power of two (the kernel then wraps with AND), else 0 (modulo)."""
    return n - 1 if n & (n - 1) == 0 else 0


def vec4_grid(sm_count: int, threads: int, max_threads_per_sm: int) -> int:
    """Blocks of copy_vec4: one full wave (every SM holds max_threads_per_sm // threads)."""
    return max(1, sm_count) * max(1, max_threads_per_sm // threads)


def pct_of(gbps: float, ceiling_gbps: float) -> float:
    """gbps as % of a ceiling; NaN where the ceiling is unknown."""
    return 100.0 * gbps / ceiling_gbps if ceiling_gbps > 0 else math.nan


def transpose_grid(size: int) -> tuple[int, int]:
    g = (size + TILE - 1) // TILE
    return g, g


class Coalescing(Experiment):
    name = "coalescing"
    kernel_files = ("coalescing/coalescing.cu",)
    slot = SLOT
    order = 60
    lesson = LESSON
    roofline = True
    schema = block_schema({
            "n": {
                "type": "integer", "minimum": 1024, "maximum": MAX_N, "default": 1 << 26,
                "description": "elements (floats) of the copy variants (2^26: 256 MiB per "
                "array, far beyond L2)",
            },
            "offsets": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"type": "integer", "minimum": 0, "maximum": 4096},
                "default": list(range(33)),
                "description": "offsets (floats) of the offset variant",
            },
            "strides": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"type": "integer", "minimum": 1, "maximum": 4096},
                "default": list(range(1, 33)),
                "description": "strides (floats) of the stride variant",
            },
            "transpose_sizes": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"type": "integer", "minimum": 1, "maximum": 32768},
                "default": [1000, 2048, 4096, 4100, 8192],
                "description": "edges of the square matrices to transpose; include "
                "non-multiples of 32 (1000, 4100)",
            },
            "variants": base.choices_schema(VARIANTS),
            "threads": {
                "enum": [64, 128, 256, 512, 1024], "default": 256,
                "description": "threads per block of the copy kernels (transpose blocks are "
                f"{TILE} x {BLOCK_ROWS})",
            },
        })
    # n no power of two: the stride kernel's general modulo path (the default n takes the
    # power-of-two AND path) and a partial last block
    smoke = {"n": 1_000_003, "offsets": [0, 1], "strides": [1, 3, 32],
             "transpose_sizes": [100, 256]}

    def check_config(self, block: dict[str, Any]) -> list[str]:
        if "offset" in block["variants"]:
            bad = [o for o in block["offsets"] if o >= block["n"]]
            if bad:
                return [f"offsets: {bad} not below n = {block['n']}; allowed: 0 <= offset < n"]
        return []

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        """memcpy first at each size: the other points of that size use its time."""
        v, n = block["variants"], block["n"]
        pts = [Point(self.name, c, {"n": n}) for c in ("memcpy", "copy", "copy_vec4") if c in v]
        if "offset" in v:
            pts += [Point(self.name, "offset", {"n": n, "offset": o})
                    for o in sorted(block["offsets"])]
        if "stride" in v:
            pts += [Point(self.name, "stride", {"n": n, "stride": s})
                    for s in sorted(block["strides"])]
        for size in sorted(block["transpose_sizes"]):
            pts += [Point(self.name, t, {"size": size}) for t in ("memcpy", *TRANSPOSE_VARIANTS)
                    if t in v]
        return pts

    def gpu_bytes(self, point: Point) -> int:
        p = point.params
        count = p["size"] ** 2 if "size" in p else p["n"]
        return 2 * 4 * count  # in and out, float32

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant == "memcpy":
            return None  # the driver's copy: no kernel of ours
        return ctx.gpu.compile("coalescing/coalescing.cu", {"TILE": TILE, "BLOCK_ROWS": BLOCK_ROWS})

    def measure(self, ctx: RunContext, point: Point) -> Result:
        if point.variant == "memcpy":
            return self._measure_memcpy(ctx, point)
        if point.variant in TRANSPOSE_VARIANTS:
            return self._measure_transpose(ctx, point)
        return self._measure_copy(ctx, point)

    @staticmethod
    def _buffer_key(point: Point) -> tuple[tuple[str, int], int]:
        """The buffer set of a point (copies: n floats; transposes: size^2) and its count."""
        p = point.params
        if "size" in p:
            return ("transpose", p["size"]), p["size"] ** 2
        return ("copy", p["n"]), p["n"]

    def _memcpy_timed(self, ctx: RunContext, bufs: dict[str, Any], count: int
                      ) -> tuple[Check, Any]:
        """cudaMemcpy device to device of the input into the output, checked, then timed."""
        cuda = ctx.gpu.cuda

        def launch() -> None:
            cuda.memcpy_dtod_async(bufs["out_d"], bufs["in_d"], 4 * count)

        return self._run_checked(ctx, bufs, count, launch, lambda: bufs["in"])

    def _memcpy_gbps(self, ctx: RunContext, key: tuple[str, int], bufs: dict[str, Any],
                     count: int) -> float:
        """GB/s of cudaMemcpy of this buffer set in this job: the memcpy point's, or timed
        here if that point was not measured in this job (cached, or not in the grid)."""
        def make() -> float:
            check, timing = self._memcpy_timed(ctx, bufs, count)
            return _gbps(8.0 * count, timing) if check.passed else math.nan

        return ctx.cache.keep(("memcpy_gbps", key), make)

    def _measure_memcpy(self, ctx: RunContext, point: Point) -> Result:
        key, count = self._buffer_key(point)
        bufs = self._inputs(ctx, key, count)
        check, timing = self._memcpy_timed(ctx, bufs, count)
        if check.passed:
            ctx.cache[("memcpy_gbps", key)] = _gbps(8.0 * count, timing)
        return Result(timing, math.nan, 8.0 * count, check, working_set=8.0 * count)

    def _vs_memcpy(self, ctx: RunContext, point: Point, bufs: dict[str, Any], timing: Any
                   ) -> dict[str, float]:
        key, count = self._buffer_key(point)
        return {"pct_of_memcpy": pct_of(_gbps(8.0 * count, timing),
                                        self._memcpy_gbps(ctx, key, bufs, count))}

    def _inputs(self, ctx: RunContext, key: tuple, count: int) -> dict[str, Any]:
        def make() -> dict[str, Any]:
            cuda = ctx.gpu.cuda
            host = ctx.rng.standard_normal(count, dtype=np.float32)
            bufs = {"in": host, "in_d": cuda.mem_alloc(4 * count),
                    "out_d": cuda.mem_alloc(4 * count), "out": np.empty(count, np.float32)}
            cuda.memcpy_htod(bufs["in_d"], host)
            return bufs

        return shared.buffer_set(ctx, key, make)

    def _run_checked(self, ctx, bufs, count, launch,
                     expected: Callable[[], np.ndarray]) -> tuple[Check, Any]:
        """Poison the output, launch once, compare bit for bit with expected() (made only
        where the check runs: a later trial takes the first trial's, and a gather of 2^26
        floats costs the host about a second); then time launch()."""
        def check(out: np.ndarray) -> Check:
            bad = mismatches(out, expected())
            return Check(float(bad), 0.0, "mismatched_elements",
                         detail=f"{bad} of {count} elements differ from numpy" if bad else "")

        return self.verify_then_time(ctx, launch, check,
                                     output=(bufs["out_d"], bufs["out"]),
                                     asynchronous=True)

    def _measure_copy(self, ctx: RunContext, point: Point) -> Result:
        p = point.params
        n = p["n"]
        offset, stride = p.get("offset", 0), p.get("stride", 1)
        bufs = self._inputs(ctx, ("copy", n), n)
        kernel = self.kernel_for(ctx, point)
        func = kernel.function(KERNEL_NAME[point.variant])
        threads = ctx.block["threads"]
        grid = (shared.grid_size(n, threads), 1)
        a_d, b_d = bufs["out_d"], bufs["in_d"]
        if point.variant == "copy_vec4":
            func.prepare("PPI")
            args: tuple = (a_d, b_d, n)
            grid = (vec4_grid(ctx.gpu.attr("MULTIPROCESSOR_COUNT"), threads,
                              ctx.gpu.attr("MAX_THREADS_PER_MULTIPROCESSOR")), 1)
        elif point.variant == "copy":
            func.prepare("PPI")
            args = (a_d, b_d, n)
        elif point.variant == "offset":
            func.prepare("PPII")
            args = (a_d, b_d, n, offset)
        else:
            func.prepare("PPIII")
            args = (a_d, b_d, n, stride, stride_mask(n))

        def launch() -> None:
            func.prepared_call(grid, (threads, 1, 1), *args)

        def expected() -> np.ndarray:
            if point.variant == "stride":
                return bufs["in"][gather_index(n, 0, stride)]
            return np.roll(bufs["in"], -offset)  # copy / offset: cheaper than a gather

        check, timing = self._run_checked(ctx, bufs, n, launch, expected)
        metrics = self._vs_memcpy(ctx, point, bufs, timing)
        if point.variant != "copy_vec4":  # its warps read 16-byte elements
            metrics["read_sectors"] = read_sectors(offset, stride)
        return Result(timing, math.nan, 8.0 * n, check, metrics, kernel=kernel,
                      working_set=8.0 * n)

    def _measure_transpose(self, ctx: RunContext, point: Point) -> Result:
        size = point.params["size"]
        bufs = self._inputs(ctx, ("transpose", size), size * size)
        kernel = self.kernel_for(ctx, point)
        func = kernel.function(KERNEL_NAME[point.variant])
        func.prepare("PPii")
        grid = transpose_grid(size)
        out_d, in_d = bufs["out_d"], bufs["in_d"]

        def launch() -> None:
            func.prepared_call(grid, (TILE, BLOCK_ROWS, 1), out_d, in_d, size, size)

        check, timing = self._run_checked(ctx, bufs, size * size, launch,
                                          lambda: bufs["in"].reshape(size, size).T.ravel())
        return Result(timing, math.nan, 8.0 * size * size, check,
                      self._vs_memcpy(ctx, point, bufs, timing), kernel=kernel,
                      working_set=8.0 * size * size)

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        return self.ok(df).copy()

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        d = self._frame(df)
        if name in ("offset", "stride"):
            sub = d[d["variant"] == name]
            if sub.empty:
                return None
            sub = sub.assign(x=sub[f"p_{name}"].astype("int64")).sort_values("x")
            x = sub["x"]
            fig, ax = plt.subplots(figsize=(9, 4.8))
            ax.plot(x, sub["gbps"], "o-", color="C0", label=f"{name} copy")
            copy = d[d["variant"] == "copy"]
            if len(copy):
                ax.axhline(copy["gbps"].iloc[0], color="C2", lw=1.5,
                           label=f"coalesced copy ({copy['gbps'].iloc[0]:.0f} GB/s)")
            memcpy = memcpy_gbps_at(d, n=int(sub["p_n"].iloc[0]))
            if math.isfinite(memcpy):
                ax.axhline(memcpy, color="C3", lw=1.5, ls="-.",
                           label=f"cudaMemcpy device to device ({memcpy:.0f} GB/s)")
            peak_line(ax, d)
            ax.set_ylim(0, 1.12 * max(sub["gbps"].max(), peak_of(d) if math.isfinite(
                peak_of(d)) else 0, memcpy if math.isfinite(memcpy) else 0))
            what = "(i + offset) % n" if name == "offset" else "(i * stride) % n"
            ax.set(xlabel=f"{name} (floats)", ylabel="effective bandwidth (GB/s, 8 B/element)",
                   title=f"a[i] = b[{what}], n = {size_label(sub['p_n'].iloc[0])} floats")
            if name == "stride":
                ax2 = ax.twinx()
                ax2.plot(x, sub["m_read_sectors"].astype(float), "s:", color="C1", ms=3,
                         label="32-byte sectors per warp read")
                ax2.set_ylabel("sectors per warp read (4 = coalesced)", color="C1")
                ax2.set_ylim(0, 34)
                ax2.grid(False)
                h1, l1 = ax.get_legend_handles_labels()
                h2, l2 = ax2.get_legend_handles_labels()
                ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="center right")
            else:
                ax.legend(fontsize=8, loc="lower right")
            return fig
        if name == "transpose":
            if not d["variant"].isin(TRANSPOSE_VARIANTS).any():
                return None
            sub = d[d["variant"].isin(TRANSPOSE_VARIANTS)
                    | ((d["variant"] == "memcpy") & d["p_size"].notna())].copy()
            sub["size"] = sub["p_size"].astype("int64")
            sub["kernel"] = sub["variant"].map(TRANSPOSE_LABEL)
            sub = sub.sort_values("size")
            fig, ax = plt.subplots(figsize=(9, 4.8))
            sns.barplot(data=sub, x="size", y="gbps", hue="kernel", ax=ax,
                        hue_order=[TRANSPOSE_LABEL[v] for v in (*TRANSPOSE_VARIANTS, "memcpy")
                                   if v in set(sub["variant"])])
            copy = d[d["variant"] == "copy"]
            if len(copy):
                ax.axhline(copy["gbps"].iloc[0], color="C3", ls="-.", lw=1,
                           label=f"coalesced copy ({copy['gbps'].iloc[0]:.0f} GB/s)")
            peak_line(ax, d)
            if math.isfinite(peak_of(d)):  # room for the peak's label under the title
                ax.set_ylim(0, peak_of(d) * 1.15)
            ax.set(xlabel="matrix edge (size x size floats)",
                   ylabel="effective bandwidth (GB/s, 8 B/element)",
                   title="Matrix transpose: naive against shared-memory tiles")
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                      frameon=False)
            fig.tight_layout()
            return fig
        raise KeyError(name)


def _gbps(nbytes: float, timing: Any) -> float:
    """GB/s of the median sample."""
    med = timing.stats()["median"]
    return nbytes / med / 1e9 if med > 0 else math.nan


