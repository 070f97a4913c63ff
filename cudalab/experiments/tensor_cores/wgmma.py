"""The wgmma rungs (cuda/tensor_cores/wgmma.cu, sm_90a): their shapes, what they need from the
device, and how one is launched: tensor maps made on the host, B transposed first where the
kernel reads it K-major (tf32), the grid (one block per tile, or one per SM when persistent).

  rung            threads  block tile  stages   what it adds
  wgmma_tma       256      128 x 128   1        wgmma on TMA-loaded, 128B-swizzled tiles
  wgmma_pipe      256      128 x 128   STAGES   a ring of stages on full mbarriers
  wgmma_ws        384      128 x BN    STAGES   producer / consumer warpgroups, setmaxnreg
  wgmma_persist   384      128 x BN    STAGES   a persistent grid: loads overlap the epilogue
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cudalab.experiments.tensor_cores import tma

SOURCE = "tensor_cores/wgmma.cu"
RUNGS = ["wgmma_tma", "wgmma_pipe", "wgmma_ws", "wgmma_persist"]
PRECISIONS = ("fp16", "bf16", "tf32")
MIN_CC = (9, 0)
ARCH = "sm_90a"  # wgmma and setmaxnreg exist only in the architecture-specific target
BM = 128
SLICE_BYTES = 128  # bytes of K per stage row: the 128-byte swizzle
ALIGN_SLACK = 1024  # the kernel aligns its stages to the swizzle's 1024-byte period
STAGE_CHOICES = [2, 3, 4, 5, 6]
BN_CHOICES = [128, 256]
DEFAULT_STAGES = 4
# The stage counts a block without `wgmma_stages` sweeps: two, so the lesson shows pipeline
# depth against time. On an H200 at 4096 FP16 the pipeline ran best at 3 (591 TFLOP/s, 4:
# 510), the warp-specialised rungs at 4 (684, 3: 657); 6 was slower for all
# (reports/reference/wgmma-diag-2026-11-27/h200-run/).
DEFAULT_STAGE_SWEEP = [3, 4]
DEFAULT_BN = 256
MAX_SMEM_OPTIN = 227 * 1024
# K-major only in wgmma for tf32: those kernels read B^T, made by a transpose kernel that
# is part of every timed launch
K_MAJOR_B = {"tf32"}
# The rungs' parameter buffer: (map A, map B, C, M, N, K). Kernel parameters start at byte
# PARAM_BASE of constant bank 0 on sm_90 and the compiler aligns each one's address there, so
# the 64-byte aligned maps start 48 bytes into the buffer (cuobjdump -elf: KPARAM_INFO).
# pycuda hands the driver one packed buffer that is copied as is: without the padding C, M,
# N and K arrive as zeros (the first GPU run's fault at address 0).
PARAM_BASE = 0x210
PARAM_FORMAT = f"{-PARAM_BASE % 64}x128s128sPiii"
PROBE_KERNEL, PROBE_GLOBAL = "tc_wgmma_param_probe", "tc_wgmma_params_seen"


class ParamLayoutError(RuntimeError):
    """The kernel received other parameters than the host packed."""


@dataclass(frozen=True)
class Shape:
    threads: int
    bn: int
    stages: int
    persistent: bool = False

    @property
    def smem_bytes(self) -> int:
        return self.stages * (BM + self.bn) * SLICE_BYTES + ALIGN_SLACK


def shape(rung: str, stages: int = DEFAULT_STAGES, bn: int = DEFAULT_BN) -> Shape:
    if rung == "wgmma_tma":
        return Shape(256, 128, 1)
    if rung == "wgmma_pipe":
        return Shape(256, 128, stages)
    if rung in ("wgmma_ws", "wgmma_persist"):
        return Shape(384, bn, stages, rung == "wgmma_persist")
    raise ValueError(f"wgmma rung {rung!r}: one of {', '.join(RUNGS)}")


def shape_problems(rung: str, stages: int, bn: int) -> list[str]:
    """What is wrong with a rung's stages and BN ([] if nothing)."""
    if stages not in STAGE_CHOICES:
        return [f"wgmma stages {stages}: one of {STAGE_CHOICES}"]
    if bn not in BN_CHOICES:
        return [f"wgmma bn {bn}: one of {BN_CHOICES}"]
    s = shape(rung, stages, bn)
    if s.smem_bytes > MAX_SMEM_OPTIN:
        return [f"{rung} with {stages} stages of 128 x {s.bn} needs {s.smem_bytes} bytes of "
                f"shared memory (stages x (128 + bn) x 128 + 1024): at most {MAX_SMEM_OPTIN}"]
    return []


def defines(stages: int = DEFAULT_STAGES, bn: int = DEFAULT_BN) -> dict[str, int]:
    return {"STAGES": int(stages), "WS_BN": int(bn)}


def kernel_name(rung: str, precision: str, kmajor_b: bool = False) -> str:
    """tc_<rung>_<precision>; fp16 also has *_bt kernels that read B^T like tf32 must."""
    return f"tc_{rung}_{precision}" + ("_bt" if kmajor_b and precision not in K_MAJOR_B else "")


def not_applicable(compute_capability: tuple[int, int]) -> str:
    """Why the wgmma rungs cannot run on a device ('' if they can)."""
    if tuple(compute_capability) >= MIN_CC and tuple(compute_capability) < (10, 0):
        return ""
    cc = ".".join(map(str, compute_capability))
    return (f"wgmma, TMA tensor copies and setmaxnreg are Hopper instructions (sm_90a); "
            f"this GPU is compute capability {cc}")


def grid(rung: str, m: int, n: int, bn: int, sm_count: int) -> int:
    s = shape(rung, bn=bn)
    tiles = (m // BM) * (n // s.bn)
    return min(tiles, sm_count) if s.persistent else tiles


def tensor_maps(precision: str, a_ptr: int, b_ptr: int, m: int, k: int, n: int, bn: int,
                kmajor_b: bool = False) -> tuple[bytes, bytes]:
    """(A's map, B's map). A: M x K, boxes 128 rows x 128 bytes. B (fp16, bf16): K x N read
    N-major, boxes (128 / itemsize) rows of K x 64 columns; b_ptr of tf32 (or kmajor_b) is
    B^T (N x K), boxes bn rows x 128 bytes."""
    per_row = SLICE_BYTES // tma.ITEMSIZE[precision]  # K elements in a 128-byte row
    map_a = tma.encode_2d(a_ptr, precision, m, k, BM, per_row)
    if kmajor_b or precision in K_MAJOR_B:
        map_b = tma.encode_2d(b_ptr, precision, n, k, bn, per_row)
    else:
        map_b = tma.encode_2d(b_ptr, precision, k, n, per_row, 64)
    return map_a, map_b


def params_seen(module: Any, args: tuple, fmt: str = PARAM_FORMAT) -> list[int]:
    """Launch the probe kernel (the rungs' parameter list) with `args` packed as `fmt`:
    what it received as [C, M, N, K, map A's first and last 8 bytes, map B's]."""
    import pycuda.driver as cuda

    probe = module.get_function(PROBE_KERNEL)
    probe.prepare(fmt)
    ptr, _ = module.get_global(PROBE_GLOBAL)
    cuda.memset_d8(ptr, 0, 64)
    probe.prepared_call((1, 1), (1, 1, 1), *args)
    seen = np.zeros(8, np.uint64)
    cuda.memcpy_dtoh(seen, ptr)
    return [int(v) for v in seen]


def params_sent(args: tuple) -> list[int]:
    """What params_seen should return for `args` = (map A, map B, C, M, N, K)."""
    map_a, map_b, c_ptr, *dims = args
    words = [int.from_bytes(m[i:i + 8], "little") for m in (map_a, map_b) for i in (0, 120)]
    return [int(c_ptr), *(int(d) for d in dims), *words]


def check_params(module: Any, args: tuple) -> None:
    """Raise ParamLayoutError unless the kernels receive `args` as packed (PARAM_FORMAT)."""
    seen, sent = params_seen(module, args), params_sent(args)
    if seen != sent:
        names = ["C", "M", "N", "K", "A[0:8]", "A[120:128]", "B[0:8]", "B[120:128]"]
        diff = ", ".join(f"{n} sent {a:#x} got {b:#x}" for n, a, b in zip(names, sent, seen)
                         if a != b)
        raise ParamLayoutError(f"the wgmma kernels' parameters arrive other than packed as "
                               f"{PARAM_FORMAT!r}: {diff}")


def launcher(module: Any, rung: str, precision: str, a_ptr: int, b_ptr: int, c_ptr: int,
             m: int, k: int, n: int, sm_count: int, scratch_ptr: int | None = None,
             stages: int = DEFAULT_STAGES, bn: int = DEFAULT_BN, kmajor_b: bool = False
             ) -> tuple[Callable[[], None], dict[str, Any]]:
    """(launch, facts) of one rung on a pycuda module built from SOURCE with
    defines(stages, bn). tf32 (and fp16 with kmajor_b) needs `scratch_ptr`, k x n elements
    for B^T; its transpose runs in every launch. Checks first, with the probe kernel, that
    the parameters arrive as packed (ParamLayoutError if not)."""
    s = shape(rung, stages, bn)
    kmajor_b = kmajor_b or precision in K_MAJOR_B
    func = module.get_function(kernel_name(rung, precision, kmajor_b))
    func.prepare(PARAM_FORMAT)
    import pycuda.driver as cuda

    if s.smem_bytes > 48 * 1024:
        func.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, s.smem_bytes)
    transpose = None
    b_read = b_ptr
    if kmajor_b:
        if scratch_ptr is None:
            raise ValueError(f"{precision} reads B^T: a scratch buffer of {k} x {n} elements")
        transpose = module.get_function(
            "tc_transpose_b32" if tma.ITEMSIZE[precision] == 4 else "tc_transpose_b16")
        transpose.prepare("PPii")
        b_read = scratch_ptr
    map_a, map_b = tensor_maps(precision, a_ptr, b_read, m, k, n, s.bn, kmajor_b)
    blocks = grid(rung, m, n, s.bn, sm_count)
    dims = (np.int32(m), np.int32(n), np.int32(k))
    check_params(module, (map_a, map_b, c_ptr, *dims))

    def launch() -> None:
        if transpose is not None:  # B (k x n) -> B^T (n x k)
            transpose.prepared_call((n // 32, k // 32), (32, 8, 1), b_ptr, scratch_ptr,
                                    np.int32(k), np.int32(n))
        func.prepared_call((blocks, 1), (s.threads, 1, 1), map_a, map_b, c_ptr, *dims,
                           shared_size=s.smem_bytes)

    facts = {"grid": [blocks, 1], "block": [s.threads, 1, 1], "stages": s.stages,
             "bn": s.bn, "dynamic_smem_bytes": s.smem_bytes,
             "regs": int(getattr(func, "num_regs", -1)),
             "transposes_b": transpose is not None}
    return launch, facts
