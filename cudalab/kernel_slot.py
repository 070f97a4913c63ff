"""The public kernel-slot interface: what a lesson offers a kernel written elsewhere (an
exercise's submission, the course's own kernel put in the same slot), and the one way such
a kernel is checked and timed.

A slot is a fixed kernel name and signature with a grid rule. The lesson that owns the slot
declares a KernelSlot (Experiment.slot, in its folder's slot.py): fresh inputs and the CPU
reference of one size (make_case), the launch geometry (geometry), its tolerance from its
config block (tolerance), its own check (check) and, where a library is the slot's ceiling,
the launcher of that library (ceiling). The check and the timing are the framework's:
verify_then_time, the same sequence the lessons measure with. The exercises reach a lesson
only through its registry entry's slot and this module, never through the lesson's modules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from cudalab.experiments.base import (  # noqa: F401 - the interface's vocabulary
    NAN_BITS,
    POISON_64_WORD,
    Check,
    RunContext,
    uniform_f32,
    verify_then_time,
)

Size = tuple[int, ...]
Geometry = tuple[tuple[int, int], tuple[int, int, int]]


class SlotSpec(Protocol):
    """What a slot's lesson reads of the exercise that fills it."""

    name: str
    dtype: str
    defines: Mapping[str, Any]


@dataclass
class Case:
    """One size of a slot: the inputs in argument order, the output's host buffer and how
    it is poisoned, the reference, and check(out, launches) with the lesson's own test."""

    size: Size
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


@dataclass(frozen=True)
class KernelSlot:
    """A lesson's slot: kind names the slot's inputs and check (vector_add, matmul,
    transpose, reduction); tolerance(block, spec) reads the lesson's config block;
    make_case(spec, rng, size, tolerance) builds one size; geometry(spec, size) is the grid
    rule; check is the lesson's test of an output against its reference (its own
    arguments); ceiling, where set, launches the library the slot is measured against."""

    kind: str
    tolerance: Callable[[Mapping[str, Any], SlotSpec], float]
    make_case: Callable[[SlotSpec, np.random.Generator, Size, float], Case]
    geometry: Callable[[SlotSpec, Size], Geometry]
    check: Callable[..., Check]
    ceiling: Callable[..., Any] | None = None
