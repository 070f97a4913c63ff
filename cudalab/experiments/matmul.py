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
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments import base
from cudalab.experiments.base import Check, Expectation, Experiment, Point, Result, block_schema
from cudalab.harness import WallTimer

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

TILED = ["tiled", "tiled_padded", "tiled_conflict"]  # one kernel each, the same `tiles`
GPU_VARIANTS = ["naive", *TILED, "register", "cublas"]
VARIANTS = ["cpu", *GPU_VARIANTS]

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

_size = base.size_schema(3, 1, 65536, "a square size n (n x n . n x n) or [M, K, N] for "
                         "M x K . K x N")


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
        "Look for: tiled at least 1.2x above naive (at the course's 160x240.240x320 and at "
        "the largest size) and register above tiled at large sizes, padded more than 1.1x "
        "faster than conflict (far faster at TILE 32), cuBLAS on top from n of about 1000, "
        "the GPU far above the CPU once the matrices fill the chip, and, in the time split, "
        "copies (H2D + D2H) dominating for small matrices: for those, moving data costs "
        "more than the arithmetic."
    )
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
        })
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
        "gflops": "GFLOP/s of the square products against n (both axes log scale), one "
        "panel per lesson: global memory vs shared-memory tiles, bank conflicts (padded vs "
        "conflicting layout, same colour per tile, dotted = conflicting), register tiling; "
        "the fourth panel is the course's rectangular product 160x240.240x320 on its own "
        "(best configuration of each variant). Each legend entry gives that configuration's "
        "percentage of cuBLAS at the largest size. The unlabelled tick just left of 1024 is "
        "n = 1000, a size no tile divides. cuBLAS (dashed) is the ceiling only from n of "
        "about 1000: in the grey band a product takes microseconds, every variant is bound "
        "by its launch path rather than its arithmetic, and cuBLAS is called through CuPy, "
        "whose per-call host work is larger than a prepared pycuda launch; it also picks "
        "kernels tuned for large matrices. There it falls below the course kernels.",
        "time_split": "End-to-end time of the tiled kernel split into allocation, "
        "host-to-device copy, kernel and device-to-host copy.",
    }

    # -- config ------------------------------------------------------------------------
    # -- teaching (report) ----------------------------------------------------------------
    try_this = [
        ("measurement.cold_l2: true", "the naive kernel loses most: its re-reads of A and "
         "B were served by the 50 MiB L2; the tiled kernels, which reuse data in shared "
         "memory, lose less, so the tiling gain grows"),
        ("matmul.tiles: [8]", "only TILE 8: 8x less reuse per load than TILE 32 and only 64 "
         "threads per block; tiled falls towards naive and the tiling check may fail"),
        ("matmul.sizes: [[160, 240, 320], [1600, 2400, 3200]]", "the course's shape ten "
         "times larger in each dimension: the copies' share of the end-to-end time drops "
         "because the arithmetic grows as n^3 and the data as n^2"),
    ]
    questions = [
        "How many global-memory loads does the naive kernel make per output element, and "
        "how many does a TILE x TILE tiled kernel make?",
        "Why does padding the shared tile by one float remove the bank conflict?",
        "Why is cuBLAS slower than the course's kernels at 256 x 256 but far faster than "
        "the best of them at 4096?",
    ]

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
            gives = f"{key}: rt={r}, bt={b} gives ({b}/{r})^2 = {threads} threads per block; "
            if threads > MAX_THREADS:
                msgs.append(gives + f"at most {MAX_THREADS} are allowed: bt/rt <= 32, so for "
                            f"bt={b} use rt >= {max(b // 32, 1)} (allowed rt: {RT})")
            if threads < MIN_THREADS:
                msgs.append(gives + f"at least {MIN_THREADS} are needed (bt/rt >= 8): smaller "
                            "blocks leave warps partly empty and their unrolled tile loads "
                            f"spill registers; for rt={r} use bt >= {8 * r}")
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

    def compile_variants(self, config: dict[str, Any] | None) -> list[base.CompileVariant]:
        """matmul_register exists only under its tile's -D defines: one per register tile."""
        tiles = self.settings_in(config).get("register_tiles") or DEFAULT_REGISTER_TILES
        out = []
        for t in tiles:
            tile = {k: int(t[k]) for k in ("rt", "bt", "bk")}
            defines = kernel_defines(Point(self.name, "register", tile))
            out.append(base.CompileVariant("matmul.cu", "matmul_register", defines, tile))
        return out

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
        def make():
            a = base.uniform_f32(ctx.rng, (m, k))
            b = base.uniform_f32(ctx.rng, (k, n))
            return a, b, a.astype(np.float64) @ b.astype(np.float64)

        # one size in memory: points are ordered by size
        return ctx.cache.one_per_slot("matmul_inputs", ("matmul", m, k, n), make)

    def _host_out(self, ctx: RunContext, m: int, k: int, n: int) -> np.ndarray:
        """The host copy of C for the check, one per size like the inputs: the D2H copy
        overwrites it whole, so reusing it across variants only saves the page faults of a
        fresh 64 MiB array (at 4096) per point."""
        return ctx.cache.one_per_slot("matmul_out", ("matmul_out", m, k, n),
                                      lambda: np.empty((m, n), np.float32))

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
            check, timing = self.verify_then_time(
                ctx, lambda: a @ b, lambda: check_product(a @ b, ref, tol), timer=WallTimer())
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
            queued = True
            if point.variant == "cublas":
                launch, timer, sync, extra = _cublas_launcher(gpu, a_d, b_d, c_d, m, k, n)
                queued = extra["queued"]
            else:
                func = kernel.function(f"matmul_{point.variant}")
                func.prepare("PPPiii")
                grid, block = launch_geometry(point)
                extra = {"grid": list(grid), "block": list(block)}

                def launch() -> None:
                    func.prepared_call(grid, block, a_d, b_d, c_d, m, n, k)

                timer, sync = gpu.event_timer(), gpu.synchronize

            check, timing = self.verify_then_time(
                ctx, launch, lambda out: check_product(out, ref, tol),
                output=(c_d, c), timer=timer, sync=sync, asynchronous=queued)
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
            out += self._tiling_expectation(gpu, big, at)
            if "tiled" in best and "register" in best:
                r = best["register"][1] / best["tiled"][1]
                out.append(Expectation(
                    f"register tiling is at least {REGISTER_GAIN}x faster than the best "
                    "shared-memory tiling at the largest size",
                    bool(r >= REGISTER_GAIN), f"best register / best tiled = {r:.2f}x at {at} "
                    f"({best['register'][0]} vs {best['tiled'][0]})"))
            out += self._padding_expectation(big, at)
            out += self._cublas_expectation(big, at, df)
            cpu = d[d["variant"] == "cpu"]
            common = set(cpu["size"]) & set(gpu["size"])
            if common:
                s = max(common, key=lambda x: cpu[cpu["size"] == x]["flops"].iloc[0])
                r = gpu[gpu["size"] == s]["gflops"].max() / cpu[cpu["size"] == s]["gflops"].max()
                out.append(Expectation(
                    f"the GPU is at least {GPU_VS_CPU:g}x faster than the CPU (numpy BLAS) on "
                    "the largest size both ran", bool(r >= GPU_VS_CPU),
                    f"best GPU / CPU = {r:.1f}x at {s}"))
            e2e = gpu.dropna(subset=["m_copy_share"]) if "m_copy_share" in gpu else gpu[:0]
            if not e2e.empty:
                small = e2e[e2e["flops"] == e2e["flops"].min()]
                sh = small["m_copy_share"].median()
                out.append(Expectation(
                    "copies (H2D + D2H) are more than 50% of the end-to-end time of the "
                    "smallest product", bool(sh > 0.5),
                    f"H2D + D2H = {100 * sh:.0f}% at {small['size'].iloc[0]}"))
        return out

    @staticmethod
    def _padding_expectation(big: pd.DataFrame, at: str) -> list[Expectation]:
        pad = big[big["variant"] == "tiled_padded"].set_index("p_tile")["gflops"]
        con = big[big["variant"] == "tiled_conflict"].set_index("p_tile")["gflops"]
        tiles = sorted(set(pad.index) & set(con.index))
        if not tiles:
            return []
        ratios = {int(t): float(pad[t] / con[t]) for t in tiles}
        # every tile conflicts (2-way at TILE 8 up to 32-way at 32), so padding must pay
        # at each of them
        return [Expectation(
            f"padded shared tiles are more than {PADDING_GAIN}x faster than the "
            "bank-conflicting layout, at every tile (all conflict) at the largest size",
            all(r > PADDING_GAIN for r in ratios.values()),
            f"tiled_padded / tiled_conflict at {at}: " + ", ".join(
                f"TILE {t}: {r:.2f}x" for t, r in sorted(ratios.items(), reverse=True)))]

    @staticmethod
    def _tiling_expectation(gpu: pd.DataFrame, big: pd.DataFrame,
                            at: str) -> list[Expectation]:
        """Tiled (best tile) vs naive, at the course's size and at the largest."""
        sizes = [at] + [s for s in [size_label(*COURSE_SIZE)]
                        if s != at and (gpu["size"] == s).any()]
        ratios = {}
        for s in sizes:
            best = _best_per_variant(gpu[gpu["size"] == s])
            if "naive" in best and "tiled" in best:
                ratios[s] = best["tiled"][1] / best["naive"][1]
        if not ratios:
            return []
        return [Expectation(
            f"shared-memory tiling (best tile) is at least {TILING_GAIN}x faster than the "
            f"naive kernel at the course's {size_label(*COURSE_SIZE)} and at the largest "
            "size", all(r >= TILING_GAIN for r in ratios.values()),
            "best tiled / naive = " + ", ".join(f"{r:.2f}x at {s}"
                                                for s, r in ratios.items()))]

    @staticmethod
    def _cublas_expectation(big: pd.DataFrame, at: str, df: pd.DataFrame) -> list[Expectation]:
        claim = ("cuBLAS SGEMM is the ceiling: no kernel here is faster at the largest size "
                 "(ratio <= 1)")
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
    """The rel_fro check of a product C against the float64 reference (base.rel_fro_error,
    blockwise: no float64 copy of C); NaN elements are looked for only when the error is
    not finite (a finite error means every element was written)."""
    err = base.rel_fro_error(c, ref)
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
        raise base.Skipped(got)
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

    Returns (launch, timer, sync, extra). On the legacy default stream (CuPy's unless
    CUPY_CUDA_PTDS=1) cuBLAS runs on the very stream pycuda's events and hold kernel use, and
    gemm with `out` given only enqueues the GEMM (its workspace is set up by the warm call
    before timing), so it is timed queued like the kernels (extra["queued"]); a stall there
    (a cudaFree inside cuBLAS) ends the hold by its timeout and the harness falls back, saying
    so. On another stream CuPy's own events time it, one call after the other.
    The device buffers are wrapped, not copied, so
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
    queued = int(stream.ptr) == 0

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
        "queued": queued,
    }
    return launch, gpu.event_timer() if queued else CupyEventTimer(cp), sync, extra


# -- expected effects: thresholds ----------------------------------------------------------
COURSE_SIZE = (160, 240, 320)  # the course's rectangular example, M x K . K x N
TILING_GAIN = 1.2  # tiled vs naive
REGISTER_GAIN = 1.2  # register-tiled vs tiled
PADDING_GAIN = 1.1  # padded vs conflicting tiles
GPU_VS_CPU = 10.0  # best GPU kernel vs numpy on the host

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
    """One panel per lesson on a numeric (log2) size axis for the square products, and
    the course's rectangular product as bars of its own: its flop count sits between two
    square sizes, and a category axis would space 160x240.240x320 and 4096 alike."""
    import matplotlib.pyplot as plt

    square = d[(d["p_m"] == d["p_k"]) & (d["p_k"] == d["p_n"])]
    rect = d[~d.index.isin(square.index)]
    cub = square[square["variant"] == "cublas"]
    pct = _pct_of_cublas(square)
    square = square.assign(legend=[pct.get(lab, lab) for lab in square["label"]],
                           config_order=[_config_order(r) for r in square.to_dict("records")])
    lessons = [(t, vs) for t, vs in PANELS if square["variant"].isin(vs).any()]
    if not lessons and rect.empty:
        lessons = [("cuBLAS", [])]
    n = len(lessons) + (not rect.empty)
    ncols = 2 if n > 1 else 1
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.7 * ncols, 5.3 * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax, (title, vs) in zip(flat, lessons):
        _lesson_panel(ax, square[square["variant"].isin(vs)], cub, title)
    if not rect.empty:
        _course_panel(flat[len(lessons)], rect)
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle("Matrix multiplication throughput (float32)")
    fig.tight_layout()
    return fig


def _pct_of_cublas(d: pd.DataFrame) -> dict[str, str]:
    """label -> legend text with its % of cuBLAS at the largest size both ran at."""
    cub = d[d["variant"] == "cublas"]
    pct: dict[str, str] = {}
    for lab, g in d[d["variant"] != "cublas"].groupby("label"):
        both = g[g["size"].isin(set(cub["size"]))]
        if not both.empty:
            row = both.loc[both["flops"].idxmax()]
            ref = cub[cub["size"] == row["size"]]["gflops"].max()
            pct[str(lab)] = f"{lab}: {100 * row['gflops'] / ref:.0f}% at {row['size']}"
    return pct


def _size_ticks(ax, sizes: list[int]) -> None:
    """Ticks at the measured sizes; of two sizes closer than a third of an octave (1000
    and 1024) only the power of two is labelled, so labels never collide."""
    from matplotlib.ticker import NullFormatter

    labelled: list[int] = []
    for s in sorted(sizes, key=lambda v: (v & (v - 1)) != 0):
        if all(abs(math.log2(s / t)) > 0.33 for t in labelled):
            labelled.append(s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(labelled), [str(s) for s in sorted(labelled)])
    ax.set_xticks([s for s in sizes if s not in labelled], minor=True)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _lesson_panel(ax, sub: pd.DataFrame, cub: pd.DataFrame, title: str) -> None:
    import seaborn as sns
    from matplotlib.lines import Line2D

    handles = []
    if not sub.empty:
        conflicts = set(sub["variant"]) <= {"tiled_conflict", "tiled_padded"}
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
        for e in hue_order:
            g = sub[sub["legend"] == e].sort_values("p_n")
            ax.plot(g["p_n"], g["gflops"], marker="o", ms=4, color=colors[e],
                    ls=":" if dotted[e] else "-")
        handles = [Line2D([], [], color=colors[e], marker="o", ms=4, label=e,
                          ls=":" if dotted[e] else "-") for e in hue_order]
    if not cub.empty:
        c = cub.sort_values("p_n")
        handles.append(ax.plot(c["p_n"], c["gflops"], ls="--", color="black", marker="s",
                               ms=4, label="cuBLAS SGEMM (ceiling)")[0])
        below = (sub.groupby("p_n")["gflops"].max().reindex(c["p_n"]).to_numpy()
                 > c["gflops"].to_numpy()) if not sub.empty else []
        small = [n for n, b in zip(c["p_n"], below) if b and n < 1000]
        if small:  # cuBLAS is no ceiling there: say so where it happens (caption: why)
            ax.axvspan(min(small) / 1.3, max(small) * 2, color="0.9", zorder=0, lw=0)
            ax.text(max(small) * 1.9, 0.97, "small n:\nlaunch-\nbound", fontsize=7.5,
                    transform=ax.get_xaxis_transform(), va="top", ha="right", color="0.3")
    sizes = sorted({int(v) for v in pd.concat([sub["p_n"], cub["p_n"]]).dropna()})
    if sizes:
        _size_ticks(ax, sizes)
    ax.set_yscale("log")
    ax.set(xlabel="matrix size n (n x n times n x n; log scale)", ylabel="GFLOP/s (log)",
           title=title)
    ax.legend(handles=handles, title="variant: % of cuBLAS" if not cub.empty else "variant",
              fontsize=7.5, title_fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=2 if len(handles) > 4 else 1, frameon=False)


def _course_panel(ax, rect: pd.DataFrame) -> None:
    """Best configuration of each variant at the rectangular product, as bars."""
    import seaborn as sns

    best = rect.loc[rect.groupby("variant")["gflops"].idxmax()]
    best = best.assign(order=[_config_order(r) for r in best.to_dict("records")])
    best = best.sort_values("order")
    colors = sns.color_palette("deep", len(best))
    ax.barh(range(len(best)), best["gflops"], color=colors)
    ax.set_yticks(range(len(best)), list(best["label"]), fontsize=8)
    ax.invert_yaxis()
    top = float(best["gflops"].max())
    ax.set_xlim(0, top * 1.45)
    for i, g in enumerate(best["gflops"]):
        ax.text(g + top * 0.02, i, fmt.flop_rate(g), va="center", fontsize=7.5)
    ax.set(xlabel="GFLOP/s (best configuration of each variant)",
           title=f"the course's product {rect['size'].iloc[0]}")


def _mkn(size: Any) -> tuple[int, int, int]:
    if isinstance(size, int):
        return size, size, size
    m, k, n = size
    return int(m), int(k), int(n)
