"""The device_query lesson: its claims, each a predicate over the device row with the data
change that turns it over. The device row is a query, not a measurement of speed: the claims
say that cudalab's view of the GPU (its limits table, the peaks computed from the reported
clocks) holds on this device."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.base import NOT_MEASURED
from cudalab.experiments.device_query import answers
from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    Lesson,
    TryThis,
    col,
    judged,
    no_data,
    with_value,
)
from cudalab.experiments.questions import Question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings


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
          lambda d: with_value(d, _first, "status", "wrong"), "limits_table_matches",
          tool=True),
    Claim("the theoretical peaks could be computed (clocks, bus width and SMs reported)",
          _peaks_computed,
          lambda d: with_value(d, _first, "m_peak_mem_gbps", float("nan")), "peaks_computed",
          tool=True),
)

LESSON = Lesson(
    title="Device query: the GPU's limits and theoretical peaks",
    print_pages=0.55,  # its share of the A4 handout
    caption=(
        "What deviceQuery prints: SMs, clocks, memory bus, caches, shared memory and "
        "registers per block and per SM, copy engines, PCIe. The theoretical peaks follow "
        "from them: DRAM bandwidth = 2 x memory clock x bus width / 8 and FP32 = 2 x FP32 "
        "cores per SM x SMs x SM clock. They are the ceilings the other experiments' GB/s "
        "and GFLOP/s are measured against. The check compares cudalab's "
        "per-compute-capability limits table (the occupancy calculator's input) with this "
        "device."
    ),
    # no figures: its summary table (summary_table) is the lesson
    claims=CLAIMS,
    try_this=[
        TryThis("device_query.clock_source: nvml", "the peaks are computed from NVML's maximum "
                "clocks instead of the driver's attributes; on most GPUs the numbers agree, "
                "where they differ the 'Clocks read from' line says which one the other "
                "experiments were compared with"),
        TryThis("gpu_index: 1", "on a machine with two GPUs the whole run moves to the second "
                "one: if it is another model, SMs, bus width and clocks change, and with them both "
                "peaks and every % of peak in this report"),
    ],
    questions=[
        Question(
            "Derive the DRAM peak from the memory clock and bus width above: why the factor 2?",
            answers.dram_peak),
        Question(
            "FP32 peak = 2 x cores x clock: where does the 2 come from, and which kernel here "
            "could ever reach it?",
            answers.fp32_peak),
        Question(
            "How many warps can one SM hold at once, and how does that bound the occupancy "
            "experiment's curves?",
            answers.warps_per_sm),
    ],
    sources={
        "2048": "the most resident threads per SM at compute capability 3.7, the K80's "
                "(CUDA C++ Programming Guide, Compute Capabilities, technical specifications)",
    },
)
