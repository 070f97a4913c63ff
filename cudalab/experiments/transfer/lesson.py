"""The transfer lesson: its claims (each a predicate over this run's table with its threshold
and the data change that turns it over) and its facts (sentences computed from the table).
Every number in a sentence comes from the table; the only constants are the named thresholds
below."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.flip import to_gbps, turn
from cudalab.experiments.lesson import (
    Claim,
    Flip,
    Judge,
    Judgement,
    Lesson,
    Mask,
    State,
    TryThis,
    all_correct,
    col,
    judged,
    no_data,
    ok,
    one_wrong,
)
from cudalab.experiments.questions import Question
from cudalab.experiments.transfer import answers

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

DIRECTIONS = ("h2d", "d2h")
# Pinned at least this much faster than pageable at the largest size (pageable adds a copy
# through the driver's pinned staging buffer, on the CPU).
PINNED_GAIN = 1.5
# Large pinned copies reach at least this share of the link's theoretical rate per direction:
# the packets' headers and the link's flow control take about 10-15 % of it.
LINK_SHARE = 0.75
# The smallest pinned copy reaches under this share of the largest one's GB/s.
SMALL_SHARE = 0.25
# From this size on, pinned copies reach at least LEVEL_SHARE of the largest copy's GB/s.
LEVEL_FROM = 4 << 20
LEVEL_SHARE = 0.8


# -- rows --------------------------------------------------------------------------------------
def _frame(d: pd.DataFrame) -> pd.DataFrame:
    d = ok(d).dropna(subset=["gbps"])
    return d.assign(size=col(d, "p_size"), direction=d["p_direction"].astype(str))


def _rows(d: pd.DataFrame, memory: str, direction: str) -> pd.DataFrame:
    f = _frame(d)
    return f[(f["variant"] == memory) & (f["direction"] == direction)].sort_values("size")


def _at(memory: str, direction: str, lo: float = 0, hi: float = math.inf) -> Mask:
    return lambda d: ((d["variant"] == memory) & (d["p_direction"].astype(str) == direction)
                      & (col(d, "p_size") >= lo) & (col(d, "p_size") <= hi))


def _gbps(d: pd.DataFrame, memory: str, direction: str, size: float) -> float:
    r = _rows(d, memory, direction)
    r = r[r["size"] == size]
    return float(r["gbps"].iloc[0]) if len(r) else math.nan


def link(d: pd.DataFrame) -> tuple[str, float]:
    """The PCIe link's text and theoretical GB/s per direction, as recorded with the largest
    pinned copy (else any row); NaN where not recorded."""
    rows = ok(d)
    if "m_pcie_link" not in rows or rows["m_pcie_link"].isna().all():
        return "PCIe link unavailable (not recorded)", math.nan
    rows = rows.dropna(subset=["m_pcie_link"]).assign(size=lambda x: col(x, "p_size"))
    pinned = rows[rows["variant"] == "pinned"]
    row = (pinned if len(pinned) else rows).sort_values("size").iloc[-1]
    theo = pd.to_numeric(pd.Series([row.get("m_pcie_theoretical_gbps")]), errors="coerce")
    return str(row["m_pcie_link"]), float(theo.iloc[0])


PerDirection = Callable[[pd.DataFrame, str], "tuple[bool, str] | None"]


def _each_direction(judge_one: PerDirection, what: str) -> Judge:
    """A judge that holds where judge_one(d, direction) holds in every direction run (None:
    that direction has no data); what: the rows it needs, for 'not measured'."""
    def judge(d: pd.DataFrame, c: Ceilings) -> Judgement:
        got = [(x, judge_one(d, x)) for x in DIRECTIONS]
        got = [(x, j) for x, j in got if j is not None]
        if not got:
            return no_data(f"no {what} in this run")
        return judged(all(h for _, (h, _) in got),
                      "; ".join(f"{x.upper()}: {ev}" for x, (_, ev) in got))

    return judge


# -- facts -------------------------------------------------------------------------------------
def transfer_fixed_cost(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The smallest copies' time against what their bytes alone take at the largest pinned
    copy's rate: the fixed cost of a copy."""
    f = _frame(d)
    pinned = f[f["variant"] == "pinned"]
    if f.empty or pinned.empty or f["size"].nunique() < 2:
        return None
    size = f["size"].min()
    rate = pinned[pinned["size"] == pinned["size"].max()]["gbps"].max()
    small = f[f["size"] == size].sort_values(["variant", "direction"], ascending=False)
    parts = [f"{fmt.seconds(r['time_median_s'])} ({r['variant']} {r['direction'].upper()})"
             for _, r in small.iterrows()]
    return (f"A copy of {fmt.nbytes(size)} takes " + ", ".join(parts) + "; its bytes alone, "
            f"at the largest pinned copy's {fmt.bandwidth(rate)}, take "
            f"{fmt.seconds(size / rate / 1e9)}: the rest is the fixed cost of a copy.")


# -- claims ------------------------------------------------------------------------------------
def _common_largest(d: pd.DataFrame, direction: str) -> float:
    both = set(_rows(d, "pinned", direction)["size"]) & set(_rows(d, "pageable", direction)
                                                             ["size"])
    return max(both) if both else math.nan


def _pinned_gain(direction: str) -> Judge:
    def judge(d: pd.DataFrame, c: Ceilings) -> Judgement:
        s = _common_largest(d, direction)
        if not math.isfinite(s):
            return no_data(f"pinned and pageable {direction.upper()} copies of one size not "
                           "both in this run")
        pin, page = _gbps(d, "pinned", direction, s), _gbps(d, "pageable", direction, s)
        return judged(pin >= PINNED_GAIN * page,
                      f"{fmt.bandwidth(pin)} vs {fmt.bandwidth(page)} ({fmt.ratio(pin / page)})"
                      f" at {fmt.nbytes(s)}; link: {link(d)[0]}")

    return judge


def _pageable_to(direction: str, factor: float) -> Flip:
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        s = _common_largest(d, direction)
        pin = _gbps(d, "pinned", direction, s)
        return to_gbps(d, _at("pageable", direction, s, s), pin / factor)

    return flip


def _near_link_one(d: pd.DataFrame, direction: str) -> tuple[bool, str] | None:
    r = _rows(d, "pinned", direction)
    theo = link(d)[1]
    if r.empty or not math.isfinite(theo):
        return None
    big = r.iloc[-1]
    return (big["gbps"] >= LINK_SHARE * theo,
            f"{fmt.bandwidth(big['gbps'])} = {fmt.percent(100 * big['gbps'] / theo)} of "
            f"{fmt.bandwidth(theo)} at {fmt.nbytes(big['size'])}")


def _pinned_largest_to(share: float) -> Flip:
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        theo = link(d)[1]
        for x in DIRECTIONS:
            r = _rows(d, "pinned", x)
            if len(r):
                s = r["size"].iloc[-1]
                d = to_gbps(d, _at("pinned", x, s, s), share * theo)
        return d

    return flip


def _small_one(d: pd.DataFrame, direction: str) -> tuple[bool, str] | None:
    r = _rows(d, "pinned", direction)
    if len(r) < 2:
        return None
    small, big = r.iloc[0], r.iloc[-1]
    share = small["gbps"] / big["gbps"]
    return (share < SMALL_SHARE,
            f"{fmt.bandwidth(small['gbps'])} at {fmt.nbytes(small['size'])} "
            f"({fmt.seconds(small['time_median_s'])} a copy) = {fmt.percent(100 * share)} of "
            f"{fmt.bandwidth(big['gbps'])} at {fmt.nbytes(big['size'])}")


def _smallest_to(share: float) -> Flip:
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        for x in DIRECTIONS:
            r = _rows(d, "pinned", x)
            if len(r) >= 2:
                s = r["size"].iloc[0]
                d = to_gbps(d, _at("pinned", x, s, s), share * r["gbps"].iloc[-1])
        return d

    return flip


def _level_one(d: pd.DataFrame, direction: str) -> tuple[bool, str] | None:
    r = _rows(d, "pinned", direction)
    mid = r[(r["size"] >= LEVEL_FROM) & (r["size"] < r["size"].max())]
    if mid.empty:
        return None
    big, worst = r.iloc[-1], mid.loc[mid["gbps"].idxmin()]
    share = worst["gbps"] / big["gbps"]
    return (share >= LEVEL_SHARE,
            f"the slowest from {fmt.nbytes(LEVEL_FROM)} on, {fmt.nbytes(worst['size'])}, "
            f"{fmt.bandwidth(worst['gbps'])} = {fmt.percent(100 * share)} of "
            f"{fmt.bandwidth(big['gbps'])} at {fmt.nbytes(big['size'])}")


def _level_to(share: float, all_sizes: bool) -> Flip:
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        for x in DIRECTIONS:
            r = _rows(d, "pinned", x)
            mid = r[(r["size"] >= LEVEL_FROM) & (r["size"] < r["size"].max())]
            if len(mid):
                hi = mid["size"].max() if all_sizes else mid["size"].min()
                d = to_gbps(d, _at("pinned", x, mid["size"].min(), hi),
                            share * r["gbps"].iloc[-1])
        return d

    return flip


_near_link_each = _each_direction(_near_link_one, "pinned copy with the PCIe link recorded")


def _near_link(d: pd.DataFrame, c: Ceilings) -> Judgement:
    j = _near_link_each(d, c)
    return j if j.state is State.NOT_MEASURED else replace(
        j, evidence=f"{j.evidence}; link: {link(d)[0]}")


_small = _each_direction(_small_one, "pinned copies of two sizes")
_level = _each_direction(_level_one, f"pinned copy of {fmt.nbytes(LEVEL_FROM)} or more below "
                         "the largest")

EXPLANATIONS = (transfer_fixed_cost,)
CLAIMS = (
    Claim("every copied byte arrives unchanged (host -> device -> host)",
          all_correct("round trips exact"), one_wrong,
          "correct"),
    Claim(f"pinned memory is at least {PINNED_GAIN:g}x faster than pageable for the largest "
          "H2D copies", _pinned_gain("h2d"),
          turn(_pinned_gain("h2d"), _pageable_to("h2d", 1.2), _pageable_to("h2d", 3.0)),
          "pinned_faster_h2d"),
    Claim(f"pinned memory is at least {PINNED_GAIN:g}x faster than pageable for the largest "
          "D2H copies", _pinned_gain("d2h"),
          turn(_pinned_gain("d2h"), _pageable_to("d2h", 1.2), _pageable_to("d2h", 3.0)),
          "pinned_faster_d2h"),
    Claim(f"the largest pinned copies reach at least {LINK_SHARE:.0%} of the PCIe link's "
          "theoretical bandwidth in each direction (packet headers and flow control take "
          "about a tenth of it)", _near_link,
          turn(_near_link, _pinned_largest_to(0.5), _pinned_largest_to(0.85)),
          "pinned_near_link"),
    Claim(f"the smallest copies are latency-bound: the smallest pinned copy reaches under "
          f"{SMALL_SHARE:.0%} of the largest one's GB/s in each direction", _small,
          turn(_small, _smallest_to(0.5), _smallest_to(0.05)), "small_latency_bound"),
    Claim(f"the pinned curves level off: from {fmt.nbytes(LEVEL_FROM)} on every pinned copy "
          f"reaches at least {LEVEL_SHARE:.0%} of the largest copy's GB/s in each direction",
          _level, turn(_level, _level_to(0.5, False), _level_to(1.0, True)),
          "pinned_levels_off"),
)
TRY_THIS = [
    TryThis("transfer.step: 2", "twice as many sizes: see where the curves bend, from "
            "latency-bound (time flat) to bandwidth-bound (GB/s flat)"),
    TryThis("transfer.memory: [pageable]", "only pageable copies: the driver stages each copy "
            "through its own pinned buffer, so the CPU's memcpy speed and not the PCIe link "
            "sets the rate"),
]

LESSON = Lesson(
    title="Host-device transfers: pageable against pinned memory over PCIe",
    caption=(
        "Copies between host and GPU memory cross the PCIe link, whose theoretical bandwidth "
        "per direction is set by its generation and width (dashed line; read from NVML). "
        "From ordinary (pageable) host memory the driver first copies the data into a "
        "pinned staging buffer, piece by piece, and DMAs from there; page-locked (pinned) "
        "memory is DMA'd directly. Look for: small copies far below the link's bandwidth "
        "(each copy has a fixed cost of microseconds, which the fact below measures), the "
        "curves rising with size and levelling off from a few MiB on, and pinned memory "
        "clearly faster than pageable for large copies in both directions, getting close "
        "to the link's limit. The claims below judge each of these on this run."
    ),
    figures={
        "bandwidth": "Copy bandwidth against copy size (log scale) for each direction, "
        "pageable and pinned host memory; dashed: the PCIe link's theoretical bandwidth.",
    },
    print_figure=("bandwidth", None),  # on paper: pageable against pinned
    print_pages=0.7,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "Why is a pageable copy slower than a pinned one, although the same bytes cross "
            "the same link?",
            answers.pageable_vs_pinned),
        Question(
            "The smallest copies move at a small fraction of the link's bandwidth: what "
            "dominates their time?",
            answers.small_copies),
        Question(
            "The link's theoretical rate is per direction: what would you expect from H2D and "
            "D2H at the same time?",
            answers.both_directions),
    ],
)
