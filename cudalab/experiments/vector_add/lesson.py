"""The vector_add lesson: sentences computed from this run's data (explanations) and the
caption's claims checked on it. Every number in a sentence comes from the table; the only
constants are the named thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import (
    FULL_BANDWIDTH_SHARE,
    LARGE_FRACTION,
    Claim,
    Verdict,
    largest,
    ok,
    ref,
)

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings


def vector_add_share(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The largest vector's best block size against the DRAM ceiling; L2-resident sizes."""
    d = ok(d).dropna(subset=["gbps"])
    dram, what = ref(c)
    big = largest(d, "p_n")
    if big.empty or not math.isfinite(dram):
        return None
    best = big.loc[big["gbps"].idxmax()]
    s = (f"At n = {fmt.integer(best['p_n'])} ({fmt.nbytes(best['working_set_bytes'])} moved, "
         f"{best['memory_level'] or 'level unknown'}) the best block size, "
         f"{int(best['p_threads'])} threads, reaches {fmt.bandwidth(best['gbps'])} = "
         f"{fmt.percent(100 * best['gbps'] / dram)} of the {what}")
    l2 = sorted({int(n) for n in d.loc[d["memory_level"] == "l2", "p_n"]})
    if l2:
        s += (f"; n = {', '.join(fmt.integer(n) for n in l2)} fit L2 on this hot run: their "
              "GB/s say nothing about DRAM")
    return s + "."

def _vector_add_large(d: pd.DataFrame, c: Ceilings) -> Verdict:
    d = ok(d).dropna(subset=["gbps"])
    dram, what = ref(c)
    big = largest(d, "p_n")
    if big.empty or not math.isfinite(dram) or big["p_n"].iloc[0] < 1e6:
        return None, "no vector of millions of elements in this run"
    g = big["gbps"].max()
    return (g >= LARGE_FRACTION * dram,
            f"{fmt.bandwidth(g)} at n = {fmt.integer(big['p_n'].iloc[0])}: "
            f"{fmt.percent(100 * g / dram)} of the {what} (threshold "
            f"{LARGE_FRACTION:.0%})")

def _vector_add_small_blocks(d: pd.DataFrame, c: Ceilings) -> Verdict:
    big = largest(ok(d).dropna(subset=["gbps"]), "p_n")
    if big.empty or big["p_threads"].nunique() < 2:
        return None, "one block size only"
    small = big[big["p_threads"] == big["p_threads"].min()]["gbps"].max()
    best = big["gbps"].max()
    return (small < FULL_BANDWIDTH_SHARE * best,
            f"{int(big['p_threads'].min())} threads: {fmt.bandwidth(small)} vs best "
            f"{fmt.bandwidth(best)} at n = {fmt.integer(big['p_n'].iloc[0])}")


EXPLANATIONS = (vector_add_share,)
CLAIMS = (
    Claim("millions of elements reaching a large fraction of peak bandwidth", _vector_add_large),
    Claim("blocks of 32 threads lagging behind", _vector_add_small_blocks),
)
