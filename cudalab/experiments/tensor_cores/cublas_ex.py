"""cuBLAS through CuPy in each precision, with the math mode and compute type set
explicitly: cublasGemmEx on the job's pycuda buffers, on the job's (primary) context.

  precision  A, B types    compute type                   handle math mode
  fp32       CUDA_R_32F    CUBLAS_COMPUTE_32F             CUBLAS_DEFAULT_MATH (no TF32)
  tf32       CUDA_R_32F    CUBLAS_COMPUTE_32F_FAST_TF32   CUBLAS_TF32_TENSOR_OP_MATH
  fp16       CUDA_R_16F    CUBLAS_COMPUTE_32F             CUBLAS_DEFAULT_MATH
  bf16       CUDA_R_16BF   CUBLAS_COMPUTE_32F             CUBLAS_DEFAULT_MATH
C is CUDA_R_32F throughout (FP32 accumulation and output, like the hand kernels).

Row-major C = A B is the column-major C^T = B^T A^T: gemmEx(N, N, n, m, k, B, ldb = n, A,
lda = k, C, ldc = n), so no copy or transpose is made. NVIDIA_TF32_OVERRIDE=0 in the
environment would turn TF32 off behind the compute type's back: it is recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from cudalab.experiments.matmul.cublas import CupyEventTimer, _cupy

CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77
CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH = 0, 3
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_OP_N = 0
CUBLAS_POINTER_MODE_HOST = 0

# precision -> (input data type, compute type, math mode)
MODES: dict[str, tuple[int, int, int]] = {
    "fp32": (CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_DEFAULT_MATH),
    "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_TF32_TENSOR_OP_MATH),
    "fp16": (CUDA_R_16F, CUBLAS_COMPUTE_32F, CUBLAS_DEFAULT_MATH),
    "bf16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_DEFAULT_MATH),
}


def describe(precision: str) -> str:
    """'cublasGemmEx A,B CUDA_R_16F, CUBLAS_COMPUTE_32F, math mode 0' (provenance)."""
    dtype, compute, mode = MODES[precision]
    names = {CUDA_R_32F: "CUDA_R_32F", CUDA_R_16F: "CUDA_R_16F", CUDA_R_16BF: "CUDA_R_16BF",
             CUBLAS_COMPUTE_32F: "CUBLAS_COMPUTE_32F",
             CUBLAS_COMPUTE_32F_FAST_TF32: "CUBLAS_COMPUTE_32F_FAST_TF32"}
    return (f"cublasGemmEx A,B {names[dtype]} C CUDA_R_32F {names[compute]} "
            f"math mode {mode}")


def gemm_ex_launcher(gpu: Any, a_d: Any, b_d: Any, c_d: Any, m: int, k: int, n: int,
                     precision: str) -> tuple[Callable[[], None], Any, Callable[[], None],
                                              dict[str, Any]]:
    """(launch, timer, sync, extra) of cublasGemmEx in `precision` on the job's buffers;
    timed queued on the legacy default stream like the kernels (see matmul's cuBLAS
    launcher), with CuPy's events on any other stream."""
    cp, _, cublas = _cupy()
    here = int(cp.cuda.driver.ctxGetCurrent())
    ours = getattr(gpu.context, "handle", None)
    if ours is not None and here != int(ours):
        raise RuntimeError(f"CuPy runs on CUDA context {here:#x}, not on the job's primary "
                           f"context {int(ours):#x}: cuBLAS would not see the job's buffers")
    dtype, compute, mode = MODES[precision]
    handle = cp.cuda.device.get_cublas_handle()
    mode_before = int(cublas.getMathMode(handle))
    # host scalars: kept alive by the closure for every queued call
    alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
    a_p, b_p, c_p = int(a_d), int(b_d), int(c_d)

    def launch() -> None:
        cublas.setMathMode(handle, mode)
        cublas.gemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, alpha.ctypes.data, b_p, dtype,
                      n, a_p, dtype, k, beta.ctypes.data, c_p, CUDA_R_32F, n, compute,
                      CUBLAS_GEMM_DEFAULT)

    cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
    cublas.setMathMode(handle, mode)
    stream = cp.cuda.get_current_stream()
    queued = int(stream.ptr) == 0

    def sync() -> None:
        stream.synchronize()
        gpu.synchronize()

    extra = {
        "library": describe(precision) + " via cupy_backends cublas.gemmEx",
        "cupy_version": cp.__version__,
        "cublas_math_mode": int(cublas.getMathMode(handle)),
        "cublas_math_mode_before": mode_before,
        "cublas_compute_type": compute,
        "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE", ""),
        "stream": int(stream.ptr),
        "context": f"{here:#x}",
        "queued": queued,
    }
    return launch, gpu.event_timer() if queued else CupyEventTimer(cp), sync, extra


def cublas_kernel_info(precision: str) -> Any:
    """A Kernel-like record for provenance and the cache key (CuPy's and cuBLAS's versions,
    the call's types and modes)."""
    import hashlib

    from cudalab.gpu import Kernel

    cp, _, cublas = _cupy()
    try:
        version = str(cublas.getVersion(cp.cuda.device.get_cublas_handle()))
    except Exception:  # noqa: BLE001 - no handle yet / older CuPy
        version = "unknown"
    ident = f"{describe(precision)} cupy={cp.__version__} cublas={version}"
    return Kernel(module=None, source_file=f"cuBLAS GemmEx {precision} via CuPy", options=[],
                  source_hash=hashlib.sha256(ident.encode()).hexdigest()[:16])
