"""A toy lesson, one folder as docs/experiments.md's recipe makes it: a numpy sum of n
floats on the CPU (so it runs without a GPU) with its figure here, its lesson (a fact, two
claims, a Try-this) in lesson.py and its course numbers in course.yaml.
tests/test_experiment_folder.py copies this folder away and registers it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments.base import (
    Check,
    Experiment,
    Point,
    Result,
    RunContext,
    block_schema,
)
from cudalab.harness import WallTimer

from .lesson import LESSON  # relative: the folder may live outside the package

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class Toy(Experiment):
    name = "toy"
    order = 200
    lesson = LESSON
    schema = block_schema({"sizes": {"type": "array", "default": [1000, 100_000],
                                     "items": {"type": "integer", "minimum": 1}}})

    def points(self, block: dict[str, Any]) -> list[Point]:
        return [Point(self.name, "numpy", {"n": n}, gpu=False) for n in block["sizes"]]

    def measure(self, ctx: RunContext, point: Point) -> Result:
        x = np.ones(point.params["n"], np.float32)

        def check() -> Check:
            return Check(abs(float(x.sum()) - x.size), 0.0, "abs_error")

        chk, timing = self.verify_then_time(ctx, x.sum, check, timer=WallTimer())
        return Result(timing, flops=float(x.size), bytes=4.0 * x.size, check=chk)

    def plot(self, name: str, df: pd.DataFrame) -> Figure | None:
        import matplotlib.pyplot as plt

        d = self.ok(df)
        if d.empty:
            return None
        fig, ax = plt.subplots()
        ax.plot(d["p_n"], d["time_median_s"], "o-")
        ax.set(xlabel="n", ylabel="time (s)", title=self.lesson.title)
        return fig
