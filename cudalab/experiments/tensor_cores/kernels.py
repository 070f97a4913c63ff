"""The hand-written tensor-core kernels: which precisions each runs, their tile
configurations, the rules a configuration must keep, and how each is built and launched.

  wmma   cuda/tensor_cores/tensor_core_wmma.cu   nvcuda::wmma fragments, 128 x 128 block tiles, one
                                    shared-memory stage (fp16, bf16, tf32)
  mma    cuda/tensor_cores/tensor_core_mma.cu
                                 mma.sync.m16n8k16 from ldmatrix, cp.async STAGES deep,
                                    tiles set by -D (fp16, bf16)
  wgmma_tma, wgmma_pipe, wgmma_ws, wgmma_persist
         cuda/tensor_cores/wgmma.cu Hopper's warpgroup MMA on TMA-loaded tiles, sm_90a only
                                    (fp16, bf16, tf32): the rungs of wgmma.py
"""

from __future__ import annotations

from typing import Any

from cudalab.experiments.base import Point
from cudalab.experiments.tensor_cores import wgmma

VARIANTS = ["wmma", "mma", *wgmma.RUNGS, "cublas"]
# What a block without `variants` runs. The wgmma rungs are in since their run on an H200
# (all four correct in every precision, memcheck and racecheck clean); before sm_90 they are
# "not applicable" with the reason, so the default stays safe on older GPUs.
SHIPPED_VARIANTS = VARIANTS
# Precisions each variant runs; cuBLAS runs all, FP32 SGEMM being the CUDA-core baseline.
RUNS = {"wmma": ("tf32", "fp16", "bf16"), "mma": ("fp16", "bf16"),
        **{r: wgmma.PRECISIONS for r in wgmma.RUNGS},
        "cublas": ("fp32", "tf32", "fp16", "bf16")}
ITEMSIZE = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
WMMA_TILE = 128  # block tile of the WMMA kernels (M and N); K slices of 32
WMMA_BK = 32
WMMA_THREADS = 256
MMA_KEYS = ("bm", "bn", "bk", "wm", "wn", "stages")
MMA_ENUMS = {"bm": [64, 128, 256], "bn": [64, 128, 256], "bk": [32, 64],
             "wm": [32, 64], "wn": [32, 64], "stages": [2, 3, 4, 5]}
DEFAULT_MMA_TILES = [
    {"bm": 128, "bn": 128, "bk": 64, "wm": 64, "wn": 64, "stages": 3},
    {"bm": 128, "bn": 128, "bk": 32, "wm": 64, "wn": 64, "stages": 4},
    {"bm": 128, "bn": 256, "bk": 64, "wm": 64, "wn": 64, "stages": 3},
    {"bm": 128, "bn": 128, "bk": 32, "wm": 64, "wn": 32, "stages": 4},
    {"bm": 128, "bn": 256, "bk": 32, "wm": 64, "wn": 64, "stages": 4},
]
MAX_SMEM_OPTIN = 227 * 1024  # bytes of shared memory a block may opt into on sm_90
MAX_THREADS = 1024
REGS_PER_SM = 65536
FRAGMENT_REGS = 64  # registers beside the accumulators: fragments, addresses, loop state
SIZE_MULTIPLE = 256  # every dimension: a multiple of the largest block tile


def mma_threads(t: dict[str, Any]) -> int:
    return (t["bm"] // t["wm"]) * (t["bn"] // t["wn"]) * 32


def mma_regs_estimate(t: dict[str, Any]) -> int:
    """Registers a thread needs, about: its wm*wn/32 FP32 accumulators and the rest."""
    return t["wm"] * t["wn"] // 32 + FRAGMENT_REGS


def mma_smem_bytes(t: dict[str, Any]) -> int:
    """Dynamic shared memory of the mma kernel: STAGES x (A slice + B slice), 2-byte
    elements, rows padded by 8 elements."""
    return t["stages"] * 2 * (t["bm"] * (t["bk"] + 8) + t["bk"] * (t["bn"] + 8))


def check_mma_tile(t: dict[str, Any]) -> list[str]:
    """What is wrong with an mma tile configuration ([] if nothing)."""
    msgs = []
    if t["bm"] % t["wm"] or t["bn"] % t["wn"]:
        msgs.append(f"bm {t['bm']} and bn {t['bn']} must be multiples of wm {t['wm']} and "
                    f"wn {t['wn']}")
    elif not 64 <= mma_threads(t) <= MAX_THREADS:
        msgs.append(f"(bm/wm)*(bn/wn)*32 = {mma_threads(t)} threads: 64 to {MAX_THREADS}")
    elif mma_threads(t) * mma_regs_estimate(t) > REGS_PER_SM:
        msgs.append(f"{mma_threads(t)} threads x about {mma_regs_estimate(t)} registers "
                    f"(wm*wn/32 accumulators + {FRAGMENT_REGS}) exceed the {REGS_PER_SM} "
                    "registers of an SM: use fewer warps or smaller warp tiles")
    if mma_smem_bytes(t) > MAX_SMEM_OPTIN:
        msgs.append(f"{mma_smem_bytes(t)} bytes of shared memory (stages x 2 x "
                    f"(bm*(bk+8) + bk*(bn+8))): at most {MAX_SMEM_OPTIN}")
    return msgs


def is_wgmma(point: Point) -> bool:
    return point.variant in wgmma.RUNGS


def kernel_source(point: Point) -> str:
    if is_wgmma(point):
        return wgmma.SOURCE
    name = "tensor_core_mma.cu" if point.variant == "mma" else "tensor_core_wmma.cu"
    return f"tensor_cores/{name}"


def kernel_name(point: Point) -> str:
    return f"tc_{point.variant}_{point.params['precision']}"


def kernel_defines(point: Point) -> dict[str, Any]:
    if is_wgmma(point):
        p = point.params
        return wgmma.defines(p.get("stages", wgmma.DEFAULT_STAGES), p.get("bn", wgmma.DEFAULT_BN))
    if point.variant != "mma":
        return {}
    return {k.upper(): int(point.params[k]) for k in MMA_KEYS}


def launch_geometry(point: Point) -> tuple[tuple[int, int], tuple[int, int, int], int]:
    """(grid, block, dynamic shared memory bytes) of a kernel point."""
    p = point.params
    m, n = p["m"], p["n"]
    if point.variant == "mma":
        return (((m // p["bm"]) * (n // p["bn"]), 1), (mma_threads(p), 1, 1),
                mma_smem_bytes(p))
    return (n // WMMA_TILE, m // WMMA_TILE), (WMMA_THREADS, 1, 1), 0
