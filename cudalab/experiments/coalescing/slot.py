"""The transpose slot: out (cols x rows) = in (rows x cols) transposed, TILE x BLOCK_ROWS
blocks over TILE x TILE tiles; checked bit for bit like the lesson's transposes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cudalab.kernel_slot import NAN_BITS, Case, Check, Geometry, KernelSlot, Size, SlotSpec


def mismatches(out: np.ndarray, expected: np.ndarray) -> int:
    """Elements whose bits differ (NaN poison left in `out` counts as a mismatch)."""
    o = np.ascontiguousarray(out, dtype=np.float32).view(np.uint32)
    e = np.ascontiguousarray(expected, dtype=np.float32).view(np.uint32)
    return int(np.count_nonzero(o != e))


def transpose_check(out: np.ndarray, expected: np.ndarray) -> Check:
    """Every element bit for bit (a checked subset: the elements given)."""
    bad = mismatches(out.ravel(), expected.ravel())
    return Check(float(bad), 0.0, "mismatched_elements",
                 f"{bad} of {out.size} checked elements differ" if bad else "")


def _tolerance(_block: Mapping[str, Any], _spec: SlotSpec) -> float:
    return 0.0  # a transpose moves bits: every element must be exact


def _case(_spec: SlotSpec, rng: np.random.Generator, size: Size, _tol: float) -> Case:
    rows, cols = size
    x = rng.standard_normal(rows * cols, dtype=np.float32)
    expected = x.reshape(rows, cols).T.copy()

    return Case(size, [x], np.empty((cols, rows), np.float32), NAN_BITS, expected,
                lambda out, _k: transpose_check(out, expected),
                (rows, cols), out_first=True, bytes=8.0 * rows * cols,
                labels={"rows": rows, "cols": cols})


def _geometry(spec: SlotSpec, size: Size) -> Geometry:
    rows, cols = size
    t = spec.defines["TILE"]
    return (-(-cols // t), -(-rows // t)), (t, spec.defines["BLOCK_ROWS"], 1)


SLOT = KernelSlot("transpose", _tolerance, _case, _geometry, transpose_check)
