"""Explanations computed from this run's data, shown under each experiment's caption, and a
check of the captions' claims against the same data.

One small function per lesson: it gets the experiment's annotated rows (roofline.annotate)
and the run's ceilings, and returns a sentence, or None where this run has nothing to say
about it (the variant was not run, the profiler was off). Profiler counters (m_ncu_*) are
used where present and ok; every number in a sentence comes from the table, the only
constants are the named thresholds below.

CAPTION_CLAIMS: phrases of the experiments' captions with a predicate over the data; a
claim this run contradicts is shown as a warning under the caption. Each phrase must occur
in its caption (a test keeps the registry and the captions in step).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cudalab import fmt, roofline
from cudalab.experiments.base import NOT_MEASURED, not_measured_evidence
from cudalab.roofline import Ceilings

# The naive matmul kernel loads one float of A and one of B (8 bytes) per FMA (2 flops):
# what it asks of memory when no cache helps.
NAIVE_BYTES_PER_FLOP = 4.0
# Within this share of its best bandwidth a kernel counts as "at full bandwidth".
FULL_BANDWIDTH_SHARE = 0.9
# Theoretical occupancy that counts as "full" (the calculator's fraction).
FULL_OCCUPANCY = 0.99
# A "large fraction of peak bandwidth" / "close to the memory bandwidth".
LARGE_FRACTION = 0.6
# The offset curve counts as "almost flat" while no offset loses more than this share.
FLAT_LOSS = 0.2
# "cuBLAS on top from n of about 1000".
CUBLAS_FROM_N = 1000
# Achieved occupancy (ncu) this far below the theoretical one is worth a sentence.
OCCUPANCY_GAP = 0.8

Lesson = Callable[[pd.DataFrame, Ceilings], str | None]


# -- helpers ---------------------------------------------------------------------------------
def _ok(d: pd.DataFrame) -> pd.DataFrame:
    return d[d["status"].astype(str) == "ok"]


def _col(d: pd.DataFrame, c: str) -> pd.Series:
    if c not in d.columns:
        return pd.Series(np.nan, index=d.index, dtype=float)
    return pd.to_numeric(d[c], errors="coerce").astype(float)


def ncu(d: pd.DataFrame, prefix: str) -> pd.Series:
    """The sum of the profiler columns starting with `prefix` per row, NaN where the point
    was not profiled (m_ncu_status other than 'ok') or the columns are absent."""
    cols = [c for c in d.columns if c.startswith(prefix)]
    if not cols:
        return pd.Series(np.nan, index=d.index, dtype=float)
    vals = pd.concat([_col(d, c) for c in cols], axis=1)
    out = vals.sum(axis=1, min_count=1)
    if "m_ncu_status" in d.columns:
        out = out.where(d["m_ncu_status"].astype(str) == "ok")
    return out


def pct_range(lo: float, hi: float) -> str:
    """'68–70 %': one unit for both ends."""
    return f"{fmt.percent(lo)[:-2]}–{fmt.percent(hi)}"


def _largest(d: pd.DataFrame, col: str = "flops") -> pd.DataFrame:
    v = _col(d, col)
    return d[v == v.max()] if v.notna().any() else d.iloc[:0]


def _ref(c: Ceilings, level: str = "dram") -> tuple[float, str]:
    value, kind = c.bandwidth(level)
    return value, f"{kind} {level.upper()} ceiling {fmt.bandwidth(value)}"


def _size(d: pd.DataFrame) -> str:
    m, k, n = (_col(d, f"p_{x}").iloc[0] for x in "mkn")
    return f"{int(m)}x{int(k)}.{int(k)}x{int(n)}" if len({m, k, n}) > 1 else f"{int(n)}³"


# -- matmul ----------------------------------------------------------------------------------
def matmul_naive_caches(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Naive's GFLOP/s against what DRAM alone could feed at 4 bytes per flop."""
    naive = _largest(_ok(d[d["variant"] == "naive"]))
    dram, what = _ref(c)
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
    d = _ok(d)
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


def matmul_best_vs_roof(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The fastest GPU variant at the largest size against the FP32 ceiling."""
    big = _largest(_ok(d[d["variant"] != "cpu"]))
    roof, kind = c.flops()
    if big.empty or not math.isfinite(roof):
        return None
    best = big.loc[big["gflops"].idxmax()]
    return (f"At {_size(big)} the fastest variant, {best['variant']}, reaches "
            f"{fmt.flop_rate(best['gflops'])}: {fmt.percent(100 * best['gflops'] / roof)} of "
            f"the {kind} FP32 ceiling {fmt.flop_rate(roof)}; at "
            f"{fmt.short(best['intensity'])} FLOP/byte it sits right of the ridge point, "
            "where only arithmetic can limit it.")


# -- occupancy -------------------------------------------------------------------------------
def occupancy_achieved(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Achieved (ncu) against theoretical occupancy per block size, per kernel."""
    d = _ok(d).assign(achieved=ncu(d, "m_ncu_achieved_occupancy_pct"),
                      theory=100 * _col(d, "m_occupancy_theory"))
    d = d[d["achieved"].notna() & d["theory"].notna() & (d["theory"] > 0)]
    if d.empty:
        return None
    parts = []
    for v, g in d.groupby("variant", sort=True):
        ratio = g["achieved"] / g["theory"]
        worst = g.loc[ratio.idxmin()]
        parts.append(f"{v}: achieved {pct_range(100 * ratio.min(), 100 * ratio.max())} of "
                     f"theoretical over {len(g)} block "
                     f"sizes, least at {int(worst['p_block_size'])} threads "
                     f"({fmt.percent(worst['achieved'])} of {fmt.percent(worst['theory'])})")
    low = d[d["achieved"] < OCCUPANCY_GAP * d["theory"]]
    tail = (f"; {len(low)} points stay below {OCCUPANCY_GAP:.0%} of their theoretical "
            "occupancy (tail effects: too few blocks for the last wave, or warps that "
            "finish early)" if len(low) else "")
    return "Nsight Compute's achieved occupancy against the calculator's: " + "; ".join(
        parts) + tail + "."


def occupancy_knee(d: pd.DataFrame, c: Ceilings) -> str | None:
    """From which theoretical occupancy the memory-bound vec_mul is at full bandwidth."""
    v = _ok(d[d["variant"] == "vec_mul"]).dropna(subset=["gbps"])
    v = v.assign(occ=_col(v, "m_occupancy_theory")).dropna(subset=["occ"])
    if len(v) < 2:
        return None
    best = v["gbps"].max()
    full = v[v["gbps"] >= FULL_BANDWIDTH_SHARE * best]
    dram, what = _ref(c)
    s = (f"vec_mul is within {1 - FULL_BANDWIDTH_SHARE:.0%} of its best "
         f"{fmt.bandwidth(best)} from {fmt.percent(100 * full['occ'].min())} theoretical "
         f"occupancy up")
    if math.isfinite(dram):
        s += f" (its best is {fmt.percent(100 * best / dram)} of the {what})"
    below = v[v["occ"] < full["occ"].min()]
    if len(below):
        s += (f"; below that it drops to {fmt.bandwidth(below['gbps'].min())}: too few "
              "resident warps to hide memory latency")
    slow = v[(v["occ"] >= full["occ"].min()) & (v["gbps"] < FULL_BANDWIDTH_SHARE * best)]
    if len(slow):
        sizes = ", ".join(str(int(b)) for b in sorted(slow["p_block_size"]))
        s += (f"; yet {len(slow)} block sizes with at least that occupancy stay below it "
              f"({sizes} threads: {fmt.sig(slow['gbps'].min())}–"
              f"{fmt.bandwidth(slow['gbps'].max())}): occupancy is not what limits them")
    return s + "."


# -- coalescing ------------------------------------------------------------------------------
def coalescing_vs_ceiling(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Each access pattern's bandwidth as a share of the copy ceiling."""
    d = _ok(d).dropna(subset=["gbps"])
    dram, what = _ref(c)
    if d.empty or not math.isfinite(dram):
        return None
    parts = []
    for v, g in d.groupby("variant", sort=True):
        g = g[g["memory_level"] != "l2"] if (g["memory_level"] != "l2").any() else g
        lo, hi = 100 * g["gbps"].min() / dram, 100 * g["gbps"].max() / dram
        parts.append(f"{v} {fmt.percent(hi)}" if len(g) == 1 or round(lo) == round(hi)
                     else f"{v} {pct_range(lo, hi)}")
    return (f"Against the {what} (DRAM-resident points): " + ", ".join(parts) + ".")


def coalescing_transpose_l2(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Transposes above the DRAM ceiling: L2-resident, said with their working set."""
    tr = _ok(d[d["variant"].astype(str).str.startswith("transpose")])
    dram, what = _ref(c)
    if tr.empty or not math.isfinite(dram):
        return None
    above = tr[tr["gbps"] > dram]
    if above.empty:
        return None
    parts = [f"{r['variant']} at {int(r['p_size'])}² ({fmt.bandwidth(r['gbps'])}, working "
             f"set {fmt.nbytes(r['working_set_bytes'])}"
             + (", L2-resident" if r["memory_level"] == "l2" else "") + ")"
             for _, r in above.iterrows()]
    l2 = f"the {fmt.nbytes(c.l2_bytes)} L2" if math.isfinite(c.l2_bytes) else "L2"
    return (f"Above the {what}: " + "; ".join(parts) + f". Such a matrix fits {l2} and the "
            "run did not flush it, so this is L2 bandwidth, not DRAM: compare it with the L2 "
            "ceiling, not with the DRAM peak.")


# -- vector_add, sobel, fast_math ------------------------------------------------------------
def vector_add_share(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The largest vector's best block size against the DRAM ceiling; L2-resident sizes."""
    d = _ok(d).dropna(subset=["gbps"])
    dram, what = _ref(c)
    big = _largest(d, "p_n")
    if big.empty or not math.isfinite(dram):
        return None
    best = big.loc[big["gbps"].idxmax()]
    s = (f"At n = {fmt.integer(best['p_n'])} ({fmt.nbytes(best['working_set_bytes'])} moved, "
         f"{best['memory_level'] or 'level unknown'}) the best block size, "
         f"{int(best['p_threads'])} threads, reaches {fmt.bandwidth(best['gbps'])} = "
         f"{fmt.percent(100 * best['gbps'] / dram)} of the {what}")
    l2 = sorted({int(n) for n in d.loc[d["memory_level"] == "l2", "p_n"]})
    if l2:
        s += (f"; n = {', '.join(fmt.integer(n) for n in l2)} fit L2 on this hot run: their "
              "GB/s say nothing about DRAM")
    return s + "."


def sobel_caches(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Whether the global kernel keeps up with shared tiles: the caches do the tiling."""
    d = _ok(d).dropna(subset=["gbps"])
    big = _largest(d, "p_width")
    best = big.groupby("variant")["gbps"].max() if len(big) else pd.Series(dtype=float)
    if not {"global", "shared"} <= set(best.index):
        return None
    g, s = best["global"], best["shared"]
    out = (f"At {int(big['p_width'].iloc[0])}² the global kernel reaches "
           f"{fmt.bandwidth(g)}, the shared-tile kernel {fmt.bandwidth(s)} (best block "
           "shape each)")
    out += (": the nine re-reads per pixel of the global kernel are served by L1/L2 as well "
            "as the hand-made tile serves them" if g >= s else
            ": the explicit tile pays off over the caches")
    hit = ncu(big[big["variant"] == "global"], "m_ncu_l2_hit_rate_pct").max()
    if math.isfinite(hit):
        out += f" (Nsight Compute: L2 hit rate up to {fmt.percent(hit)})"
    return out + "."


def fast_math_ridge(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Where the iteration counts sit against the ridge point (memory- or compute-bound)."""
    d = _ok(d).dropna(subset=["intensity"])
    dram, _ = c.bandwidth("dram")
    roof, kind = c.flops()
    if d.empty or not (math.isfinite(dram) and math.isfinite(roof)):
        return None
    ridge = roof / dram
    by = d.groupby("p_iterations")["intensity"].max().sort_index()
    left = [int(i) for i, x in by.items() if x < ridge]
    right = [int(i) for i, x in by.items() if x >= ridge]
    s = f"The {kind} ridge point is at {fmt.short(ridge)} FLOP/byte (FP32 roof / DRAM)"
    if left:
        s += (f"; {', '.join(map(str, left))} iteration(s) sit left of it (memory-bound: "
              "cheaper math cannot help)")
    if right:
        s += (f"; {', '.join(map(str, right))} iterations right of it (compute-bound: "
              "where the fast variants can win)")
    return s + "."


LESSONS: dict[str, tuple[Lesson, ...]] = {
    "matmul": (matmul_naive_caches, matmul_bank_conflicts, matmul_best_vs_roof),
    "occupancy": (occupancy_achieved, occupancy_knee),
    "coalescing": (coalescing_vs_ceiling, coalescing_transpose_l2),
    "vector_add": (vector_add_share,),
    "sobel": (sobel_caches,),
    "fast_math": (fast_math_ridge,),
}


def explain(name: str, df: pd.DataFrame) -> list[str]:
    """The sentences of one experiment's lessons on this run's data. df: the whole table
    (its ceilings and L2 size), or the experiment's rows."""
    full = roofline.annotate(df)
    c = roofline.ceilings_of(full)
    sub = full[full["experiment"] == name]
    if sub.empty:
        return []
    return [s for f in LESSONS.get(name, ()) if (s := f(sub, c))]


# -- caption claims --------------------------------------------------------------------------
Verdict = tuple[bool | None, str]  # (supported; None: not enough data), evidence


@dataclass(frozen=True)
class Claim:
    experiment: str
    phrase: str  # words of the caption, verbatim
    check: Callable[[pd.DataFrame, Ceilings], Verdict]


@dataclass(frozen=True)
class ClaimResult:
    phrase: str
    supported: bool | None
    evidence: str


def _vector_add_large(d: pd.DataFrame, c: Ceilings) -> Verdict:
    d = _ok(d).dropna(subset=["gbps"])
    dram, what = _ref(c)
    big = _largest(d, "p_n")
    if big.empty or not math.isfinite(dram) or big["p_n"].iloc[0] < 1e6:
        return None, "no vector of millions of elements in this run"
    g = big["gbps"].max()
    return (g >= LARGE_FRACTION * dram,
            f"{fmt.bandwidth(g)} at n = {fmt.integer(big['p_n'].iloc[0])}: "
            f"{fmt.percent(100 * g / dram)} of the {what} (threshold "
            f"{LARGE_FRACTION:.0%})")


def _vector_add_small_blocks(d: pd.DataFrame, c: Ceilings) -> Verdict:
    big = _largest(_ok(d).dropna(subset=["gbps"]), "p_n")
    if big.empty or big["p_threads"].nunique() < 2:
        return None, "one block size only"
    small = big[big["p_threads"] == big["p_threads"].min()]["gbps"].max()
    best = big["gbps"].max()
    return (small < FULL_BANDWIDTH_SHARE * best,
            f"{int(big['p_threads'].min())} threads: {fmt.bandwidth(small)} vs best "
            f"{fmt.bandwidth(best)} at n = {fmt.integer(big['p_n'].iloc[0])}")


def _occupancy_full_but_slow(d: pd.DataFrame, c: Ceilings) -> Verdict:
    """The smallest vec_mul block at full theoretical occupancy is below full bandwidth."""
    v = _ok(d[d["variant"] == "vec_mul"]).dropna(subset=["gbps"])
    v = v.assign(occ=_col(v, "m_occupancy_theory"), threads=_col(v, "p_block_size"))
    full = v[v["occ"] >= FULL_OCCUPANCY].dropna(subset=["threads"])
    if full.empty:
        return None, "no vec_mul point at full theoretical occupancy"
    small = full.loc[full["threads"].idxmin()]
    best = v["gbps"].max()
    return (small["gbps"] < FULL_BANDWIDTH_SHARE * best,
            f"vec_mul with {int(small['threads'])}-thread blocks: theoretical occupancy "
            f"{fmt.percent(100 * small['occ'])}, {fmt.bandwidth(small['gbps'])} = "
            f"{fmt.percent(100 * small['gbps'] / best)} of its best {fmt.bandwidth(best)} "
            f"(slower: below {FULL_BANDWIDTH_SHARE:.0%})")


def _matmul_cublas_on_top(d: pd.DataFrame, c: Ceilings) -> Verdict:
    gpu = _ok(d[d["variant"] != "cpu"]).dropna(subset=["gflops"])
    sq = gpu[(_col(gpu, "p_m") == _col(gpu, "p_n")) & (_col(gpu, "p_k") == _col(gpu, "p_n"))
             & (_col(gpu, "p_n") >= CUBLAS_FROM_N)]
    if "cublas" not in set(sq["variant"]):
        return None, f"cuBLAS not run at a square size of n >= {CUBLAS_FROM_N}"
    top = sq.loc[sq.groupby("p_n")["gflops"].idxmax()]
    lost = top[top["variant"] != "cublas"]
    sizes = ", ".join(str(int(n)) for n in top["p_n"])
    return (lost.empty,
            f"fastest at n = {sizes}: " + ", ".join(
                f"{r['variant']} ({int(r['p_n'])})" for _, r in top.iterrows()))


def _coalescing_offset_flat(d: pd.DataFrame, c: Ceilings) -> Verdict:
    off = _ok(d[d["variant"] == "offset"]).dropna(subset=["gbps"])
    if len(off) < 2:
        return None, "fewer than two offsets"
    lo, hi = off["gbps"].min(), off["gbps"].max()
    return (lo >= (1 - FLAT_LOSS) * hi,
            f"offsets {fmt.sig(lo)}–{fmt.bandwidth(hi)} (the worst loses "
            f"{fmt.percent(100 * (1 - lo / hi))}; threshold {FLAT_LOSS:.0%})")


def _sobel_far_from_bandwidth(d: pd.DataFrame, c: Ceilings) -> Verdict:
    d = _ok(d).dropna(subset=["gbps"])
    dram, what = _ref(c)
    big = _largest(d, "p_width")
    if big.empty or not math.isfinite(dram):
        return None, "no image or no DRAM ceiling"
    g = big["gbps"].max()
    return (g < LARGE_FRACTION * dram,
            f"best {fmt.bandwidth(g)} at {int(big['p_width'].iloc[0])}²: "
            f"{fmt.percent(100 * g / dram)} of the {what} (far: below {LARGE_FRACTION:.0%})")


def _fast_math_one_iteration(d: pd.DataFrame, c: Ceilings) -> Verdict:
    one = _ok(d[_col(d, "p_iterations") == 1]).dropna(subset=["time_median_s"])
    one = _largest(one, "p_n")
    t = one.groupby("variant")["time_median_s"].min()
    if "precise" not in t or len(t) < 2:
        return None, "no 1-iteration points of precise and a fast variant"
    gain = t["precise"] / t.drop("precise").min()
    ok = _ok(d).dropna(subset=["time_median_s"])
    most = _largest(ok[_col(ok, "p_iterations") == _col(ok, "p_iterations").max()], "p_n")
    tm = most.groupby("variant")["time_median_s"].min()
    if "precise" not in tm or len(tm) < 2 or most["p_iterations"].max() <= 1:
        return None, "no points at more than 1 iteration to compare with"
    gain_most = tm["precise"] / tm.drop("precise").min()
    return (gain < gain_most,
            f"the fastest variant gains {gain:.2f}x over precise at 1 iteration and "
            f"{gain_most:.2f}x at {int(most['p_iterations'].max())} iterations")


CAPTION_CLAIMS: tuple[Claim, ...] = (
    Claim("vector_add", "millions of elements reaching a large fraction of peak bandwidth",
          _vector_add_large),
    Claim("vector_add", "blocks of 32 threads lagging behind", _vector_add_small_blocks),
    Claim("occupancy", "the smallest blocks reach full occupancy on paper yet run slower",
          _occupancy_full_but_slow),
    Claim("matmul", "cuBLAS on top from n of about 1000", _matmul_cublas_on_top),
    Claim("coalescing", "the offset curve almost flat", _coalescing_offset_flat),
    Claim("sobel", "far from the DRAM bandwidth even at large images",
          _sobel_far_from_bandwidth),
    Claim("fast_math", "a smaller gain at 1 iteration", _fast_math_one_iteration),
)


def check_caption(name: str, caption: str, df: pd.DataFrame) -> list[ClaimResult]:
    """Every registered claim of this experiment that its caption still makes, checked on
    this run's data."""
    full = roofline.annotate(df)
    c = roofline.ceilings_of(full)
    sub = full[full["experiment"] == name]
    out = []
    # points a GPU-less run left out: a claim none of them can judge is "not measured",
    # never "not supported", and a claim without enough data says which were left out
    nm = sub[sub["status"].astype(str) == NOT_MEASURED] if not sub.empty else sub
    unmeasured = not_measured_evidence(nm) if len(nm) else ""
    for claim in CAPTION_CLAIMS:
        if claim.experiment == name and claim.phrase in caption and not sub.empty:
            if len(nm) == len(sub):
                out.append(ClaimResult(claim.phrase, None, unmeasured))
                continue
            ok, evidence = claim.check(sub, c)
            if ok is None and unmeasured:
                evidence = f"{unmeasured}; {evidence}"
            out.append(ClaimResult(claim.phrase, None if ok is None else bool(ok), evidence))
    return out
