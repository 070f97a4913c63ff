"""The device_query lesson: its claims, each a predicate over the device row with the data
change that turns it over. The device row is a query, not a measurement of speed: the claims
say that cudalab's view of the GPU (its limits table, the peaks computed from the reported
clocks) holds on this device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.base import NOT_MEASURED
from cudalab.experiments.lesson import Claim, Judgement, col, judged, no_data, with_value

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings


def _device(d: pd.DataFrame) -> pd.DataFrame:
    """The queried device rows (a run without a GPU records none)."""
    return d[d["status"].astype(str) != NOT_MEASURED]


def _cc(r: pd.Series) -> str:
    cc = r.get("m_cc")
    return f"{float(cc):.1f}" if isinstance(cc, (int, float)) else str(cc)


def _table_matches(d: pd.DataFrame, c: Ceilings) -> Judgement:
    rows = _device(d)
    rows = rows[rows["status"].astype(str).isin(["ok", "wrong"])]
    if rows.empty:
        return no_data("no device row checked against cudalab's table")
    r = rows.iloc[-1]
    return judged(r["status"] == "ok",
                  f"cc {_cc(r)}: mismatches: {r.get('m_table_mismatches') or 'none'}")


def _peaks_computed(d: pd.DataFrame, c: Ceilings) -> Judgement:
    rows = _device(d)
    if rows.empty:
        return no_data("no device queried")
    r = rows.iloc[-1]
    mem, fp32 = col(rows, "m_peak_mem_gbps").iloc[-1], col(rows, "m_peak_fp32_gflops").iloc[-1]
    return judged(bool(pd.notna(mem) and mem > 0 and pd.notna(fp32) and fp32 > 0),
                  f"peak DRAM {fmt.bandwidth(mem) or 'not computed'}, FP32 "
                  f"{fmt.flop_rate(fp32) or 'not computed'} (clocks from "
                  f"{r.get('m_clock_source')})")


def _first(d: pd.DataFrame) -> pd.Series:
    return pd.Series(d.index == d.index[0], index=d.index)


CLAIMS = (
    Claim("cudalab's limits table for this compute capability matches the device (the "
          "occupancy calculator's input)", _table_matches,
          lambda d: with_value(d, _first, "status", "wrong"), "limits_table_matches"),
    Claim("the theoretical peaks could be computed (clocks, bus width and SMs reported)",
          _peaks_computed,
          lambda d: with_value(d, _first, "m_peak_mem_gbps", float("nan")), "peaks_computed"),
)
