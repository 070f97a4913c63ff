"""A toy lesson, one folder as docs/experiments.md's recipe makes it: a numpy sum of n
floats on the CPU (so it runs without a GPU), with its figure, a fact, two claims (each with
the data change that turns it over), a Try-this and its course numbers (course.yaml).
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
from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    TryThis,
    judged,
    no_data,
    ok,
    one_wrong,
    slower,
)
from cudalab.harness import WallTimer

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from cudalab.roofline import Ceilings


def sums_counted(d: pd.DataFrame, c: Ceilings) -> str | None:
    d = ok(d)
    return f"The toy summed {len(d)} arrays." if len(d) else None


def small_is_faster(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = ok(d).sort_values("p_n")
    if len(d) < 2:
        return no_data("one size only")
    t = d["time_median_s"]
    return judged(bool(t.iloc[0] <= t.iloc[-1]), f"{t.iloc[0]:.2g} s vs {t.iloc[-1]:.2g} s")


def every_sum_exact(d: pd.DataFrame, c: Ceilings) -> Judgement:
    good = ok(d)
    return judged(bool(len(good)) and len(good) == len(d), f"{len(good)} of {len(d)} ok")


def _smallest(d: pd.DataFrame) -> pd.Series:
    return d["p_n"] == d["p_n"].min()


class Toy(Experiment):
    name = "toy"
    order = 200
    title = "Toy: a sum on the CPU"
    caption = "A numpy sum of n floats: small sums are faster."
    schema = block_schema({"sizes": {"type": "array", "default": [1000, 100_000],
                                     "items": {"type": "integer", "minimum": 1}}})
    figures = {"time": "time per sum against n"}
    explanations = (sums_counted,)
    claims = (Claim("every sum is exact", every_sum_exact, one_wrong, "exact"),
              Claim("small sums are faster", small_is_faster,
                    lambda d: slower(d, _smallest, 1e6), "small_faster"))
    try_this = [TryThis("experiments.toy.sizes: [10]", "one point: the claim says so")]

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
        ax.set(xlabel="n", ylabel="time (s)", title=self.title)
        return fig
