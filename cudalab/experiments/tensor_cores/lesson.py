"""The tensor-core lesson, "precision is a knob": its claims (each a predicate over this run's
table with its threshold and the data change that turns it over) and its facts (sentences
computed from the table). Every number in a sentence comes from the table; the only
constants are the named thresholds below.

Speeds are compared at the largest size both sides of a comparison were measured ok at
(cuBLAS against cuBLAS of another precision, the best mma.sync tile against WMMA); errors are
m_err_input, the error against the float64 product of the unrounded inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt, tensor_peaks
from cudalab.experiments.lesson import (
    Claim,
    Flip,
    Judgement,
    Lesson,
    TryThis,
    col,
    judged,
    no_data,
    not_applicable,
    ok,
    slower,
    with_value,
)
from cudalab.experiments.questions import Question
from cudalab.experiments.tensor_cores import answers, wgmma, wgmma_lesson
from cudalab.experiments.tensor_cores.numerics import expected_input_error
from cudalab.experiments.tensor_cores.table import (
    CUBLAS,
    FLIP_MARGIN,
    NAMES,
    Key,
    at_largest,
    cc_of,
    flip_speed,
    is_key,
    label,
    measured,
    num,
    rate_text,
    size_text,
    times,
)

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings


# cuBLAS TF32 at least this much faster than SGEMM, on chips whose dense TF32 tensor peak is
# at least TF32_PEAK_GAIN times the FP32 peak (sm_80, sm_90: 8x; 2x on Ada and GA10x, and 1x
# on their GeForce boards, where the claim does not apply).
TF32_OVER_FP32 = 2.0
TF32_PEAK_GAIN = 4.0
# cuBLAS FP16 and BF16 at least this much faster than TF32 (their peaks: 2x on every chip).
HALF_OVER_TF32 = 1.5
# TF32 and FP16 keep the same 10 mantissa bits: errors within this factor of each other.
SAME_ERROR = 2.0
# BF16 keeps three bits fewer than FP16: its error 2^3 = 8x FP16's, within this range.
BF16_ERROR = (4.0, 16.0)
# FP32 inputs are not rounded: its error at least this far below FP16's (2^-24 vs 2^-11 at
# the input, less the accumulation both share).
FP32_BETTER = 100.0
# The best mma.sync tile (cp.async stages, ldmatrix) at least this much faster than WMMA
# (one shared-memory stage): a pipeline that overlaps loads with MMAs should win by more
# than the run-to-run spread of a few per cent.
MMA_OVER_WMMA = 1.2
# Compute capabilities whose tensor cores take asynchronous warpgroup MMAs (wgmma on 9.x,
# tcgen05 on 10.x), which the hand kernels (mma.sync, WMMA) do not issue.
ASYNC_MMA_MAJORS = (9, 10)
# Try-this: at the smallest size cuBLAS FP16's speed-up over SGEMM is under this share of
# its speed-up at the largest size (the fast kernel meets its fixed costs first).
SMALL_GAIN_SHARE = 0.8
def _no_tensor_path(d: pd.DataFrame, *precs: str) -> Judgement | None:
    """Not applicable where the chip has no tensor-core path for one of precs: by the peak
    table where it knows the compute capability, else none before 7.0 and only FP16 on 7.x
    (TF32 and BF16 came with 8.0)."""
    cc = cc_of(d)
    if not cc:
        return None
    known, major = tensor_peaks.RATES.get(cc), int(cc.split(".")[0])
    for p in precs:
        lacks = (p not in known if known is not None
                 else major < 7 or (major < 8 and p != "fp16"))
        if lacks:
            return not_applicable(f"compute capability {cc} has no {p.upper()} tensor cores")
    return None


# -- facts -----------------------------------------------------------------------------------
def peaks_and_shares(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Each precision's dense peak on this GPU and the share cuBLAS reaches of it."""
    parts = []
    for p, k in CUBLAS.items():
        got = at_largest(d, (k,))
        if isinstance(got, Judgement):
            continue
        r = got[0]
        peak = num(r, "m_peak_precision_gflops")
        if math.isfinite(peak) and peak > 0:
            unit = "FP32 on the CUDA cores" if p == "fp32" else f"{p.upper()} tensor cores"
            parts.append(f"{unit} {fmt.flop_rate(peak)}, cuBLAS {rate_text(r)} = "
                         f"{fmt.percent(100 * r['gflops'] / peak)} at {size_text(r)}")
    if not parts:
        return None
    return ("Dense peaks on this GPU (SMs x clock x rate per SM) and what cuBLAS reaches of "
            "them: " + "; ".join(parts) + ".")


def errors_against_rounding(d: pd.DataFrame, c: Ceilings) -> str | None:
    """cuBLAS's error against the unrounded product per precision, beside the error that
    rounding the inputs alone predicts."""
    parts = []
    for p, k in CUBLAS.items():
        got = at_largest(d, (k,), "m_err_input")
        if isinstance(got, Judgement):
            continue
        r, want = got[0], expected_input_error(p)
        parts.append(f"{p.upper()} {fmt.error(r['m_err_input'])}"
                     + (f" (rounding the inputs predicts {fmt.error(want)})" if want > 0
                        else " (inputs not rounded: the accumulation's error)"))
    if not parts:
        return None
    return ("cuBLAS's error against the float64 product of the unrounded inputs, at the "
            "largest size: " + "; ".join(parts) + ".")


# -- claims ----------------------------------------------------------------------------------
def _correct(d: pd.DataFrame, c: Ceilings) -> Judgement:
    status = d["status"].astype(str)
    done = d[status.isin(["ok", "wrong"])]
    failed = d[~status.isin(["ok", "wrong", "not_measured"])]
    kinds = ", ".join(sorted(set(failed["status"].astype(str))))
    gone = (f"; {fmt.integer(len(failed))} points gave no result ({kinds}: not judged)"
            if len(failed) else "")
    if done.empty:
        return no_data("no point produced a result" + gone)
    wrong = done[done["status"].astype(str) == "wrong"]
    return judged(wrong.empty,
                  f"{fmt.integer(len(done) - len(wrong))}/{fmt.integer(len(done))} results "
                  "within their tolerance"
                  + (f"; wrong: {', '.join(wrong['point_id'].astype(str).head(5))}"
                     if len(wrong) else "") + gone)


def _flip_correct(d: pd.DataFrame) -> pd.DataFrame:
    """Seen: the first ok point is wrong; not seen: every wrong point is ok."""
    status = d["status"].astype(str)
    if (status == "wrong").any():
        return with_value(d, lambda x: x["status"].astype(str) == "wrong", "status", "ok")
    first = d.index[status == "ok"][:1]
    return with_value(d, lambda x: pd.Series(x.index.isin(first), index=x.index), "status",
                      "wrong")


def _speedup(fast: Key, slow: Key, factor: float) -> Callable[..., Judgement]:
    def judge(d: pd.DataFrame, c: Ceilings) -> Judgement:
        if (na := _no_tensor_path(d, *(p for _, p in (fast, slow) if p != "fp32"))):
            return na
        got = at_largest(d, (fast, slow))
        if isinstance(got, Judgement):
            return got
        f, s = got
        r = f["gflops"] / s["gflops"]
        return judged(r >= factor, f"{label(fast)} {rate_text(f)} / {label(slow)} {rate_text(s)} "
                                   f"= {fmt.ratio(r)} at {size_text(f)}")
    return judge


def _tf32_over_fp32(d: pd.DataFrame, c: Ceilings) -> Judgement:
    got = at_largest(d, (CUBLAS["tf32"], CUBLAS["fp32"]))
    if not isinstance(got, Judgement):
        tf32, fp32 = (num(r, "m_peak_precision_gflops") for r in got)
        if tf32 > 0 and fp32 > 0 and tf32 / fp32 < TF32_PEAK_GAIN:
            return not_applicable(f"the dense TF32 tensor peak is {fmt.ratio(tf32 / fp32)} "
                                  "the FP32 peak on this GPU")
    return _speedup(CUBLAS["tf32"], CUBLAS["fp32"], TF32_OVER_FP32)(d, c)


def _errors(d: pd.DataFrame, a: str, b: str) -> tuple[float, float] | Judgement:
    got = at_largest(d, (CUBLAS[a], CUBLAS[b]), "m_err_input")
    if isinstance(got, Judgement):
        return got
    return float(got[0]["m_err_input"]), float(got[1]["m_err_input"])


def _err_alike(d: pd.DataFrame, c: Ceilings) -> Judgement:
    e = _errors(d, "tf32", "fp16")
    if isinstance(e, Judgement):
        return e
    r = max(e) / min(e)
    return judged(r <= SAME_ERROR, f"cuBLAS error against the unrounded product: TF32 "
                                   f"{fmt.error(e[0])}, FP16 {fmt.error(e[1])} "
                                   f"({fmt.ratio(r)} apart)")


def _err_bf16(d: pd.DataFrame, c: Ceilings) -> Judgement:
    e = _errors(d, "bf16", "fp16")
    if isinstance(e, Judgement):
        return e
    r = e[0] / e[1]
    lo, hi = BF16_ERROR
    return judged(lo <= r <= hi, f"cuBLAS error against the unrounded product: BF16 "
                                 f"{fmt.error(e[0])} / FP16 {fmt.error(e[1])} = {fmt.ratio(r)}")


def _err_fp32(d: pd.DataFrame, c: Ceilings) -> Judgement:
    e = _errors(d, "fp16", "fp32")
    if isinstance(e, Judgement):
        return e
    r = e[0] / e[1]
    return judged(r >= FP32_BETTER, f"cuBLAS error against the unrounded product: FP16 "
                                    f"{fmt.error(e[0])} / FP32 {fmt.error(e[1])} = "
                                    f"{fmt.ratio(r)}")


def _flip_error(prec: str, other: str, holds: Callable[[float], bool], fail: float,
                hold: float) -> Flip:
    """prec's error becomes other's x `fail` where the claim holds (ratio prec / other),
    x `hold` where it does not."""
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        e = _errors(d, prec, other)
        if isinstance(e, Judgement):
            return d
        return with_value(d, is_key(CUBLAS[prec]), "m_err_input",
                          e[1] * (fail if holds(e[0] / e[1]) else hold))
    return flip


def _mma_pair(d: pd.DataFrame) -> tuple[str, pd.Series, pd.Series] | Judgement:
    """(precision, best mma.sync row, WMMA row) in fp16, else bf16 (the same kernels)."""
    why = None
    for p in ("fp16", "bf16"):
        got = at_largest(d, (("mma", p), ("wmma", p)))
        if not isinstance(got, Judgement):
            return p, *got
        why = why or got
    return why


def _mma_over_wmma(d: pd.DataFrame, c: Ceilings) -> Judgement:
    got = _mma_pair(d)
    if isinstance(got, Judgement):
        return got
    p, m, w = got
    r = m["gflops"] / w["gflops"]
    return judged(r >= MMA_OVER_WMMA, f"{p.upper()} at {size_text(m)}: best mma.sync "
                                      f"{rate_text(m)}, WMMA {rate_text(w)} ({fmt.ratio(r)})")


def _flip_mma(d: pd.DataFrame) -> pd.DataFrame:
    got = _mma_pair(d)
    if isinstance(got, Judgement):
        return d
    return flip_speed(("mma", got[0]), ("wmma", got[0]), MMA_OVER_WMMA)(d)


def _hand_pair(d: pd.DataFrame) -> tuple[str, pd.Series, pd.Series] | Judgement:
    """(precision, best hand row, cuBLAS row) at the largest size both were measured ok
    at, in fp16, else bf16."""
    why = None
    for p in ("fp16", "bf16"):
        best = None
        for v in ("mma", "wmma"):
            got = at_largest(d, ((v, p), CUBLAS[p]))
            if isinstance(got, Judgement):
                why = why or got
            elif best is None or (got[0]["flops"], got[0]["gflops"]) > (
                    best[0]["flops"], best[0]["gflops"]):
                best = got
        if best is not None:
            return p, *best
    return why


def _wgmma_at(d: pd.DataFrame, prec: str, like: pd.Series) -> pd.DataFrame:
    """The wgmma rungs' ok rows of this precision at the shape of `like`."""
    o = ok(d)
    keep = o["variant"].isin(wgmma.RUNGS) & (o["p_precision"] == prec)
    for k in ("p_m", "p_n", "p_k"):
        keep &= col(o, k) == like[k]
    return o[keep]


def hand_vs_cublas(d: pd.DataFrame, c: Ceilings) -> str | None:
    """How close the best hand kernel comes to cuBLAS, and the gap's cause as a hypothesis:
    a share of cuBLAS alone cannot tell a missing instruction from a slow kernel, and no
    claim is made of it."""
    got = _hand_pair(d)
    if isinstance(got, Judgement) or got is None:
        return None
    p, h, cub = got
    said = (f"{p.upper()} at {size_text(h)}: the best hand kernel ({NAMES[h['variant']]}) "
            f"reaches {rate_text(h)} = {fmt.percent(100 * h['gflops'] / cub['gflops'])} of "
            f"cuBLAS {rate_text(cub)}.")
    rungs = _wgmma_at(d, p, h)
    if not rungs.empty:  # the run measured the instruction the hypothesis would name
        best = rungs.loc[rungs["gflops"].idxmax()]
        return said + (f" Measured in this run: the wgmma rungs, which issue asynchronous "
                       f"warpgroup MMAs, reach up to {rate_text(best)} = "
                       f"{fmt.percent(100 * best['gflops'] / cub['gflops'])} of cuBLAS at "
                       f"this size ({NAMES[best['variant']]}).")
    cc = cc_of(d)
    if cc and int(cc.split(".")[0]) in ASYNC_MMA_MAJORS:
        said += (" Hypothesis for the gap (not measured: this run did not profile cuBLAS): "
                 "on this compute capability cuBLAS may issue asynchronous warpgroup MMAs "
                 "(wgmma, tcgen05), which mma.sync and WMMA cannot; Nsight Compute on the "
                 "cuBLAS point (profile.ncu) would name its kernel and its tensor-pipe "
                 "instructions.")
    return said


def _peak_share(d: pd.DataFrame) -> pd.Series:
    """gflops / the dense peak of the row's precision (m_peak_precision_gflops)."""
    return col(d, "gflops") / col(d, "m_peak_precision_gflops")


def _cublas_under_peak(d: pd.DataFrame, c: Ceilings) -> Judgement:
    o = ok(d)
    o = o[(o["variant"] == "cublas") & (_peak_share(o) > 0)]
    if o.empty:
        return no_data("no cuBLAS point with a known peak")
    share = _peak_share(o)
    top = o.loc[share.idxmax()]
    return judged(share.max() <= 1,
                  f"highest: cuBLAS {top['p_precision'].upper()} {rate_text(top)} = "
                  f"{fmt.percent(100 * share.max())} of its peak "
                  f"{fmt.flop_rate(top['m_peak_precision_gflops'])} at {size_text(top)}")


def _flip_peak(d: pd.DataFrame) -> pd.DataFrame:
    """Seen: the fastest cuBLAS point runs at 1.5x its peak; not seen: every cuBLAS point
    above its peak runs at half of it."""
    share = _peak_share(d)
    cub = (d["variant"] == "cublas") & (d["status"].astype(str) == "ok") & (share > 0)
    if not cub.any():
        return d
    if share[cub].max() <= 1:
        top = share[cub].idxmax()
        return slower(d, lambda x: pd.Series(x.index == top, index=x.index),
                      share[top] / (1 + 1 / FLIP_MARGIN))
    out = d
    for i in share[cub & (share > 1)].index:
        out = slower(out, lambda x, i=i: pd.Series(x.index == i, index=x.index),
                     share[i] * FLIP_MARGIN)
    return out


def _gain_by_size(d: pd.DataFrame) -> list[tuple[pd.Series, float]]:
    """(cuBLAS FP16 row, its speed-up over SGEMM) at each size both were measured ok at,
    smallest first."""
    h, s = measured(d, CUBLAS["fp16"]), measured(d, CUBLAS["fp32"])
    out = []
    for f in sorted(set(col(h, "flops")) & set(col(s, "flops"))):
        hr = h.loc[col(h, "gflops")[col(h, "flops") == f].idxmax()]
        sr = s.loc[col(s, "gflops")[col(s, "flops") == f].idxmax()]
        out.append((hr, hr["gflops"] / sr["gflops"]))
    return out


def _small_gain(d: pd.DataFrame, c: Ceilings) -> Judgement:
    g = _gain_by_size(d)
    if len(g) < 2:
        return no_data("cuBLAS FP16 and SGEMM not both measured ok at two sizes")
    (small, rs), (big, rb) = g[0], g[-1]
    return judged(rs < SMALL_GAIN_SHARE * rb,
                  f"cuBLAS FP16 over SGEMM: {fmt.ratio(rs)} at {size_text(small)}, "
                  f"{fmt.ratio(rb)} at {size_text(big)}")


def _flip_small_gain(d: pd.DataFrame) -> pd.DataFrame:
    g = _gain_by_size(d)
    if len(g) < 2:
        return d
    (small, rs), (_, rb) = g[0], g[-1]
    target = rb * (SMALL_GAIN_SHARE * FLIP_MARGIN if rs < SMALL_GAIN_SHARE * rb
                   else SMALL_GAIN_SHARE / FLIP_MARGIN)
    f = small["flops"]
    return slower(d, lambda x: is_key(CUBLAS["fp16"])(x) & (col(x, "flops") == f), rs / target)


EXPLANATIONS = (peaks_and_shares, errors_against_rounding, hand_vs_cublas,
                *wgmma_lesson.EXPLANATIONS)
CLAIMS = (
    Claim("every result matches the float64 product of its rounded inputs within the "
          "tolerance derived from K and FP32 accumulation", _correct, _flip_correct,
          "correct"),
    Claim(f"at the largest size, cuBLAS TF32 is at least {times(TF32_OVER_FP32)} as fast "
          f"as cuBLAS SGEMM (on chips whose TF32 tensor peak is at least "
          f"{times(TF32_PEAK_GAIN)} the FP32 peak)", _tf32_over_fp32,
          flip_speed(CUBLAS["tf32"], CUBLAS["fp32"], TF32_OVER_FP32), "tf32_over_fp32"),
    Claim(f"at the largest size, cuBLAS FP16 is at least {times(HALF_OVER_TF32)} as fast "
          "as cuBLAS TF32", _speedup(CUBLAS["fp16"], CUBLAS["tf32"], HALF_OVER_TF32),
          flip_speed(CUBLAS["fp16"], CUBLAS["tf32"], HALF_OVER_TF32), "fp16_over_tf32"),
    Claim(f"at the largest size, cuBLAS BF16 is at least {times(HALF_OVER_TF32)} as fast "
          "as cuBLAS TF32", _speedup(CUBLAS["bf16"], CUBLAS["tf32"], HALF_OVER_TF32),
          flip_speed(CUBLAS["bf16"], CUBLAS["tf32"], HALF_OVER_TF32), "bf16_over_tf32"),
    Claim(f"TF32 and FP16 (the same stored mantissa bits) err within "
          f"{times(SAME_ERROR)} of each other against the unrounded product", _err_alike,
          _flip_error("tf32", "fp16", lambda r: max(r, 1 / r) <= SAME_ERROR,
                      2 * SAME_ERROR, 1.0), "error_tf32_like_fp16"),
    Claim(f"BF16 (three mantissa bits fewer) errs {times(BF16_ERROR[0])} to "
          f"{times(BF16_ERROR[1])} as much as FP16", _err_bf16,
          _flip_error("bf16", "fp16", lambda r: BF16_ERROR[0] <= r <= BF16_ERROR[1], 1.0,
                      math.sqrt(BF16_ERROR[0] * BF16_ERROR[1])), "error_bf16_8x_fp16"),
    Claim(f"FP16 errs at least {times(FP32_BETTER)} as much as FP32 (whose inputs are not "
          "rounded)", _err_fp32,
          _flip_error("fp32", "fp16", lambda r: 1 / r >= FP32_BETTER, 1 / 10,
                      1 / (10 * FP32_BETTER)), "error_fp32_far_below"),
    Claim(f"at the largest size, the best mma.sync tile is at least "
          f"{times(MMA_OVER_WMMA)} as fast as WMMA, in FP16 (else BF16: the same "
          "kernels)", _mma_over_wmma, _flip_mma, "mma_over_wmma"),
    Claim("no cuBLAS point is faster than the dense peak of its precision (else the peak "
          "table is wrong)", _cublas_under_peak, _flip_peak, "cublas_under_peak"),
    *wgmma_lesson.CLAIMS,
)
TRY_THIS = [
    TryThis("tensor_cores.sizes: [256, 512, 4096]",
            "small products cannot fill the tensor cores: cuBLAS FP16 runs into its fixed "
            "costs (launch, the first and last tiles) long before SGEMM does, so the lead of "
            "the low precisions shrinks at the small sizes; the claim judges it on the "
            "smallest and the largest size of whatever sizes ran",
            Claim(f"cuBLAS FP16's speed-up over SGEMM at the smallest size is under "
                  f"{fmt.percent(100 * SMALL_GAIN_SHARE)} of its speed-up at the largest size",
                  _small_gain, _flip_small_gain, "small_sizes_lose_the_lead")),
    TryThis("tensor_cores.mma_tiles: [{bm: 128, bn: 128, bk: 32, wm: 64, wn: 32, stages: 2}, "
            "{bm: 128, bn: 128, bk: 32, wm: 64, wn: 32, stages: 4}]",
            "the same tile with two and with four cp.async stages: with two, one k-slice "
            "loads while the tensor cores work on the other, and a load that takes longer "
            "than the MMAs of a slice stalls the warps; more stages keep more loads in "
            "flight. Where the deeper pipeline gains little, the loads were already hidden "
            "and something else limits the kernel (the registers that ldmatrix fills, the "
            "issue rate of one small MMA per instruction)"),
    TryThis("tensor_cores.sizes: [[4096, 256, 4096]]",
            "a thin K: every element of C is a sum of few products while C itself, in FP32, "
            "is as large as before, so the bytes per FLOP grow and the point moves left on "
            "the roofline; the low precisions, which gained by computing faster, now wait on "
            "memory as well, so their lead over SGEMM shrinks"),
]

LESSON = Lesson(
    title="Tensor cores: WMMA, mma.sync, Hopper's wgmma and cuBLAS in TF32, FP16 and BF16; "
          "precision as a knob",
    caption=(
        "The same product C = A B in four input precisions, all accumulating in FP32: FP32 "
        "(cuBLAS SGEMM on the CUDA cores), TF32, BF16 and FP16 (tensor cores). The hand "
        "kernels climb two rungs: WMMA fragments fed from one shared-memory stage, then "
        "mma.sync fed by ldmatrix from a cp.async pipeline several stages deep. On Hopper "
        "(compute capability 9.x) four more rungs use the chip's own instructions: wgmma, "
        "a warpgroup's asynchronous MMA that reads both operands from shared memory, fed by "
        "TMA copies of whole tiles in the 128-byte swizzle (one stage, every warp waiting "
        "for each copy); then a ring of stages on mbarriers so that copies overlap the MMAs; "
        "then a producer warpgroup that only copies and two consumer warpgroups that only "
        "multiply, with registers moved to the consumers (setmaxnreg); then the same on a "
        "persistent grid, so the next tile loads while this one is stored. Elsewhere those "
        "rungs are not applicable. cuBLAS in "
        "each precision, in the same job, is the ceiling, and each precision's dense tensor "
        "peak (SMs x clock x rate per SM) the roof. Every result is checked against the "
        "float64 product of its rounded inputs within a tolerance derived from K and FP32 "
        "accumulation; its error against the product of the unrounded inputs is what the "
        "precision costs. Look for: TF32 far faster than FP32, FP16 and BF16 faster again; "
        "TF32 and FP16 with about the same error (10 stored mantissa bits each), BF16 about "
        "8 times worse (7 bits), FP32 orders of magnitude better; mma.sync faster than WMMA; "
        "each wgmma rung faster than the one before and the best of them close to cuBLAS; "
        "and how close the best pre-Hopper hand kernel comes to cuBLAS FP16 (shown, not "
        "judged). The claims below judge the others on this run."),
    figures={
        "precision_knob": "Precision is a knob: at the largest size, the relative Frobenius error "
        "of each precision's result against the float64 product of the unrounded inputs (x, log "
        "scale) and its TFLOP/s (y, log scale); one colour per precision, one marker per "
        "variant (cuBLAS, WMMA, the best mma.sync tile). Lower precision moves right "
        "(more error) and up (more speed); the dotted lines mark the error that rounding the "
        "inputs alone predicts.",
        "tflops": "TFLOP/s of each variant against matrix size, one panel per precision "
        "(best tile of the mma kernel per size), with the precision's dense peak (SMs x clock x "
        "rate per SM; dashed) above cuBLAS.",
        "wgmma_ladder": "The ladder at the largest size: TFLOP/s of every rung (WMMA, the "
        "best mma.sync tile, the four wgmma rungs, cuBLAS) per precision, each bar labelled "
        "with its share of cuBLAS of the same precision. Each wgmma rung adds one thing: "
        "stages, then warp specialisation, then a persistent grid. The TF32 wgmma rungs "
        "include the transpose of B that wgmma's K-major TF32 operands need.",
        "pipeline_depth": "Pipeline depth against speed at the largest size: TFLOP/s of the "
        "wgmma rungs against their shared-memory stages (the one-stage rung at 1). Where a "
        "deeper ring gains nothing, the copies were already hidden.",
    },
    print_figure=("precision_knob", None),  # on paper: speed against error
    print_pages=0.95,  # its share of the A4 handout (0.87 on the H100 reference)
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "Why is a product of two fp16 numbers exact in FP32, and what error is then left?",
            answers.fp16_product),
        Question(
            "TF32 and FP16 keep the same number of mantissa bits: why does TF32 still run at "
            "half the FP16 rate?",
            answers.tf32_rate),
        Question(
            "What does a cp.async stage overlap, and why does mma.sync need ldmatrix.trans for "
            "a row-major B?",
            answers.stages),
    ],
    sources={
        "10": "stored mantissa bits of FP16 (IEEE 754 binary16) and of TF32 (NVIDIA A100 "
              "Tensor Core GPU Architecture whitepaper)",
        "7": "stored mantissa bits of BF16 (bfloat16: the upper half of an IEEE 754 binary32)",
        "8": "BF16's rounding error over FP16's: three fewer mantissa bits, 2^3",
        "9": "compute capability 9.x: Hopper (H100, H200), the chips with wgmma and TMA "
             "(CUDA C++ Programming Guide, compute capabilities)",
    },
)
