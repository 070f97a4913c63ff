"""The host side of a slot (no GPU needed): fresh inputs, the CPU reference, the check of
the slot's lesson with its tolerance, the first wrong element, the launch geometry and the
work. All of it comes from the slot the lesson declares (cudalab.kernel_slot), reached
through the registry: the checks are the lessons' own functions, not copies.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cudalab.exercises.catalog import Exercise
from cudalab.experiments import REGISTRY
from cudalab.kernel_slot import Case, Geometry, KernelSlot

__all__ = ["Case", "block_threads", "first_wrong", "geometry", "make_case", "slot_of",
           "tolerance"]


def slot_of(ex: Exercise) -> KernelSlot:
    """The slot the exercise's lesson offers (its registry entry's, the public interface)."""
    slot = REGISTRY[ex.experiment].slot
    if slot is None or slot.kind != ex.kind:
        raise LookupError(f"exercise {ex.name}: lesson {ex.experiment} offers no "
                          f"{ex.kind!r} slot")
    return slot


def tolerance(ex: Exercise) -> float:
    """The tolerance of the slot's lesson (its config block's default)."""
    return slot_of(ex).tolerance(REGISTRY[ex.experiment].settings_in(None), ex)


def geometry(ex: Exercise, size: tuple[int, ...]) -> Geometry:
    """(grid, block) of the slot's grid rule at `size`."""
    return slot_of(ex).geometry(ex, size)


def block_threads(ex: Exercise, size: tuple[int, ...]) -> int:
    return math.prod(geometry(ex, size)[1])


def make_case(ex: Exercise, rng: np.random.Generator, size: tuple[int, ...]) -> Case:
    """Fresh random inputs of one size, and what the output must be."""
    return slot_of(ex).make_case(ex, rng, size, tolerance(ex))


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
