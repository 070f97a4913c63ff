"""The vector_add slot: c = a + b over n floats, blocks of `threads` threads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cudalab.experiments import shared
from cudalab.experiments.vector_add.check import check_sum, reference
from cudalab.kernel_slot import NAN_BITS, Case, Geometry, KernelSlot, Size, SlotSpec, uniform_f32


def _tolerance(block: Mapping[str, Any], _spec: SlotSpec) -> float:
    return block.get("tolerance", 0.0)


def _case(_spec: SlotSpec, rng: np.random.Generator, size: Size, tol: float) -> Case:
    n = size[0]
    a, b = uniform_f32(rng, n), uniform_f32(rng, n)
    return Case(size, [a, b], np.empty(n, np.float32), NAN_BITS, reference(a, b),
                lambda c, _k: check_sum(c, a, b, tol), (n,),
                flops=float(n), bytes=12.0 * n, labels={"n": n, "threads": size[1]})


def _geometry(_spec: SlotSpec, size: Size) -> Geometry:
    n, threads = size
    return (shared.grid_size(n, threads), 1), (threads, 1, 1)


SLOT = KernelSlot("vector_add", _tolerance, _case, _geometry, check_sum)
