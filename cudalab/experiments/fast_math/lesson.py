"""The fast_math lesson: sentences computed from this run's data (explanations) and the
caption's claims checked on it. Every number in a sentence comes from the table; the only
constants are the named thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import Claim, Verdict, col, largest, ok

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings


def fast_math_ridge(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Where the iteration counts sit against the ridge point (memory- or compute-bound)."""
    d = ok(d).dropna(subset=["intensity"])
    dram, _ = c.bandwidth("dram")
    roof, kind = c.flops()
    if d.empty or not (math.isfinite(dram) and math.isfinite(roof)):
        return None
    ridge = roof / dram
    by = d.groupby("p_iterations")["intensity"].max().sort_index()
    left = [int(i) for i, x in by.items() if x < ridge]
    right = [int(i) for i, x in by.items() if x >= ridge]
    s = f"The {kind} ridge point is at {fmt.short(ridge)} FLOP/byte (FP32 roof / DRAM)"
    if left:
        s += (f"; {', '.join(map(str, left))} iteration(s) sit left of it (memory-bound: "
              "cheaper math cannot help)")
    if right:
        s += (f"; {', '.join(map(str, right))} iterations right of it (compute-bound: "
              "where the fast variants can win)")
    return s + "."

def _fast_math_one_iteration(d: pd.DataFrame, c: Ceilings) -> Verdict:
    one = ok(d[col(d, "p_iterations") == 1]).dropna(subset=["time_median_s"])
    one = largest(one, "p_n")
    t = one.groupby("variant")["time_median_s"].min()
    if "precise" not in t or len(t) < 2:
        return None, "no 1-iteration points of precise and a fast variant"
    gain = t["precise"] / t.drop("precise").min()
    done = ok(d).dropna(subset=["time_median_s"])
    most = largest(done[col(done, "p_iterations") == col(done, "p_iterations").max()],
                   "p_n")
    tm = most.groupby("variant")["time_median_s"].min()
    if "precise" not in tm or len(tm) < 2 or most["p_iterations"].max() <= 1:
        return None, "no points at more than 1 iteration to compare with"
    gain_most = tm["precise"] / tm.drop("precise").min()
    return (gain < gain_most,
            f"the fastest variant gains {gain:.2f}x over precise at 1 iteration and "
            f"{gain_most:.2f}x at {int(most['p_iterations'].max())} iterations")


EXPLANATIONS = (fast_math_ridge,)
CLAIMS = (
    Claim("a smaller gain at 1 iteration", _fast_math_one_iteration),
)
