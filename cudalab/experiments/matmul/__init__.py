"""Matrix multiplication: CPU (numpy BLAS), naive, shared-memory tiled (plain, padded and
bank-conflicting), register-tiled kernels, the ladder toward cuBLAS (float4 loads, double
buffering, warp tiling), and cuBLAS SGEMM / DGEMM (through CuPy) as the ceiling.

C[M x N] = A[M x K] . B[K x N], float32 (and float64 for naive, tiled and cuBLAS), checked
against a float64 CPU product.
Parameters of a point: m, k, n, and
  naive                         tile (block edge)
  tiled, tiled_padded,
  tiled_conflict                tile (tile width: TILE x TILE threads, TILE x TILE tiles)
  register, vec4, dbuf          rt (each thread computes rt x rt elements of C),
                                bt (a block computes a bt x bt tile of C), bk (k depth of
                                the shared-memory slices)
  warptile                      bm, bn, bk (block tile), wm, wn (warp tile), wniter (warp
                                sub-tiles along n), tm, tn (outputs per thread and
                                sub-tile), threads
  pipelined, swizzled           bm, bn, bk (block tile), wm, wn (warp tile), wtm (a warp's
                                threads along m), stages (cp.async stages), threads
  cpu, cublas                   nothing else.
float64 points carry dtype=float64; float32 points carry no dtype parameter, so their ids
(and the recorded references) are those of the float32-only grid (the table's p_dtype is
filled with float32 by _frame).
cuBLAS is optional: where CuPy is not importable its points are recorded as "skipped".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments import base
from cudalab.experiments.base import Experiment, Launch, Point, Result, block_schema
from cudalab.experiments.matmul import lesson
from cudalab.experiments.matmul.build import (  # noqa: F401
    _dtype,
    _itemsize,
    kernel_defines,
    kernel_resources,
    kernel_source,
    launch_geometry,
)
from cudalab.experiments.matmul.cublas import (  # noqa: F401
    CupyEventTimer,
    _cublas_info,
    _cublas_launcher,
    _cupy,
    _gemm_name,
    _import_cupy,
)
from cudalab.experiments.matmul.figures import (  # noqa: F401
    PANELS,
    _best_per_variant,
    _config_order,
    _course_panel,
    _lesson_panel,
    _mkn,
    _pct_of_cublas,
    _plot_gflops,
    _size_ticks,
    params,
    size_label,
    variant_label,
)
from cudalab.experiments.matmul.fp64 import (  # noqa: F401
    FP64_RATIO,
    FP64_TENSOR_RATIO,
    _fp64_table_html,
    fp64_metrics,
    fp64_peak_ratio,
    fp64_ratio,
    fp64_summary,
    ratio_text,
)

# The experiment's modules, by meaning; their names are the package's (tests, scripts and
# static analysis read them as cudalab.experiments.matmul.<name>).
from cudalab.experiments.matmul.kernels import (  # noqa: F401
    APAD,
    BK,
    BT,
    COURSE_SIZE,
    DEFAULT_REGISTER_TILES,
    DTYPES,
    FP64_VARIANTS,
    GPU_VARIANTS,
    ITEMSIZE,
    LADDER,
    LADDER_KERNELS,
    MAX_ELEMENTS,
    MAX_STATIC_SMEM,
    MAX_THREADS,
    MIN_THREADS,
    PIPELINE_KERNELS,
    RT,
    TILED,
    TILES,
    VARIANTS,
    _check_register_tile,
    _size,
    _tile_list,
    check_product,
    register_smem_bytes,
    register_threads,
    vec4_smem_bytes,
)
from cudalab.experiments.matmul.ladder import (  # noqa: F401
    DEFAULT_PIPE_TILES,
    DEFAULT_VEC4_TILES,
    DEFAULT_WARP_TILES,
    LADDER_MIN_STEPS,
    LADDER_NOTES,
    MAX_WARP_ACC,
    PIPE_ENUMS,
    PIPE_KEYS,
    PIPE_OPTIONAL,
    VEC4_BK,
    VEC4_RT,
    WARP_ENUMS,
    WARP_KEYS,
    _cell,
    _ladder_table_html,
    _largest_square,
    _num,
    _plot_ladder,
    _pt,
    _wt,
    check_pipe_tile,
    check_warp_tile,
    ladder_at,
    ladder_rows,
    pipe_geometry,
    warp_geometry,
)
from cudalab.experiments.matmul.lesson import LESSON
from cudalab.experiments.matmul.slot import SLOT
from cudalab.harness import WallTimer

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext


class Matmul(Experiment):
    name = "matmul"
    kernel_files = (
        "matmul/matmul.cu", "matmul/matmul_ladder.cu", "matmul/matmul_pipeline.cu")
    slot = SLOT
    order = 30
    lesson = LESSON
    roofline = True
    schema = block_schema({
            "sizes": {
                "type": "array", "items": _size, "minItems": 1,
                "default": [[160, 240, 320], 256, 1000, 1024, 2048, 4096],
                "description": "matrix sizes; include one that is no tile multiple (1000)",
            },
            "variants": base.choices_schema(VARIANTS),
            "tiles": {
                "type": "array", "items": {"enum": TILES}, "minItems": 1,
                "uniqueItems": True, "default": TILES,
                "description": "tile widths of tiled, tiled_padded and tiled_conflict "
                               "(a block is tile x tile threads, at most 1024)",
            },
            "register_tiles": _tile_list(
                DEFAULT_REGISTER_TILES, RT, BK,
                "configurations of the register-tiled kernel; a block has 64 <= (bt/rt)^2 "
                "<= 1024 threads and 4*bk*(2*bt+4) <= 48 KiB of shared memory"),
            "vec4_tiles": _tile_list(
                DEFAULT_VEC4_TILES, VEC4_RT, VEC4_BK,
                "configurations of vec4 and dbuf (register tiles with float4 loads): "
                "64 <= (bt/rt)^2 <= 1024 threads, and dbuf's two buffers "
                "2*4*bk*(2*bt+4) <= 48 KiB of shared memory"),
            "warp_tiles": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "default": DEFAULT_WARP_TILES,
                "description": "configurations of the warp-tiled kernel (a small tile "
                               "search: the figures keep the best per size); threads = "
                               "(bm/wm)*(bn/wn)*32, wm*wn a multiple of 32*tm*tn*wniter, "
                               "4*bk*(bm+4+bn) <= 48 KiB",
                "items": {
                    "type": "object", "additionalProperties": False,
                    "required": list(WARP_KEYS),
                    "properties": {k: {"enum": v} for k, v in WARP_ENUMS.items()},
                },
            },
            "pipe_tiles": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "default": DEFAULT_PIPE_TILES,
                "description": "configurations of pipelined and swizzled (cp.async stages, "
                               "warp tiles): threads = (bm/wm)*(bn/wn)*32, wm a multiple of "
                               "wtm, wn of 4*32/wtm, 4*stages*bk*(bm+bn) <= 48 KiB",
                "items": {
                    "type": "object", "additionalProperties": False,
                    "required": list(PIPE_KEYS),
                    "properties": {k: {"enum": v} for k, v in
                                   (PIPE_ENUMS | PIPE_OPTIONAL).items()},
                },
            },
            "dtypes": {**base.choices_schema(
                DTYPES, "element types; float64 runs only naive, tiled and cublas (DGEMM); "
                "config.yaml asks for both"), "default": ["float32"]},
            "naive_block": {
                "enum": TILES, "default": 16,
                "description": "block edge of the naive kernel",
            },
            "cpu_max_size": {
                "type": "integer", "minimum": 1, "maximum": 65536, "default": 2048,
                "description": "time the CPU variant only where max(M, K, N) <= this "
                "(elements; at most the largest size a grid may have)",
            },
            "end_to_end": {
                "type": "boolean", "default": True,
                "description": "also time allocation, H2D and D2H around the tiled kernel "
                               "(the nvprof view)",
            },
            "tolerance": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1e-4,
                "description": "largest ||C - C_ref||_F / ||C_ref||_F that passes (float32)",
            },
            "tolerance_float64": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1e-12,
                "description": "the same for float64 products: a double sum of K products "
                               "errs by about sqrt(K) * 1.1e-16 (7e-15 at K = 4096)",
            },
        })
    smoke = {
        "sizes": [[160, 240, 320], 100, 256, [5, 7, 3]],
        "cpu_max_size": 256,
        "register_tiles": [
            {"rt": 2, "bt": 16, "bk": 8},
            {"rt": 4, "bt": 64, "bk": 16},
            {"rt": 8, "bt": 128, "bk": 8},
        ],
        "vec4_tiles": [{"rt": 8, "bt": 128, "bk": 8}, {"rt": 4, "bt": 32, "bk": 16}],
        "warp_tiles": DEFAULT_WARP_TILES[:1] + DEFAULT_WARP_TILES[2:3],
        "pipe_tiles": DEFAULT_PIPE_TILES[:1] + DEFAULT_PIPE_TILES[2:],
        "dtypes": ["float32", "float64"],
    }

    # -- config ------------------------------------------------------------------------
    def check_config(self, block: dict[str, Any]) -> list[str]:
        msgs = []
        for i, size in enumerate(block.get("sizes", [])):
            m, k, n = _mkn(size)
            elems = max(m * k, k * n, m * n)
            if elems > MAX_ELEMENTS:
                msgs.append(
                    f"sizes[{i}]: {size} has a matrix of {elems} elements; the kernels index "
                    f"with 32-bit ints, so at most {MAX_ELEMENTS} (2^31 - 1) per matrix")
        for i, rt in enumerate(block.get("register_tiles", [])):
            msgs += _check_register_tile(f"register_tiles[{i}]", rt, RT, buffers=1)
        for i, rt in enumerate(block.get("vec4_tiles", [])):
            msgs += _check_register_tile(f"vec4_tiles[{i}]", rt, VEC4_RT, buffers=2)
        for i, wt in enumerate(block.get("warp_tiles", [])):
            msgs += [f"warp_tiles[{i}]: {m}" for m in check_warp_tile(wt)]
        for i, pt in enumerate(block.get("pipe_tiles", [])):
            msgs += [f"pipe_tiles[{i}]: {m}" for m in check_pipe_tile(pt)]
        variants = block.get("variants", [])
        if "float64" in block.get("dtypes", []) and not set(FP64_VARIANTS) & set(variants):
            msgs.append(f"dtypes: float64 is listed, but none of the variants runs in float64 "
                        f"(those that do: {', '.join(FP64_VARIANTS)}; variants: "
                        f"{', '.join(map(str, variants))}); add one or drop float64")
        return msgs

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        """Ordered by size (inputs are made once per size), float32 before float64."""
        pts = []
        dtypes = block.get("dtypes", ["float32"])
        for size in sorted(block["sizes"], key=lambda s: math.prod(_mkn(s))):
            m, k, n = _mkn(size)
            dims = {"m": m, "k": k, "n": n}
            for dtype in dtypes:
                tag = {} if dtype == "float32" else {"dtype": dtype}
                for v in block["variants"]:
                    if dtype == "float32" or v in FP64_VARIANTS:
                        pts += [Point(self.name, v, dims | c | tag, gpu=v != "cpu")
                                for c in self._configs(block, v, m, k, n)]
        return pts

    @staticmethod
    def _configs(block: dict[str, Any], v: str, m: int, k: int, n: int) -> list[dict[str, Any]]:
        """The parameter sets of variant v at one size (beside m, k, n)."""
        if v == "cpu":
            return [{}] if max(m, k, n) <= block["cpu_max_size"] else []
        if v == "naive":
            return [{"tile": block["naive_block"]}]
        if v in TILED:
            return [{"tile": t} for t in block["tiles"]]
        if v == "register":
            return [{x: rt[x] for x in ("rt", "bt", "bk")} for rt in block["register_tiles"]]
        if v in ("vec4", "dbuf"):
            tiles = block.get("vec4_tiles", DEFAULT_VEC4_TILES)
            return [{x: rt[x] for x in ("rt", "bt", "bk")} for rt in tiles]
        if v == "warptile":
            return [{x: int(wt[x]) for x in WARP_KEYS}
                    for wt in block.get("warp_tiles", DEFAULT_WARP_TILES)]
        if v in PIPELINE_KERNELS:
            return [{x: int(pt[x]) for x in PIPE_KEYS}
                    | {x: int(pt[x]) for x in PIPE_OPTIONAL if pt.get(x)}
                    for pt in block.get("pipe_tiles", DEFAULT_PIPE_TILES)]
        return [{}]  # cublas

    def compile_variants(self, config: dict[str, Any] | None) -> list[base.CompileVariant]:
        """matmul_register, matmul_vec4, matmul_dbuf, matmul_warptile, matmul_pipelined and
        matmul_swizzled exist only under their tile's -D defines: one variant per tile of the
        run's block for the variants it runs, the defaults for the others (a tile chosen for
        one rung, e.g. pipelined's 128x256, may spill in a rung that shares the key but is
        never launched with it)."""
        blk = self.settings_in(config)
        ran = set(blk.get("variants") or VARIANTS)
        defaults = {"register_tiles": DEFAULT_REGISTER_TILES, "vec4_tiles": DEFAULT_VEC4_TILES,
                    "warp_tiles": DEFAULT_WARP_TILES, "pipe_tiles": DEFAULT_PIPE_TILES}
        key = {"register": "register_tiles", "vec4": "vec4_tiles", "dbuf": "vec4_tiles",
               "warptile": "warp_tiles", "pipelined": "pipe_tiles", "swizzled": "pipe_tiles"}
        out = []
        for v in ("register", "vec4", "dbuf", "warptile", *PIPELINE_KERNELS):
            tiles = (blk.get(key[v]) if v in ran else None) or defaults[key[v]]
            for t in tiles:
                tile = {k: int(x) for k, x in t.items()}
                p = Point(self.name, v, tile)
                out.append(base.CompileVariant(kernel_source(p), f"matmul_{v}",
                                               kernel_defines(p), tile))
        return out

    def gpu_bytes(self, point: Point) -> int:
        """A, B and C in the point's dtype; the tiled kernel's end-to-end split allocates a
        second set while the first is alive, and cuBLAS (CuPy) may hold copies: count those
        twice."""
        p = point.params
        one = _itemsize(point) * (p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"])
        return 2 * one if point.variant in ("tiled", "cublas") else one

    def plan_warnings(self, block: dict[str, Any]) -> list[str]:
        """Every size's float64 reference (A @ B) is computed on the host, GPU-only sizes
        too: say when one will take minutes (at an optimistic 50 GFLOP/s of numpy FP64)."""
        slow = [(2 * math.prod(_mkn(s)) / 50e9, s) for s in block["sizes"]]
        slow = [(t, s) for t, s in slow if t > 60]
        return [f"sizes: {s} needs a float64 CPU reference of about {t / 60:.0f} min or more "
                f"(2*M*K*N flops on the host)" for t, s in slow]

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant == "cublas":
            return _cublas_info(_dtype(point))  # Skipped where CuPy is missing
        return ctx.gpu.compile(kernel_source(point), kernel_defines(point))

    def _inputs(self, ctx: RunContext, m: int, k: int, n: int, dtype: str = "float32"):
        """(A, B, the float64 reference) of a size. float64 inputs are the float32 ones
        widened (exactly), so both dtypes share one reference: the float64 CPU product."""
        def make():
            a = base.uniform_f32(ctx.rng, (m, k))
            b = base.uniform_f32(ctx.rng, (k, n))
            return a, b, a.astype(np.float64) @ b.astype(np.float64)

        # one size in memory: points are ordered by size
        a, b, ref = ctx.cache.one_per_slot("matmul_inputs", ("matmul", m, k, n), make)
        if dtype == "float32":
            return a, b, ref
        a64, b64 = ctx.cache.one_per_slot(
            "matmul_inputs64", ("matmul64", m, k, n),
            lambda: (a.astype(np.float64), b.astype(np.float64)))
        return a64, b64, ref

    def _host_out(self, ctx: RunContext, m: int, k: int, n: int,
                  dtype: str = "float32") -> np.ndarray:
        """The host copy of C for the check, one per size and dtype like the inputs: the
        D2H copy overwrites it whole, so reusing it across variants only saves the page
        faults of a fresh 64 MiB array (at 4096) per point."""
        key = ("matmul_out", m, k, n) + (() if dtype == "float32" else (dtype,))
        return ctx.cache.one_per_slot(f"matmul_out_{dtype}", key,
                                      lambda: np.empty((m, n), np.dtype(dtype)))

    def measure(self, ctx: RunContext, point: Point) -> Result:
        p = point.params
        m, k, n = p["m"], p["k"], p["n"]
        if point.variant == "cublas":
            _cupy()  # skip before making inputs
        dtype = _dtype(point)
        a, b, ref = self._inputs(ctx, m, k, n, dtype)
        flops = 2.0 * m * n * k
        nbytes = float(ITEMSIZE[dtype] * (m * k + k * n + m * n))
        tol = ctx.block["tolerance"] if dtype == "float32" else ctx.block["tolerance_float64"]
        if point.variant == "cpu":
            check, timing = self.verify_then_time(
                ctx, lambda: a @ b, lambda: check_product(a @ b, ref, tol), timer=WallTimer())
            return Result(timing, flops, nbytes, check)
        return self._measure_gpu(ctx, point, a, b, ref, flops, nbytes, tol)

    def _measure_gpu(self, ctx, point, a, b, ref, flops, nbytes, tol) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        p = point.params
        m, k, n = p["m"], p["k"], p["n"]
        dtype = _dtype(point)
        kernel = self.kernel_for(ctx, point)
        c = self._host_out(ctx, m, k, n, dtype)
        a_d, b_d, c_d = cuda.mem_alloc(a.nbytes), cuda.mem_alloc(b.nbytes), cuda.mem_alloc(c.nbytes)
        extra: dict[str, Any] = {}
        shape: Launch | None = None  # cuBLAS picks its own kernels and grids
        metrics: dict[str, Any] = {}
        try:
            cuda.memcpy_htod(a_d, a)
            cuda.memcpy_htod(b_d, b)
            queued = True
            if point.variant == "cublas":
                launch, timer, sync, extra = _cublas_launcher(gpu, a_d, b_d, c_d, m, k, n, dtype)
                queued = extra["queued"]
            else:
                func = kernel.function(f"matmul_{point.variant}")
                func.prepare("PPPiii")
                grid, block = launch_geometry(point)
                shape = Launch(grid, block)
                metrics = kernel_resources(gpu, func, math.prod(block))

                def launch() -> None:
                    func.prepared_call(grid, block, a_d, b_d, c_d, m, n, k)

                timer, sync = gpu.event_timer(), gpu.synchronize

            check, timing = self.verify_then_time(
                ctx, launch, lambda out: check_product(out, ref, tol), output=(c_d, c),
                timer=timer, sync=sync, asynchronous=queued)
            sync()
            phases = {}
            metrics["kernel_s"] = timing.stats()["median"]
            if dtype == "float64":
                metrics |= fp64_metrics(gpu, flops, metrics["kernel_s"], point.variant)
            # the end-to-end split is host-synchronous work that never gates: measured in the
            # first trial only (cudalab.trials keeps it with the chosen trial)
            if (ctx.block["end_to_end"] and point.variant == "tiled" and dtype == "float32"
                    and not ctx.harness.later_trial):
                phases, e2e = self._end_to_end(ctx, a, b, c, a_d, b_d, c_d, timing)
                metrics |= e2e
        finally:
            ctx.cache.retire(a_d, b_d, c_d)  # freed after the point's trials: each lands anew
        return Result(timing, flops, nbytes, check, metrics, phases, kernel, extra,
                      launch=shape)

    def _end_to_end(self, ctx, a, b, c, a_d, b_d, c_d, timing):
        """The nvprof view: allocation, H2D, kernel, D2H timed separately (pageable host
        memory, as a first CUDA program would do it)."""
        gpu, h = ctx.gpu, ctx.harness
        cuda = gpu.cuda
        ev = gpu.event_timer()

        def alloc() -> None:
            bufs = [cuda.mem_alloc(x.nbytes) for x in (a, b, c)]
            gpu.synchronize()
            for x in bufs:
                x.free()

        def h2d() -> None:
            cuda.memcpy_htod(a_d, a)
            cuda.memcpy_htod(b_d, b)

        phases = {
            "alloc": h.measure(alloc, WallTimer(), batchable=False),
            "h2d": h.measure(h2d, ev, batchable=False),
            "d2h": h.measure(lambda: cuda.memcpy_dtoh(c, c_d), ev, batchable=False),
        }
        med = {k: v.stats()["median"] for k, v in phases.items()}
        med["kernel"] = timing.stats()["median"]
        total = sum(med.values())
        metrics = {f"{k}_s": v for k, v in med.items()}
        metrics["total_s"] = total
        metrics["copy_share"] = (med["h2d"] + med["d2h"]) / total
        metrics["gpu_copy_share"] = lesson.gpu_copy_share(med["h2d"], med["kernel"], med["d2h"])
        return phases, metrics

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame, dtype: str | None = "float32") -> pd.DataFrame:
        """The ok rows of one dtype (None: all), with size, label and p_dtype (float32
        where a point has no dtype parameter)."""
        d = self.ok(df).copy()
        d["p_dtype"] = (d["p_dtype"].fillna("float32") if "p_dtype" in d else "float32")
        if dtype is not None:
            d = d[d["p_dtype"] == dtype].copy()
        d["size"] = [size_label(m, k, n) for m, k, n in zip(d["p_m"], d["p_k"], d["p_n"])]
        d["label"] = [variant_label(r) for r in params(d)]
        return d.sort_values("flops", kind="stable")

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        d = self._frame(df)
        if d.empty:
            return None
        if name == "gflops":
            return _plot_gflops(d)
        if name == "ladder":
            return _plot_ladder(d)
        if name == "time_split":
            if "m_h2d_s" not in d:
                return None
            e2e = d[d["variant"] == "tiled"].dropna(subset=["m_h2d_s"])
            if e2e.empty:
                return None
            # the best tile per size: what a user would ship
            best = e2e.loc[e2e.groupby("size", sort=False)["m_kernel_s"].idxmin()]
            cols = {"m_alloc_s": "cudaMalloc", "m_h2d_s": "H2D copy",
                    "m_kernel_s": "kernel", "m_d2h_s": "D2H copy"}
            share = best.set_index("size")[list(cols)].rename(columns=cols)
            total_ms = share.sum(axis=1) * 1e3
            share = share.div(share.sum(axis=1), axis=0) * 100
            fig, ax = plt.subplots(figsize=(9, 5))
            share.plot(kind="barh", stacked=True, ax=ax,
                       color=sns.color_palette("deep", 4), width=0.7, legend=False)
            for i, tot in enumerate(total_ms):
                ax.text(101, i, fmt.seconds(tot / 1e3), va="center", fontsize=8)
            ax.invert_yaxis()
            ax.set(ylabel="matrix size (M x K . K x N, or n)", xlim=(0, 118),
                   xlabel="share of end-to-end time (%); total time right of each bar",
                   title="Where the time goes: tiled matmul, best tile per size")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, fontsize=8,
                      frameon=False)
            fig.tight_layout()
            return fig
        raise KeyError(name)

    def tables(self, df: pd.DataFrame) -> list[dict[str, str]]:
        out = []
        steps = ladder_rows(self._frame(df))
        if steps:
            out.append({"title": f"The ladder, step by step (float32, best configuration of "
                                 f"each step at {steps[0]['size']})",
                        "html": _ladder_table_html(steps)})
        fp64 = fp64_summary(self._frame(df, None))
        if fp64:
            out.append({"title": "Double precision: FP64 against FP32 (same kernels, same "
                                 "inputs)", "html": _fp64_table_html(fp64)})
        return out
