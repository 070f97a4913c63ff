"""The tensor-core lesson, "precision is a knob": the caption's claims as plain predicates
over the results table, each returning (state, evidence). State is one of "seen", "not
seen", "not measured" (the points were in the grid but have no ok result) and "not
applicable" (the grid has no such points). Every number in the evidence comes from the
table; the only constants are the thresholds below.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from cudalab.experiments.tensor_cores.figures import best, largest

SEEN, NOT_SEEN, NOT_MEASURED, NOT_APPLICABLE = "seen", "not seen", "not measured", "not applicable"
State = tuple[str, str]

TF32_OVER_FP32 = 2.0  # cuBLAS TF32 at least this much faster than SGEMM
HALF_OVER_TF32 = 1.5  # cuBLAS FP16 and BF16 at least this much faster than TF32
SAME_ERROR = 2.0  # TF32 and FP16 errors within this factor of each other
BF16_ERROR = (4.0, 16.0)  # BF16 error / FP16 error: three fewer bits, 8x expected
FP32_BETTER = 100.0  # FP32 error at least this much below FP16's
HAND_TARGET = 0.70  # best hand FP16 kernel against cuBLAS FP16


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"].astype(str) == "ok"] if "status" in df else df


def _missing(df: pd.DataFrame, pairs: list[tuple[str, str]]) -> State | None:
    """'not applicable' where the grid has no rows of a (variant, precision), 'not
    measured' where it has some but none ok; None when every pair has an ok row."""
    for v, p in pairs:
        rows = df[(df["variant"] == v) & (df["p_precision"] == p)]
        if rows.empty:
            return NOT_APPLICABLE, f"no {v} {p} point in this run"
        if _ok(rows).empty:
            return NOT_MEASURED, f"{v} {p}: {len(rows)} points, none measured ok"
    return None


def _best_at_largest(df: pd.DataFrame) -> dict[tuple[str, str], pd.Series]:
    b = best(largest(_ok(df)))
    return {(r["variant"], r["p_precision"]): r for _, r in b.iterrows()}


def _size(r: pd.Series) -> str:
    m, k, n = int(r["p_m"]), int(r["p_k"]), int(r["p_n"])
    return f"n = {m}" if m == k == n else f"{m}x{k}.{k}x{n}"


def _speedup(df: pd.DataFrame, fast: str, slow: str, factor: float) -> State:
    if (miss := _missing(df, [("cublas", fast), ("cublas", slow)])) is not None:
        return miss
    b = _best_at_largest(df)
    if ("cublas", fast) not in b or ("cublas", slow) not in b:
        return NOT_MEASURED, f"cuBLAS {fast} and {slow} not both measured at the largest size"
    f, s = b[("cublas", fast)], b[("cublas", slow)]
    r = f["gflops"] / s["gflops"]
    return (SEEN if r >= factor else NOT_SEEN,
            f"cuBLAS {fast} {f['gflops'] / 1e3:.1f} / {slow} {s['gflops'] / 1e3:.1f} TFLOP/s "
            f"= {r:.1f}x at {_size(f)} (threshold {factor:g}x)")


def every_point_correct(df: pd.DataFrame) -> State:
    """Every result matches the float64 product of its rounded inputs within the derived
    tolerance."""
    if df.empty:
        return NOT_APPLICABLE, "no tensor-core point in this run"
    done = df[df["status"].astype(str) != "not_measured"]
    if done.empty:
        return NOT_MEASURED, f"{len(df)} points, none measured"
    bad = done[done["status"] != "ok"]
    return (SEEN if bad.empty else NOT_SEEN,
            f"{len(done) - len(bad)}/{len(done)} points correct"
            + (f"; first failure: {bad['point_id'].iloc[0]}" if len(bad) else ""))


def tf32_faster_than_fp32(df: pd.DataFrame) -> State:
    return _speedup(df, "tf32", "fp32", TF32_OVER_FP32)


def fp16_faster_than_tf32(df: pd.DataFrame) -> State:
    return _speedup(df, "fp16", "tf32", HALF_OVER_TF32)


def bf16_faster_than_tf32(df: pd.DataFrame) -> State:
    return _speedup(df, "bf16", "tf32", HALF_OVER_TF32)


def _errors(df: pd.DataFrame, precs: list[str]) -> dict[str, float] | State:
    if (miss := _missing(df, [("cublas", p) for p in precs])) is not None:
        return miss
    b = _best_at_largest(df)
    out = {p: float(b[("cublas", p)].get("m_err_input", math.nan))
           for p in precs if ("cublas", p) in b}
    if len(out) < len(precs) or not all(math.isfinite(v) and v > 0 for v in out.values()):
        return NOT_MEASURED, "errors against the unrounded product not recorded"
    return out


def tf32_and_fp16_err_alike(df: pd.DataFrame) -> State:
    e = _errors(df, ["tf32", "fp16"])
    if isinstance(e, tuple):
        return e
    r = max(e.values()) / min(e.values())
    return (SEEN if r <= SAME_ERROR else NOT_SEEN,
            f"cuBLAS error vs unrounded: tf32 {e['tf32']:.1e}, fp16 {e['fp16']:.1e} "
            f"({r:.1f}x apart; threshold {SAME_ERROR:g}x)")


def bf16_err_about_8x_fp16(df: pd.DataFrame) -> State:
    e = _errors(df, ["bf16", "fp16"])
    if isinstance(e, tuple):
        return e
    r = e["bf16"] / e["fp16"]
    lo, hi = BF16_ERROR
    return (SEEN if lo <= r <= hi else NOT_SEEN,
            f"cuBLAS error vs unrounded: bf16 {e['bf16']:.1e} / fp16 {e['fp16']:.1e} = "
            f"{r:.1f}x (expected {lo:g} to {hi:g}x)")


def fp32_far_more_accurate(df: pd.DataFrame) -> State:
    e = _errors(df, ["fp32", "fp16"])
    if isinstance(e, tuple):
        return e
    r = e["fp16"] / e["fp32"]
    return (SEEN if r >= FP32_BETTER else NOT_SEEN,
            f"cuBLAS error vs unrounded: fp32 {e['fp32']:.1e}, fp16 {e['fp16']:.1e} "
            f"({r:.0f}x; threshold {FP32_BETTER:g}x)")


def mma_faster_than_wmma(df: pd.DataFrame) -> State:
    """The best mma.sync tile beats WMMA, in fp16 (else bf16: the same two kernels)."""
    b = _best_at_largest(df)
    prec = next((p for p in ("fp16", "bf16") if ("mma", p) in b and ("wmma", p) in b), None)
    if prec is None:
        miss = _missing(df, [("mma", "fp16"), ("wmma", "fp16")])
        return miss or (NOT_MEASURED, "mma and wmma not both measured at the largest size")
    m, w = b[("mma", prec)], b[("wmma", prec)]
    return (SEEN if m["gflops"] > w["gflops"] else NOT_SEEN,
            f"{prec} at {_size(m)}: best mma.sync {m['gflops'] / 1e3:.1f}, WMMA "
            f"{w['gflops'] / 1e3:.1f} TFLOP/s")


def hand_fp16_near_cublas(df: pd.DataFrame) -> State:
    """The best hand FP16 kernel reaches HAND_TARGET of cuBLAS FP16 at the largest size."""
    if (miss := _missing(df, [("cublas", "fp16")])) is not None:
        return miss
    b = _best_at_largest(df)
    hand = [b[k] for k in (("mma", "fp16"), ("wmma", "fp16")) if k in b]
    if ("cublas", "fp16") not in b or not hand:
        return NOT_MEASURED, "no hand fp16 kernel and cuBLAS fp16 measured at the largest size"
    top = max(hand, key=lambda r: r["gflops"])
    c = b[("cublas", "fp16")]
    r = top["gflops"] / c["gflops"]
    return (SEEN if r >= HAND_TARGET else NOT_SEEN,
            f"best hand fp16 ({top['variant']}) {top['gflops'] / 1e3:.1f} TFLOP/s = "
            f"{100 * r:.0f}% of cuBLAS fp16 {c['gflops'] / 1e3:.1f} at {_size(c)} "
            f"(target {HAND_TARGET:.0%})")


def cublas_under_tensor_peak(df: pd.DataFrame) -> State:
    """No cuBLAS result exceeds its precision's dense peak (else the peak table is wrong)."""
    d = _ok(df)
    d = d[d["variant"] == "cublas"]
    if d.empty or "m_pct_peak_precision" not in d or d["m_pct_peak_precision"].isna().all():
        return NOT_MEASURED, "no cuBLAS point with a known peak"
    pct = pd.to_numeric(d["m_pct_peak_precision"], errors="coerce")
    top = d.loc[pct.idxmax()]
    return (SEEN if pct.max() <= 100 else NOT_SEEN,
            f"highest: cuBLAS {top['p_precision']} at {pct.max():.0f}% of its peak "
            f"({_size(top)})")


CLAIMS: tuple[tuple[str, Callable[[pd.DataFrame], State]], ...] = (
    ("every result is checked against the float64 product of its rounded inputs",
     every_point_correct),
    ("TF32 far faster than FP32", tf32_faster_than_fp32),
    ("FP16 and BF16 faster again", fp16_faster_than_tf32),
    ("FP16 and BF16 faster again", bf16_faster_than_tf32),
    ("TF32 and FP16 with about the same error", tf32_and_fp16_err_alike),
    ("BF16 about 8x worse", bf16_err_about_8x_fp16),
    ("FP32 orders of magnitude better", fp32_far_more_accurate),
    ("mma.sync faster than WMMA", mma_faster_than_wmma),
    ("how close the best hand FP16 kernel comes to cuBLAS FP16", hand_fp16_near_cublas),
    ("each precision's dense tensor peak", cublas_under_tensor_peak),
)


def evaluate(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(caption phrase, state, evidence) of every claim on the experiment's rows."""
    d = df[df["experiment"] == "tensor_cores"] if "experiment" in df else df
    return [(phrase, *check(d)) for phrase, check in CLAIMS]
