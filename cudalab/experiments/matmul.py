"""Matrix multiplication: CPU (numpy BLAS), naive, shared-memory tiled (plain, padded and
bank-conflicting), register-tiled kernels, and cuBLAS SGEMM (through CuPy) as the ceiling.

C[M x N] = A[M x K] . B[K x N], float32, checked against a float64 CPU product.
Parameters of a point: m, k, n, and
  naive                         tile (block edge)
  tiled, tiled_padded,
  tiled_conflict                tile (tile width: TILE x TILE threads, TILE x TILE tiles)
  register                      rt (each thread computes rt x rt elements of C),
                                bt (a block computes a bt x bt tile of C), bk (k depth of
                                the shared-memory slices)
  cpu, cublas                   nothing else.
cuBLAS is optional: where CuPy is not importable its points are recorded as "skipped".
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from cudalab.experiments.base import (
    Check,
    Expectation,
    Experiment,
    Point,
    Result,
    RunContext,
    Skipped,
    rel_fro_error,
    uniform_f32,
)
from cudalab.harness import WallTimer

TILED = ["tiled", "tiled_padded", "tiled_conflict"]  # one kernel each, the same `tiles`
GPU_VARIANTS = ["naive", *TILED, "register", "cublas"]
VARIANTS = ["cpu", *GPU_VARIANTS]
NAN_BITS = 0x7FC00000  # float32 quiet NaN: poisons outputs before every check

TILES = [8, 16, 32]
RT = [2, 4, 8]  # register tile edge (RM = RN)
BT = [16, 32, 64, 128]  # block tile edge (BM = BN)
BK = [4, 8, 16, 32, 64]
MAX_THREADS = 1024
MAX_ELEMENTS = 2**31 - 1  # int indices in the kernels: row * K + k must not overflow
MIN_THREADS = 64  # two full warps: (bt/rt)^2 of 16 or 4 would leave warps half empty
MAX_STATIC_SMEM = 48 * 1024  # bytes of static __shared__ per block
APAD = 4  # row padding of the A slice in matmul_register (cuda/matmul.cu: APAD)
DEFAULT_REGISTER_TILES = [
    {"rt": 2, "bt": 32, "bk": 32},
    {"rt": 4, "bt": 64, "bk": 16},
    {"rt": 8, "bt": 128, "bk": 8},
]

_size = {
    "oneOf": [
        {"type": "integer", "minimum": 1, "maximum": 65536},
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": 65536},
            "minItems": 3,
            "maxItems": 3,
        },
    ],
    "description": "a square size n (n x n . n x n) or [M, K, N] for M x K . K x N",
}


def register_threads(rt: int, bt: int) -> int:
    """Threads of a matmul_register block: (BM / RM) * (BN / RN)."""
    return (bt // rt) ** 2


def register_smem_bytes(bt: int, bk: int) -> int:
    """Static shared memory of matmul_register: As[BK][BM + APAD] + Bs[BK][BN] floats."""
    return 4 * bk * ((bt + APAD) + bt)


class Matmul(Experiment):
    name = "matmul"
    order = 30
    title = "Matrix multiplication: global memory, shared-memory tiles, registers, cuBLAS"
    caption = (
        "Each thread of the naive kernel reads a row of A and a column of B straight from "
        "global memory: 2K loads for 2K flops. The tiled kernel loads TILE x TILE tiles of A "
        "and B into shared memory once per block and reuses every value TILE times, cutting "
        "global traffic by the tile factor. "
        "Bank conflicts: tiled_conflict and tiled_padded store the B tile transposed, so in "
        "the inner loop the 32 threads of a warp read down a column of it. With rows of "
        "TILE = 32 floats (tiled_conflict) that column lies in a single one of the 32 "
        "shared-memory banks and the warp's load is replayed once per thread (a 32-way "
        "conflict; 8-way for TILE 16, 2-way for TILE 8; nvcc's 128-bit loads do not avoid "
        "it). One float of padding per row (tiled_padded, TILE + 1) shifts each row by one "
        "bank, the column spreads over all 32 banks and the same code runs conflict-free. "
        "Register tiling (unroll-and-jam) lets each thread compute an rt x rt block of C "
        "from a bt x bt block tile: per shared-memory load it does rt FMAs instead of one. "
        "cuBLAS SGEMM (through CuPy, plain FP32: no TF32, whose 10-bit mantissa would fail "
        "the correctness check) is the ceiling. "
        "Look for: tiled above naive and register above tiled at large sizes, padded at "
        "least as fast as conflict (far faster at TILE 32), cuBLAS on top, the GPU far above "
        "the CPU once the matrices fill the chip, and, in the time split, copies (H2D + D2H) "
        "dominating for small matrices: for those, moving data costs more than the "
        "arithmetic."
    )
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean", "default": True},
            "sizes": {
                "type": "array", "items": _size, "minItems": 1,
                "default": [[160, 240, 320], 256, 1000, 1024, 2048, 4096],
                "description": "matrix sizes; include one that is no tile multiple (1000)",
            },
            "variants": {
                "type": "array", "items": {"enum": VARIANTS}, "minItems": 1,
                "uniqueItems": True, "default": VARIANTS,
            },
            "tiles": {
                "type": "array", "items": {"enum": TILES}, "minItems": 1,
                "uniqueItems": True, "default": TILES,
                "description": "tile widths of tiled, tiled_padded and tiled_conflict "
                               "(a block is tile x tile threads, at most 1024)",
            },
            "register_tiles": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "default": DEFAULT_REGISTER_TILES,
                "description": "configurations of the register-tiled kernel; a block has "
                               "64 <= (bt/rt)^2 <= 1024 threads and 4*bk*(2*bt+4) <= 48 KiB "
                               "of shared memory",
                "items": {
                    "type": "object", "additionalProperties": False,
                    "required": ["rt", "bt", "bk"],
                    "properties": {
                        "rt": {"enum": RT, "description": "each thread computes rt x rt "
                                                          "elements of C"},
                        "bt": {"enum": BT, "description": "each block computes a bt x bt "
                                                          "tile of C"},
                        "bk": {"enum": BK, "description": "k depth of the shared A and B "
                                                          "slices"},
                    },
                },
            },
            "naive_block": {
                "enum": TILES, "default": 16,
                "description": "block edge of the naive kernel",
            },
            "cpu_max_size": {
                "type": "integer", "minimum": 1, "default": 2048,
                "description": "time the CPU variant only where max(M, K, N) <= this",
            },
            "end_to_end": {
                "type": "boolean", "default": True,
                "description": "also time allocation, H2D and D2H around the tiled kernel "
                               "(the nvprof view)",
            },
            "tolerance": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1e-4,
                "description": "largest ||C - C_ref||_F / ||C_ref||_F that passes",
            },
        },
    }
    smoke = {
        "sizes": [[160, 240, 320], 100, 256, [5, 7, 3]],
        "cpu_max_size": 256,
        "register_tiles": [
            {"rt": 2, "bt": 16, "bk": 8},
            {"rt": 4, "bt": 64, "bk": 16},
            {"rt": 8, "bt": 128, "bk": 8},
        ],
    }
    figures = {
        "gflops": "GFLOP/s against matrix size (log scale), one panel per lesson: global "
        "memory vs shared-memory tiles, bank conflicts (padded vs conflicting layout), "
        "register tiling. cuBLAS SGEMM is the dashed line in every panel; each legend entry "
        "gives that configuration's percentage of cuBLAS at the largest size.",
        "time_split": "End-to-end time of the tiled kernel split into allocation, "
        "host-to-device copy, kernel and device-to-host copy.",
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
            r, b, k = rt["rt"], rt["bt"], rt["bk"]
            key = f"register_tiles[{i}]"
            threads = register_threads(r, b)
            if threads > MAX_THREADS:
                msgs.append(
                    f"{key}: rt={r}, bt={b} gives ({b}/{r})^2 = {threads} threads per block; "
                    f"at most {MAX_THREADS} are allowed: bt/rt <= 32, so for bt={b} use "
                    f"rt >= {max(b // 32, 1)} (allowed rt: {RT})")
            if threads < MIN_THREADS:
                msgs.append(
                    f"{key}: rt={r}, bt={b} gives ({b}/{r})^2 = {threads} threads per block; "
                    f"at least {MIN_THREADS} are needed (bt/rt >= 8): smaller blocks leave "
                    f"warps partly empty and their unrolled tile loads spill registers; "
                    f"for rt={r} use bt >= {8 * r}")
            smem = register_smem_bytes(b, k)
            if smem > MAX_STATIC_SMEM:
                msgs.append(
                    f"{key}: bt={b}, bk={k} needs {smem} bytes of static shared memory per "
                    f"block (A {k}x{b + APAD} + B {k}x{b} floats); at most {MAX_STATIC_SMEM} "
                    f"(48 KiB) are allowed: use a smaller bk or bt")
        return msgs

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        pts = []
        for size in sorted(block["sizes"], key=lambda s: math.prod(_mkn(s))):
            m, k, n = _mkn(size)
            dims = {"m": m, "k": k, "n": n}
            for v in block["variants"]:
                if v == "cpu":
                    if max(m, k, n) <= block["cpu_max_size"]:
                        pts.append(Point(self.name, v, dims, gpu=False))
                elif v == "naive":
                    pts.append(Point(self.name, v, dims | {"tile": block["naive_block"]}))
                elif v in TILED:
                    for t in block["tiles"]:
                        pts.append(Point(self.name, v, dims | {"tile": t}))
                elif v == "register":
                    for rt in block["register_tiles"]:
                        pts.append(Point(self.name, v, dims | {
                            "rt": rt["rt"], "bt": rt["bt"], "bk": rt["bk"]}))
                else:  # cublas
                    pts.append(Point(self.name, v, dims))
        return pts

    def gpu_bytes(self, point: Point) -> int:
        """A, B and C in float32; the tiled kernel's end-to-end split allocates a second
        set while the first is alive, and cuBLAS (CuPy) may hold copies: count those twice."""
        p = point.params
        one = 4 * (p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"])
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
            return _cublas_info()  # Skipped where CuPy is missing
        return ctx.gpu.compile("matmul.cu", kernel_defines(point))

    def _inputs(self, ctx: RunContext, m: int, k: int, n: int):
        key = ("matmul", m, k, n)
        if key not in ctx.cache:
            ctx.cache.clear()  # keep one size in memory: points are ordered by size
            a = uniform_f32(ctx.rng, (m, k))
            b = uniform_f32(ctx.rng, (k, n))
            ref = a.astype(np.float64) @ b.astype(np.float64)
            ctx.cache[key] = (a, b, ref)
        return ctx.cache[key]

    def _host_out(self, ctx: RunContext, m: int, k: int, n: int) -> np.ndarray:
        """The host copy of C for the check, one per size like the inputs (made after them,
        so a new size clears it too): the D2H copy overwrites it whole, so reusing it across
        variants only saves the page faults of a fresh 64 MiB array (at 4096) per point."""
        key = ("matmul_out", m, k, n)
        if key not in ctx.cache:
            ctx.cache[key] = np.empty((m, n), np.float32)
        return ctx.cache[key]

    def measure(self, ctx: RunContext, point: Point) -> Result:
        p = point.params
        m, k, n = p["m"], p["k"], p["n"]
        if point.variant == "cublas":
            _cupy()  # skip before making inputs
        a, b, ref = self._inputs(ctx, m, k, n)
        flops = 2.0 * m * n * k
        nbytes = 4.0 * (m * k + k * n + m * n)
        tol = ctx.block["tolerance"]
        if point.variant == "cpu":
            check = check_product(a @ b, ref, tol)
            timing = ctx.harness.measure(lambda: a @ b, WallTimer())
            return Result(timing, flops, nbytes, check)
        return self._measure_gpu(ctx, point, a, b, ref, flops, nbytes, tol)

    def _measure_gpu(self, ctx, point, a, b, ref, flops, nbytes, tol) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        p = point.params
        m, k, n = p["m"], p["k"], p["n"]
        kernel = self.kernel_for(ctx, point)
        c = self._host_out(ctx, m, k, n)
        a_d, b_d, c_d = cuda.mem_alloc(a.nbytes), cuda.mem_alloc(b.nbytes), cuda.mem_alloc(c.nbytes)
        extra: dict[str, Any] = {}
        try:
            cuda.memcpy_htod(a_d, a)
            cuda.memcpy_htod(b_d, b)
            if point.variant == "cublas":
                launch, timer, sync, extra = _cublas_launcher(gpu, a_d, b_d, c_d, m, k, n)
            else:
                func = kernel.function(f"matmul_{point.variant}")
                func.prepare("PPPiii")
                grid, block = launch_geometry(point)
                extra = {"grid": list(grid), "block": list(block)}

                def launch() -> None:
                    func.prepared_call(grid, block, a_d, b_d, c_d, m, n, k)

                timer, sync = gpu.event_timer(), gpu.synchronize

            # correctness on a poisoned output, before any timing
            cuda.memset_d32(c_d, NAN_BITS, m * n)
            launch()
            sync()
            cuda.memcpy_dtoh(c, c_d)
            check = check_product(c, ref, tol)
            timing = ctx.harness.measure(launch, timer,
                                         asynchronous=point.variant != "cublas")
            sync()
            phases, metrics = {}, {"kernel_s": timing.stats()["median"]}
            if ctx.block["end_to_end"] and point.variant == "tiled":
                phases, metrics = self._end_to_end(ctx, a, b, c, a_d, b_d, c_d, timing)
        finally:
            for d in (a_d, b_d, c_d):
                d.free()
        return Result(timing, flops, nbytes, check, metrics, phases, kernel, extra)

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
        return phases, metrics

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        d = self.ok(df).copy()
        d["size"] = [size_label(m, k, n) for m, k, n in zip(d["p_m"], d["p_k"], d["p_n"])]
        d["label"] = [variant_label(r) for r in d.to_dict("records")]
        return d.sort_values("flops", kind="stable")

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        d = self._frame(df)
        if d.empty:
            return None
        if name == "gflops":
            return _plot_gflops(d)
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
            share.plot(kind="bar", stacked=True, ax=ax,
                       color=sns.color_palette("deep", 4), width=0.75)
            for i, tot in enumerate(total_ms):
                ax.text(i, 101, f"{tot:.2g} ms", ha="center", va="bottom", fontsize=8)
            ax.set(xlabel="matrix size", ylabel="share of end-to-end time (%)", ylim=(0, 112),
                   title="Where the time goes: tiled matmul, best tile (total above bars)")
            ax.tick_params(axis="x", rotation=30)
            ax.legend(loc="lower right", fontsize=8)
            return fig
        raise KeyError(name)

    # -- expected effects --------------------------------------------------------------
    def expectations(self, df: pd.DataFrame) -> list[Expectation]:
        d = self._frame(df)
        out = []
        all_rows = df[df["variant"] != "cpu"]
        skipped = all_rows[all_rows["status"] == "skipped"]
        measured = all_rows[all_rows["status"] != "skipped"]
        bad = measured[measured["status"] != "ok"]
        note = ""
        if len(skipped):
            note = f"; {len(skipped)} skipped ({skipped['reason'].iloc[0]})"
        out.append(Expectation(
            "every GPU result matches the float64 CPU reference",
            len(measured) > 0 and bad.empty,
            f"{len(measured) - len(bad)}/{len(measured)} GPU points correct{note}",
        ))
        gpu = d[d["variant"] != "cpu"]
        if not gpu.empty:
            big = gpu[gpu["flops"] == gpu["flops"].max()]
            at = big["size"].iloc[0]
            best = _best_per_variant(big)
            if "naive" in best and "tiled" in best:
                r = best["tiled"][1] / best["naive"][1]
                out.append(Expectation(
                    "shared-memory tiling beats the naive kernel at the largest size",
                    bool(r > 1), f"best tiled / naive = {r:.2f}x at {at}"))
            if "tiled" in best and "register" in best:
                r = best["register"][1] / best["tiled"][1]
                out.append(Expectation(
                    "register tiling beats shared-memory tiling at the largest size",
                    bool(r > 1), f"best register / best tiled = {r:.2f}x at {at} "
                                 f"({best['register'][0]} vs {best['tiled'][0]})"))
            out += self._padding_expectation(big, at)
            out += self._cublas_expectation(big, at, df)
            cpu = d[d["variant"] == "cpu"]
            common = set(cpu["size"]) & set(gpu["size"])
            if common:
                s = max(common, key=lambda x: cpu[cpu["size"] == x]["flops"].iloc[0])
                r = gpu[gpu["size"] == s]["gflops"].max() / cpu[cpu["size"] == s]["gflops"].max()
                out.append(Expectation("the GPU beats the CPU (numpy BLAS) on large matrices",
                                       bool(r > 1), f"best GPU / CPU = {r:.1f}x at {s}"))
            e2e = gpu.dropna(subset=["m_copy_share"]) if "m_copy_share" in gpu else gpu[:0]
            if not e2e.empty:
                small = e2e[e2e["flops"] == e2e["flops"].min()]
                sh = small["m_copy_share"].median()
                out.append(Expectation(
                    "copies dominate the end-to-end time of the smallest product",
                    bool(sh > 0.5), f"H2D + D2H = {100 * sh:.0f}% at {small['size'].iloc[0]}"))
        return out

    @staticmethod
    def _padding_expectation(big: pd.DataFrame, at: str) -> list[Expectation]:
        pad = big[big["variant"] == "tiled_padded"].set_index("p_tile")["gflops"]
        con = big[big["variant"] == "tiled_conflict"].set_index("p_tile")["gflops"]
        tiles = sorted(set(pad.index) & set(con.index))
        if not tiles:
            return []
        ratios = {int(t): float(pad[t] / con[t]) for t in tiles}
        worst = int(max(tiles))  # the widest tile has the worst conflict (32-way at 32)
        return [Expectation(
            "padded shared tiles are at least as fast as the bank-conflicting layout",
            bool(ratios[worst] >= 1),
            f"tiled_padded / tiled_conflict at {at}: " + ", ".join(
                f"TILE {t}: {r:.2f}x" for t, r in sorted(ratios.items(), reverse=True)))]

    @staticmethod
    def _cublas_expectation(big: pd.DataFrame, at: str, df: pd.DataFrame) -> list[Expectation]:
        claim = "cuBLAS SGEMM is the ceiling: no kernel here beats it"
        cub = big[big["variant"] == "cublas"]
        if cub.empty:
            rows = df[df["variant"] == "cublas"]
            if rows.empty:
                return []
            why = rows["reason"].dropna()
            return [Expectation(claim, None, "cuBLAS not measured at the largest size: "
                                + (why.iloc[0] if len(why) else "no ok point"))]
        ceiling = float(cub["gflops"].max())
        best = _best_per_variant(big[~big["variant"].isin(["cublas", "cpu"])])
        if not best:
            return []
        top = max(g for _, g in best.values())
        pct = ", ".join(f"{lab} {100 * g / ceiling:.0f}%"
                        for lab, g in sorted(best.values(), key=lambda x: -x[1]))
        return [Expectation(claim, bool(ceiling >= top),
                            f"cuBLAS {ceiling / 1e3:.1f} TFLOP/s at {at}; % of cuBLAS: {pct}")]


def check_product(c: np.ndarray, ref: np.ndarray, tolerance: float) -> Check:
    """The rel_fro check of a product C against the float64 reference (rel_fro_error,
    blockwise: no float64 copy of C); NaN elements are looked for only when the error is
    not finite (a finite error means every element was written)."""
    err = rel_fro_error(c, ref)
    detail = ""
    if not math.isfinite(err) and not np.isfinite(c).all():
        detail = "unwritten (NaN) elements"
    return Check(err, tolerance, "rel_fro", detail=detail)


# -- kernels and launch geometry -----------------------------------------------------------
def kernel_defines(point: Point) -> dict[str, int]:
    """nvcc -D defines of the module a point's kernel comes from."""
    p = point.params
    if point.variant in TILED:
        return {"TILE": p["tile"]}
    if point.variant == "register":
        return {"BM": p["bt"], "BN": p["bt"], "BK": p["bk"], "RM": p["rt"], "RN": p["rt"]}
    return {}


def launch_geometry(point: Point) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(grid, block) of a kernel point: a block per output tile, rounded up."""
    p = point.params
    m, n = p["m"], p["n"]
    if point.variant == "register":
        bt, rt = p["bt"], p["rt"]
        return (-(-n // bt), -(-m // bt)), (bt // rt, bt // rt, 1)
    t = p["tile"]
    return (-(-n // t), -(-m // t)), (t, t, 1)


# -- cuBLAS through CuPy -------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _import_cupy() -> tuple[Any, Any, Any] | str:
    """(cupy, cupy.cublas.gemm, the cuBLAS binding module) or why not."""
    try:
        import cupy
        import cupy.cublas  # loads libcublas
        from cupy_backends.cuda.libs import cublas
    except Exception as exc:  # noqa: BLE001 - ImportError, or a missing libcublas
        return (f"cuBLAS is measured through CuPy, which is not importable here "
                f"({type(exc).__name__}: {exc}); install the CuPy wheel that matches the "
                f"CUDA driver (e.g. pip install cupy-cuda12x or cupy-cuda13x)")
    return cupy, cupy.cublas.gemm, cublas


def _cupy() -> tuple[Any, Any, Any]:
    got = _import_cupy()
    if isinstance(got, str):
        raise Skipped(got)
    return got


def _cublas_info() -> Any:
    """A Kernel-like record for provenance and the cache key: CuPy's and cuBLAS's versions."""
    from cudalab.gpu import Kernel

    cp, _, cublas = _cupy()
    try:
        cublas_version = str(cublas.getVersion(cp.cuda.device.get_cublas_handle()))
    except Exception:  # noqa: BLE001 - no handle yet / older CuPy
        cublas_version = "unknown"
    ident = f"cublasSgemm CUBLAS_DEFAULT_MATH cupy={cp.__version__} cublas={cublas_version}"
    return Kernel(module=None, source_file="cuBLAS SGEMM via CuPy", options=[],
                  source_hash=hashlib.sha256(ident.encode()).hexdigest()[:16])


class CupyEventTimer:
    """CUDA events recorded on the stream CuPy (and so cuBLAS) runs on: CuPy's current
    stream, the legacy default stream unless CUPY_CUDA_PTDS=1 or a `with stream:` block
    changed it. cupy.cuda.Event.record() with no argument records on the null stream, so the
    stream is always passed explicitly."""

    name = "cuda_event"

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.start = cp.cuda.Event()
        self.end = cp.cuda.Event()

    def time(self, fn: Callable[[], Any], reps: int) -> float:
        stream = self.cp.cuda.get_current_stream()
        self.start.record(stream)
        for _ in range(reps):
            fn()
        self.end.record(stream)
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.end) * 1e-3


def _cublas_launcher(gpu, a_d, b_d, c_d, m, k, n):
    """cublasSgemm on the job's pycuda buffers, on the job's (primary) context.

    Returns (launch, timer, sync, extra). The device buffers are wrapped, not copied, so
    cuBLAS reads the very inputs the kernels read and writes the poisoned output.
    cupy.cublas.gemm calls cublasSgemm directly: CUPY_TF32 (which switches cupy.matmul to
    CUBLAS_COMPUTE_32F_FAST_TF32) does not apply to it, and the handle's math mode is set to
    CUBLAS_DEFAULT_MATH (no TF32 tensor-op math) before timing.
    """
    import os

    cp, gemm, cublas = _cupy()
    here = int(cp.cuda.driver.ctxGetCurrent())
    ours = getattr(gpu.context, "handle", None)
    if ours is not None and here != int(ours):
        raise RuntimeError(f"CuPy runs on CUDA context {here:#x}, not on the job's primary "
                           f"context {int(ours):#x}: cuBLAS would not see the job's buffers")

    def wrap(ptr: Any, shape: tuple[int, int]) -> Any:
        mem = cp.cuda.UnownedMemory(int(ptr), 4 * shape[0] * shape[1], ptr, gpu.index)
        return cp.ndarray(shape, cp.float32, cp.cuda.MemoryPointer(mem, 0))

    a, b, c = wrap(a_d, (m, k)), wrap(b_d, (k, n)), wrap(c_d, (m, n))
    handle = cp.cuda.device.get_cublas_handle()
    mode_before = int(cublas.getMathMode(handle))
    if mode_before != cublas.CUBLAS_DEFAULT_MATH:
        cublas.setMathMode(handle, cublas.CUBLAS_DEFAULT_MATH)
    stream = cp.cuda.get_current_stream()

    def launch() -> None:
        gemm("N", "N", a, b, out=c)

    def sync() -> None:
        stream.synchronize()
        gpu.synchronize()

    extra = {
        "library": "cuBLAS cublasSgemm via cupy.cublas.gemm",
        "cupy_version": cp.__version__,
        "cublas_math_mode": int(cublas.getMathMode(handle)),
        "cublas_math_mode_before": mode_before,
        "CUPY_TF32": os.environ.get("CUPY_TF32", ""),
        "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE", ""),
        "stream": int(stream.ptr),
        "context": f"{here:#x}",
        "same_context_as_pycuda": None if ours is None else here == int(ours),
    }
    return launch, CupyEventTimer(cp), sync, extra


# -- figures -------------------------------------------------------------------------------
PANELS = [
    ("global memory vs shared-memory tiles", ["cpu", "naive", "tiled"]),
    ("bank conflicts: padded vs conflicting tile", ["tiled_conflict", "tiled_padded"]),
    ("register tiling", ["register"]),
]


def size_label(m: Any, k: Any, n: Any) -> str:
    m, k, n = int(m), int(k), int(n)
    return f"{n}" if m == k == n else f"{m}x{k}.{k}x{n}"


def variant_label(r: dict[str, Any]) -> str:
    v = r["variant"]

    def i(key: str) -> int:
        return int(r[f"p_{key}"])

    if v == "cpu":
        return "cpu"
    if v == "cublas":
        return "cuBLAS SGEMM"
    if v == "register":
        return f"register {i('rt')}x{i('rt')} ({i('bt')}x{i('bt')}x{i('bk')})"
    if v == "tiled_padded":
        return f"tiled_padded ({i('tile')}x{i('tile') + 1})"
    t = r.get("p_tile")
    if t is None or pd.isna(t):
        return v
    return f"{v} ({int(t)}x{int(t)})"


def _config_order(r: dict[str, Any]) -> tuple:
    """Legend order: variant (course order), then tile or register tile, block tile, depth."""
    def num(key: str) -> float:
        v = r.get(f"p_{key}")
        return -1.0 if v is None or pd.isna(v) else float(v)

    return (VARIANTS.index(r["variant"]) if r["variant"] in VARIANTS else len(VARIANTS),
            num("tile"), num("rt"), num("bt"), num("bk"))


def _best_per_variant(rows: pd.DataFrame) -> dict[str, tuple[str, float]]:
    """variant -> (label, gflops) of its fastest configuration among rows."""
    out = {}
    for v, g in rows.groupby("variant", sort=False):
        top = g.loc[g["gflops"].idxmax()]
        out[str(v)] = (str(top["label"]), float(top["gflops"]))
    return out


def _plot_gflops(d: pd.DataFrame):
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.lines import Line2D

    order = list(dict.fromkeys(d["size"]))  # sizes by work
    pos = {s: i for i, s in enumerate(order)}
    d = d.assign(x=d["size"].map(pos))
    cub = d[d["variant"] == "cublas"]
    # % of cuBLAS at the largest size both were measured at
    pct: dict[str, str] = {}
    for lab, g in d[d["variant"] != "cublas"].groupby("label"):
        both = g[g["size"].isin(set(cub["size"]))]
        if not both.empty:
            row = both.loc[both["x"].idxmax()]
            ref = cub[cub["size"] == row["size"]]["gflops"].max()
            pct[str(lab)] = f"{lab}: {100 * row['gflops'] / ref:.0f}% at {row['size']}"
    d = d.assign(legend=[pct.get(lab, lab) for lab in d["label"]],
                 config_order=[_config_order(r) for r in d.to_dict("records")])
    panels = [(t, vs) for t, vs in PANELS if d["variant"].isin(vs).any()]
    if not panels:
        panels = [("cuBLAS", [])]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.4), sharey=True,
                             squeeze=False)
    for ax, (title, vs) in zip(axes[0], panels):
        sub = d[d["variant"].isin(vs)]
        handles = []
        if not sub.empty:
            conflicts = set(vs) == {"tiled_conflict", "tiled_padded"}
            if conflicts:  # pair them: one colour per tile, dotted = conflicting layout
                sub = sub.assign(config_order=[(c[1], -c[0]) for c in sub["config_order"]])
            hue_order = list(dict.fromkeys(sub.sort_values("config_order")["legend"]))
            first = sub.drop_duplicates("legend").set_index("legend")
            if conflicts:
                tiles = sorted(first["p_tile"].unique())
                pal = dict(zip(tiles, sns.color_palette("deep", len(tiles))))
                colors = {e: pal[first.loc[e, "p_tile"]] for e in hue_order}
            else:
                colors = dict(zip(hue_order, sns.color_palette("deep", len(hue_order))))
            dotted = {e: first.loc[e, "variant"] == "tiled_conflict" for e in hue_order}
            sns.lineplot(data=sub, x="x", y="gflops", hue="legend", hue_order=hue_order,
                         palette=colors, style="legend", style_order=hue_order,
                         dashes={e: (1, 1.5) if dotted[e] else "" for e in hue_order},
                         markers={e: "o" for e in hue_order}, ax=ax, sort=True,
                         errorbar=None, legend=False)
            handles = [Line2D([], [], color=colors[e], marker="o", ms=5, label=e,
                              ls=":" if dotted[e] else "-") for e in hue_order]
        if not cub.empty:
            handles.append(ax.plot(cub["x"], cub["gflops"], ls="--", color="black",
                                   marker="s", ms=4, label="cuBLAS SGEMM (ceiling)")[0])
        ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set(xlabel="matrix size (n: n x n, else M x K . K x N)", ylabel="GFLOP/s (log)",
               title=title)
        ax.legend(handles=handles, title="variant: % of cuBLAS" if not cub.empty
                  else "variant", fontsize=7, title_fontsize=8, loc="best")
    fig.suptitle("Matrix multiplication throughput (float32)")
    fig.tight_layout()
    return fig


def _mkn(size: Any) -> tuple[int, int, int]:
    if isinstance(size, int):
        return size, size, size
    m, k, n = size
    return int(m), int(k), int(n)
