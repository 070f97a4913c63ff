"""The course's matmul kernels (naive, shared-memory tiles, padded and conflicting tiles,
register tiling): the variants, tile sizes and register tiles a block may ask for, and the
check of a product against the CPU reference.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from cudalab.experiments import base
from cudalab.experiments.base import Check

if TYPE_CHECKING:
    pass


TILED = ["tiled", "tiled_padded", "tiled_conflict"]  # one kernel each, the same `tiles`
PIPELINE_KERNELS = ["pipelined", "swizzled"]  # cuda/matmul/matmul_pipeline.cu
LADDER_KERNELS = ["vec4", "dbuf", "warptile", *PIPELINE_KERNELS]  # past register tiling
GPU_VARIANTS = ["naive", *TILED, "register", *LADDER_KERNELS, "cublas"]
VARIANTS = ["cpu", *GPU_VARIANTS]
# The ladder figure's steps, in course order; each step shows its best configuration.
LADDER = ["naive", "tiled", "register", "vec4", "dbuf", "warptile", *PIPELINE_KERNELS, "cublas"]
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
APAD = 4  # row padding of the A slice in matmul_register (cuda/matmul/matmul.cu: APAD)
DEFAULT_REGISTER_TILES = [
    {"rt": 2, "bt": 32, "bk": 32},
    {"rt": 4, "bt": 64, "bk": 16},
    {"rt": 8, "bt": 128, "bk": 8},
]
# vec4 and dbuf: the register tile with float4 loads; rt and bk multiples of 4
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
    As[BK][BM + APAD] + Bs[BK][BN] floats (cuda/matmul/matmul_ladder.cu)."""
    return buffers * register_smem_bytes(bt, bk)


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


# -- expected effects: thresholds ----------------------------------------------------------
COURSE_SIZE = (160, 240, 320)  # the course's rectangular example, M x K . K x N
