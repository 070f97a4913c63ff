"""The teacher's answers to the transfer lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import (
    NOT_MEASURED,
    Answer,
    Run,
    cite,
    have,
    not_measured,
    num,
)

DIRECTIONS = ("h2d", "d2h")
DUPLEX = "duplex"  # the streams lesson's points of both copy directions, alone and at once
# (H2D alone + D2H alone) / both at once: 2 is full duplex, 1 one shared path
DUPLEX_NEAR, SHARED_BELOW = 1.8, 1.2


def _rows(run: Run, memory: str, direction: str) -> pd.DataFrame:
    d = run.ok().dropna(subset=["gbps"])
    d = d[(d["variant"].astype(str) == memory) & (d["p_direction"].astype(str) == direction)]
    return d.sort_values("p_size", key=lambda s: pd.to_numeric(s, errors="coerce"))


def pageable_vs_pinned(run: Run) -> Answer:
    work, numbers, parts = [], {}, []
    for direction in DIRECTIONS:
        pin, page = _rows(run, "pinned", direction), _rows(run, "pageable", direction)
        both = set(pd.to_numeric(pin["p_size"])) & set(pd.to_numeric(page["p_size"]))
        if not both:
            continue
        size = max(both)
        a = pin[pd.to_numeric(pin["p_size"]) == size].iloc[0]
        b = page[pd.to_numeric(page["p_size"]) == size].iloc[0]
        gain = num(a["gbps"]) / num(b["gbps"])
        numbers[f"gain_{direction}"] = gain
        work.append(f"{direction.upper()} at {fmt.nbytes(size)}: {cite(a, 'gbps', fmt.bandwidth)}"
                    f" / {cite(b, 'gbps', fmt.bandwidth)} = {fmt.ratio(gain)}")
        parts.append(f"{direction.upper()} {fmt.bandwidth(a['gbps'])} pinned against "
                     f"{fmt.bandwidth(b['gbps'])} pageable ({fmt.ratio(gain)}) at "
                     f"{fmt.nbytes(size)}")
    if not parts:
        return not_measured("pinned and pageable copies of one size",
                            "run transfer with memory: [pageable, pinned]")
    return Answer("The DMA engines that move data over the link read and write only "
                  "page-locked (pinned) host memory. A pageable copy is staged: the driver "
                  "first copies the bytes with the CPU into a pinned buffer of its own, in "
                  "chunks, then the DMA moves them, so the CPU copy's speed and the hand-off "
                  "between chunks limit it, not the link. This run: " + "; ".join(parts) + ".",
                  work, numbers)


def small_copies(run: Run) -> Answer:
    d = _rows(run, "pinned", "h2d")
    if len(d) < 2:
        return not_measured("pinned H2D copies of several sizes",
                            "run transfer with pinned memory from 4 KiB up")
    small, big = d.iloc[0], d.iloc[-1]
    t, bw = num(small["time_median_s"]), num(big["gbps"])
    wire = num(small["p_size"]) / (bw * 1e9)
    numbers = {"small_time_s": t, "wire_s": wire, "overhead_share": 100 * (t - wire) / t,
               "small_gbps": num(small["gbps"])}
    link = num(small.get("m_pcie_theoretical_gbps"))
    work = [f"{cite(small, 'time_median_s', fmt.seconds)} for {fmt.nbytes(small['p_size'])} "
            f"({cite(small, 'gbps', fmt.bandwidth)})",
            f"the same bytes at the largest copy's rate ({cite(big, 'gbps', fmt.bandwidth)}): "
            f"{fmt.nbytes(small['p_size'])} / {fmt.bandwidth(bw)} = {fmt.seconds(wire)}",
            f"fixed cost = {fmt.seconds(t)} − {fmt.seconds(wire)}: "
            f"{fmt.percent(numbers['overhead_share'])} of the copy's time"]
    text = (f"A fixed cost per copy: the {fmt.nbytes(small['p_size'])} pinned H2D copy took "
            f"{fmt.seconds(t)}, of which moving the bytes at full speed would take "
            f"{fmt.seconds(wire)}; the remaining {fmt.percent(numbers['overhead_share'])} is "
            "the API call, the DMA set-up and the completion round trip over the link, which "
            "do not grow with the size")
    if have(link):
        numbers["small_link_share"] = 100 * num(small["gbps"]) / link
        work.append(f"{fmt.bandwidth(small['gbps'])} / link "
                    f"{cite(small, 'm_pcie_theoretical_gbps', fmt.bandwidth)} = "
                    f"{fmt.percent(numbers['small_link_share'])}")
        text += f", so it moves {fmt.percent(numbers['small_link_share'])} of the link's rate"
    return Answer(text + ".", work, numbers)


def _duplex(run: Run) -> dict[str, float] | None:
    """The streams lesson's duplex points where this run has them: direction -> seconds at
    the largest n with H2D alone, D2H alone and both at once (two streams) all measured."""
    d = run.ok("streams")
    if "p_direction" not in d:
        return None
    d = d[d["variant"].astype(str) == DUPLEX].dropna(subset=["time_median_s"])
    for n in sorted(pd.to_numeric(d["p_n"]).dropna().unique(), reverse=True):
        at = d[pd.to_numeric(d["p_n"]) == n]
        got = dict(zip(at["p_direction"].astype(str), pd.to_numeric(at["time_median_s"])))
        if all(k in got for k in (*DIRECTIONS, "both")):
            return {k: float(v) for k, v in got.items()} | {"n": float(n)}
    return None


def _measured_duplex(t: dict[str, float]) -> Answer:
    b = 4.0 * t["n"]
    r = (t["h2d"] + t["d2h"]) / t["both"]
    work = [f"streams rows of variant {DUPLEX}, p_n = {fmt.integer(t['n'])} floats "
            f"({fmt.nbytes(b)} each way): time_median_s H2D alone {fmt.seconds(t['h2d'])}, "
            f"D2H alone {fmt.seconds(t['d2h'])}, both at once {fmt.seconds(t['both'])}",
            f"({fmt.seconds(t['h2d'])} + {fmt.seconds(t['d2h'])}) / {fmt.seconds(t['both'])}"
            f" = {fmt.ratio(r)} (2: full duplex, 1: one shared path)",
            f"both at once: 2 × {fmt.nbytes(b)} / {fmt.seconds(t['both'])} = "
            f"{fmt.bandwidth(2 * b / t['both'] / 1e9)}"]
    verdict = ("the two directions run together at nearly their separate speeds: the link "
               "is used full duplex" if r >= DUPLEX_NEAR else
               "the two directions slow each other: here they share part of the path "
               "(host memory or the root complex)" if r >= SHARED_BELOW else
               "both at once take as long as one after the other: on this machine the two "
               "directions share one path")
    return Answer(f"Each direction has its own lanes, so both should run at once at close to "
                  f"their separate rates. Measured (the streams lesson's duplex points): H2D "
                  f"and D2H alone take {fmt.seconds(t['h2d'])} and {fmt.seconds(t['d2h'])}, "
                  f"both at once {fmt.seconds(t['both'])}, {fmt.ratio(r)} the speed of one "
                  f"after the other: {verdict}.", work,
                  {"duplex_ratio": r, "both_gbps": 2 * b / t["both"] / 1e9})


def both_directions(run: Run) -> Answer:
    t = _duplex(run)
    if t is not None:
        return _measured_duplex(t)
    h2d, d2h = _rows(run, "pinned", "h2d"), _rows(run, "pinned", "d2h")
    if h2d.empty or d2h.empty:
        return not_measured("pinned copies in both directions",
                            "run transfer with directions [h2d, d2h] and pinned memory")
    a, b = h2d.loc[h2d["gbps"].idxmax()], d2h.loc[d2h["gbps"].idxmax()]
    link = num(a.get("m_pcie_theoretical_gbps"))
    total = num(a["gbps"]) + num(b["gbps"])
    work = [f"best pinned H2D {cite(a, 'gbps', fmt.bandwidth)}, best pinned D2H "
            f"{cite(b, 'gbps', fmt.bandwidth)}, each alone",
            f"sum {fmt.bandwidth(a['gbps'])} + {fmt.bandwidth(b['gbps'])} = "
            f"{fmt.bandwidth(total)}"]
    numbers = {"expected_total_gbps": total}
    if have(link):
        work.append(f"{cite(a, 'm_pcie_theoretical_gbps', fmt.bandwidth)} per direction: "
                    f"2 × {fmt.bandwidth(link)} = {fmt.bandwidth(2 * link)} both ways")
        numbers["link_both_gbps"] = 2 * link
    return Answer(f"{NOT_MEASURED}: nothing here times an H2D and a D2H copy at the same time "
                  "(to measure it: two pinned copies in opposite directions on two streams, "
                  "timed together, on a GPU with two or more copy engines: the streams "
                  "lesson's duplex variant). Expected: PCIe is "
                  "full duplex, each direction has its own lanes, so both can run at once at "
                  f"close to their separate rates: up to about {fmt.bandwidth(total)} together "
                  "on this GPU, less where the host's memory or the root complex cannot keep "
                  "up with both.", work, numbers, measured=False)
