"""The matmul lesson: sentences computed from this run's data (explanations) and the
caption's claims checked on it. Every number in a sentence comes from the table; the only
constants are the named thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import Claim, Verdict, col, largest, ncu, ok, ref

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings

# The naive matmul kernel loads one float of A and one of B (8 bytes) per FMA (2 flops):
# what it asks of memory when no cache helps.
NAIVE_BYTES_PER_FLOP = 4.0
# "cuBLAS on top from n of about 1000".
CUBLAS_FROM_N = 1000


def _size(d: pd.DataFrame) -> str:
    m, k, n = (col(d, f"p_{x}").iloc[0] for x in "mkn")
    return f"{int(m)}x{int(k)}.{int(k)}x{int(n)}" if len({m, k, n}) > 1 else f"{int(n)}³"

def matmul_naive_caches(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Naive's GFLOP/s against what DRAM alone could feed at 4 bytes per flop."""
    naive = largest(ok(d[d["variant"] == "naive"]))
    dram, what = ref(c)
    if naive.empty or not math.isfinite(dram):
        return None
    row = naive.loc[naive["gflops"].idxmax()]
    fed = dram / NAIVE_BYTES_PER_FLOP
    s = (f"The naive kernel asks for {NAIVE_BYTES_PER_FLOP:g} bytes per flop (a float of A and "
         f"one of B per FMA); the {what} could feed it {fmt.flop_rate(fed)}. At "
         f"{_size(naive)} it reached {fmt.flop_rate(row['gflops'])}")
    if row["gflops"] > fed:
        s += (f", {row['gflops'] / fed:.1f}x more: most of its loads were served by the L1 "
              "and L2 caches, not DRAM")
    else:
        s += ": no more than DRAM alone can feed, so its re-reads did come from DRAM"
    hit = ncu(naive.loc[[row.name]], "m_ncu_l2_hit_rate_pct").iloc[0]
    if math.isfinite(hit):
        s += f" (Nsight Compute: L2 hit rate {fmt.percent(hit)})"
    return s + "."

def matmul_bank_conflicts(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Bank conflicts counted by the profiler, conflicting tile against the padded one."""
    d = ok(d)
    conf = ncu(d, "m_ncu_smem_bank_conflicts")
    d = d.assign(conflicts=conf)[conf.notna()]
    pairs = d[d["variant"].isin(["tiled_conflict", "tiled_padded"])]
    if pairs.empty or "p_tile" not in pairs:
        return None
    big = largest(pairs)
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

def matmul_best_vs_roof(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The fastest GPU variant at the largest size against the FP32 ceiling."""
    big = largest(ok(d[d["variant"] != "cpu"]))
    roof, kind = c.flops()
    if big.empty or not math.isfinite(roof):
        return None
    best = big.loc[big["gflops"].idxmax()]
    return (f"At {_size(big)} the fastest variant, {best['variant']}, reaches "
            f"{fmt.flop_rate(best['gflops'])}: {fmt.percent(100 * best['gflops'] / roof)} of "
            f"the {kind} FP32 ceiling {fmt.flop_rate(roof)}; at "
            f"{fmt.short(best['intensity'])} FLOP/byte it sits right of the ridge point, "
            "where only arithmetic can limit it.")

def _matmul_cublas_on_top(d: pd.DataFrame, c: Ceilings) -> Verdict:
    gpu = ok(d[d["variant"] != "cpu"]).dropna(subset=["gflops"])
    sq = gpu[(col(gpu, "p_m") == col(gpu, "p_n")) & (col(gpu, "p_k") == col(gpu, "p_n"))
             & (col(gpu, "p_n") >= CUBLAS_FROM_N)]
    if "cublas" not in set(sq["variant"]):
        return None, f"cuBLAS not run at a square size of n >= {CUBLAS_FROM_N}"
    top = sq.loc[sq.groupby("p_n")["gflops"].idxmax()]
    lost = top[top["variant"] != "cublas"]
    sizes = ", ".join(str(int(n)) for n in top["p_n"])
    return (lost.empty,
            f"fastest at n = {sizes}: " + ", ".join(
                f"{r['variant']} ({int(r['p_n'])})" for _, r in top.iterrows()))


EXPLANATIONS = (matmul_naive_caches, matmul_bank_conflicts, matmul_best_vs_roof)
CLAIMS = (
    Claim("cuBLAS on top from n of about 1000", _matmul_cublas_on_top),
)
