"""What aggregate computes for the roofline: each point's memory level, roof, % of ceiling,
and how honest each bandwidth number is about where it came from.

The ceilings themselves are cudalab.run_ceilings; the figure is cudalab.roofline_figure.

Memory-level honesty: a working set that fits L2 on a hot run (the harness did not flush
L2) measures L2, not DRAM; a number above the ceiling it is compared with is suspect and
said so, with why. Tables written before the ceilings columns existed (the committed H100
reference) get the same columns derived here from what they have: the theoretical DRAM
peak and device_query's L2 size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cudalab import fmt, harness_columns, results
from cudalab.run_ceilings import PRECISIONS, Ceilings, as_float, ceilings_of, num, row_roof

# The lessons' declarations the roofline needs, as data: the experiments whose points go
# through device memory and are compared with the device's peaks (vs_device_peak), or carry
# the roof of their own precision (precision_roofs). The lesson registry declares them when
# it loads; the roofline never imports the registry, so a lesson may use the roofline's types
# without the two modules needing each other.
_device_experiments: frozenset[str] | None = None


class RooflineError(RuntimeError):
    """The roofline was asked about points before any lesson declared its roofs."""


def declare_device_experiments(names: Iterable[str]) -> None:
    """Which experiments' points are judged against the device's roofs (the registry calls
    this once with its lessons' declarations; a test may call it with its own)."""
    global _device_experiments
    _device_experiments = frozenset(str(n) for n in names)


def device_experiments() -> frozenset[str]:
    if _device_experiments is None:
        raise RooflineError("no lesson has declared its roofs: import cudalab.experiments "
                            "(or call roofline.declare_device_experiments) first")
    return _device_experiments


# -- memory levels and suspect numbers -------------------------------------------------------
def _truthy(v: Any) -> bool:
    if fmt.missing(v):
        return False
    return v is True or str(v).strip().lower() in ("true", "1", "yes")


def annotate(df: pd.DataFrame, c: Ceilings | None = None) -> pd.DataFrame:
    """df with the memory-level columns of the contract filled: working_set_bytes,
    memory_level ('dram' | 'l2' | ''), pct_ceil_gbps, pct_ceil_gflops, suspect (bool),
    plus cold_l2 (the harness setting), intensity (FLOP/byte) and suspect_why (text).
    Columns the table has are kept; missing ones are derived by the contract's rules.
    Annotate the whole table, then select (the L2 size of old tables is on device_query's
    row), or give the whole table's ceilings as c. A frame whose every row has them
    (aggregate wrote them, or annotate ran) is returned as is."""
    if len(df) and _filled(df, "roof_name", every=True):
        return df
    out = df.copy()
    c = c or ceilings_of(df)
    out = harness_columns.expand(out, drop=False)  # a frame with the older JSON column
    if "cold_l2" not in out:
        out["cold_l2"] = pd.Series(None, index=out.index, dtype=object)
    # results.read_table gives an older table the new columns, empty: derive those as if
    # they were absent
    if not _filled(out, "working_set_bytes"):
        out["working_set_bytes"] = num(out, "bytes")
    out["working_set_bytes"] = num(out, "working_set_bytes")
    if _filled(out, "memory_level"):
        out["memory_level"] = out["memory_level"].map(lambda v: "" if fmt.missing(v)
                                                      else str(v))
    else:
        out["memory_level"] = [_level(r, c) for _, r in out.iterrows()]
    for col in ("pct_ceil_gbps", "pct_ceil_gflops"):
        out[col] = num(out, col)
    flops = num(out, "flops")
    nbytes = num(out, "bytes")
    out["intensity"] = np.where((flops > 0) & (nbytes > 0), flops / nbytes, np.nan)
    # every point against the roof of its own dtype (FP64 points against an FP64 peak) or
    # input precision (tensor-core points against their precision's peak)
    roofs = [row_roof(r, c) for _, r in out.iterrows()]
    out["roof_gflops"] = [r[0] for r in roofs]
    out["roof_name"] = [r[2] for r in roofs]
    own = (out["p_dtype"].astype(str) == "float64" if "p_dtype" in out
           else pd.Series(False, index=out.index))
    if "p_precision" in out:
        own |= out["p_precision"].astype(str).isin(PRECISIONS)
    out.loc[own, "pct_ceil_gflops"] = 100 * num(out, "gflops")[own] / out["roof_gflops"][own]
    why = [_suspect_why(r, c) for _, r in out.iterrows()]
    given = (out["suspect"].map(_truthy) if _filled(out, "suspect")
             else pd.Series(False, out.index))
    out["suspect"] = [bool(g) or bool(w) for g, w in zip(given, why, strict=True)]
    out["suspect_why"] = [w or ("above 100 % of the peak or ceiling the results table "
                                "compares it with" if s else "")
                          for w, s in zip(why, out["suspect"], strict=True)]
    return out


def _filled(df: pd.DataFrame, col: str, every: bool = False) -> bool:
    """The table has the column with a value in at least one row (every: in every row);
    '' counts as none."""
    if col not in df:
        return False
    has = df[col].map(lambda v: not fmt.missing(v) and str(v) != "").astype(bool)
    return bool(has.all() if every else has.any())


def load_table(path: Path) -> pd.DataFrame:
    """results.csv as the figures and the report read it: every derived column as aggregate
    wrote it, or, for a table aggregated before those columns (the committed references),
    derived here; the one place an older table gets them."""
    return annotate(results.read_table(path))


def on_device(experiment: Any, timer: Any) -> bool:
    """A GPU point whose bytes go through device memory (not a CPU point, not PCIe): of an
    experiment declared compared with the device's peaks or with the peak of its own
    precision (tensor cores, whose roof is not the FP32 peak)."""
    return str(experiment) in device_experiments() and str(timer) != "perf_counter"


def _level(r: pd.Series, c: Ceilings) -> str:
    """results.memory_level for a row of an older table: '' for CPU points and PCIe
    experiments; the L2 size from the row or, for old tables, the run's (device_query)."""
    if not on_device(r.get("experiment"), r.get("timer")):
        return ""
    l2 = as_float(r.get("l2_bytes"))
    return results.memory_level(as_float(r.get("working_set_bytes")),
                                l2 if math.isfinite(l2) else as_float(c.l2_bytes),
                                r.get("cold_l2") is True)


def _suspect_why(r: pd.Series, c: Ceilings) -> str:
    """Why an ok point's speed cannot be taken at face value ('' if it can): above the
    ceiling of its memory level (or, without one, the DRAM peak), or above the FP32 roof."""
    if r.get("status") != "ok":
        return ""
    out = []
    gbps, level = as_float(r.get("gbps")), r.get("memory_level") or ""
    if math.isfinite(gbps) and level:
        ref, kind, name = *c.bandwidth(level), level.upper()
        if not math.isfinite(ref) and level == "l2":  # no L2 ceiling: only DRAM to compare
            ref, kind, name = *c.bandwidth("dram"), "DRAM"
        if math.isfinite(ref) and gbps > ref:
            out.append(f"{fmt.bandwidth(gbps)} is {fmt.percent(100 * gbps / ref)} of the "
                       f"{kind} {name} ceiling {fmt.bandwidth(ref)}"
                       + _l2_hint(r, c, level, name))
    gflops = as_float(r.get("gflops"))
    ref, kind, name = row_roof(r, c)
    if math.isfinite(gflops) and math.isfinite(ref) and gflops > ref:
        out.append(f"{fmt.flop_rate(gflops)} is above the {kind} {name} ceiling "
                   f"{fmt.flop_rate(ref)}: the declared flop count is too high or the "
                   "timing is wrong")
    return "; ".join(out)


def _l2_hint(r: pd.Series, c: Ceilings, level: str, compared: str) -> str:
    ws = as_float(r.get("working_set_bytes"))
    l2 = c.l2_bytes
    hot = r.get("cold_l2") is not True
    if level == "l2" and compared == "DRAM":
        return (f": its working set {fmt.nbytes(ws)} fits the {fmt.nbytes(l2)} L2 and the run "
                f"was {'hot (L2 not flushed)' if hot else 'cold'}, so it measured L2; compare "
                "it with the L2 ceiling (not measured in this run)")
    if level == "l2":
        return (f": L2-resident ({fmt.nbytes(ws)} of {fmt.nbytes(l2)}), yet faster than L2 "
                "was measured: check the declared bytes")
    return (": from DRAM nothing is faster than the DRAM ceiling; check the declared bytes "
            "or whether the data stayed in a cache")


def distrust(df: pd.DataFrame) -> list[dict[str, str]]:
    """The 'measurements to distrust' list: every suspect point with why."""
    d = annotate(df)
    d = d[d["suspect"]]
    return [{"experiment": str(r["experiment"]), "point_id": str(r["point_id"]),
             "level": r["memory_level"], "why": r["suspect_why"]} for _, r in d.iterrows()]


def hot_cold_note(df: pd.DataFrame, c: Ceilings | None = None) -> str:
    """Whether a section's bandwidth numbers were taken hot or cold, and how many of them
    measured L2 ('' where the section has no device-memory bandwidth). c: the run's
    ceilings (its L2 size), where df is one section of the table."""
    d = annotate(df, c)
    d = d[(d["status"] == "ok") & (d["memory_level"] != "") & np.isfinite(num(d, "gbps"))]
    if d.empty:
        return ""
    cold = d["cold_l2"].dropna()
    if cold.empty:
        how = "L2 flushing not recorded (older harness)"
    elif cold.all():
        how = "cold: L2 flushed before every sample (measurement.cold_l2: true)"
    elif not cold.any():
        how = "hot: L2 not flushed between samples (measurement.cold_l2: false)"
    else:
        how = f"mixed: {int(cold.sum())} of {len(cold)} points cold"
    n_l2 = int((d["memory_level"] == "l2").sum())
    l2 = (c or ceilings_of(df)).l2_bytes
    size = f" fits the {fmt.nbytes(l2)} L2" if math.isfinite(l2) else " fits L2"
    return (f"Bandwidth measured {how}. {n_l2} of {len(d)} points have a working set that"
            f"{size} and, run hot, measure L2 rather than DRAM (column memory level); "
            "% of ceiling compares each with the ceiling of its level.")


# -- points ----------------------------------------------------------------------------------
def device_points(df: pd.DataFrame) -> pd.DataFrame:
    """ok GPU points of experiments whose bytes go through device memory."""
    d = annotate(df)
    timer = d["timer"] if "timer" in d else pd.Series("", index=d.index)
    dev = [on_device(e, t) for e, t in zip(d["experiment"], timer, strict=True)]
    return d[np.array(dev, dtype=bool) & (d["status"].astype(str) == "ok")
             & (num(d, "bytes") > 0)]


def roofline_points(df: pd.DataFrame) -> pd.DataFrame:
    d = device_points(df)
    return d[(num(d, "flops") > 0) & (num(d, "gflops") > 0)]


def bandwidth_points(df: pd.DataFrame) -> pd.DataFrame:
    """Points without flops (copies): they have GB/s only."""
    d = device_points(df)
    return d[~(num(d, "flops") > 0) & (num(d, "gbps") > 0)]


