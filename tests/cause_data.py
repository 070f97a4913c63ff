"""Synthetic runs for the claims about a cause: a committed reference's rows plus the rows of
a cause probe (block rate, duplex copies) made from a model, once where the claimed cause
holds and once where the competing cause does. Each claim about a cause must be seen on the
first and not seen on the second (tests/test_cause_claims.py), and the claims audit judges
and flips them here (tests/test_claims.py), since the committed references predate the
probes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from cudalab.experiments.vector_add import block_rate

LAUNCH_S = 3e-6  # a launch's fixed time in the model


def _row_like(template: pd.Series, **values: object) -> dict:
    row = template.to_dict()
    for c in [c for c in row if c.startswith(("p_", "m_"))]:
        row[c] = np.nan
    row.update(status="ok", reason=np.nan, gbps=np.nan, gflops=np.nan, flops=np.nan)
    row.update(values)
    return row


def block_rate_run(ref: pd.DataFrame, rate_per_ns: float | None = None) -> pd.DataFrame:
    """ref plus one-load and empty probe rows whose time is LAUNCH_S + blocks / rate.
    rate_per_ns None: the rate that makes the slowest vector-add size's blocks its whole
    time (a fixed cost per block holds); a number: that rate (10x it: blocks are cheap,
    latency hiding is what is left)."""
    va = ref[(ref["experiment"] == "vector_add") & (ref["variant"] == "gpu")]
    big = va[va["p_n"] == va["p_n"].max()]
    slowest = big.loc[big["time_median_s"].idxmax()]
    if rate_per_ns is None:
        rate_per_ns = math.ceil(slowest["p_n"] / slowest["p_threads"]) / (
            (slowest["time_median_s"] - LAUNCH_S) * 1e9)
    rows = []
    for kind in block_rate.KINDS:
        for t in sorted(va["p_threads"].dropna().unique()):
            for b in block_rate.DEFAULT_BLOCKS:
                s = LAUNCH_S + b / (rate_per_ns * 1e9)
                rows.append(_row_like(
                    slowest, variant=block_rate.VARIANT,
                    point_id=f"block_rate-kind{kind}-threads{int(t)}-blocks{b}",
                    p_kind=kind, p_threads=float(t), p_blocks=float(b), m_blocks=float(b),
                    time_median_s=s, time_min_s=s, time_mean_s=s,
                    bytes=4.0 * b * t if kind == "one_load" else np.nan))
    return pd.concat([ref, pd.DataFrame(rows)], ignore_index=True)


def fixed_cost_rate(ref: pd.DataFrame) -> float:
    """The block rate at which the fixed-cost model explains ref's slowest size."""
    d = block_rate_run(ref)
    return float(block_rate.rates(d)["rate"].iloc[0])


def duplex_run(ref: pd.DataFrame, duplex_ratio: float) -> pd.DataFrame:
    """ref plus the streams experiment's duplex points: H2D and D2H alone at the stage times
    ref's streams rows carry, both at once taking (h2d + d2h) / duplex_ratio (about 2: full
    duplex; about 1: the two directions share one path)."""
    st = ref[(ref["experiment"] == "streams") & (ref["status"] == "ok")]
    row = st.iloc[0]
    n = float(row["p_n"])
    h2d, d2h = float(row["m_h2d_s"]), float(row["m_d2h_s"])
    times = {"h2d": h2d, "d2h": d2h, "both": (h2d + d2h) / duplex_ratio}
    rows = [_row_like(row, variant="duplex", point_id=f"duplex-n{int(n)}-direction{k}",
                      p_n=n, p_direction=k, time_median_s=s, time_min_s=s, time_mean_s=s,
                      bytes=4.0 * n * (2 if k == "both" else 1),
                      gbps=4.0 * n * (2 if k == "both" else 1) / s / 1e9)
            for k, s in times.items()]
    return pd.concat([ref, pd.DataFrame(rows)], ignore_index=True)


def synthetic_references(h100: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The H100 reference plus each cause probe's rows, once where the claimed cause holds
    and once where the competing one does (the claims audit's extra references)."""
    rate = fixed_cost_rate(h100)
    return {
        "H100 + probes, fixed cost per block, full duplex":
            duplex_run(block_rate_run(h100), 1.9),
        "H100 + probes, cheap blocks, shared copy path":
            duplex_run(block_rate_run(h100, 10 * rate), 1.05),
    }
