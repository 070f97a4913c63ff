"""The coalescing lesson: sentences computed from this run's data (explanations) and the
caption's claims checked on it. Every number in a sentence comes from the table; the only
constants are the named thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import Claim, Verdict, ok, pct_range, ref

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings

# The offset curve counts as "almost flat" while no offset loses more than this share.
FLAT_LOSS = 0.2


def coalescing_vs_ceiling(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Each access pattern's bandwidth as a share of the copy ceiling."""
    d = ok(d).dropna(subset=["gbps"])
    dram, what = ref(c)
    if d.empty or not math.isfinite(dram):
        return None
    parts = []
    for v, g in d.groupby("variant", sort=True):
        g = g[g["memory_level"] != "l2"] if (g["memory_level"] != "l2").any() else g
        lo, hi = 100 * g["gbps"].min() / dram, 100 * g["gbps"].max() / dram
        parts.append(f"{v} {fmt.percent(hi)}" if len(g) == 1 or round(lo) == round(hi)
                     else f"{v} {pct_range(lo, hi)}")
    return (f"Against the {what} (DRAM-resident points): " + ", ".join(parts) + ".")

def coalescing_transpose_l2(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Transposes above the DRAM ceiling: L2-resident, said with their working set."""
    tr = ok(d[d["variant"].astype(str).str.startswith("transpose")])
    dram, what = ref(c)
    if tr.empty or not math.isfinite(dram):
        return None
    above = tr[tr["gbps"] > dram]
    if above.empty:
        return None
    parts = [f"{r['variant']} at {int(r['p_size'])}² ({fmt.bandwidth(r['gbps'])}, working "
             f"set {fmt.nbytes(r['working_set_bytes'])}"
             + (", L2-resident" if r["memory_level"] == "l2" else "") + ")"
             for _, r in above.iterrows()]
    l2 = f"the {fmt.nbytes(c.l2_bytes)} L2" if math.isfinite(c.l2_bytes) else "L2"
    return (f"Above the {what}: " + "; ".join(parts) + f". Such a matrix fits {l2} and the "
            "run did not flush it, so this is L2 bandwidth, not DRAM: compare it with the L2 "
            "ceiling, not with the DRAM peak.")

def _coalescing_offset_flat(d: pd.DataFrame, c: Ceilings) -> Verdict:
    off = ok(d[d["variant"] == "offset"]).dropna(subset=["gbps"])
    if len(off) < 2:
        return None, "fewer than two offsets"
    lo, hi = off["gbps"].min(), off["gbps"].max()
    return (lo >= (1 - FLAT_LOSS) * hi,
            f"offsets {fmt.sig(lo)}–{fmt.bandwidth(hi)} (the worst loses "
            f"{fmt.percent(100 * (1 - lo / hi))}; threshold {FLAT_LOSS:.0%})")


EXPLANATIONS = (coalescing_vs_ceiling, coalescing_transpose_l2)
CLAIMS = (
    Claim("the offset curve almost flat", _coalescing_offset_flat),
)
