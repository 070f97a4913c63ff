"""What an experiment is. Adding one = a kernel file in cuda/, a module here, a config block.

A module subclasses Experiment, declares its config schema, expands its grid into Points,
measures one Point at a time through the shared Harness, checks the result against a CPU
reference, declares its work (FLOPs, bytes), draws its figures and states the expected
effects the report checks against the data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.harness import Harness, Timing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from cudalab.gpu import GpuSession


@dataclass(frozen=True)
class Point:
    experiment: str
    variant: str
    params: dict[str, Any]
    gpu: bool = True  # needs the GPU

    @property
    def point_id(self) -> str:
        parts = [self.variant] + [f"{k}{_fmt(v)}" for k, v in self.params.items()]
        return re.sub(r"[^A-Za-z0-9_.=-]", "_", "-".join(parts))

    def label(self) -> str:
        return f"{self.experiment} {self.variant} " + " ".join(
            f"{k}={v}" for k, v in self.params.items()
        )


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "x".join(map(str, v))
    return str(v)


class Skipped(Exception):
    """Raised by kernel_for() or measure() when a point cannot be measured here for a reason
    that is no fault (an optional library such as CuPy is not installed). The runner records
    the point with status "skipped" and the message as its reason."""


@dataclass
class Check:
    """Correctness against the CPU reference."""

    error: float
    tolerance: float
    metric: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.error) and self.error <= self.tolerance)

    def as_dict(self) -> dict[str, Any]:
        return {
            "error": float(self.error),
            "tolerance": float(self.tolerance),
            "metric": self.metric,
            "passed": self.passed,
            "detail": self.detail,
        }


@dataclass
class Result:
    """What measure() returns for one point."""

    timing: Timing | None
    flops: float = float("nan")
    bytes: float = float("nan")
    check: Check | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Timing] = field(default_factory=dict)
    kernel: Any = None  # cudalab.gpu.Kernel used (provenance: options, source hash)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form, kept in the raw record


@dataclass
class Expectation:
    """An expected effect, checked on this GPU's data for the report."""

    claim: str
    passed: bool | None  # None: not enough data to say
    evidence: str


@dataclass
class RunContext:
    gpu: GpuSession | None
    harness: Harness
    rng: np.random.Generator
    config: dict[str, Any]  # the whole validated config
    block: dict[str, Any]  # this experiment's block
    cache: dict[str, Any] = field(default_factory=dict)  # per-job scratch (inputs, refs)


class Experiment:
    name: str = ""
    title: str = ""
    # What to look for and the expected effect: shown above the figures in the report.
    caption: str = ""
    schema: dict[str, Any] = {}
    # figure name -> caption; plot() draws each of these names
    figures: dict[str, str] = {}
    # A small grid (a config block) for the GPU smoke test (tests/gpu) and quick runs.
    smoke: dict[str, Any] = {}
    # Position in the report (course order).
    order: int = 100

    def check_config(self, block: dict[str, Any]) -> list[str]:
        """Cross-field rules the schema cannot express; messages start with the key."""
        return []

    def points(self, block: dict[str, Any]) -> list[Point]:
        raise NotImplementedError

    def prepare(self, ctx: RunContext) -> None:
        """Once per job, before any point (compile kernels, allocate shared buffers)."""

    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        """The compiled kernel (cudalab.gpu.Kernel) a GPU point uses, for its cache key and
        provenance; compiling is cached, so this is cheap after the first call."""
        return None

    def measure(self, ctx: RunContext, point: Point) -> Result:
        raise NotImplementedError

    def plot(self, name: str, df: pd.DataFrame) -> Figure | None:
        """Draw figure `name` from this experiment's ok rows (None if nothing to draw)."""
        raise NotImplementedError

    def expectations(self, df: pd.DataFrame) -> list[Expectation]:
        return []

    # shared helpers -------------------------------------------------------------------
    @staticmethod
    def ok(df: pd.DataFrame) -> pd.DataFrame:
        return df[df["status"] == "ok"]


def rel_fro_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref||_F / ||ref||_F in float64; inf if anything is not finite (unwritten)."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (denom if denom > 0 else 1.0))


def uniform_f32(rng: np.random.Generator, shape: int | tuple[int, ...], lo: float = -1.0,
                hi: float = 1.0) -> np.ndarray:
    """Fresh float32 inputs uniform in [lo, hi), drawn in float32 directly: a float64 draw
    plus a cast takes ~3x longer, which at 2^26 elements is most of a grid point's
    overhead."""
    x = rng.random(shape, dtype=np.float32)
    x *= np.float32(hi - lo)
    x += np.float32(lo)
    return x


def poison(a: np.ndarray) -> None:
    """Fill an output with NaN (floats) or a sentinel so unwritten elements show."""
    if np.issubdtype(a.dtype, np.floating):
        a.fill(np.nan)
    else:
        a.fill(np.iinfo(a.dtype).max if np.issubdtype(a.dtype, np.integer) else 0)


Registry = dict[str, Experiment]
Factory = Callable[[], Experiment]
