"""The wgmma part of the tensor-core lesson: Hopper's own matrix product, rung by rung.

Claims (each with its threshold and the data change that turns it over): the best wgmma
rung reaches a share of cuBLAS of the same precision; the multi-stage pipeline beats the
one-stage rung; the warp-specialised rung beats the best mma.sync tile. On a GPU of another
compute capability than 9.x they are not applicable (wgmma is an sm_90a instruction). Facts:
each rung's rate, share of cuBLAS and of the dense tensor peak (achieved tensor-core
throughput); the time against pipeline depth; the copy and shared-memory-to-register
instructions per k-slice that TMA and wgmma take off the warps (from the tile shapes), and
where the run was profiled (profile.ncu), what Nsight Compute counted of them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import (
    Claim,
    Flip,
    Judgement,
    col,
    judged,
    largest,
    ncu,
    no_data,
    not_applicable,
    ok,
    slower,
)
from cudalab.experiments.tensor_cores import wgmma
from cudalab.experiments.tensor_cores.table import (
    CUBLAS,
    FLIP_MARGIN,
    NAMES,
    Key,
    at_largest,
    cc_of,
    flip_speed,
    is_key,
    rate_text,
    size_text,
    times,
)

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

# The best wgmma rung reaches at least this share of cuBLAS of the same precision (the
# targets of the rungs: FP16 and BF16 at 70 %, TF32, whose rung also transposes B, at 60 %).
SHARE_OF_CUBLAS = {"fp16": 0.70, "bf16": 0.70, "tf32": 0.60}
# Stages that overlap TMA copies with the MMAs beat the one-stage rung by at least this.
PIPE_OVER_ONE_STAGE = 1.2
# The warp-specialised wgmma rung beats the best mma.sync tile by at least this.
WS_OVER_MMA = 1.5


def _hopper_only(d: pd.DataFrame) -> Judgement | None:
    cc = cc_of(d)
    if cc and not cc.startswith("9."):
        return not_applicable(f"wgmma is an sm_90a instruction; this GPU is compute "
                              f"capability {cc}")
    return None


def _best_rung(d: pd.DataFrame, prec: str) -> tuple[pd.Series, pd.Series] | Judgement:
    """(fastest wgmma row, cuBLAS row) in `prec` at the largest size both were measured ok
    at (the fastest rung there; ties in size go to the rate)."""
    best = None
    for rung in wgmma.RUNGS:
        got = at_largest(d, ((rung, prec), CUBLAS[prec]))
        if isinstance(got, Judgement):
            continue
        if best is None or (got[0]["flops"], got[0]["gflops"]) > (
                best[0]["flops"], best[0]["gflops"]):
            best = got
    return best if best is not None else no_data(
        f"no wgmma rung and cuBLAS {prec.upper()} measured ok at one size")


def _share_judge(prec: str):
    def judge(d: pd.DataFrame, c: Ceilings) -> Judgement:
        if (na := _hopper_only(d)):
            return na
        got = _best_rung(d, prec)
        if isinstance(got, Judgement):
            return got
        w, cub = got
        share = w["gflops"] / cub["gflops"]
        return judged(share >= SHARE_OF_CUBLAS[prec],
                      f"{prec.upper()} at {size_text(w)}: {NAMES[w['variant']]} "
                      f"{rate_text(w)} = {fmt.percent(100 * share)} of cuBLAS "
                      f"{rate_text(cub)}")
    judge.__name__ = f"wgmma_{prec}_share"
    return judge


def _flip_share(prec: str) -> Flip:
    """Seen: every wgmma row of prec slows to half the threshold's share; not seen: they
    all speed up to twice it."""
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        got = _best_rung(d, prec)
        if isinstance(got, Judgement):
            return d
        share, want = got[0]["gflops"] / got[1]["gflops"], SHARE_OF_CUBLAS[prec]
        target = want / FLIP_MARGIN if share >= want else want * FLIP_MARGIN
        return slower(d, is_key(*((r, prec) for r in wgmma.RUNGS)), share / target)
    return flip


def _ratio_judge(fast: Key, slow: Key, factor: float):
    def judge(d: pd.DataFrame, c: Ceilings) -> Judgement:
        if (na := _hopper_only(d)):
            return na
        got = at_largest(d, (fast, slow))
        if isinstance(got, Judgement):
            return got
        f, s = got
        r = f["gflops"] / s["gflops"]
        return judged(r >= factor, f"{fast[1].upper()} at {size_text(f)}: "
                                   f"{NAMES[fast[0]]} {rate_text(f)}, {NAMES[slow[0]]} "
                                   f"{rate_text(s)} ({fmt.ratio(r)})")
    return judge


# -- facts -----------------------------------------------------------------------------------
def wgmma_ladder(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Each rung at the largest size, per precision: its rate, its share of cuBLAS and of
    the precision's dense tensor peak (the tensor cores' achieved throughput)."""
    parts = []
    for prec in wgmma.PRECISIONS:
        cub = at_largest(d, (CUBLAS[prec],))
        said = []
        for v in ["mma", *wgmma.RUNGS]:
            got = at_largest(d, ((v, prec),) + (() if isinstance(cub, Judgement)
                                                else (CUBLAS[prec],)))
            if isinstance(got, Judgement):
                continue
            r = got[0]
            share = (f", {fmt.percent(100 * r['gflops'] / got[1]['gflops'])} of cuBLAS"
                     if len(got) > 1 else "")
            peak = col(pd.DataFrame([r]), "m_pct_peak_precision").iloc[0]
            said.append(f"{NAMES[v]} {rate_text(r)}{share}"
                        + (f", {fmt.percent(peak)} of the peak" if peak == peak else ""))
        if said and any(s.startswith("wgmma") for s in said):
            parts.append(f"{prec.upper()}: " + "; ".join(said))
    if not parts:
        return None
    return "The rungs at the largest size measured: " + ". ".join(parts) + "."


def pipeline_depth(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The time of the pipelined rungs against their stages (FP16, else BF16, largest size),
    beside the one-stage rung."""
    o = largest(ok(d))
    for prec in ("fp16", "bf16"):
        sub = o[(o["p_precision"] == prec) & o["variant"].isin(wgmma.RUNGS)]
        if col(sub, "p_stages").nunique() < 2:
            continue
        parts = []
        for v in wgmma.RUNGS:
            g = sub[sub["variant"] == v]
            if g.empty:
                continue
            stages = col(g, "p_stages").fillna(1).astype(int)
            parts.append(f"{NAMES[v]}: " + ", ".join(
                f"{s} stage{'s' if s > 1 else ''} {fmt.seconds(t)}"
                for s, t in sorted(zip(stages, col(g, "time_median_s"), strict=True))))
        return (f"Time against pipeline depth, {prec.upper()} at {size_text(sub.iloc[0])}: "
                + "; ".join(parts) + ".")
    return None


def copies_per_slice(d: pd.DataFrame, c: Ceilings) -> str | None:
    """What one k-slice of a block tile asks of the warps, from the tile shapes of the best
    mma.sync tile and the warp-specialised wgmma rung (FP16, largest size)."""
    got = at_largest(d, (("mma", "fp16"), ("wgmma_ws", "fp16")))
    if isinstance(got, Judgement):
        return None
    m, w = got
    bm, bn, bk, wm, wn = (int(m[f"p_{k}"]) for k in ("bm", "bn", "bk", "wm", "wn"))
    warps = (bm // wm) * (bn // wn)
    cp_async = (bm * bk + bk * bn) * 2 // 16
    ldsm_bytes = warps * (wm + wn) * bk * 2  # every warp's A and B fragments, once
    wbn = int(w["p_bn"]) if w.get("p_bn") == w.get("p_bn") else wgmma.DEFAULT_BN
    tma = 1 + wbn // 64  # one box of A, one per 64 columns of N-major B
    return (f"Per k-slice, from the tile shapes: the mma.sync tile {bm}x{bn}x{bk} issues "
            f"{fmt.integer(cp_async)} 16-byte cp.async from its {fmt.integer(warps * 32)} "
            f"threads and its {fmt.integer(warps)} warps copy "
            f"{fmt.integer(ldsm_bytes // 1024)} KiB from shared memory into registers with "
            f"ldmatrix; the warp-specialised wgmma rung "
            f"({wgmma.BM}x{wbn}x64) issues {tma} TMA copies from one thread and no ldmatrix: "
            "the tensor cores read both operands from shared memory.")


# Nsight Compute's counts of who moves the operands (ncu_csv.SHORT_NAMES), as the fact says
# them: (column, what it counts)
TRAFFIC = (("m_ncu_cp_async_inst", "cp.async"), ("m_ncu_ldmatrix_inst", "ldmatrix"),
           ("m_ncu_tma_load_inst", "TMA load"))
WAVEFRONTS = "m_ncu_smem_lsu_wavefronts"
WARP_INST = "m_ncu_warp_inst"


def _counts(pair: pd.DataFrame, i: int) -> str:
    """What the profiler counted for row i of pair (a count it did not collect is left out)."""
    def count(column: str) -> float:
        return float(ncu(pair, column).iloc[i])

    said = [f"{fmt.integer(v)} {what}" for column, what in TRAFFIC
            if math.isfinite(v := count(column))]
    said.append(f"{fmt.integer(count(WAVEFRONTS))} shared-memory wavefronts through the "
                "load/store unit")
    if math.isfinite(v := count(WARP_INST)):
        said.append(f"{fmt.integer(v)} warp instructions in all")
    return ", ".join(said)


def shared_traffic_measured(d: pd.DataFrame, c: Ceilings) -> str | None:
    """What Nsight Compute counted (profile.ncu, with the shipped config's metrics) for the
    best mma.sync tile and the warp-specialised wgmma rung, FP16 at the largest size both
    were profiled at: the copy instructions into shared memory and out of it, the
    shared-memory wavefronts through the warps' load/store unit, every warp instruction.
    None where the run did not profile both."""
    o = ok(d)
    got = at_largest(o[ncu(o, WAVEFRONTS) >= 0], (("mma", "fp16"), ("wgmma_ws", "fp16")))
    if isinstance(got, Judgement):
        return None
    pair = pd.DataFrame(list(got))
    mw, ww = ncu(pair, WAVEFRONTS)
    fewer = (f" ({fmt.ratio(mw / ww)} fewer wavefronts)" if 0 < ww < mw
             else " (no wavefront at all)" if ww == 0 < mw else "")
    return (f"Nsight Compute counted, FP16 at {size_text(got[0])}: the mma.sync tile "
            f"{_counts(pair, 0)}; the warp-specialised wgmma rung {_counts(pair, 1)}{fewer}.")


CLAIMS = (
    *(Claim(f"at the largest size, the best wgmma rung reaches at least "
            f"{fmt.percent(100 * SHARE_OF_CUBLAS[p])} of cuBLAS {p.upper()} (compute "
            "capability 9.x)", _share_judge(p), _flip_share(p), f"wgmma_{p}_share")
      for p in wgmma.PRECISIONS),
    Claim(f"at the largest size, the wgmma pipeline (its best stage count) is at least "
          f"{times(PIPE_OVER_ONE_STAGE)} as fast as the one-stage wgmma rung, in FP16",
          _ratio_judge(("wgmma_pipe", "fp16"), ("wgmma_tma", "fp16"), PIPE_OVER_ONE_STAGE),
          flip_speed(("wgmma_pipe", "fp16"), ("wgmma_tma", "fp16"), PIPE_OVER_ONE_STAGE),
          "wgmma_pipeline_pays"),
    Claim(f"at the largest size, the warp-specialised wgmma rung is at least "
          f"{times(WS_OVER_MMA)} as fast as the best mma.sync tile, in FP16",
          _ratio_judge(("wgmma_ws", "fp16"), ("mma", "fp16"), WS_OVER_MMA),
          flip_speed(("wgmma_ws", "fp16"), ("mma", "fp16"), WS_OVER_MMA),
          "wgmma_ws_over_mma"),
)
EXPLANATIONS = (wgmma_ladder, pipeline_depth, copies_per_slice, shared_traffic_measured)

