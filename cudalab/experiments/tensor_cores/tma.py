"""Tensor maps for TMA, Hopper's tensor memory accelerator: the 128-byte CUtensorMap that a
`cp.async.bulk.tensor` instruction reads to copy a box of a matrix into shared memory.

The driver makes them (cuTensorMapEncodeTiled, CUDA 12.0 and newer); pycuda does not wrap
that call, so it goes through ctypes on libcuda. The map holds the matrix's device address,
its shape and row stride, the box one copy moves and the shared-memory swizzle; the wgmma
kernels take it by value as a `const __grid_constant__` kernel parameter (pycuda packs the
128 bytes as a "128s" argument where the kernel expects it: wgmma.PARAM_FORMAT).

Only what the wgmma rungs use: 2-D row-major matrices, the 128-byte swizzle (a box row of
exactly 128 bytes), 256-byte L2 promotion, no interleave, no out-of-bounds fill (the
kernels only read whole boxes).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

# CU_TENSOR_MAP_DATA_TYPE_*: FLOAT16, BFLOAT16, FLOAT32 (tf32 inputs are float32 patterns
# already rounded on the host: the copy moves bits, the tensor cores read them as tf32)
DATA_TYPE = {"fp16": 6, "bf16": 9, "tf32": 7}
ITEMSIZE = {"fp16": 2, "bf16": 2, "tf32": 4}
SWIZZLE_128B = 3  # CU_TENSOR_MAP_SWIZZLE_128B
SWIZZLE_BYTES = 128
L2_PROMOTION_256B = 3  # CU_TENSOR_MAP_L2_PROMOTION_L2_256B
MAP_BYTES = 128
MAX_BOX = 256  # elements along any box dimension


class TmaError(RuntimeError):
    """The driver refused to make a tensor map, or has no call to make one."""


def box_problems(precision: str, rows: int, cols: int, box_rows: int, box_cols: int) -> list[str]:
    """What keeps a (rows x cols, row-major) matrix and box from a 128-byte-swizzled tensor
    map ([] if nothing): the driver's own rules, said before it is asked."""
    if precision not in ITEMSIZE:
        return [f"precision {precision!r}: one of {', '.join(ITEMSIZE)}"]
    size = ITEMSIZE[precision]
    out = []
    if box_cols * size != SWIZZLE_BYTES:
        out.append(f"a box row of {box_cols} {precision} elements is {box_cols * size} bytes: "
                   f"the 128-byte swizzle needs exactly {SWIZZLE_BYTES}")
    if not 1 <= box_rows <= MAX_BOX:
        out.append(f"box of {box_rows} rows: 1 to {MAX_BOX}")
    if (cols * size) % 16:
        out.append(f"row stride {cols * size} bytes: a multiple of 16")
    if rows % box_rows or cols % box_cols:
        out.append(f"{rows} x {cols} matrix: not whole boxes of {box_rows} x {box_cols}")
    return out


@cache
def _encode_fn() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TmaError(f"libcuda.so.1 cannot be loaded ({exc}): tensor maps need the "
                       "NVIDIA driver") from exc
    fn = getattr(lib, "cuTensorMapEncodeTiled", None)
    if fn is None:
        raise TmaError("the driver has no cuTensorMapEncodeTiled (CUDA 12.0 or newer needed)")
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                   u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def encode_2d(address: int, precision: str, rows: int, cols: int, box_rows: int,
              box_cols: int) -> bytes:
    """The CUtensorMap (128 bytes) of the row-major rows x cols matrix at device `address`,
    copied in boxes of box_rows x box_cols elements into 128-byte-swizzled shared memory."""
    bad = box_problems(precision, rows, cols, box_rows, box_cols)
    if bad:
        raise ValueError("; ".join(bad))
    if address % 16:
        raise ValueError(f"device address {address:#x}: must be 16-byte aligned")
    raw = ctypes.create_string_buffer(MAP_BYTES + 64)  # the driver wants it 64-byte aligned
    aligned = (ctypes.addressof(raw) + 63) & ~63
    dims = (ctypes.c_uint64 * 2)(cols, rows)  # innermost first
    strides = (ctypes.c_uint64 * 1)(cols * ITEMSIZE[precision])  # bytes, dims 1.. only
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    step = (ctypes.c_uint32 * 2)(1, 1)
    rc = _encode_fn()(aligned, DATA_TYPE[precision], 2, ctypes.c_void_p(address), dims,
                      strides, box, step, 0, SWIZZLE_128B, L2_PROMOTION_256B, 0)
    if rc != 0:
        raise TmaError(f"cuTensorMapEncodeTiled returned CUresult {rc} for a {rows} x {cols} "
                       f"{precision} matrix at {address:#x}, box {box_rows} x {box_cols}")
    return ctypes.string_at(aligned, MAP_BYTES)
