"""cuBLAS through CuPy: the SGEMM/DGEMM ceiling on the job's device buffers (optional:
without CuPy these points are skipped).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cudalab.experiments import base
from cudalab.experiments.matmul.kernels import ITEMSIZE

if TYPE_CHECKING:
    pass


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
