"""The matmul slots: C = A B (M x K times K x N, float32 or float64), the tiled kernel's
grid of TILE x TILE blocks or the register-tiled kernel's BM x BN blocks; cuBLAS is their
ceiling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cudalab.experiments.base import Point
from cudalab.experiments.matmul.build import launch_geometry
from cudalab.experiments.matmul.cublas import _cublas_launcher
from cudalab.experiments.matmul.kernels import check_product
from cudalab.kernel_slot import NAN_BITS, Case, Geometry, KernelSlot, Size, SlotSpec, uniform_f32


def _tolerance(block: Mapping[str, Any], spec: SlotSpec) -> float:
    return block["tolerance_float64" if spec.dtype == "float64" else "tolerance"]


def _case(spec: SlotSpec, rng: np.random.Generator, size: Size, tol: float) -> Case:
    m, k, n = size
    a, b = uniform_f32(rng, (m, k)), uniform_f32(rng, (k, n))
    if spec.dtype == "float64":
        a, b = a.astype(np.float64), b.astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    item = np.dtype(spec.dtype).itemsize
    return Case(size, [a, b], np.empty((m, n), spec.dtype), NAN_BITS, ref,
                lambda c, _k: check_product(c, ref, tol), (m, n, k),
                flops=2.0 * m * n * k, bytes=float(item * (m * k + k * n + m * n)),
                labels={"m": m, "k": k, "n": n})


def _geometry(spec: SlotSpec, size: Size) -> Geometry:
    """The register-tiled slot (its defines name the register tile RM) launches as the
    lesson's register kernel, the others as its tiled kernel of TILE x TILE blocks."""
    m, k, n = size
    d = spec.defines
    if "RM" in d:
        return launch_geometry(Point("matmul", "register", {
            "m": m, "k": k, "n": n, "rt": d["RM"], "bt": d["BM"], "bk": d["BK"]}))
    return launch_geometry(Point("matmul", "tiled", {"m": m, "k": k, "n": n,
                                                     "tile": d["TILE"]}))


SLOT = KernelSlot("matmul", _tolerance, _case, _geometry, check_product,
                  ceiling=_cublas_launcher)
