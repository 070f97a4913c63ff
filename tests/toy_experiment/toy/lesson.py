"""The toy's lesson: what the report says about it (title, caption, figure caption), a
fact, two claims (each with the data change that turns it over) and a Try-this."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    Lesson,
    TryThis,
    judged,
    no_data,
    ok,
    one_wrong,
    slower,
)

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings


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


LESSON = Lesson(
    title="Toy: a sum on the CPU",
    caption="A numpy sum of n floats: small sums are faster.",
    figures={"time": "time per sum against n"},
    claims=(Claim("every sum is exact", every_sum_exact, one_wrong, "exact"),
            Claim("small sums are faster", small_is_faster,
                  lambda d: slower(d, _smallest, 1e6), "small_faster")),
    explanations=(sums_counted,),
    try_this=[TryThis("experiments.toy.sizes: [10]", "one point: the claim says so")],
)
