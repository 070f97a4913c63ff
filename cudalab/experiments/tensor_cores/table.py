"""The rows of the tensor-core table that the lesson's claims and facts read: a (variant,
precision) key, its fastest ok row at the largest size every compared key was measured at,
how a row's size and rate are said, and the flip that moves a speed ratio across its
threshold (shared by lesson.py and wgmma_lesson.py)."""

from __future__ import annotations

import math

import pandas as pd

from cudalab import fmt, tensor_peaks
from cudalab.experiments.lesson import Flip, Judgement, Mask, col, no_data, ok, slower

Key = tuple[str, str]  # (variant, precision)

# A flip moves the quantity a claim judges this far past its threshold.
FLIP_MARGIN = 2.0

CUBLAS = {p: ("cublas", p) for p in ("fp32", "tf32", "fp16", "bf16")}
NAMES = {"cublas": "cuBLAS", "wmma": "WMMA", "mma": "mma.sync", "wgmma_tma": "wgmma 1-stage",
         "wgmma_pipe": "wgmma pipeline", "wgmma_ws": "wgmma warp-specialised",
         "wgmma_persist": "wgmma persistent"}


def label(k: Key) -> str:
    return "cuBLAS SGEMM" if k == CUBLAS["fp32"] else f"{NAMES[k[0]]} {k[1].upper()}"


def is_key(*keys: Key) -> Mask:
    return lambda d: pd.Series(
        [(v, p) in keys for v, p in zip(d["variant"], d["p_precision"], strict=True)],
        index=d.index, dtype=bool)


def size_text(r: pd.Series) -> str:
    m, k, n = (fmt.integer(r[c]) for c in ("p_m", "p_k", "p_n"))
    return f"n = {m}" if m == k == n else f"{m} x {k} x {n}"


def measured(d: pd.DataFrame, key: Key, need: str = "gflops") -> pd.DataFrame:
    """The ok rows of (variant, precision) with a positive `need`."""
    o = ok(d)
    o = o[is_key(key)(o)]
    return o[col(o, need) > 0]


def at_largest(d: pd.DataFrame, keys: tuple[Key, ...],
                need: str = "gflops") -> tuple[pd.Series, ...] | Judgement:
    """The fastest row of each key at the largest size (flops) every key was measured ok
    at, or why there is none."""
    rows = [measured(d, k, need) for k in keys]
    common = set.intersection(*(set(col(r, "flops")) for r in rows))
    if not common:
        what = " and ".join(label(k) for k in keys)
        extra = "" if need == "gflops" else f" with {need} recorded"
        return no_data(f"{what} not measured ok at one size{extra}")
    f = max(common)
    return tuple(r.loc[col(r, "gflops")[col(r, "flops") == f].idxmax()] for r in rows)


def cc_of(d: pd.DataFrame) -> str:
    cc = d["compute_capability"].dropna() if "compute_capability" in d else []
    return tensor_peaks.cc_key(cc.iloc[0]) if len(cc) else ""


def num(r: pd.Series, c: str) -> float:
    v = pd.to_numeric(pd.Series([r.get(c)]), errors="coerce").iloc[0]
    return float(v) if pd.notna(v) else math.nan


def times(v: float) -> str:
    """A threshold factor: '2×', '1.5×' (its exact value, as configured)."""
    return f"{fmt.param(v)}×"


def rate_text(r: pd.Series) -> str:
    return fmt.flop_rate(r["gflops"])

def flip_speed(fast: Key, slow: Key, factor: float) -> Flip:
    """Seen: the fast rows slow to half the threshold's speed-up; not seen: they gain twice
    it (every row of the key scaled alike, so the best tile stays the best)."""
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        got = at_largest(d, (fast, slow))
        if isinstance(got, Judgement):
            return d
        r = got[0]["gflops"] / got[1]["gflops"]
        target = factor / FLIP_MARGIN if r >= factor else factor * FLIP_MARGIN
        return slower(d, is_key(fast), r / target)
    return flip
