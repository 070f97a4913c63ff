"""What the report says about the timing itself: points whose samples did not converge (or
whose statistics need care), and the launch-overhead lesson kept apart from kernel time.

Data functions only: report.build_context passes their output to the template's "Timing"
section (reports/templates/report.html.j2).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

# The measured pieces of a launch (vector_add's m_* metrics, gpu.GpuSession.launch_costs)
# with what each one is; the kernel alone is the row's time_median_s.
LAUNCH_PARTS = {
    "m_host_call_s": "host time of one launch from Python, Function.__call__",
    "m_host_prepared_call_s": "host time of one launch from Python, prepared_call",
    "m_one_launch_s": "one launch end to end (CUDA events around a single launch)",
    "time_median_s": "the kernel alone (timer column: how it was timed)",
}


def _target_cv(harness: Any, default: float) -> float:
    try:
        return float(json.loads(harness)["target_cv"])
    except (TypeError, ValueError, KeyError):
        return default


def gpu_timed(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows timed on the GPU (CUDA events, either method)."""
    if df.empty or "timer" not in df:
        return df[:0]
    timer = df["timer"].astype("string").fillna("")
    return df[(df["status"] == "ok") & timer.str.startswith("cuda_event")]


def convergence(df: pd.DataFrame, default_target: float = 0.02) -> dict[str, Any]:
    """Share of GPU points whose sample CV ended at or below the target they were measured
    with, and the list of those that did not or whose timing carries a note (too few
    clean samples, a fallback from queued timing)."""
    g = gpu_timed(df)
    targets = [_target_cv(h, default_target) for h in g.get("harness", [None] * len(g))]
    g = g.assign(target_cv=targets)
    ok = g["time_cv"] <= g["target_cv"]
    note = g["timing_note"].astype("string").fillna("") if "timing_note" in g else ""
    listed = g[~ok | (note != "")]
    rows = [{
        "experiment": r["experiment"], "point_id": r["point_id"],
        "cv_pct": 100 * float(r["time_cv"]), "target_pct": 100 * float(r["target_cv"]),
        "stop_reason": r["stop_reason"], "n_samples": r["n_samples"],
        "median_us": 1e6 * float(r["time_median_s"]),
        "note": "" if pd.isna(r.get("timing_note")) else str(r.get("timing_note") or ""),
    } for _, r in listed.sort_values(["experiment", "point_id"]).iterrows()]
    n = len(g)
    return {"n_gpu": n, "n_converged": int(ok.sum()),
            "share_pct": 100 * float(ok.sum()) / n if n else math.nan, "points": rows}


def launch_overhead(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per point that measured its launch cost, every piece in microseconds."""
    if "m_host_call_s" not in df:
        return []
    d = df[(df["status"] == "ok") & df["m_host_call_s"].notna()]
    out = []
    for _, r in d.iterrows():
        us = {k: 1e6 * float(r[k]) for k in LAUNCH_PARTS}
        params = {k[2:]: r[k] for k in r.index if k.startswith("p_") and pd.notna(r[k])}
        out.append({"experiment": r["experiment"], "point_id": r["point_id"],
                    "params": ", ".join(f"{k}={v}" for k, v in params.items()),
                    "timer": r["timer"], **{k[:-2] + "_us": v for k, v in us.items()}})
    return out


def context(df: pd.DataFrame, default_target: float = 0.02) -> dict[str, Any]:
    """The template's `timing` block."""
    return {"convergence": convergence(df, default_target), "launch": launch_overhead(df),
            "launch_parts": LAUNCH_PARTS}
