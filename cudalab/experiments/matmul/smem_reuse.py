"""FMAs per shared-memory load of the shared-memory kernels, counted from each kernel's own
configuration, and the claim that they set the register kernels' speed.

Per step k of the inner loop (cuda/matmul.cu), a thread of
- matmul_tiled loads one word of the A tile and one of the B tile for one FMA: 1/2;
- matmul_register loads RM words of A and RN of B for RM x RN FMAs: RM RN / (RM + RN),
  rt/2 for the square register tile rt = RM = RN.
Where shared-memory loads limit these kernels, their speed rises with this ratio; where
something else does (global traffic, latency, the issue rate), it does not.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import Judgement, col, judged, no_data, ok, slower

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

TILED_FMA_PER_LOAD = 0.5  # one FMA for one word of A and one of B
# Each step up in FMAs per shared-memory load is at least this much faster (GFLOP/s).
STEP_GAIN = 1.05


def fma_per_load(variant: str, rt: float) -> float:
    """FMAs per shared-memory word a thread loads, from the kernel's configuration (NaN:
    not one of the two kernels)."""
    if variant == "tiled":
        return TILED_FMA_PER_LOAD
    if variant == "register" and rt > 0:
        return rt * rt / (2 * rt)
    return math.nan


def ladder(d: pd.DataFrame) -> pd.DataFrame:
    """At the largest float32 product: the best tiled row and each register tile's best row,
    with fma_per_load, in rising order of it."""
    d = ok(d)
    d = d[d["variant"].isin(["tiled", "register"]) & col(d, "gflops").notna()]
    if "p_dtype" in d:
        d = d[d["p_dtype"].isna() | (d["p_dtype"].astype(str) == "float32")]
    f = col(d, "flops")
    d = d[f == f.max()]
    if d.empty:
        return d.assign(fpl=pd.Series(dtype=float))
    d = d.assign(fpl=[fma_per_load(v, r) for v, r in zip(d["variant"], col(d, "p_rt"))])
    best = d.loc[d.groupby("fpl")["gflops"].idxmax()]
    return best.sort_values("fpl")


def _label(r: pd.Series) -> str:
    name = "tiled" if r["variant"] == "tiled" else f"register rt {int(r['p_rt'])}"
    return f"{name}: {fmt.short(r['fpl'])} FMAs per load, {fmt.flop_rate(r['gflops'])}"


def fact(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The FMAs per shared-memory load of each kernel beside its speed at the largest size."""
    lad = ladder(d)
    if len(lad) < 2:
        return None
    return ("FMAs per shared-memory word a thread loads, counted from each kernel's "
            "configuration (per k step: one word of A and one of B for one FMA in tiled; rt "
            "of A and rt of B for rt x rt FMAs in register), beside its speed at the largest "
            "size: " + "; ".join(_label(r) for _, r in lad.iterrows()) + ".")


def claim(d: pd.DataFrame, c: Ceilings) -> Judgement:
    lad = ladder(d)
    if len(lad) < 2 or (lad["variant"] == "register").sum() < 1:
        return no_data("tiled and register tiles not measured at one size")
    g = col(lad, "gflops").to_numpy()
    steps = g[1:] / g[:-1]
    return judged(bool((steps >= STEP_GAIN).all()),
                  "; ".join(_label(r) for _, r in lad.iterrows())
                  + f" (smallest step {fmt.ratio(float(steps.min()))})")


def _ranked(d: pd.DataFrame) -> list[tuple[pd.Series, float]]:
    """(mask of a ladder row, its gflops) in rising FMAs per load."""
    return [(pd.Series(d.index == i, index=d.index), float(r["gflops"]))
            for i, r in ladder(d).iterrows()]


def other_limit(d: pd.DataFrame) -> pd.DataFrame:
    """The competing cause: something other than shared loads limits them, so every rung
    runs at the speed of the first (more FMAs per load buy nothing)."""
    ranked = _ranked(d)
    for mask, g in ranked[1:]:
        d = slower(d, lambda x, m=mask: m, g / ranked[0][1])
    return d


def loads_limit(d: pd.DataFrame) -> pd.DataFrame:
    """Shared loads limit them: speed in proportion to FMAs per load (from the first)."""
    lad = ladder(d)
    if lad.empty:
        return d
    base_g, base_f = float(lad["gflops"].iloc[0]), float(lad["fpl"].iloc[0])
    for i, r in lad.iloc[1:].iterrows():
        want = base_g * r["fpl"] / base_f
        d = slower(d, lambda x, i=i: pd.Series(x.index == i, index=x.index),
                   float(r["gflops"]) / want)
    return d
