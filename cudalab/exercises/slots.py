"""The host side of a slot (no GPU needed): fresh inputs, the CPU reference, the check of
the slot's experiment with its tolerance, the first wrong element, the launch geometry and
the work. The checks are the experiments' own functions, not copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cudalab.exercises.catalog import REGISTER_DEFINES, Exercise
from cudalab.experiments import REGISTRY, base, shared
from cudalab.experiments import atomics as atomics_exp
from cudalab.experiments import coalescing as coalescing_exp
from cudalab.experiments import vector_add as vector_add_exp
from cudalab.experiments.base import NAN_BITS, Check, Point
from cudalab.experiments.matmul.build import launch_geometry
from cudalab.experiments.matmul.kernels import check_product

# A reduction's timed launches keep adding into *out: after k launches it holds k sums, up
# to the float32 rounding of k * blocks atomicAdds into a growing total (about 1e-4 of it at
# 2^24 elements and a thousand launches); a launch that skipped its work is off by 1 / k.
ACCUMULATED_SUM_TOLERANCE = 1e-3


@dataclass
class Case:
    """One size of a slot: the inputs in argument order, the output's host buffer and how
    it is poisoned, the reference, and check(out, launches) with the experiment's test."""

    size: tuple[int, ...]
    inputs: list[np.ndarray]
    out: np.ndarray
    fill: int
    expected: np.ndarray
    check: Callable[[np.ndarray, int], Check]
    scalars: tuple[int, ...]
    out_first: bool = False  # transpose(out, in, ...): the output is the first argument
    flops: float = math.nan
    bytes: float = math.nan
    labels: dict[str, Any] = field(default_factory=dict)


def tolerance(ex: Exercise) -> float:
    """The tolerance of the slot's experiment (its config block's default)."""
    block = REGISTRY[ex.experiment].settings_in(None)
    if ex.kind == "matmul":
        return block["tolerance_float64" if ex.dtype == "float64" else "tolerance"]
    if ex.kind == "reduction":
        return block["sum_tolerance_factor"]
    return block.get("tolerance", 0.0)


def geometry(ex: Exercise, size: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(grid, block) of the slot's grid rule at `size`."""
    if ex.kind == "vector_add":
        n, threads = size
        return (shared.grid_size(n, threads), 1), (threads, 1, 1)
    if ex.kind == "matmul":
        m, k, n = size
        if ex.name == "register_matmul":
            d = REGISTER_DEFINES
            return launch_geometry(Point("matmul", "register", {
                "m": m, "k": k, "n": n, "rt": d["RM"], "bt": d["BM"], "bk": d["BK"]}))
        return launch_geometry(Point("matmul", "tiled", {"m": m, "k": k, "n": n,
                                                         "tile": ex.defines["TILE"]}))
    if ex.kind == "transpose":
        rows, cols = size
        t = ex.defines["TILE"]
        return (-(-cols // t), -(-rows // t)), (t, ex.defines["BLOCK_ROWS"], 1)
    (n,) = size
    b = ex.defines["BLOCK"]
    return (-(-n // (2 * b)), 1), (b, 1, 1)


def block_threads(ex: Exercise, size: tuple[int, ...]) -> int:
    return math.prod(geometry(ex, size)[1])


def make_case(ex: Exercise, rng: np.random.Generator, size: tuple[int, ...]) -> Case:
    """Fresh random inputs of one size, and what the output must be."""
    return {"vector_add": _vector_add, "matmul": _matmul, "transpose": _transpose,
            "reduction": _reduction}[ex.kind](ex, rng, size)


def _vector_add(ex: Exercise, rng: np.random.Generator, size: tuple[int, ...]) -> Case:
    n = size[0]
    a, b = base.uniform_f32(rng, n), base.uniform_f32(rng, n)
    tol = tolerance(ex)
    return Case(size, [a, b], np.empty(n, np.float32), NAN_BITS,
                vector_add_exp.reference(a, b),
                lambda c, _k: vector_add_exp.check_sum(c, a, b, tol), (n,),
                flops=float(n), bytes=12.0 * n, labels={"n": n, "threads": size[1]})


def _matmul(ex: Exercise, rng: np.random.Generator, size: tuple[int, ...]) -> Case:
    m, k, n = size
    a, b = base.uniform_f32(rng, (m, k)), base.uniform_f32(rng, (k, n))
    if ex.dtype == "float64":
        a, b = a.astype(np.float64), b.astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = tolerance(ex)
    item = np.dtype(ex.dtype).itemsize
    return Case(size, [a, b], np.empty((m, n), ex.dtype), NAN_BITS, ref,
                lambda c, _k: check_product(c, ref, tol), (m, n, k),
                flops=2.0 * m * n * k, bytes=float(item * (m * k + k * n + m * n)),
                labels={"m": m, "k": k, "n": n})


def _transpose(ex: Exercise, rng: np.random.Generator, size: tuple[int, ...]) -> Case:
    rows, cols = size
    x = rng.standard_normal(rows * cols, dtype=np.float32)
    expected = x.reshape(rows, cols).T.copy()

    def check(out: np.ndarray, _k: int) -> Check:
        bad = coalescing_exp.mismatches(out.ravel(), expected.ravel())
        return Check(float(bad), 0.0, "mismatched_elements",
                     f"{bad} of {out.size} elements differ" if bad else "")

    return Case(size, [x], np.empty((cols, rows), np.float32), NAN_BITS, expected, check,
                (rows, cols), out_first=True, bytes=8.0 * rows * cols,
                labels={"rows": rows, "cols": cols})


def _reduction(ex: Exercise, rng: np.random.Generator, size: tuple[int, ...]) -> Case:
    n = size[0]
    x = atomics_exp.sum_inputs(rng, n)
    ref = float(np.sum(x, dtype=np.float64))
    abs_sum = float(np.sum(np.abs(x), dtype=np.float64))
    tol = sum_tolerance(ex, n)
    return Case(size, [x], np.zeros(1, np.float32), 0, np.array([ref]),
                lambda out, k: sum_check(float(out[0]), k, ref, abs_sum, tol), (n,),
                flops=float(n), bytes=4.0 * n, labels={"n": n})


def sum_tolerance(ex: Exercise, n: int) -> float:
    return atomics_exp.sum_tolerance(n, tolerance(ex))


def sum_check(got: float, launches: int, ref: float, abs_sum: float, tol: float) -> Check:
    """The atomics experiment's test of *out after `launches` launches adding into it."""
    t = tol if launches <= 1 else max(tol, ACCUMULATED_SUM_TOLERANCE)
    return Check(atomics_exp.sum_error(got, launches * ref, launches * abs_sum), t,
                 "rel_sum_err", f"sum {got!r} after {launches} launch(es), expected "
                 f"{launches * ref!r}")


def first_wrong(out: np.ndarray, expected: np.ndarray, tol: float) -> dict[str, Any] | None:
    """The first element (in memory order) that is unwritten or off by more than
    tol x the reference's RMS, else the worst one; None where the arrays agree exactly."""
    o = np.asarray(out, dtype=np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(o - e)
        bound = tol * max(float(np.sqrt(np.mean(e * e))) if e.size else 0.0, 1e-30)
        bad = ~np.isfinite(o) | (diff > bound)
    if bad.any():
        i = int(np.argmax(bad))
    elif diff.size and float(diff.max()) > 0:
        i = int(np.argmax(diff))
    else:
        return None
    shape = np.shape(expected)
    return {"index": [int(v) for v in np.unravel_index(i, shape)] if len(shape) > 1 else [i],
            "got": float(o[i]), "expected": float(e[i]),
            "unwritten": int(np.count_nonzero(~np.isfinite(o))), "wrong": int(bad.sum())}
