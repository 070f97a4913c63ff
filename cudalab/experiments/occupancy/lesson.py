"""The occupancy lesson: sentences computed from this run's data (explanations) and the
caption's claims checked on it. Every number in a sentence comes from the table; the only
constants are the named thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import (
    FULL_BANDWIDTH_SHARE,
    Claim,
    Verdict,
    col,
    ncu,
    ok,
    pct_range,
    ref,
)

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings

# Theoretical occupancy that counts as "full" (the calculator's fraction).
FULL_OCCUPANCY = 0.99
# Achieved occupancy (ncu) this far below the theoretical one is worth a sentence.
OCCUPANCY_GAP = 0.8


def occupancy_achieved(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Achieved (ncu) against theoretical occupancy per block size, per kernel."""
    d = ok(d).assign(achieved=ncu(d, "m_ncu_achieved_occupancy_pct"),
                      theory=100 * col(d, "m_occupancy_theory"))
    d = d[d["achieved"].notna() & d["theory"].notna() & (d["theory"] > 0)]
    if d.empty:
        return None
    parts = []
    for v, g in d.groupby("variant", sort=True):
        ratio = g["achieved"] / g["theory"]
        worst = g.loc[ratio.idxmin()]
        parts.append(f"{v}: achieved {pct_range(100 * ratio.min(), 100 * ratio.max())} of "
                     f"theoretical over {len(g)} block "
                     f"sizes, least at {int(worst['p_block_size'])} threads "
                     f"({fmt.percent(worst['achieved'])} of {fmt.percent(worst['theory'])})")
    low = d[d["achieved"] < OCCUPANCY_GAP * d["theory"]]
    tail = (f"; {len(low)} points stay below {OCCUPANCY_GAP:.0%} of their theoretical "
            "occupancy (tail effects: too few blocks for the last wave, or warps that "
            "finish early)" if len(low) else "")
    return "Nsight Compute's achieved occupancy against the calculator's: " + "; ".join(
        parts) + tail + "."

def occupancy_knee(d: pd.DataFrame, c: Ceilings) -> str | None:
    """From which theoretical occupancy the memory-bound vec_mul is at full bandwidth."""
    v = ok(d[d["variant"] == "vec_mul"]).dropna(subset=["gbps"])
    v = v.assign(occ=col(v, "m_occupancy_theory")).dropna(subset=["occ"])
    if len(v) < 2:
        return None
    best = v["gbps"].max()
    full = v[v["gbps"] >= FULL_BANDWIDTH_SHARE * best]
    dram, what = ref(c)
    s = (f"vec_mul is within {1 - FULL_BANDWIDTH_SHARE:.0%} of its best "
         f"{fmt.bandwidth(best)} from {fmt.percent(100 * full['occ'].min())} theoretical "
         f"occupancy up")
    if math.isfinite(dram):
        s += f" (its best is {fmt.percent(100 * best / dram)} of the {what})"
    below = v[v["occ"] < full["occ"].min()]
    if len(below):
        s += (f"; below that it drops to {fmt.bandwidth(below['gbps'].min())}: too few "
              "resident warps to hide memory latency")
    slow = v[(v["occ"] >= full["occ"].min()) & (v["gbps"] < FULL_BANDWIDTH_SHARE * best)]
    if len(slow):
        sizes = ", ".join(str(int(b)) for b in sorted(slow["p_block_size"]))
        s += (f"; yet {len(slow)} block sizes with at least that occupancy stay below it "
              f"({sizes} threads: {fmt.sig(slow['gbps'].min())}–"
              f"{fmt.bandwidth(slow['gbps'].max())}): occupancy is not what limits them")
    return s + "."

def _occupancy_full_but_slow(d: pd.DataFrame, c: Ceilings) -> Verdict:
    """The smallest vec_mul block at full theoretical occupancy is below full bandwidth."""
    v = ok(d[d["variant"] == "vec_mul"]).dropna(subset=["gbps"])
    v = v.assign(occ=col(v, "m_occupancy_theory"), threads=col(v, "p_block_size"))
    full = v[v["occ"] >= FULL_OCCUPANCY].dropna(subset=["threads"])
    if full.empty:
        return None, "no vec_mul point at full theoretical occupancy"
    small = full.loc[full["threads"].idxmin()]
    best = v["gbps"].max()
    return (small["gbps"] < FULL_BANDWIDTH_SHARE * best,
            f"vec_mul with {int(small['threads'])}-thread blocks: theoretical occupancy "
            f"{fmt.percent(100 * small['occ'])}, {fmt.bandwidth(small['gbps'])} = "
            f"{fmt.percent(100 * small['gbps'] / best)} of its best {fmt.bandwidth(best)} "
            f"(slower: below {FULL_BANDWIDTH_SHARE:.0%})")


EXPLANATIONS = (occupancy_achieved, occupancy_knee)
CLAIMS = (
    Claim("the smallest blocks reach full occupancy on paper yet run slower",
          _occupancy_full_but_slow),
)
