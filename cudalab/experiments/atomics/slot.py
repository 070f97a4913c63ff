"""The reduction slot: *out += the sum of n floats, blocks of BLOCK threads each summing
2 x BLOCK elements; checked like the lesson's sums, within a tolerance growing as sqrt(n)
float32 roundings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from cudalab.kernel_slot import Case, Check, Geometry, KernelSlot, Size, SlotSpec

U = 2.0**-24


def sum_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.random(n, dtype=np.float32)  # uniform in [0, 1)


def sum_error(got: float, ref: float, abs_sum: float) -> float:
    if not math.isfinite(got):
        return math.inf
    return abs(got - ref) / (abs_sum if abs_sum > 0 else 1.0)


def sum_tolerance(n: int, factor: float) -> float:
    return factor * math.sqrt(n) * U


# A reduction's timed launches keep adding into *out: after k launches it holds k sums, up
# to the float32 rounding of k * blocks atomicAdds into a growing total (about 1e-4 of it at
# 2^24 elements and a thousand launches); a launch that skipped its work is off by 1 / k.
ACCUMULATED_SUM_TOLERANCE = 1e-3


def sum_check(got: float, launches: int, ref: float, abs_sum: float, tol: float) -> Check:
    """The lesson's test of *out after `launches` launches adding into it."""
    t = tol if launches <= 1 else max(tol, ACCUMULATED_SUM_TOLERANCE)
    return Check(sum_error(got, launches * ref, launches * abs_sum), t,
                 "rel_sum_err", f"sum {got!r} after {launches} launch(es), expected "
                 f"{launches * ref!r}")


def inputs_check(got: float, launches: int, x: np.ndarray, factor: float) -> Check:
    """sum_check of *out against the sum of the inputs x, at the slot's tolerance factor."""
    ref = float(np.sum(x, dtype=np.float64))
    abs_sum = float(np.sum(np.abs(x), dtype=np.float64))
    return sum_check(got, launches, ref, abs_sum, sum_tolerance(x.size, factor))


def _tolerance(block: Mapping[str, Any], _spec: SlotSpec) -> float:
    return block["sum_tolerance_factor"]


def _case(_spec: SlotSpec, rng: np.random.Generator, size: Size, factor: float) -> Case:
    n = size[0]
    x = sum_inputs(rng, n)
    ref = float(np.sum(x, dtype=np.float64))
    abs_sum = float(np.sum(np.abs(x), dtype=np.float64))
    tol = sum_tolerance(n, factor)
    return Case(size, [x], np.zeros(1, np.float32), 0, np.array([ref]),
                lambda out, k: sum_check(float(out[0]), k, ref, abs_sum, tol), (n,),
                flops=float(n), bytes=4.0 * n, labels={"n": n})


def _geometry(spec: SlotSpec, size: Size) -> Geometry:
    (n,) = size
    b = spec.defines["BLOCK"]
    return (-(-n // (2 * b)), 1), (b, 1, 1)


SLOT = KernelSlot("reduction", _tolerance, _case, _geometry, inputs_check)
