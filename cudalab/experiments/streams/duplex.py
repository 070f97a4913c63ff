"""Both copy directions at once (the streams experiment's `duplex` variant): is the host link
full duplex for this pipeline's copies, or do H2D and D2H share it?

The pipeline overlaps an H2D copy of one chunk with the D2H copy of another. Whether that
halves the copies' time depends on the two directions running at full speed together: PCIe
is full duplex on paper, but both directions also go through host memory and the root
complex. Three points time the whole array's copies (pinned buffers, whole array each way):
H2D alone, D2H alone, and both at once on two streams. The duplex ratio
(t_h2d + t_d2h) / t_both is 2 where the directions do not slow each other (equal copies),
1 where they share one path; the lesson's claim and fact read it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments.base import Check, Point, Result
from cudalab.experiments.lesson import Judgement, col, judged, no_data, ok

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext
    from cudalab.run_ceilings import Ceilings

VARIANT = "duplex"
DIRECTIONS = ["h2d", "d2h", "both"]
# Both directions at once move at least this many times the bytes per second of the two one
# after the other: (t_h2d + t_d2h) / t_both. 2 is perfect overlap, 1 none; the margin below
# 2 leaves room for host-memory contention, above 1 for the noise of three measurements.
DUPLEX_MIN = 1.5


def points(name: str, n: int) -> list[Point]:
    return [Point(name, VARIANT, {"n": n, "direction": d}) for d in DIRECTIONS]


def measure(ctx: RunContext, point: Point, bufs: dict[str, Any], streams: list[Any]) -> Result:
    """One direction (or both at once, each on its own blocking stream) of the whole array,
    bracketed by the harness's default-stream events (blocking streams wait for the start
    event, and the end event waits for them)."""
    cuda = ctx.gpu.cuda
    n, direction = point.params["n"], point.params["direction"]
    h2d_s, d2h_s = streams[0], streams[1]

    def launch() -> None:
        if direction in ("h2d", "both"):
            cuda.memcpy_htod_async(bufs["d_in"], bufs["h_in"], h2d_s)
        if direction in ("d2h", "both"):
            cuda.memcpy_dtoh_async(bufs["h_out"], bufs["d_out"], d2h_s)

    def verify() -> Check:
        """d_out holds the input first; after the copies d_in and h_out must both equal it
        (the directions this point copies), bit for bit."""
        h_in, h_out = bufs["h_in"], bufs["h_out"]
        cuda.memcpy_htod(bufs["d_out"], h_in)
        cuda.memset_d32(bufs["d_in"], 0x7FC00000, n)
        h_out.fill(np.nan)
        launch()
        ctx.gpu.synchronize()
        bad = 0
        if direction in ("d2h", "both"):
            bad += int(np.count_nonzero(h_out.view(np.int32) != h_in.view(np.int32)))
        if direction in ("h2d", "both"):
            cuda.memcpy_dtoh(h_out, bufs["d_in"])
            bad += int(np.count_nonzero(h_out.view(np.int32) != h_in.view(np.int32)))
        return Check(bad / n, 0.0, "mismatched_fraction",
                     detail=f"{bad} elements differ from the input" if bad else "")

    check = verify()
    timing = ctx.harness.measure(launch, ctx.gpu.event_timer(), batchable=False)
    ways = 2 if direction == "both" else 1
    return Result(timing, math.nan, 4.0 * n * ways, check, {"directions": ways})


# -- reading the rows --------------------------------------------------------------------------
def times(d: pd.DataFrame) -> dict[str, float] | None:
    """direction -> median seconds of the largest n with all three measured (None: none)."""
    r = ok(d[d["variant"] == VARIANT]) if "variant" in d else d.iloc[:0]
    r = r[col(r, "time_median_s").notna()]
    for n in sorted(col(r, "p_n").dropna().unique(), reverse=True):
        at = r[col(r, "p_n") == n]
        got = {str(x): float(t) for x, t in zip(at["p_direction"], col(at, "time_median_s"))}
        if all(k in got for k in DIRECTIONS):
            return got | {"n": float(n)}
    return None


def ratio(t: dict[str, float]) -> float:
    return (t["h2d"] + t["d2h"]) / t["both"] if t["both"] > 0 else math.nan


def _rates(t: dict[str, float]) -> str:
    b = 4.0 * t["n"]
    return (f"H2D alone {fmt.bandwidth(b / t['h2d'] / 1e9)}, D2H alone "
            f"{fmt.bandwidth(b / t['d2h'] / 1e9)}, both at once "
            f"{fmt.bandwidth(2 * b / t['both'] / 1e9)} in all")


def full_duplex(d: pd.DataFrame, c: Ceilings) -> Judgement:
    """(t_h2d + t_d2h) / t_both at least DUPLEX_MIN."""
    t = times(d)
    if t is None:
        return no_data("H2D alone, D2H alone and both at once not all measured "
                       "(streams.variants: duplex)")
    r = ratio(t)
    return judged(r >= DUPLEX_MIN, f"(H2D + D2H alone) / both at once = {fmt.ratio(r)} for "
                  f"{fmt.nbytes(4 * t['n'])} each way ({_rates(t)})")


def duplex_fact(d: pd.DataFrame, c: Ceilings) -> str | None:
    """What the duplex points mean for the pipeline: both directions' copies at once."""
    t = times(d)
    if t is None:
        return None
    slower = max(t["h2d"], t["d2h"])
    return (f"Both copy directions at once ({_rates(t)}) take {fmt.seconds(t['both'])} for "
            f"the whole array, {fmt.ratio(t['both'] / slower)} the slower direction alone: "
            "where the copies are the slowest stages, a pipeline that runs them together "
            "cannot beat that time, whatever the number of streams.")


def _both_takes(d: pd.DataFrame, seconds: float) -> pd.DataFrame:
    """The 'both at once' row(s) take `seconds` (times and GB/s together)."""
    d = d.copy()
    m = ((d["variant"] == VARIANT) & (d["p_direction"].astype(str) == "both")).to_numpy()
    factor = seconds / col(d, "time_median_s")[m]
    for c in ("time_median_s", "time_min_s", "time_mean_s"):
        if c in d:
            d.loc[m, c] = col(d, c)[m] * factor
    if "gbps" in d:
        d.loc[m, "gbps"] = col(d, "gbps")[m] / factor
    return d


def half_duplex(d: pd.DataFrame) -> pd.DataFrame:
    """The competing cause: the directions share one path, so both take their sum."""
    t = times(d)
    return _both_takes(d, t["h2d"] + t["d2h"]) if t else d


def duplex_overlap(d: pd.DataFrame) -> pd.DataFrame:
    """Full duplex: both at once take only the slower direction's time."""
    t = times(d)
    return _both_takes(d, max(t["h2d"], t["d2h"])) if t else d
