"""The memset lesson: what the report says about the driver's memset bandwidth."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    Lesson,
    TryThis,
    col,
    judged,
    no_data,
    ok,
    one_wrong,
    slower,
)

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings


def every_buffer_set(d: pd.DataFrame, c: Ceilings) -> Judgement:
    good = ok(d)
    return judged(bool(len(good)) and len(good) == len(d), f"{len(good)} of {len(d)} ok")


def large_is_faster(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = ok(d).sort_values("p_mib")
    if len(d) < 2:
        return no_data("one size only")
    r = col(d, "gbps")
    return judged(bool(r.iloc[-1] > r.iloc[0]),
                  f"{r.iloc[0]:.3g} GB/s at the smallest, {r.iloc[-1]:.3g} at the largest")


def _largest(d: pd.DataFrame) -> pd.Series:
    return col(d, "p_mib") == col(d, "p_mib").max()


LESSON = Lesson(
    title="Memset: the driver's fill bandwidth",
    caption="The driver sets a buffer to one 32-bit word; small buffers pay the launch, "
            "large ones run at memory speed.",
    figures={"bandwidth": "GB/s against the buffer size"},
    claims=(Claim("every buffer holds the word afterwards", every_buffer_set, one_wrong,
                  "every_set"),
            Claim("the largest buffer is set at a higher rate than the smallest",
                  large_is_faster, lambda d: slower(d, _largest, 1e3), "large_faster")),
    try_this=[TryThis("experiments.memset_bw.sizes_mib: [1]",
                      "one size only: the claim comparing sizes has no data to judge"),
              TryThis("experiments.memset_bw.sizes_mib: [1, 4096]",
                      "the largest buffer the schema allows: the rate at memory speed")],
    questions=("Why does a small memset reach a lower rate than a large one?",
               "Which limit would a memset of a buffer in L2 run into?"),
)
