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
  cpu, cublas                   nothing else.
float64 points carry dtype=float64; float32 points carry no dtype parameter, so their ids
(and the recorded references) are those of the float32-only grid (the table's p_dtype is
filled with float32 by _frame).
cuBLAS is optional: where CuPy is not importable its points are recorded as "skipped".
"""

from __future__ import annotations

import functools
import hashlib
import html
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
LADDER_KERNELS = ["vec4", "dbuf", "warptile"]  # cuda/matmul_ladder.cu
GPU_VARIANTS = ["naive", *TILED, "register", *LADDER_KERNELS, "cublas"]
VARIANTS = ["cpu", *GPU_VARIANTS]
# The ladder figure's steps, in course order; each step shows its best configuration.
LADDER = ["naive", "tiled", "register", "vec4", "dbuf", "warptile", "cublas"]
DTYPES = ["float32", "float64"]
FP64_VARIANTS = ("naive", "tiled", "cublas")  # the float64 points: kernels built with REAL=double
ITEMSIZE = {"float32": 4, "float64": 8}

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
# vec4 and dbuf: the register tile with float4 loads; rt and bk multiples of 4
VEC4_RT = [4, 8]
VEC4_BK = [8, 16, 32]
DEFAULT_VEC4_TILES = [{"rt": 8, "bt": 128, "bk": 8}, {"rt": 8, "bt": 128, "bk": 16}]
# warptile: a small tile search (Kernel Tuner style) over these; the figure keeps the best
WARP_KEYS = ("bm", "bn", "bk", "wm", "wn", "wniter", "tm", "tn", "threads")
WARP_ENUMS: dict[str, list[int]] = {
    "bm": [32, 64, 128, 256], "bn": [32, 64, 128, 256], "bk": [8, 16, 32],
    "wm": [16, 32, 64, 128], "wn": [16, 32, 64, 128], "wniter": [1, 2, 4, 8],
    "tm": [4, 8], "tn": [4, 8], "threads": [64, 128, 256, 512],
}
MAX_WARP_ACC = 128  # outputs per thread (wm*wn/32): more do not fit 255 registers unspilled


def _wt(bm, bn, bk, wm, wn, wniter, tm, tn, threads) -> dict[str, int]:
    return dict(zip(WARP_KEYS, (bm, bn, bk, wm, wn, wniter, tm, tn, threads)))


DEFAULT_WARP_TILES = [
    _wt(128, 128, 16, 64, 64, 4, 8, 4, 128),  # the known-good FP32 start on Ampere/Hopper
    _wt(128, 128, 8, 64, 64, 4, 8, 4, 128),
    _wt(128, 128, 16, 32, 64, 2, 8, 4, 256),
    _wt(128, 64, 16, 64, 32, 2, 8, 4, 128),
    _wt(64, 128, 16, 32, 64, 2, 8, 4, 128),
]

def _tile_list(default: list[dict[str, int]], rts: list[int], bks: list[int],
               description: str) -> dict[str, Any]:
    """Schema of a list of {rt, bt, bk} tiles (register_tiles, vec4_tiles)."""
    return {
        "type": "array", "minItems": 1, "uniqueItems": True, "default": default,
        "description": description,
        "items": {
            "type": "object", "additionalProperties": False, "required": ["rt", "bt", "bk"],
            "properties": {
                "rt": {"enum": rts, "description": "each thread computes rt x rt elements of C"},
                "bt": {"enum": BT, "description": "each block computes a bt x bt tile of C"},
                "bk": {"enum": bks, "description": "k depth of the shared A and B slices"},
            },
        },
    }


_size = base.size_schema(3, 1, 65536, "a square size n (n x n . n x n) or [M, K, N] for "
                         "M x K . K x N")


def register_threads(rt: int, bt: int) -> int:
    """Threads of a matmul_register block: (BM / RM) * (BN / RN)."""
    return (bt // rt) ** 2


def register_smem_bytes(bt: int, bk: int) -> int:
    """Static shared memory of matmul_register: As[BK][BM + APAD] + Bs[BK][BN] floats."""
    return 4 * bk * ((bt + APAD) + bt)


def vec4_smem_bytes(bt: int, bk: int, buffers: int = 1) -> int:
    """Static shared memory of matmul_vec4 (1 buffer) and matmul_dbuf (2): per buffer
    As[BK][BM + APAD] + Bs[BK][BN] floats (cuda/matmul_ladder.cu)."""
    return buffers * register_smem_bytes(bt, bk)


def warp_geometry(t: dict[str, int]) -> dict[str, float]:
    """Derived numbers of a warp tile (cuda/matmul_ladder.cu): warps, WMITER, sub-tile
    WSUBM x WSUBN, threads of a warp along n (tcols), outputs per thread, shared bytes.
    Fractions where the tile is inconsistent (check_warp_tile says why)."""
    warps = (t["bm"] / t["wm"]) * (t["bn"] / t["wn"])
    wmiter = t["wm"] * t["wn"] / (32 * t["tm"] * t["tn"] * t["wniter"])
    wsubn = t["wn"] / t["wniter"]
    return {"warps": warps, "wmiter": wmiter, "wsubm": t["wm"] / wmiter if wmiter else 0.0,
            "wsubn": wsubn, "tcols": wsubn / t["tn"], "acc": t["wm"] * t["wn"] / 32,
            "smem": 4 * t["bk"] * (t["bm"] + APAD + t["bn"])}


def check_warp_tile(t: dict[str, int]) -> list[str]:
    """Why a warp tile cannot be compiled or launched (the kernel's static_asserts, the
    1024-thread and 48 KiB limits), one message per broken rule ([] : it is fine)."""
    g = warp_geometry(t)
    out = []
    if t["bm"] % t["wm"] or t["bn"] % t["wn"]:
        out.append(f"bm={t['bm']} must be a multiple of wm={t['wm']} and bn={t['bn']} of "
                   f"wn={t['wn']}")
    elif t["threads"] != g["warps"] * 32:
        out.append(f"threads={t['threads']} must be (bm/wm)*(bn/wn)*32 = "
                   f"({t['bm']}/{t['wm']})*({t['bn']}/{t['wn']})*32 = {int(g['warps'] * 32)}")
    if (t["wm"] * t["wn"]) % (32 * t["tm"] * t["tn"] * t["wniter"]):
        out.append(f"wm*wn = {t['wm'] * t['wn']} must be a multiple of 32*tm*tn*wniter = "
                   f"{32 * t['tm'] * t['tn'] * t['wniter']} (a warp's 32 threads cover its "
                   "tile in whole sub-tiles)")
    elif t["wn"] % t["wniter"] or g["wsubn"] % t["tn"] or 32 % g["tcols"]:
        out.append(f"wn/wniter = {g['wsubn']:g} must be a multiple of tn={t['tn']} and "
                   f"wn/wniter/tn = {g['tcols']:g} must divide 32")
    if g["smem"] > MAX_STATIC_SMEM:
        out.append(f"needs {int(g['smem'])} bytes of static shared memory (A {t['bk']}x"
                   f"{t['bm'] + APAD} + B {t['bk']}x{t['bn']} floats); at most "
                   f"{MAX_STATIC_SMEM} (48 KiB): use a smaller bk, bm or bn")
    if g["acc"] > MAX_WARP_ACC:
        out.append(f"wm*wn/32 = {g['acc']:g} outputs per thread; at most {MAX_WARP_ACC} fit "
                   "the 255 registers of a thread without spilling: use a smaller wm or wn")
    return out


# -- double precision ------------------------------------------------------------------------
# FP64 : FP32 throughput of the CUDA cores by compute capability (CUDA C++ Programming
# Guide, "Arithmetic Instructions": 64-bit fma results per clock per SM against 32-bit).
# GA100 / GH100 (and V100) are the HPC parts with full-rate FP64 units; the consumer and
# workstation chips (sm_86, sm_89, sm_120) have 1:64. cuBLAS DGEMM may also use the FP64
# tensor cores of sm_80 / sm_90 (DMMA), which double the FP64 rate of GH100 and GA100.
FP64_RATIO = {"7.0": 1 / 2, "8.0": 1 / 2, "9.0": 1 / 2, "8.6": 1 / 64, "8.9": 1 / 64,
              "12.0": 1 / 64}
# FP64 tensor cores (DMMA, which cuBLAS DGEMM uses) against the FP32 CUDA cores: GA100 and
# GH100 run FP64 matrix products at the FP32 rate (A100 19.5 / 19.5, H100 SXM 67 / 67
# TFLOP/s), twice their CUDA cores' FP64. Seen on the H100: DGEMM 63.0 TFLOP/s at 4096.
FP64_TENSOR_RATIO = {"8.0": 1.0, "9.0": 1.0}


def fp64_ratio(cc: Any) -> float | None:
    """FP64:FP32 rate of the CUDA cores of a compute capability ("9.0", (9, 0), "sm_90"),
    None where cudalab does not know it."""
    from cudalab import devicespec

    try:
        return FP64_RATIO.get(devicespec.cc_key(cc))
    except ValueError:
        return None


def fp64_peak_ratio(cc: Any, variant: str) -> tuple[float | None, str]:
    """(FP64 peak / FP32 peak, which units) a float64 point is judged against: cuBLAS DGEMM
    against the FP64 tensor cores where the GPU has them, kernels against the CUDA cores."""
    from cudalab import devicespec

    try:
        key = devicespec.cc_key(cc)
    except ValueError:
        return None, ""
    if variant == "cublas" and key in FP64_TENSOR_RATIO:
        return FP64_TENSOR_RATIO[key], "FP64 tensor cores"
    r = FP64_RATIO.get(key)
    return r, ("FP64 CUDA cores" if r is not None else "")


def ratio_text(r: float | None) -> str:
    return "unknown" if r is None else f"1:{1 / r:.0f}"


class Matmul(Experiment):
    name = "matmul"
    order = 30
    title = ("Matrix multiplication: global memory, shared-memory tiles, registers, the "
             "ladder to cuBLAS, double precision")
    caption = (
        "Each thread of the naive kernel issues 2K global loads (a row of A and a column of "
        "B) for 2K flops; neighbouring threads share rows of A and columns of B, so most of "
        "those loads are served by the L1 and L2 caches, not by DRAM (with profile.ncu on, "
        "the L2 hit rate says how many: it falls once the matrices outgrow the L2), and "
        "what limits the kernel is the load traffic "
        "through the caches. The tiled kernel loads TILE x TILE tiles of A "
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
        "The ladder goes on toward cuBLAS: vec4 moves tiles with 128-bit loads, dbuf "
        "overlaps the next tile's loads with the current tile's math, warptile gives each "
        "warp its own sub-tile (each step is explained in the ladder table). "
        "cuBLAS SGEMM (through CuPy, plain FP32: no TF32, whose 10-bit mantissa would fail "
        "the correctness check) is the ceiling. In double precision (naive, tiled, cuBLAS "
        "DGEMM) the same kernels run at the GPU's FP64 rate: half the FP32 rate on GH100 and "
        "GA100, 1/64 on consumer chips; DGEMM may use the FP64 tensor cores (sm_80, sm_90) "
        "and so exceed the CUDA cores' FP64 peak it is compared with. "
        "Look for: tiled at least 1.2x above naive (at the course's 160x240.240x320 and at "
        "the largest size) and register above tiled at large sizes, the best hand-written "
        "kernel at 80 % of cuBLAS or more at the largest size, padded more than 1.1x "
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
            "dtypes": {**base.choices_schema(
                DTYPES, "element types; float64 runs only naive, tiled and cublas (DGEMM); "
                "config.yaml asks for both"), "default": ["float32"]},
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
        "dtypes": ["float32", "float64"],
    }
    figures = {
        "ladder": "The ladder from the naive kernel to cuBLAS SGEMM, float32: TFLOP/s of "
        "each step's best configuration at the largest square size (top) and at the "
        "course's 160x240.240x320 (bottom); each bar is labelled with its % of cuBLAS "
        "(same run) and % of the GPU's FP32 peak. The ladder table below gives each step's "
        "registers, shared memory and occupancy.",
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
        ("matmul.warp_tiles: [{bm: 128, bn: 128, bk: 16, wm: 64, wn: 64, wniter: 4, tm: 8, "
         "tn: 4, threads: 128}, {bm: 64, bn: 64, bk: 16, wm: 32, wn: 32, wniter: 1, tm: 4, "
         "tn: 8, threads: 128}]", "a large and a small warp tile: the small one has 4x the "
         "blocks (better at the course's size, where 128x128 tiles leave most SMs idle) but "
         "re-reads A and B twice as often from L2, so it falls behind at 4096"),
        ("measurement.cold_l2: true", "the naive kernel loses most: its re-reads of A and "
         "B were served by the 50 MiB L2; the tiled kernels, which reuse data in shared "
         "memory, lose less, so the tiling gain grows"),
        ("matmul.tiles: [8]", "only TILE 8: 8x less reuse per load than TILE 32 and only 64 "
         "threads per block; tiled falls towards naive and the tiling check may fail"),
    ]
    questions = [
        "What does double buffering overlap, and why does it need twice the shared memory?",
        "How many global-memory loads does the naive kernel make per output element, and "
        "how many does a TILE x TILE tiled kernel make?",
        "Why does padding the shared tile by one float remove the bank conflict?",
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
            msgs += _check_register_tile(f"register_tiles[{i}]", rt, RT, buffers=1)
        for i, rt in enumerate(block.get("vec4_tiles", [])):
            msgs += _check_register_tile(f"vec4_tiles[{i}]", rt, VEC4_RT, buffers=2)
        for i, wt in enumerate(block.get("warp_tiles", [])):
            msgs += [f"warp_tiles[{i}]: {m}" for m in check_warp_tile(wt)]
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
        return [{}]  # cublas

    def compile_variants(self, config: dict[str, Any] | None) -> list[base.CompileVariant]:
        """matmul_register, matmul_vec4, matmul_dbuf and matmul_warptile exist only under
        their tile's -D defines: one variant per tile of the run's block (or the defaults)."""
        blk = self.settings_in(config)
        tiles = {"register": blk.get("register_tiles") or DEFAULT_REGISTER_TILES,
                 "vec4": blk.get("vec4_tiles") or DEFAULT_VEC4_TILES,
                 "warptile": blk.get("warp_tiles") or DEFAULT_WARP_TILES}
        out = []
        for v in ("register", "vec4", "dbuf", "warptile"):
            for t in tiles["vec4" if v == "dbuf" else v]:
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
                extra = {"grid": list(grid), "block": list(block)}
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
            if ctx.block["end_to_end"] and point.variant == "tiled" and dtype == "float32":
                phases, e2e = self._end_to_end(ctx, a, b, c, a_d, b_d, c_d, timing)
                metrics |= e2e
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
    def _frame(self, df: pd.DataFrame, dtype: str | None = "float32") -> pd.DataFrame:
        """The ok rows of one dtype (None: all), with size, label and p_dtype (float32
        where a point has no dtype parameter)."""
        d = self.ok(df).copy()
        d["p_dtype"] = (d["p_dtype"].fillna("float32") if "p_dtype" in d else "float32")
        if dtype is not None:
            d = d[d["p_dtype"] == dtype].copy()
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

    # -- expected effects --------------------------------------------------------------
    def expectations(self, df: pd.DataFrame) -> list[Expectation]:
        d = self._frame(df)
        out = []
        all_rows = df[df["variant"] != "cpu"]
        skipped = all_rows[all_rows["status"] == "skipped"]
        judged = base.measured(all_rows[all_rows["status"] != "skipped"])
        bad = judged[judged["status"] != "ok"]
        note = base.not_measured_note(all_rows)
        if len(skipped):
            note += f"; {len(skipped)} skipped ({skipped['reason'].iloc[0]})"
        claim = "every GPU result matches the float64 CPU reference"
        out.append(base.unmeasured(claim, all_rows, "GPU point") or Expectation(
            claim, len(judged) > 0 and bad.empty,
            f"{len(judged) - len(bad)}/{len(judged)} GPU points correct{note}",
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
            out += _ladder_expectation(gpu, df)
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


def _check_register_tile(key: str, rt: dict[str, int], rts: list[int],
                         buffers: int) -> list[str]:
    """Thread-count and shared-memory rules of a {rt, bt, bk} tile; `buffers` 2: the
    tile is also dbuf's, which holds two copies of the shared slices."""
    r, b, k = rt["rt"], rt["bt"], rt["bk"]
    threads = register_threads(r, b)
    gives = f"{key}: rt={r}, bt={b} gives ({b}/{r})^2 = {threads} threads per block; "
    msgs = []
    if threads > MAX_THREADS:
        msgs.append(gives + f"at most {MAX_THREADS} are allowed: bt/rt <= 32, so for "
                    f"bt={b} use rt >= {max(b // 32, 1)} (allowed rt: {rts})")
    if threads < MIN_THREADS:
        msgs.append(gives + f"at least {MIN_THREADS} are needed (bt/rt >= 8): smaller "
                    "blocks leave warps partly empty and their unrolled tile loads "
                    f"spill registers; for rt={r} use bt >= {8 * r}")
    smem = vec4_smem_bytes(b, k, buffers)
    if smem > MAX_STATIC_SMEM:
        what = "" if buffers == 1 else f"{buffers} buffers (dbuf) of "
        msgs.append(
            f"{key}: bt={b}, bk={k} needs {smem} bytes of static shared memory per "
            f"block ({what}A {k}x{b + APAD} + B {k}x{b} floats); at most {MAX_STATIC_SMEM} "
            f"(48 KiB) are allowed: use a smaller bk or bt")
    return msgs


# -- kernels and launch geometry -----------------------------------------------------------
def _dtype(point: Point) -> str:
    return str(point.params.get("dtype", "float32"))


def _itemsize(point: Point) -> int:
    return ITEMSIZE[_dtype(point)]


def kernel_source(point: Point) -> str:
    """The file in cuda/ a point's kernel is compiled from."""
    return "matmul_ladder.cu" if point.variant in LADDER_KERNELS else "matmul.cu"


def kernel_defines(point: Point) -> dict[str, Any]:
    """nvcc -D defines of the module a point's kernel comes from."""
    p = point.params
    real = {"REAL": "double"} if _dtype(point) == "float64" else {}
    if point.variant in TILED:
        return {"TILE": p["tile"]} | real
    if point.variant == "register":
        return {"BM": p["bt"], "BN": p["bt"], "BK": p["bk"], "RM": p["rt"], "RN": p["rt"]}
    if point.variant in ("vec4", "dbuf"):
        return {"BM": p["bt"], "BN": p["bt"], "BK": p["bk"], "TM": p["rt"], "TN": p["rt"]}
    if point.variant == "warptile":
        return {k.upper() if k != "threads" else "NTHREADS": int(p[k]) for k in WARP_KEYS}
    return real


def launch_geometry(point: Point) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(grid, block) of a kernel point: a block per output tile, rounded up."""
    p = point.params
    m, n = p["m"], p["n"]
    if point.variant == "register":
        bt, rt = p["bt"], p["rt"]
        return (-(-n // bt), -(-m // bt)), (bt // rt, bt // rt, 1)
    if point.variant in ("vec4", "dbuf"):  # 1-D blocks: tx = tid % (BN/TN)
        bt, rt = p["bt"], p["rt"]
        return (-(-n // bt), -(-m // bt)), (register_threads(rt, bt), 1, 1)
    if point.variant == "warptile":
        return (-(-n // p["bn"]), -(-m // p["bm"])), (p["threads"], 1, 1)
    t = p["tile"]
    return (-(-n // t), -(-m // t)), (t, t, 1)


def kernel_resources(gpu: Any, func: Any, threads: int) -> dict[str, Any]:
    """Registers and static shared memory of a loaded kernel (pycuda Function.num_regs,
    shared_size_bytes) and the occupancy they allow at this block size (cudalab's
    calculator); {} where the function does not say (a stand-in)."""
    regs, smem = getattr(func, "num_regs", None), getattr(func, "shared_size_bytes", None)
    if regs is None or smem is None:
        return {}
    out: dict[str, Any] = {"regs": int(regs), "smem_bytes": int(smem), "threads": int(threads)}
    try:
        from cudalab import occupancy

        cc = gpu.info["compute_capability"]
        out["occupancy"] = occupancy.occupancy(cc, threads, int(regs), int(smem)).occupancy
    except Exception:  # noqa: BLE001 - a compute capability the limits table lacks
        pass
    return out


def fp64_metrics(gpu: Any, flops: float, seconds: float,
                 variant: str = "naive") -> dict[str, float]:
    """The FP64 peak this point is judged against (FP32 peak x fp64_peak_ratio: the FP64
    tensor cores for cuBLAS DGEMM where the GPU has them, else the CUDA cores) and this
    point's % of it; {} where the ratio or the FP32 peak is unknown."""
    from cudalab import devicespec

    try:
        ratio, _ = fp64_peak_ratio(gpu.info["compute_capability"], variant)
        peak32 = devicespec.device_peaks(gpu)["peak_fp32_gflops"]
    except Exception:  # noqa: BLE001 - no device facts (a stand-in)
        return {}
    if ratio is None or not math.isfinite(peak32) or not seconds > 0:
        return {}
    peak = peak32 * ratio
    return {"peak_fp64_gflops": peak, "pct_peak_fp64": 100 * flops / seconds / 1e9 / peak}


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


def _gemm_name(dtype: str) -> str:
    return "DGEMM" if dtype == "float64" else "SGEMM"


def _cublas_info(dtype: str = "float32") -> Any:
    """A Kernel-like record for provenance and the cache key: CuPy's and cuBLAS's versions."""
    from cudalab.gpu import Kernel

    cp, _, cublas = _cupy()
    try:
        cublas_version = str(cublas.getVersion(cp.cuda.device.get_cublas_handle()))
    except Exception:  # noqa: BLE001 - no handle yet / older CuPy
        cublas_version = "unknown"
    name = _gemm_name(dtype)
    ident = (f"cublas{name.capitalize()} CUBLAS_DEFAULT_MATH cupy={cp.__version__} "
             f"cublas={cublas_version}")
    return Kernel(module=None, source_file=f"cuBLAS {name} via CuPy", options=[],
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


def _cublas_launcher(gpu, a_d, b_d, c_d, m, k, n, dtype="float32"):
    """cublasSgemm (cublasDgemm for float64) on the job's pycuda buffers, on the job's
    (primary) context.

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

    dt = getattr(cp, dtype)

    def wrap(ptr: Any, shape: tuple[int, int]) -> Any:
        nbytes = ITEMSIZE[dtype] * shape[0] * shape[1]
        mem = cp.cuda.UnownedMemory(int(ptr), nbytes, ptr, gpu.index)
        return cp.ndarray(shape, dt, cp.cuda.MemoryPointer(mem, 0))

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
        "library": f"cuBLAS cublas{_gemm_name(dtype).capitalize()} via cupy.cublas.gemm",
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

LADDER_GAIN = 0.8  # best hand-written kernel vs cuBLAS SGEMM, largest square size
LADDER_MIN_STEPS = 2  # steps measured at a size before the ladder figure shows it

# -- figures -------------------------------------------------------------------------------
PANELS = [
    ("global memory vs shared-memory tiles", ["cpu", "naive", "tiled"]),
    ("bank conflicts: padded vs conflicting tile", ["tiled_conflict", "tiled_padded"]),
    ("register tiling", ["register"]),
    ("toward cuBLAS: float4, double buffer, warp tiles", LADDER_KERNELS),
]

# One paragraph per step of the ladder (the report's ladder table): what it changes, what
# it buys.
LADDER_NOTES = {
    "naive": "One thread per element of C, operands read from global memory: 2K loads for "
             "2K flops. The caches catch most of them (neighbours share rows and columns), "
             "but every flop still waits on a load through L1.",
    "tiled": "A block stages TILE x TILE tiles of A and B in shared memory and every thread "
             "reuses each staged value TILE times: global loads drop by the tile factor; now "
             "one shared-memory load feeds one FMA.",
    "register": "Each thread computes an rt x rt block of C in registers (unroll-and-jam): "
                "per k it loads rt values of A and rt of B from shared memory and does "
                "rt*rt FMAs, so the FMA units, not the shared-memory port, set the pace.",
    "vec4": "The register tile with 128-bit (float4) global loads and stores, and A stored "
            "transposed (As[k][m]) so a thread reads its A and B values from shared memory "
            "as float4 too: a quarter of the load instructions, conflict-free (neighbouring "
            "threads read neighbouring float4s). Edge tiles and rows whose length is no "
            "multiple of 4 fall back to guarded scalar loads.",
    "dbuf": "vec4 with two shared buffers: while the block multiplies one tile pair, the "
            "next is loaded into the other (B by cp.async straight into shared memory on "
            "sm_80+, A through registers because it is stored transposed), so load latency "
            "hides behind the math and one barrier per tile remains instead of two.",
    "warptile": "Warp tiling: each warp owns a WM x WN sub-tile of the block tile and each "
                "thread TM x TN outputs in each of its WMITER x WNITER sub-sub-tiles. A "
                "warp's shared-memory reads stay inside its own rows and columns (broadcasts, "
                "register reuse across sub-tiles): the structure of cuBLAS/CUTLASS kernels, "
                "on the CUDA cores.",
    "cublas": "cuBLAS SGEMM through CuPy, plain FP32 (no TF32): NVIDIA's tuned kernel for "
              "this GPU, the ceiling of the ladder.",
}


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
        return f"cuBLAS {_gemm_name(str(r.get('p_dtype') or 'float32'))}"
    if v in ("register", "vec4", "dbuf"):
        return f"{v} {i('rt')}x{i('rt')} ({i('bt')}x{i('bt')}x{i('bk')})"
    if v == "warptile":
        return (f"warptile {i('bm')}x{i('bn')}x{i('bk')} w{i('wm')}x{i('wn')}/{i('wniter')} "
                f"t{i('tm')}x{i('tn')}")
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
            num("tile"), num("rt"), num("bt"), num("bm"), num("bn"), num("bk"), num("wm"),
            num("wn"), num("wniter"), num("tm"), num("tn"))


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
              # two columns of the long warp-tile labels would run off the panel
              ncol=2 if len(handles) > 4 and max(len(str(h.get_label())) for h in handles)
              <= 40 else 1, frameon=False)


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


# -- the ladder ----------------------------------------------------------------------------
def _largest_square(d: pd.DataFrame) -> str | None:
    sq = d[(d["p_m"] == d["p_k"]) & (d["p_k"] == d["p_n"])]
    return None if sq.empty else str(sq.loc[sq["flops"].idxmax(), "size"])


def _num(r: Any, col: str) -> float:
    v = r.get(col) if hasattr(r, "get") else None
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def ladder_at(d: pd.DataFrame, size: str) -> list[dict[str, Any]]:
    """The ladder's steps at one size (float32 rows of _frame): the best configuration of
    each step in LADDER order, with its % of cuBLAS (same run, same size; NaN without
    cuBLAS), % of the FP32 peak and the kernel's registers, shared memory, occupancy."""
    at = d[(d["size"] == size) & d["variant"].isin(LADDER)]
    cub = at[at["variant"] == "cublas"]["gflops"].max() if (at["variant"] == "cublas").any() \
        else math.nan
    rows = []
    for v in LADDER:
        g = at[at["variant"] == v]
        if g.empty:
            continue
        top = g.loc[g["gflops"].idxmax()]
        rows.append({"step": v, "size": size, "label": str(top["label"]),
                     "gflops": float(top["gflops"]), "pct_cublas": 100 * top["gflops"] / cub,
                     "pct_peak": _num(top, "pct_peak_gflops"), "regs": _num(top, "m_regs"),
                     "smem": _num(top, "m_smem_bytes"), "occupancy": _num(top, "m_occupancy")})
    return rows


def ladder_rows(d: pd.DataFrame) -> list[dict[str, Any]]:
    """The ladder at the largest square size ([] without square products)."""
    size = _largest_square(d)
    return [] if size is None else ladder_at(d, size)


def _ladder_expectation(gpu: pd.DataFrame, df: pd.DataFrame) -> list[Expectation]:
    """Best hand-written kernel vs cuBLAS SGEMM at the largest square size; made only where
    a kernel past register tiling was measured (the claim is the ladder's)."""
    size = _largest_square(gpu)
    if size is None:
        return []
    at = gpu[gpu["size"] == size]
    if not at["variant"].isin(LADDER_KERNELS).any():
        return []
    claim = (f"the best hand-written kernel reaches at least {100 * LADDER_GAIN:.0f}% of "
             "cuBLAS SGEMM at the largest square size")
    cub = at[at["variant"] == "cublas"]
    if cub.empty:
        why = df[df["variant"] == "cublas"]["reason"].dropna()
        return [Expectation(claim, None, f"cuBLAS not measured at {size}"
                            + (f": {why.iloc[0]}" if len(why) else ""))]
    mine = at[~at["variant"].isin(["cublas", "cpu"])]
    top = mine.loc[mine["gflops"].idxmax()]
    r = float(top["gflops"] / cub["gflops"].max())
    return [Expectation(claim, bool(r >= LADDER_GAIN),
                        f"{top['label']}: {fmt.flop_rate(top['gflops'])} = {100 * r:.0f}% of "
                        f"cuBLAS ({fmt.flop_rate(cub['gflops'].max())}) at {size}")]


def _cell(x: float, f: Callable[[float], str]) -> str:
    return "–" if not math.isfinite(x) else f(x)


def _ladder_table_html(steps: list[dict[str, Any]]) -> str:
    head = ("<tr><th>step</th><th>what it changes, what it buys</th><th>best configuration"
            "</th><th>TFLOP/s</th><th>% of cuBLAS</th><th>% of FP32 peak</th>"
            "<th>registers</th><th>shared memory</th><th>occupancy</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['step'])}</td><td>{html.escape(LADDER_NOTES[r['step']])}</td>"
        f"<td>{html.escape(r['label'])}</td><td>{r['gflops'] / 1e3:.1f}</td>"
        f"<td>{_cell(r['pct_cublas'], lambda x: f'{x:.0f} %')}</td>"
        f"<td>{_cell(r['pct_peak'], lambda x: f'{x:.0f} %')}</td>"
        f"<td>{_cell(r['regs'], lambda x: f'{x:.0f}')}</td>"
        f"<td>{_cell(r['smem'], lambda x: f'{x / 1024:.1f} KiB')}</td>"
        f"<td>{_cell(r['occupancy'], lambda x: f'{100 * x:.0f} %')}</td></tr>"
        for r in steps)
    return f'<table class="kv">{head}{body}</table>'


def fp64_summary(d: pd.DataFrame) -> dict[str, Any] | None:
    """FP64 against FP32 per size and variant (best configuration of each), the theoretical
    FP64:FP32 ratio of the run's GPU and cuBLAS DGEMM / SGEMM at the largest size both
    ran; None without float64 rows. d: _frame(df, None)."""
    f64 = d[d["p_dtype"] == "float64"]
    if f64.empty:
        return None
    ccs = d["compute_capability"].dropna() if "compute_capability" in d else pd.Series([])
    cc = str(ccs.iloc[0]) if len(ccs) else ""
    rows = []
    for (size, v), g in f64.groupby(["size", "variant"], sort=False):
        top = g.loc[g["gflops"].idxmax()]
        f32 = d[(d["p_dtype"] == "float32") & (d["size"] == size) & (d["variant"] == v)]
        g32 = float(f32["gflops"].max()) if not f32.empty else math.nan
        # % of the FP64 peak of the units the point runs on, from the FP32 peak recorded
        # with it (records made before the tensor-core peak was known are judged right too)
        ratio, _ = fp64_peak_ratio(cc, v) if cc else (None, "")
        peak32 = _num(top, "m_peak_fp64_gflops") / (fp64_ratio(cc) or math.nan)
        pct = (100 * float(top["gflops"]) / (peak32 * ratio) if ratio and peak32 > 0
               else _num(top, "m_pct_peak_fp64"))
        rows.append({"size": size, "variant": v, "flops": float(top["flops"]),
                     "gflops64": float(top["gflops"]), "gflops32": g32, "pct_peak_fp64": pct})
    rows.sort(key=lambda r: (r["flops"], LADDER.index(r["variant"])))
    both = [r for r in rows if r["variant"] == "cublas" and math.isfinite(r["gflops32"])]
    measured = None
    if both:
        b = max(both, key=lambda r: r["flops"])
        measured = (b["size"], b["gflops64"] / b["gflops32"])
    theory = fp64_ratio(cc) if cc else None
    return {"cc": cc, "theory": theory, "measured": measured, "rows": rows}


def _fp64_table_html(s: dict[str, Any]) -> str:
    meas = "not measured (cuBLAS DGEMM and SGEMM at one size)"
    if s["measured"] is not None:
        size, r = s["measured"]
        meas = f"cuBLAS DGEMM / SGEMM = {r:.2f}" + (f" (1:{1 / r:.1f})" if r < 1 else "") \
            + f" at {size}"
    tensor, _ = fp64_peak_ratio(s["cc"], "cublas") if s["cc"] else (None, "")
    dmma = ("" if tensor is None or tensor == s["theory"] else
            f" cuBLAS DGEMM runs on the FP64 tensor cores (DMMA), which on this GPU do FP64 "
            f"matrix products at {ratio_text(tensor) if tensor < 1 else 'the FP32 rate'}: "
            f"that is why it beats SGEMM, and its % is of that peak; the hand-written "
            f"kernels use the CUDA cores.")
    lead = (f"<p>FP64:FP32 of the CUDA cores of this GPU (compute capability "
            f"{html.escape(s['cc'] or '?')}): {ratio_text(s['theory'])}; measured: "
            f"{html.escape(meas)}.{html.escape(dmma)}</p>")
    head = ("<tr><th>size</th><th>variant</th><th>float64</th><th>float32</th>"
            "<th>FP64 / FP32</th><th>% of FP64 peak</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['size'])}</td><td>{html.escape(r['variant'])}</td>"
        f"<td>{fmt.flop_rate(r['gflops64'])}</td>"
        f"<td>{_cell(r['gflops32'], fmt.flop_rate)}</td>"
        f"<td>{_cell(r['gflops64'] / r['gflops32'], lambda x: f'{x:.2f}')}</td>"
        f"<td>{_cell(r['pct_peak_fp64'], lambda x: f'{x:.0f} %')}</td></tr>"
        for r in s["rows"])
    return f'{lead}<table class="kv">{head}{body}</table>'


def _plot_ladder(d: pd.DataFrame):
    """Horizontal bars, one per step, at the largest square size and at the course's
    product; each labelled with TFLOP/s, % of cuBLAS and % of the FP32 peak."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    course = size_label(*COURSE_SIZE)
    big = _largest_square(d)
    panels = [(f"largest square product: n = {big}", ladder_at(d, big)) if big else ("", []),
              (f"the course's product {course}", ladder_at(d, course))]
    # one step is no ladder
    panels = [(t, rows) for t, rows in panels if len(rows) >= LADDER_MIN_STEPS]
    if not panels:
        return None
    heights = [len(rows) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.6 + 0.42 * sum(heights)
                                                      + 0.9 * len(panels)),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    colors = dict(zip(LADDER, sns.color_palette("deep", len(LADDER))))
    colors["cublas"] = (0.25, 0.25, 0.25)
    for ax, (title, rows) in zip(axes[:, 0], panels):
        tf = [r["gflops"] / 1e3 for r in rows]
        ax.barh(range(len(rows)), tf, color=[colors[r["step"]] for r in rows])
        ax.set_yticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        top = max(tf)
        ax.set_xlim(0, top * 1.75)
        for i, r in enumerate(rows):
            parts = [fmt.flop_rate(r["gflops"])]
            if math.isfinite(r["pct_cublas"]) and r["step"] != "cublas":
                parts.append(f"{r['pct_cublas']:.0f}% of cuBLAS")
            if math.isfinite(r["pct_peak"]):
                parts.append(f"{r['pct_peak']:.0f}% of FP32 peak")
            ax.text(tf[i] + top * 0.02, i, ", ".join(parts), va="center", fontsize=7.5)
        ax.set(xlabel="TFLOP/s (float32, best configuration of each step)", title=title)
    fig.suptitle("The matmul ladder: from the naive kernel to cuBLAS SGEMM")
    fig.tight_layout()
    return fig
