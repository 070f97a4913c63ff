"""The matmul lesson: its claims (each a predicate over this run's table with its threshold
and the data change that turns it over) and its facts (sentences computed from the table).
Every number in a sentence comes from the table; the only constants are the named
thresholds below.

Each point is judged against the roof of its own dtype: float32 points against the FP32
ceiling, float64 points against the FP64 peak of the units they run on (fp64.fp64_peak:
cuBLAS DGEMM on the FP64 tensor cores where the GPU has them, the kernels on the CUDA
cores). The float32 claims read float32 rows only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.base import NOT_MEASURED
from cudalab.experiments.flip import turn
from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    Lesson,
    TryThis,
    col,
    judged,
    ncu,
    no_data,
    not_applicable,
    one_wrong,
    ref,
    slower,
)
from cudalab.experiments.matmul import answers, smem_reuse
from cudalab.experiments.matmul.course_facts import COURSE_FACTS
from cudalab.experiments.matmul.fp64 import FP64_TENSOR_RATIO, fp64_peak, fp64_ratio
from cudalab.experiments.matmul.kernels import LADDER_KERNELS
from cudalab.experiments.matmul.rows import (
    _at_course,
    _at_largest,
    _best,
    _course,
    _fewer_copies,
    _is,
    _largest,
    _rate,
    _rows,
    _size,
    _skipped,
    dtype_of,
)
from cudalab.experiments.questions import Question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

# The naive kernel loads one float of A and one of B (8 bytes) per FMA (2 flops): what it
# asks of memory when no cache helps.
NAIVE_BYTES_PER_FLOP = 4.0
# The naive kernel is fed by the caches: at least twice what DRAM alone could feed it (1x is
# the physical bound; the margin keeps a measured DRAM ceiling below the true peak from
# counting as cache hits).
NAIVE_CACHE_GAIN = 2.0
# The naive kernel's loads limit it: at NAIVE_BYTES_PER_FLOP its loads ask the L1 for at
# least this share of the measured shared-memory ceiling (L1 and shared memory are one
# on-chip memory with one load path). A kernel held by anything else (latency, too few
# warps, the launch) asks far less of it; one held by its arithmetic cannot get there.
NAIVE_L1_SHARE = 0.5
TILING_GAIN = 1.2  # tiled (best tile) vs naive
REGISTER_GAIN = 1.2  # register-tiled vs tiled, largest size
PADDING_GAIN = 1.1  # padded vs conflicting tiles, every tile (each one conflicts)
LADDER_GAIN = 0.8  # best hand-written kernel vs cuBLAS SGEMM, largest square size
CUBLAS_FROM_N = 1000  # cuBLAS SGEMM is the fastest float32 variant from this square n on
GPU_VS_CPU = 10.0  # best GPU kernel vs numpy's BLAS on the host
COPY_SHARE = 0.5  # copies' share of the GPU time of the course's product
COURSE_TILE = 16  # the course's 16 x 16 tiles: the end-to-end point the course table reads
BIG_BLOCK_TILE = 128 * 128  # the warp-tiled kernel's large block tile (bm x bn)


# -- facts -----------------------------------------------------------------------------------
def matmul_bank_conflicts(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Bank conflicts counted by the profiler, conflicting tile against the padded one."""
    d = _rows(d)
    conf = ncu(d, "m_ncu_smem_bank_conflicts")
    d = d.assign(conflicts=conf)[conf.notna()]
    pairs = d[d["variant"].isin(["tiled_conflict", "tiled_padded"])]
    if pairs.empty or "p_tile" not in pairs:
        return None
    big = _largest(pairs)
    by = big.groupby(["variant", "p_tile"])["conflicts"].max()
    parts = []
    for tile in sorted({t for _, t in by.index}, reverse=True):
        con, pad = by.get(("tiled_conflict", tile)), by.get(("tiled_padded", tile))
        if con is not None and pad is not None:
            parts.append(f"tile {int(tile)}: {fmt.integer(con)} conflicting vs "
                         f"{fmt.integer(pad)} padded")
    if not parts:
        return None
    return (f"Shared-memory bank conflicts counted by Nsight Compute at {_size(big)}: "
            + "; ".join(parts) + ".")


def _ridge(intensity: float, roof: float, c: Ceilings) -> str:
    dram, _ = c.bandwidth("dram")
    if not (math.isfinite(dram) and dram > 0 and math.isfinite(intensity)):
        return ""
    ridge = roof / dram
    side = (", where only arithmetic can limit it" if intensity > ridge
            else ", where DRAM bandwidth limits it")
    return (f"; at {fmt.short(intensity)} FLOP/byte it sits "
            f"{'right' if intensity > ridge else 'left'} of this roof's ridge point "
            f"({fmt.short(ridge)} FLOP/byte){side}")


def matmul_best_fp32(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The fastest float32 GPU variant at the largest size against the FP32 ceiling."""
    big = _largest(_rows(d))
    roof, kind = c.flops()
    if big.empty or not math.isfinite(roof):
        return None
    best = big.loc[col(big, "gflops").idxmax()]
    return (f"In float32 at {_size(big)} the fastest variant, {best['label']}, reaches "
            f"{fmt.flop_rate(best['gflops'])}: {fmt.percent(100 * best['gflops'] / roof)} of "
            f"the {kind} FP32 ceiling {fmt.flop_rate(roof)}"
            + _ridge(col(big, "intensity").loc[best.name], roof, c) + ".")


def matmul_best_fp64(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The fastest float64 GPU variant at the largest size against the FP64 peak of the
    units it runs on."""
    big = _largest(_rows(d, "float64"))
    if big.empty:
        return None
    best = big.loc[col(big, "gflops").idxmax()]
    peak, units = fp64_peak(best)
    if not math.isfinite(peak):
        return None
    return (f"In float64 at {_size(big)} the fastest variant, {best['label']}, reaches "
            f"{fmt.flop_rate(best['gflops'])}: {fmt.percent(100 * best['gflops'] / peak)} of "
            f"the FP64 peak of the units it runs on ({units}, {fmt.flop_rate(peak)}, "
            "theoretical)" + _ridge(col(big, "intensity").loc[best.name], peak, c) + ".")


# -- claims: correctness and the float32 ladder ----------------------------------------------
def _correct(d: pd.DataFrame, c: Ceilings) -> Judgement:
    gpu = d[d["variant"] != "cpu"]
    st = gpu["status"].astype(str)
    done, skipped = gpu[~st.isin([NOT_MEASURED, "skipped"])], gpu[st == "skipped"]
    note = (f"; {len(skipped)} skipped ({skipped['reason'].dropna().iloc[0]})"
            if len(skipped) and skipped["reason"].notna().any() else
            f"; {len(skipped)} skipped" if len(skipped) else "")
    if done.empty:
        return no_data("no GPU point measured" + note)
    bad = done[done["status"].astype(str) != "ok"]
    return judged(bad.empty, f"{len(done) - len(bad)}/{len(done)} GPU points correct"
                  + (f"; not ok: {', '.join(bad['point_id'].astype(str).head(5))}"
                     if len(bad) else "") + note)


def _tiling(d: pd.DataFrame, c: Ceilings) -> Judgement:
    g = _rows(d)
    big, course = _largest(g), _course(g)
    ratios = {}
    for at in (big, course):
        best = _best(at)
        if "naive" in best and "tiled" in best:
            ratios[at["size"].iloc[0]] = best["tiled"]["gflops"] / best["naive"]["gflops"]
    if not ratios:
        return no_data("naive and tiled not both measured at the largest or the course's size")
    return judged(all(r >= TILING_GAIN for r in ratios.values()),
                  "best tiled / naive = " + ", ".join(f"{fmt.ratio(r)} at {s}"
                                                      for s, r in ratios.items()))


def _register(d: pd.DataFrame, c: Ceilings) -> Judgement:
    big = _largest(_rows(d))
    best = _best(big)
    if "tiled" not in best or "register" not in best:
        return no_data("register and tiled not both measured at the largest size")
    reg, til = best["register"], best["tiled"]
    r = reg["gflops"] / til["gflops"]
    return judged(r >= REGISTER_GAIN, f"best register / best tiled = {fmt.ratio(r)} at "
                  f"{reg['size']} ({_rate(reg)} vs {_rate(til)})")


def _padding(d: pd.DataFrame, c: Ceilings) -> Judgement:
    big = _largest(_rows(d))
    pad = big[big["variant"] == "tiled_padded"].groupby("p_tile")["gflops"].max()
    con = big[big["variant"] == "tiled_conflict"].groupby("p_tile")["gflops"].max()
    tiles = sorted(set(pad.index) & set(con.index), reverse=True)
    if not tiles:
        return no_data("padded and conflicting tiles not both measured at the largest size")
    ratios = {int(t): pad[t] / con[t] for t in tiles}
    return judged(all(r > PADDING_GAIN for r in ratios.values()),
                  f"tiled_padded / tiled_conflict at {big['size'].iloc[0]}: "
                  + ", ".join(f"TILE {t}: {fmt.ratio(r)}" for t, r in ratios.items()))


def _square(d: pd.DataFrame) -> pd.DataFrame:
    return d[(col(d, "p_m") == col(d, "p_n")) & (col(d, "p_k") == col(d, "p_n"))]


def _cublas_ceiling(d: pd.DataFrame, c: Ceilings) -> Judgement:
    g = _square(_rows(d))
    g = g[col(g, "p_n") >= CUBLAS_FROM_N]
    cub = g[g["variant"] == "cublas"]
    if cub.empty:
        return no_data(f"cuBLAS SGEMM not measured at a square size of n >= "
                       f"{fmt.integer(CUBLAS_FROM_N)}{_skipped(d, 'cublas')}")
    parts, holds = [], True
    for n, at in g.groupby("p_n"):
        best = _best(at)
        if "cublas" not in best or len(best) < 2:
            continue
        other = max((r for v, r in best.items() if v != "cublas"), key=lambda r: r["gflops"])
        r = best["cublas"]["gflops"] / other["gflops"]
        holds &= bool(r >= 1)
        parts.append(f"n = {fmt.integer(n)}: cuBLAS {fmt.flop_rate(best['cublas']['gflops'])}"
                     f" / {_rate(other)} = {fmt.ratio(r)}")
    if not parts:
        return no_data("no other kernel measured beside cuBLAS SGEMM at those sizes")
    return judged(holds, "; ".join(parts))


def _ladder(d: pd.DataFrame, c: Ceilings) -> Judgement:
    g = _square(_rows(d))
    at = _largest(g)
    if at.empty or not at["variant"].isin(LADDER_KERNELS).any():
        return no_data("no kernel past register tiling (" + ", ".join(LADDER_KERNELS)
                       + ") measured at the largest square size")
    size = at["size"].iloc[0]
    cub = at[at["variant"] == "cublas"]
    if cub.empty:
        return no_data(f"cuBLAS SGEMM not measured at {size}{_skipped(d, 'cublas')}")
    mine = at[at["variant"] != "cublas"]
    top = mine.loc[col(mine, "gflops").idxmax()]
    r = top["gflops"] / cub["gflops"].max()
    return judged(r >= LADDER_GAIN, f"{_rate(top)} = {fmt.percent(100 * r)} of cuBLAS SGEMM "
                  f"({fmt.flop_rate(cub['gflops'].max())}) at {size}")


def _blas(r: pd.Series) -> str:
    """How the CPU reference ran: numpy's BLAS with the job's threads (newer tables)."""
    threads, blas = r.get("cpu_threads"), r.get("blas")
    t = "threads not recorded" if fmt.missing(threads) else f"{fmt.integer(threads)} threads"
    return f"numpy BLAS, {t}" + ("" if fmt.missing(blas) else f": {blas}")


def _gpu_vs_cpu(d: pd.DataFrame, c: Ceilings) -> Judgement:
    gpu, cpu = _rows(d), _rows(d, cpu=True)
    cpu = _largest(cpu[cpu["size"].isin(set(gpu["size"]))])
    if cpu.empty:
        return no_data("the CPU and the GPU ran no size in common")
    size = cpu["size"].iloc[0]
    g = gpu[gpu["size"] == size]
    top, host = g.loc[col(g, "gflops").idxmax()], cpu.loc[col(cpu, "gflops").idxmax()]
    r = top["gflops"] / host["gflops"]
    return judged(r >= GPU_VS_CPU, f"{_rate(top)} / CPU {fmt.flop_rate(host['gflops'])} "
                  f"({_blas(host)}) = {fmt.ratio(r)} at {size}")


# -- claims: the time split, the naive kernel, double precision ------------------------------
def gpu_copy_share(h2d: float, kernel: float, d2h: float) -> float:
    """The copies' share of the GPU time as nvprof's GPU activities count it: H2D + D2H over
    H2D + kernel + D2H (cudaMalloc is host time and not in it)."""
    return (h2d + d2h) / (h2d + kernel + d2h)


def _copy_point(d: pd.DataFrame) -> pd.Series | None:
    """The end-to-end point the course table reads: tiled at the course's product (the
    smallest where the course's is not in the run), its 16 x 16 tiles where measured."""
    t = _rows(d)
    t = t[(t["variant"] == "tiled") & col(t, "m_h2d_s").notna() & col(t, "m_d2h_s").notna()
          & col(t, "m_kernel_s").notna()]
    at = _course(t)
    if at.empty:
        at = t[col(t, "flops") == col(t, "flops").min()]
    if at.empty:
        return None
    tile = at[col(at, "p_tile") == COURSE_TILE]
    at = tile if len(tile) else at
    return at.loc[col(at, "m_kernel_s").idxmin()]


def _copies(d: pd.DataFrame, c: Ceilings) -> Judgement:
    r = _copy_point(d)
    if r is None:
        return no_data("no end-to-end split of the tiled kernel (matmul.end_to_end)")
    h2d, ker, d2h = (float(r[f"m_{x}_s"]) for x in ("h2d", "kernel", "d2h"))
    share = gpu_copy_share(h2d, ker, d2h)
    alloc = float(col(r.to_frame().T, "m_alloc_s").iloc[0])
    return judged(share > COPY_SHARE,
                  f"H2D {fmt.seconds(h2d)} + D2H {fmt.seconds(d2h)} of "
                  f"{fmt.seconds(h2d + ker + d2h)} (H2D + kernel + D2H) = "
                  f"{fmt.percent(100 * share)} for {r['label']} at {r['size']}"
                  + (f"; cudaMalloc {fmt.seconds(alloc)} besides, host time"
                     if math.isfinite(alloc) else ""))


def _naive_row(d: pd.DataFrame) -> pd.Series | None:
    """The naive kernel at its largest float32 product."""
    g = _rows(d)
    naive = _largest(g[g["variant"] == "naive"])
    return None if naive.empty else naive.loc[col(naive, "gflops").idxmax()]


def _naive_fed(d: pd.DataFrame, c: Ceilings) -> Judgement:
    row, (dram, what) = _naive_row(d), ref(c)
    if row is None or not math.isfinite(dram):
        return no_data("no naive point, or no DRAM ceiling, in this run")
    fed = dram / NAIVE_BYTES_PER_FLOP
    hit = ncu(row.to_frame().T, "m_ncu_l2_hit_rate_pct").iloc[0]
    return judged(row["gflops"] >= NAIVE_CACHE_GAIN * fed,
                  f"{_rate(row)} at {row['size']} = {fmt.ratio(row['gflops'] / fed)} what the "
                  f"{what} could feed at {fmt.number(NAIVE_BYTES_PER_FLOP)} bytes per flop "
                  f"({fmt.flop_rate(fed)})"
                  + (f"; Nsight Compute: L2 hit rate {fmt.percent(hit)}"
                     if math.isfinite(hit) else ""))


def _naive_load_bound(d: pd.DataFrame, c: Ceilings) -> Judgement:
    row = _naive_row(d)
    smem, kind = (c.smem, "measured") if math.isfinite(c.smem) else (c.smem_peak, "theoretical")
    if row is None or not math.isfinite(smem):
        return no_data("no naive point, or no shared-memory ceiling, in this run")
    asked = row["gflops"] * NAIVE_BYTES_PER_FLOP
    return judged(asked >= NAIVE_L1_SHARE * smem,
                  f"{_rate(row)} at {row['size']}; at {fmt.number(NAIVE_BYTES_PER_FLOP)} bytes "
                  f"per flop, {fmt.bandwidth(asked)} of loads = "
                  f"{fmt.percent(100 * asked / smem)} of the {kind} shared-memory ceiling "
                  f"{fmt.bandwidth(smem)}")


def _dgemm_tensor_cores(d: pd.DataFrame, c: Ceilings) -> Judgement:
    f64 = _rows(d, "float64")
    cub = _largest(f64[f64["variant"] == "cublas"])
    if cub.empty:
        why = _skipped(d[dtype_of(d) == "float64"], "cublas")
        return no_data(f"cuBLAS DGEMM not measured{why}")
    row = cub.loc[col(cub, "gflops").idxmax()]
    cc = row.get("compute_capability")
    if fmt.missing(cc) or fp64_ratio(cc) is None:
        return no_data("the GPU's FP64 rate is not known (no compute capability cudalab knows)")
    from cudalab import devicespec

    if devicespec.cc_key(cc) not in FP64_TENSOR_RATIO:
        return not_applicable(f"compute capability {cc} has no FP64 tensor cores")
    tensor, _ = fp64_peak(row)
    cores = tensor / FP64_TENSOR_RATIO[devicespec.cc_key(cc)] * fp64_ratio(cc)
    return judged(row["gflops"] > cores,
                  f"{_rate(row)} at {row['size']} = {fmt.ratio(row['gflops'] / cores)} the FP64 "
                  f"peak of the CUDA cores ({fmt.flop_rate(cores)}); the FP64 tensor cores' "
                  f"peak is {fmt.flop_rate(tensor)}")


def _fp64_slower(d: pd.DataFrame, c: Ceilings) -> Judgement:
    big64 = _largest(_rows(d, "float64"))
    if big64.empty:
        return no_data("no float64 point in this run")
    size = big64["size"].iloc[0]
    f32 = _rows(d)
    b64, b32 = _best(big64), _best(f32[f32["size"] == size])
    ratios = {v: b64[v]["gflops"] / b32[v]["gflops"] for v in ("naive", "tiled")
              if v in b64 and v in b32}
    if not ratios:
        return no_data(f"naive or tiled not measured in both float32 and float64 at {size}")
    return judged(all(r < 1 for r in ratios.values()),
                  "float64 / float32 = " + ", ".join(
                      f"{fmt.ratio(r)} for {v} ({fmt.flop_rate(b64[v]['gflops'])} vs "
                      f"{fmt.flop_rate(b32[v]['gflops'])})" for v, r in ratios.items())
                  + f" at {size}")


# -- Try-this claims -------------------------------------------------------------------------
def _block_tiles(d: pd.DataFrame, c: Ceilings) -> Judgement:
    g = _rows(d)
    w = g[g["variant"] == "warptile"]
    parts, holds = [], True
    for at, small_wins in ((_course(w), True), (_largest(w), False)):
        area = col(at, "p_bm") * col(at, "p_bn")
        big, small = at[area >= BIG_BLOCK_TILE], at[area < BIG_BLOCK_TILE]
        if big.empty or small.empty:
            return no_data("warp tiles with 128x128 and with smaller block tiles not both "
                           "measured at the course's product and at the largest size")
        b = big.loc[col(big, "gflops").idxmax()]
        s = small.loc[col(small, "gflops").idxmax()]
        holds &= bool((s["gflops"] > b["gflops"]) == small_wins)
        parts.append(f"at {b['size']}: smaller {_rate(s)} vs {_rate(b)}")
    return judged(holds, "; ".join(parts))


def _tile8(d: pd.DataFrame, c: Ceilings) -> Judgement:
    big = _largest(_rows(d))
    naive = big[big["variant"] == "naive"]
    t8 = big[(big["variant"] == "tiled") & (col(big, "p_tile") == 8)]
    if naive.empty or t8.empty:
        return no_data("naive and tiled with TILE 8 not both measured at the largest size")
    r = t8["gflops"].max() / naive["gflops"].max()
    return judged(r < TILING_GAIN, f"tiled TILE 8 {fmt.flop_rate(t8['gflops'].max())} / naive "
                  f"{fmt.flop_rate(naive['gflops'].max())} = {fmt.ratio(r)} at "
                  f"{big['size'].iloc[0]}")


def _small_block_tile_at_course(d: pd.DataFrame) -> pd.Series:
    return ((d["variant"] == "warptile") & (col(d, "p_bm") * col(d, "p_bn") < BIG_BLOCK_TILE)
            & _at_course(d))


HAND_WRITTEN = ("naive", "tiled", "tiled_padded", "tiled_conflict", "register", *LADDER_KERNELS)
EXPLANATIONS = (matmul_best_fp32, matmul_best_fp64, matmul_bank_conflicts, smem_reuse.fact)
CLAIMS = (
    Claim("every GPU result matches the float64 CPU reference", _correct, one_wrong,
          "correct"),
    Claim(f"shared-memory tiling (best tile) is at least {fmt.ratio(TILING_GAIN)} faster than "
          "the naive kernel at the course's product and at the largest size", _tiling,
          lambda d: slower(d, lambda x: _is("naive")(x) & _at_course(x), 1 / 1.25),
          "tiling_pays"),
    Claim(f"register tiling is at least {fmt.ratio(REGISTER_GAIN)} faster than the best "
          "shared-memory tiling at the largest size", _register,
          lambda d: slower(d, _is("register"), 3.0), "register_pays"),
    Claim("shared-memory loads set the speed of tiled and register kernels: at the largest "
          "size, ranked by FMAs per shared-memory word a thread loads (from each kernel's "
          "configuration: 1/2 for tiled, rt/2 for register), each is at least "
          f"{fmt.percent(100 * (smem_reuse.STEP_GAIN - 1))} faster than the one before; where "
          "something else limited them, more FMAs per load would buy nothing",
          smem_reuse.claim, turn(smem_reuse.claim, smem_reuse.other_limit,
                                 smem_reuse.loads_limit), "fma_per_load_sets_speed"),
    Claim(f"padded shared tiles are more than {fmt.ratio(PADDING_GAIN)} faster than the "
          "bank-conflicting layout at every tile (each one conflicts) at the largest size",
          _padding, lambda d: slower(d, lambda x: _is("tiled_conflict")(x)
                                     & (col(x, "p_tile") == 8), 1 / 1.25), "padding_pays"),
    Claim(f"cuBLAS SGEMM is the ceiling: the fastest float32 variant at every square size "
          f"from n = {fmt.integer(CUBLAS_FROM_N)} on (smaller products can be bound by "
          "their launch path, which costs cuBLAS through CuPy more)",
          _cublas_ceiling, lambda d: slower(d, _is("cublas"), 2.0), "cublas_ceiling"),
    Claim(f"the best hand-written kernel reaches at least {fmt.percent(100 * LADDER_GAIN)} of "
          "cuBLAS SGEMM at the largest square size (judged where a kernel past register "
          "tiling ran)", _ladder, lambda d: slower(d, _is(*HAND_WRITTEN), 1.2),
          "ladder_near_cublas"),
    Claim(f"the best GPU kernel is at least {fmt.ratio(GPU_VS_CPU)} faster than the CPU "
          "reference on the largest size both ran; the CPU reference is numpy's BLAS "
          "(vectorised and multithreaded), not the course's triple loop on one core",
          _gpu_vs_cpu, lambda d: slower(d, lambda x: x["variant"] == "cpu", 1 / 100),
          "gpu_vs_cpu"),
    Claim(f"at the course's product, copies (H2D + D2H) take more than "
          f"{fmt.percent(100 * COPY_SHARE)} of the tiled kernel's GPU time (H2D + kernel + "
          "D2H, as nvprof counts it; cudaMalloc is host time and not in it)", _copies,
          _fewer_copies, "copies_dominate"),
    Claim(f"the naive kernel runs at least {fmt.ratio(NAIVE_CACHE_GAIN)} faster than DRAM "
          f"alone could feed it at {fmt.number(NAIVE_BYTES_PER_FLOP)} bytes per flop: the L1 "
          "and L2 caches serve most of its re-reads", _naive_fed,
          lambda d: slower(d, _is("naive"), 5.0), "naive_cache_fed"),
    Claim(f"the naive kernel's loads limit it: at {fmt.number(NAIVE_BYTES_PER_FLOP)} bytes "
          "per flop (two 4-byte loads per FMA) its largest size asks the L1 for at least "
          f"{fmt.percent(100 * NAIVE_L1_SHARE)} of the measured shared-memory ceiling (one "
          "on-chip memory, one load path); a kernel held by latency or the launch asks far "
          "less", _naive_load_bound, lambda d: slower(d, _is("naive"), 4.0),
          "naive_load_bound"),
    Claim("where the GPU has FP64 tensor cores (sm_80, sm_90), cuBLAS DGEMM at the largest "
          "size runs above the FP64 peak of the CUDA cores: it runs on the tensor cores",
          _dgemm_tensor_cores, lambda d: slower(d, _is("cublas", dtype="float64"), 2.5),
          "dgemm_tensor_cores"),
    Claim("the hand-written kernels (naive, tiled) run slower in float64 than in float32 at "
          "the largest float64 size: twice the bytes per element, and FP64 units no faster "
          "than FP32", _fp64_slower,
          lambda d: slower(d, _is("naive", "tiled", dtype="float64"), 0.5), "fp64_slower"),
)
TRY_THIS = [
    TryThis("matmul.warp_tiles: [{bm: 128, bn: 128, bk: 16, wm: 64, wn: 64, wniter: 4, tm: 8, "
            "tn: 4, threads: 128}, {bm: 64, bn: 64, bk: 16, wm: 32, wn: 32, wniter: 1, tm: 4, "
            "tn: 8, threads: 128}]",
            "a large and a small block tile: the small one has four times the blocks, "
            "better at the course's product, where 128x128 tiles leave most SMs idle, but it "
            "re-reads A and B twice as often from L2, so it falls behind at the largest size; "
            "judged on the block tiles the run has (128x128 against smaller ones)",
            Claim("a warp-tiled kernel with a block tile smaller than 128x128 is faster than "
                  "the best 128x128 one at the course's product and slower at the largest "
                  "size", _block_tiles,
                  lambda d: slower(d, _small_block_tile_at_course, 2.0), "block_tile_tradeoff")),
    TryThis("measurement.cold_l2: true", "each timed launch starts with A and B out of the "
            "L2; re-reads within a launch still hit it, so expect a small loss, largest for "
            "the small products whose launches are short"),
    TryThis("matmul.tiles: [8]", "only TILE 8: a quarter of the reuse per load of TILE 32 and "
            "only 64 threads per block; tiled falls to about the naive kernel's speed and the "
            "tiling claim may fail",
            Claim(f"at the largest size, tiled with TILE 8 is under {fmt.ratio(TILING_GAIN)} "
                  "the naive kernel's speed (too little reuse per load)", _tile8,
                  lambda d: slower(d, lambda x: _is("tiled")(x) & (col(x, "p_tile") == 8)
                                   & _at_largest(x), 0.5), "tile8_near_naive")),
]

LESSON = Lesson(
    title=("Matrix multiplication: global memory, shared-memory tiles, registers, the "
             "ladder to cuBLAS, double precision"),
    caption=(
        "Each thread of the naive kernel issues 2K global loads (a row of A and a column of "
        "B) for 2K flops; neighbouring threads share rows of A and columns of B, so most of "
        "those loads are served by the L1 and L2 caches, not by DRAM (with profile.ncu on, "
        "the L2 hit rate says how many: it falls once the matrices outgrow the L2), and "
        "what limits the kernel is the load traffic through the caches, not its arithmetic. "
        "The tiled kernel loads TILE x TILE tiles of A and B into shared memory once per "
        "block and reuses every value TILE times, cutting global loads by the tile width. "
        "Bank conflicts: tiled_conflict and tiled_padded store the B tile transposed, so in "
        "the inner loop the 32 threads of a warp read down a column of it. With rows of "
        "TILE = 32 floats (tiled_conflict) that column lies in a single one of the 32 "
        "shared-memory banks and the warp's load is replayed once per thread (a 32-way "
        "conflict; 8-way for TILE 16, 2-way for TILE 8; nvcc's 128-bit loads do not avoid "
        "it). One float of padding per row (tiled_padded, TILE + 1) shifts each row by one "
        "bank, the column spreads over all 32 banks and the same code runs conflict-free. "
        "Register tiling (unroll-and-jam) lets each thread compute an rt x rt block of C "
        "from a bt x bt block tile: per k it loads rt values of A and rt of B from shared "
        "memory for rt x rt FMAs, rt/2 FMAs per shared-memory load where the tiled kernel "
        "does one FMA per two loads. "
        "The ladder goes on toward cuBLAS: vec4 moves tiles with 128-bit loads, dbuf "
        "overlaps the next tile's loads with the current tile's math, warptile gives each "
        "warp its own sub-tile (the ladder table explains each step). "
        "cuBLAS SGEMM (through CuPy, plain FP32: no TF32, whose 10-bit mantissa would fail "
        "the correctness check) is the float32 ceiling. In double precision (naive, tiled, "
        "cuBLAS DGEMM) the kernels run on the GPU's FP64 CUDA cores, at half the FP32 rate "
        "on GH100 and GA100 and 1/64 of it on consumer chips, while cuBLAS DGEMM uses the "
        "FP64 tensor cores where the GPU has them (sm_80, sm_90); each float64 point is "
        "judged against the FP64 peak of the units it runs on, each float32 point against "
        "the FP32 ceiling. "
        "Look for: tiling paying over the naive kernel (at the course's product and at the "
        "largest size), register tiling paying over shared-memory tiles, padding paying "
        "over the conflicting layout at every tile, the best hand-written kernel close to "
        "cuBLAS, cuBLAS on top once the products are large, the GPU far above the CPU "
        "(numpy's multithreaded BLAS, not the course's single-core loop), and, in the time "
        "split, copies taking most of the GPU time of small products. The claims below "
        "state each with its threshold and judge it on this run."
    ),
    figures={
        "ladder": "The ladder from the naive kernel to cuBLAS SGEMM, float32: TFLOP/s of "
        "each step's best configuration at the largest square size (top) and at the "
        "course's 160x240.240x320 (bottom); each bar is labelled with its % of cuBLAS "
        "(same run) and % of the GPU's FP32 peak. The ladder table of this section gives "
        "each step's registers, shared memory and occupancy.",
        "gflops": "GFLOP/s of the square products against n (both axes log scale), one "
        "panel per lesson: global memory vs shared-memory tiles, bank conflicts (padded vs "
        "conflicting layout, same colour per tile, dotted = conflicting), register tiling; "
        "the fourth panel is the course's rectangular product 160x240.240x320 on its own "
        "(best configuration of each variant). Each legend entry gives that configuration's "
        "percentage of cuBLAS at the largest size. The unlabelled tick just left of 1024 is "
        "n = 1000, a size no tile divides. cuBLAS (dashed) is the ceiling only for large "
        "products (the claim on cuBLAS states from which n): in the grey band a product "
        "takes microseconds, every variant is bound by its launch path rather than its "
        "arithmetic, and cuBLAS is called through CuPy, whose per-call host work is larger "
        "than a prepared pycuda launch; it also picks kernels tuned for large matrices. "
        "There it can fall below the course kernels.",
        "time_split": "End-to-end time of the tiled kernel split into allocation "
        "(cudaMalloc, host time), host-to-device copy, kernel and device-to-host copy; the "
        "claim on copies counts the GPU time alone (copies and kernel), as nvprof does.",
    },
    print_figure=("ladder", 0),  # on paper: the ladder at the largest size
    print_pages=1.55,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    course_facts=COURSE_FACTS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "What does double buffering overlap, and why does it need twice the shared memory?",
            answers.double_buffering),
        Question(
            "How many global-memory loads does the naive kernel make per output element, and "
            "how many does a TILE x TILE tiled kernel make?",
            answers.loads_per_element),
        Question(
            "Why does padding the shared tile by one float remove the bank conflict?",
            answers.padding),
    ],
    sources={
        "10": "TF32's explicit mantissa bits (NVIDIA A100 Tensor Core GPU Architecture "
              "whitepaper)",
        "1000": "a size of the default grid that no tile divides (matmul.sizes)",
        "256": "16 x 16, the course's factor for 16 x 16 tiles (the course table names the "
               "error)",
    },
)
