"""What the block-rate probe (vector_add's `block_rate` points) says about vec_mul's small
blocks: a course fact of the occupancy lesson, read from the whole run's table, since the
probe runs in the vector_add experiment."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import col, ok
from cudalab.experiments.vector_add import block_rate

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

# As vector_add's claim: the blocks at the probe's rate account for at least this share.
BLOCK_SHARE = 0.6
SMALL = 32
LARGE = 256


def small_blocks_block_rate(t: pd.DataFrame, c: Ceilings) -> str | None:
    """vec_mul at 32 and 256 threads: measured time against its block count over the
    one-load probe's block rate at that block size (None: probe or rows missing)."""
    r = block_rate.rates(t[t["experiment"] == "vector_add"])
    v = ok(t[(t["experiment"] == "occupancy") & (t["variant"] == "vec_mul")])
    v = v[col(v, "time_median_s").notna()]
    if v.empty:
        return None
    if r.empty:
        return ("The block-rate probe, which measures the fixed cost per block that could "
                "account for the small blocks' time, did not run here (vector_add.probe_blocks "
                "in a run with a GPU).")
    v = v[col(v, "p_n") == col(v, "p_n").max()]
    parts, shares = [], {}
    for threads in (SMALL, LARGE):
        row = v[col(v, "p_block_size") == threads]
        rate = block_rate.rate_at(r, "one_load", threads)
        if row.empty or not math.isfinite(rate):
            return None
        n, secs = float(row["p_n"].iloc[0]), float(row["time_median_s"].iloc[0])
        blocks = math.ceil(n / threads)
        alone = blocks / (rate * 1e9)
        shares[threads] = alone / secs
        parts.append(f"{threads} threads: {fmt.integer(blocks)} blocks in {fmt.seconds(secs)}, "
                     f"{fmt.seconds(alone)} at the probe's {fmt.sig(rate, 3)} blocks per ns "
                     f"({fmt.percent(100 * alone / secs)})")
    said = (f"vec_mul at n = {fmt.integer(v['p_n'].iloc[0])} against the block-rate probe "
            "(vector_add lesson), its block count over the probe's rate at the same block "
            "size: " + "; ".join(parts))
    if shares[SMALL] >= BLOCK_SHARE > shares[LARGE]:
        said += (": the small blocks' time is mostly the fixed cost of their blocks, the "
                 "large blocks' is not")
    elif shares[SMALL] < BLOCK_SHARE:
        said += (": the blocks' fixed cost leaves most of the small blocks' time unexplained "
                 "(too few warps in flight is the other candidate)")
    return said + "."
