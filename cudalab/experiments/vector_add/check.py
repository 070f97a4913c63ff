"""The vector add's check: the float32 sum against the float64 reference of its inputs."""

from __future__ import annotations

import math

import numpy as np

from cudalab.experiments import base
from cudalab.experiments.base import Check


def reference(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The float64 sum the float32 kernel is checked against: both inputs converted exactly
    to float64, then added (into `out` where given)."""
    return np.add(a, b, out=out, dtype=np.float64)


def sum_error(c: np.ndarray, a: np.ndarray, b: np.ndarray,
              chunk: int = base.REL_FRO_CHUNK) -> float:
    """rel_fro_error(c, reference(a, b)) without the full-size float64 reference: it is
    formed block by block in a reused buffer (same value up to float64 rounding)."""
    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    if not (a.size == b.size == np.asarray(c).size):
        raise ValueError(f"sizes differ: c {np.asarray(c).size}, a {a.size}, b {b.size}")
    buf = np.empty(min(chunk, a.size), np.float64)

    def block(i: int, j: int) -> np.ndarray:
        return reference(a[i:j], b[i:j], out=buf[: j - i])

    return base.rel_fro_error_blocks(c, block, chunk)


def check_sum(c: np.ndarray, a: np.ndarray, b: np.ndarray, tolerance: float) -> Check:
    """The rel_l2 check of a kernel output c against the float64 sum a + b; the unwritten
    (NaN) elements are counted only when the error is not finite (a finite error means
    every element was written)."""
    err = sum_error(c, a, b)
    detail = ""
    if not math.isfinite(err):
        unwritten = int(np.count_nonzero(~np.isfinite(c)))
        detail = f"{unwritten} unwritten (NaN) elements" if unwritten else ""
    return Check(err, tolerance, "rel_l2", detail=detail)
