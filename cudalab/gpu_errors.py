"""What a failed GPU step is called in its record: a short class of failure, read from the
exception's type. The runner (timing walk, ceilings) and the profiler's child both name
failures this way, so a reason reads the same whichever process wrote it."""

from __future__ import annotations

import sys

from cudalab.experiments.base import CompileFailure

# pycuda's exception classes (pycuda.driver) -> what the record's reason starts with.
# Checked in order: subclasses before their bases.
_PYCUDA_KINDS = (
    ("MemoryError", "out of GPU memory"),
    ("LaunchError", "kernel launch failed"),
    ("CompileError", "nvcc failed"),
    ("LogicError", "CUDA call misused (LogicError)"),
    ("RuntimeError", "CUDA runtime error"),
)
# The kinds only a CUDA call raises: after one of them the context may be lost.
CUDA_KINDS = frozenset(kind for _, kind in _PYCUDA_KINDS)


def gpu_error_kind(exc: BaseException) -> str:
    """A short class of failure, from the exception's type (never from its message)."""
    drv = sys.modules.get("pycuda.driver")  # an error from pycuda means it is imported
    for cls_name, kind in _PYCUDA_KINDS:
        cls = getattr(drv, cls_name, None) if drv is not None else None
        if isinstance(cls, type) and isinstance(exc, cls):
            return kind
    if isinstance(exc, CompileFailure):
        return "nvcc failed"
    cupy_mem = sys.modules.get("cupy.cuda.memory")
    if cupy_mem is not None and isinstance(exc, cupy_mem.OutOfMemoryError):
        return "out of GPU memory"
    if isinstance(exc, MemoryError):
        return "out of host memory"
    return type(exc).__name__
