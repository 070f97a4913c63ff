"""What the report says about the timing itself: points whose samples did not converge (or
whose statistics need care), and the launch-overhead lesson kept apart from kernel time.

Data functions only: report.build_context passes their output to the template's "Timing"
section (reports/templates/report.html.j2).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from cudalab import harness_columns

# The measured pieces of a launch (vector_add's m_* metrics, gpu.GpuSession.launch_costs)
# with what each one is; the kernel alone is the row's time_median_s.
LAUNCH_PARTS = {
    "m_host_call_s": "host time of one launch from Python, Function.__call__",
    "m_host_prepared_call_s": "host time of one launch from Python, prepared_call",
    "m_one_launch_s": "one launch end to end (CUDA events around a single launch)",
    "time_median_s": "the kernel alone (timer column: how it was timed)",
}


def gpu_timed(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows timed on the GPU (CUDA events, either method)."""
    if df.empty or "timer" not in df:
        return df[:0]
    timer = df["timer"].astype("string").fillna("")
    return df[(df["status"] == "ok") & timer.str.startswith("cuda_event")]


def noise_reason(experiment: str, variant: str) -> str:
    """Why this kind of point may not converge (the experiment's `noise`), or ''."""
    from cudalab.experiments import REGISTRY

    exp = REGISTRY.get(experiment)
    return exp.noise.get(variant, "") if exp is not None else ""


def convergence(df: pd.DataFrame, default_target: float = 0.02) -> dict[str, Any]:
    """Share of GPU points whose sample CV ended at or below the target they were measured
    with, and the list of those that did not or whose timing carries a note (too few
    clean samples, a fallback from queued timing)."""
    g = gpu_timed(df)
    # the target each point was measured with (its harness setting), else the config's
    g = harness_columns.expand(g, drop=False)
    target = (pd.to_numeric(g["harness_target_cv"], errors="coerce")
              if "harness_target_cv" in g else pd.Series(float("nan"), index=g.index))
    g = g.assign(target_cv=target.fillna(default_target).astype(float))
    ok = g["time_cv"] <= g["target_cv"]
    note = g["timing_note"].astype("string").fillna("") if "timing_note" in g else ""
    listed = g[~ok | (note != "")]
    rows = [{
        "experiment": r["experiment"], "point_id": r["point_id"],
        "cv_pct": 100 * float(r["time_cv"]), "target_pct": 100 * float(r["target_cv"]),
        "stop_reason": r["stop_reason"], "n_samples": r["n_samples"],
        "median_us": 1e6 * float(r["time_median_s"]),
        "note": "" if pd.isna(r.get("timing_note")) else str(r.get("timing_note") or ""),
        "why": noise_reason(r["experiment"], r["variant"]) if r["time_cv"] > r["target_cv"]
        else "",
    } for _, r in listed.sort_values(["experiment", "point_id"]).iterrows()]
    n = len(g)
    return {"n_gpu": n, "n_converged": int(ok.sum()),
            "share_pct": 100 * float(ok.sum()) / n if n else math.nan, "points": rows}


# The harness's per-launch time agrees with Nsight Compute's gpu__time_duration when within
# this share of it, or this many microseconds (max(10 %, 0.5 us): the event pair's
# resolution bounds what a short kernel can agree to).
NCU_AGREE_SHARE = 0.10
NCU_AGREE_US = 0.5
# Kernels shorter than this are "short": ncu times one isolated launch, whose fixed cost of
# starting and draining a kernel back-to-back launches partly overlap; the report gives the
# median gap of these apart (seen on an H100 with the duration-only time pass: ~0.1 us).
SHORT_KERNEL_US = 5.0
# A kernel's own timer (Experiment.own_timer) that read this much more or less under ncu
# than in the timed run says the kernel itself ran at another speed there.
OWN_TIMER_MOVED = 0.01


def own_timer_ratio(g: pd.DataFrame) -> pd.Series:
    """Per row: the kernel's own timer in ncu's child over the same timer in the timed run
    (m_ncu_own_timer / m_<own_timer>); NaN where the kernel does not time itself."""
    from cudalab.experiments import REGISTRY

    out = pd.Series(math.nan, index=g.index, dtype=float)
    if "m_ncu_own_timer" not in g or g.empty:
        return out
    child = pd.to_numeric(g["m_ncu_own_timer"], errors="coerce")
    for name, idx in g.groupby("experiment").groups.items():
        exp = REGISTRY.get(str(name))
        col = f"m_{exp.own_timer}" if exp is not None and exp.own_timer else ""
        if col in g:
            ours = pd.to_numeric(g.loc[idx, col], errors="coerce")
            out[idx] = (child[idx] / ours.where(ours > 0)).astype(float)
    return out


def ncu_agreement(df: pd.DataFrame, worst: int = 10) -> dict[str, Any] | None:
    """The queued per-launch time of every profiled single-kernel GPU point against ncu's
    duration of the same kernel (m_ncu_time_us: profile.ncu's time pass, or in a table of
    before the time pass the replayed duration), or None without counters.

    Where the kernel times itself and its own timer read differently under ncu (it ran at
    another speed in that process: a tiny chain's lines in other L2 slices), the harness's
    time is scaled by that ratio before the comparison; `n_agree_raw` counts without it."""
    need = ("m_ncu_time_us", "m_ncu_status", "m_ncu_kernels")
    if any(c not in df for c in need):
        return None
    g = gpu_timed(df)
    status = g["m_ncu_time_status"] if "m_ncu_time_status" in g else g["m_ncu_status"]
    g = g[(g["timer"].astype("string") == "cuda_event_queued")
          & (status.astype("string") == "ok")
          & (pd.to_numeric(g["m_ncu_kernels"], errors="coerce") == 1)]
    g = g.copy()  # a slice of a wide table: new columns go on a compact copy
    ncu = pd.to_numeric(g["m_ncu_time_us"], errors="coerce")
    g = g.assign(ours_us=1e6 * g["time_median_s"].astype(float), ncu_us=ncu)
    g = g[g["ncu_us"] > 0]
    if g.empty:
        return None
    own = own_timer_ratio(g)
    g = g.assign(own_ratio=own, expected_us=g["ours_us"] * own.fillna(1.0))
    tol = (NCU_AGREE_SHARE * g["ncu_us"]).clip(lower=NCU_AGREE_US)
    agree = (g["expected_us"] - g["ncu_us"]).abs() <= tol
    agree_raw = (g["ours_us"] - g["ncu_us"]).abs() <= tol
    g = g.assign(ratio=g["ncu_us"] / g["ours_us"])
    off = g[~agree].assign(gap=lambda x: (x["ncu_us"] / x["expected_us"] - 1).abs()
                           ).sort_values("gap", ascending=False)
    moved = g[(own - 1).abs() > OWN_TIMER_MOVED]
    short = g[g["ours_us"] < SHORT_KERNEL_US]
    return {"n": len(g), "n_agree": int(agree.sum()), "share_pct": 100 * float(agree.mean()),
            "n_agree_raw": int(agree_raw.sum()),
            "method": ("ncu's time pass: gpu__time_duration alone (one pass, nothing replayed),"
                       " median of 5 launches" if "m_ncu_time_status" in df else
                       "ncu's replayed duration (a table of before the time pass)"),
            "tolerance": f"{NCU_AGREE_SHARE:.0%} or {NCU_AGREE_US:g} µs, whichever is larger",
            "ratio_median": float(g["ratio"].median()),
            "short_us": SHORT_KERNEL_US, "short_n": len(short),
            "short_gap_us": float((short["ncu_us"] - short["ours_us"]).median())
            if len(short) else math.nan,
            "own_n": int(own.notna().sum()),
            "own_moved": _ncu_rows(moved.sort_values("own_ratio")),
            "worst": _ncu_rows(off.head(worst))}


def _ncu_rows(g: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of an ncu agreement table (the report's)."""
    return [{"experiment": r["experiment"], "point_id": r["point_id"],
             "ours_us": float(r["ours_us"]), "ncu_us": float(r["ncu_us"]),
             "ratio": float(r["ratio"]),
             "own_ratio": None if pd.isna(r["own_ratio"]) else float(r["own_ratio"])}
            for _, r in g.iterrows()]


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
            "launch_parts": LAUNCH_PARTS, "ncu": ncu_agreement(df)}
