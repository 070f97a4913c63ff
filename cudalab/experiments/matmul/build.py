"""How every matmul kernel is built and launched: its source file, -D defines (REAL=double
for the float64 points), launch geometry and the resources the driver reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cudalab.experiments.base import Point
from cudalab.experiments.matmul.kernels import (
    ITEMSIZE,
    LADDER_KERNELS,
    PIPELINE_KERNELS,
    TILED,
    register_threads,
)
from cudalab.experiments.matmul.ladder import PIPE_KEYS, PIPE_OPTIONAL, WARP_KEYS

if TYPE_CHECKING:
    pass


# -- kernels and launch geometry -----------------------------------------------------------
def _dtype(point: Point) -> str:
    return str(point.params.get("dtype", "float32"))


def _itemsize(point: Point) -> int:
    return ITEMSIZE[_dtype(point)]


def kernel_source(point: Point) -> str:
    """The file in cuda/ a point's kernel is compiled from."""
    if point.variant in PIPELINE_KERNELS:
        return "matmul/matmul_pipeline.cu"
    return "matmul/matmul_ladder.cu" if point.variant in LADDER_KERNELS else "matmul/matmul.cu"


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
    if point.variant in PIPELINE_KERNELS:
        return ({k.upper() if k != "threads" else "NTHREADS": int(p[k]) for k in PIPE_KEYS}
                | {k.upper(): int(p[k]) for k in PIPE_OPTIONAL if k in p})
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
    if point.variant == "warptile" or point.variant in PIPELINE_KERNELS:
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
