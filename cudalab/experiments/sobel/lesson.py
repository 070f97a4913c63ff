"""The sobel lesson: sentences computed from this run's data (explanations) and the
caption's claims checked on it. Every number in a sentence comes from the table; the only
constants are the named thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import LARGE_FRACTION, Claim, Verdict, largest, ncu, ok, ref

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings


def sobel_caches(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Whether the global kernel keeps up with shared tiles: the caches do the tiling."""
    d = ok(d).dropna(subset=["gbps"])
    big = largest(d, "p_width")
    best = big.groupby("variant")["gbps"].max() if len(big) else pd.Series(dtype=float)
    if not {"global", "shared"} <= set(best.index):
        return None
    g, s = best["global"], best["shared"]
    out = (f"At {int(big['p_width'].iloc[0])}² the global kernel reaches "
           f"{fmt.bandwidth(g)}, the shared-tile kernel {fmt.bandwidth(s)} (best block "
           "shape each)")
    out += (": the nine re-reads per pixel of the global kernel are served by L1/L2 as well "
            "as the hand-made tile serves them" if g >= s else
            ": the explicit tile pays off over the caches")
    hit = ncu(big[big["variant"] == "global"], "m_ncu_l2_hit_rate_pct").max()
    if math.isfinite(hit):
        out += f" (Nsight Compute: L2 hit rate up to {fmt.percent(hit)})"
    return out + "."

def _sobel_far_from_bandwidth(d: pd.DataFrame, c: Ceilings) -> Verdict:
    d = ok(d).dropna(subset=["gbps"])
    dram, what = ref(c)
    big = largest(d, "p_width")
    if big.empty or not math.isfinite(dram):
        return None, "no image or no DRAM ceiling"
    g = big["gbps"].max()
    return (g < LARGE_FRACTION * dram,
            f"best {fmt.bandwidth(g)} at {int(big['p_width'].iloc[0])}²: "
            f"{fmt.percent(100 * g / dram)} of the {what} (far: below {LARGE_FRACTION:.0%})")


EXPLANATIONS = (sobel_caches,)
CLAIMS = (
    Claim("far from the DRAM bandwidth even at large images", _sobel_far_from_bandwidth),
)
