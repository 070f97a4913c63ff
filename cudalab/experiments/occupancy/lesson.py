"""The occupancy lesson: its claims (each a predicate over this run's table with its
threshold and the data change that turns it over) and its facts (sentences computed from the
table). Every number in a sentence comes from the table; the only constants are the named
thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.base import NOT_MEASURED
from cudalab.experiments.lesson import (
    FULL_BANDWIDTH_SHARE,
    Claim,
    Judgement,
    Lesson,
    TryThis,
    col,
    judged,
    ncu,
    no_data,
    ok,
    one_wrong,
    pct_range,
    ref,
    slower,
    with_value,
)
from cudalab.experiments.occupancy import answers, block_cost
from cudalab.experiments.questions import Question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

VEC = ("vec_mul", "vec_mul_regs", "vec_mul_smem")
# The memory-bound vector kernels (one product per element, flops = n); vec_mul_regs keeps
# many values live and is held by something else than its resident warps.
MEMORY_BOUND = ("vec_mul", "vec_mul_smem")
# Theoretical occupancy that counts as "full" (the calculator's fraction).
FULL_OCCUPANCY = 0.99
# Achieved occupancy (ncu) this far below the theoretical one is worth a sentence.
OCCUPANCY_GAP = 0.8
# "Low occupancy": below this theoretical occupancy a memory-bound kernel keeps under
# FULL_BANDWIDTH_SHARE of its own best bandwidth (median of those points).
LOW_OCCUPANCY = 0.25
# One-warp blocks take at least this much longer than 256-thread blocks (the same threshold as
# vector_add's blocks of 32 threads).
SLOW_32 = 1.5
# "Far below" its theoretical occupancy: Nsight Compute's achieved occupancy under this share.
UNDERFILLED = 0.5
# The blocks that start and retire within microseconds: one and two warps.
SMALL_BLOCK = 64
# The calculator's best square tile may take this much longer than the fastest tile.
TILE_SLACK = 1.25


def _vec(d: pd.DataFrame, variant: str) -> pd.DataFrame:
    v = ok(d[d["variant"] == variant])
    return v.assign(occ=col(v, "m_occupancy_theory"), threads=col(v, "p_block_size"))


# -- facts -----------------------------------------------------------------------------------
def occupancy_achieved(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Achieved (ncu) against theoretical occupancy per block size, per kernel."""
    d = ok(d).assign(achieved=ncu(d, "m_ncu_achieved_occupancy_pct"),
                      theory=100 * col(d, "m_occupancy_theory"))
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
            "occupancy (possible causes: blocks that start and retire faster than the SM "
            "refills their slots, a last partial wave, warps that finish early)"
            if len(low) else "")
    return "Nsight Compute's achieved occupancy against the calculator's: " + "; ".join(
        parts) + tail + "."


def occupancy_knee(d: pd.DataFrame, c: Ceilings) -> str | None:
    """From which theoretical occupancy the memory-bound vec_mul is at full bandwidth."""
    v = _vec(d, "vec_mul").dropna(subset=["gbps", "occ"])
    if len(v) < 2:
        return None
    best = v["gbps"].max()
    full = v[v["gbps"] >= FULL_BANDWIDTH_SHARE * best]
    dram, what = ref(c)
    s = (f"vec_mul is within {1 - FULL_BANDWIDTH_SHARE:.0%} of its best "
         f"{fmt.bandwidth(best)} from {fmt.percent(100 * full['occ'].min())} theoretical "
         f"occupancy up")
    if math.isfinite(dram):
        s += f" (its best is {fmt.percent(100 * best / dram)} of the {what})"
    below = v[v["occ"] < full["occ"].min()]
    if len(below):
        s += (f"; below that it drops to {fmt.bandwidth(below['gbps'].min())} (too few "
              "resident warps to hide memory latency is one candidate, a fixed cost per "
              "block another: the vector_add lesson's block-rate probe measures the second)")
    slow = v[(v["occ"] >= full["occ"].min()) & (v["gbps"] < FULL_BANDWIDTH_SHARE * best)]
    if len(slow):
        sizes = ", ".join(str(int(b)) for b in sorted(slow["p_block_size"]))
        lo, hi = slow["gbps"].min(), slow["gbps"].max()
        s += (f"; yet {len(slow)} block sizes with at least that occupancy stay below it "
              f"({sizes} threads: "
              f"{fmt.bandwidth(lo) if lo == hi else fmt.span(lo, hi, fmt.bandwidth)}): "
              "theoretical occupancy is not what limits them")
    return s + "."


# -- claims ----------------------------------------------------------------------------------
def _correct(d: pd.DataFrame, c: Ceilings) -> Judgement:
    done = d[d["status"].astype(str) != NOT_MEASURED]
    bad = done[done["status"].astype(str) != "ok"]
    if done.empty:
        return no_data("no point measured")
    first = bad.iloc[0] if len(bad) else None
    return judged(bad.empty, f"{len(done) - len(bad)}/{len(done)} points ok"
                  + (f"; first problem: {first['point_id']}: {first['reason']}"
                     if first is not None else ""))


def _calc_agrees(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = ok(d)
    known = d[col(d, "m_calc_agrees").notna()]
    if known.empty:
        return no_data("no point had a compute capability in the calculator's table")
    mism = known[col(known, "m_calc_agrees") != 1]
    ev = f"{len(known) - len(mism)}/{len(known)} points give the same resident blocks"
    if len(mism):
        r = mism.iloc[0]
        ev += (f"; first mismatch {r['variant']} at {int(r['p_block_size'])} threads: "
               f"calculator {r.get('m_blocks_theory')} blocks ({r.get('m_limiter')}), "
               f"driver {r.get('m_blocks_driver')}")
        note = r.get("m_spec_note")
        if isinstance(note, str) and note:
            ev += f" (table vs device: {note})"
    return judged(mism.empty, ev)


def _api_agrees(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = ok(d)
    known = d[col(d, "m_api_agrees").notna()]
    if known.empty:
        return no_data("no point asked cuOccupancyMaxPotentialBlockSize")
    bad = known[col(known, "m_api_agrees") != 1]
    ev = f"{len(known) - len(bad)}/{len(known)} points"
    if len(bad):
        r = bad.iloc[0]
        ev += (f"; {r['variant']}: calculator {r.get('m_api_block_size_calc')}, "
               f"driver {r.get('m_api_block_size')}")
    return judged(bad.empty, ev)


def _api_largest(d: pd.DataFrame, c: Ceilings) -> Judgement:
    parts, holds = [], True
    for v in VEC:
        k = _vec(d, v).dropna(subset=["occ", "threads"])
        pick = col(k, "m_api_block_size").dropna()
        if k.empty or pick.empty or pick.iloc[0] not in set(k["threads"]):
            continue  # the API's pick is not among the measured block sizes
        best = k["occ"].max()
        ties = k[k["occ"] >= best - 1e-9]["threads"]
        holds &= bool(pick.iloc[0] == ties.max())
        parts.append(f"{v}: the API picks {int(pick.iloc[0])}; {len(ties)} measured block "
                     f"sizes reach its best {fmt.percent(100 * best)}, the largest "
                     f"{int(ties.max())}")
    if not parts:
        return no_data("no vector kernel whose API pick was among the measured block sizes")
    return judged(holds, "; ".join(parts))


def _regs_lower(d: pd.DataFrame, c: Ceilings) -> Judgement:
    a, b = _vec(d, "vec_mul"), _vec(d, "vec_mul_regs")
    if a["occ"].isna().all() or b["occ"].isna().all():
        return no_data("vec_mul and vec_mul_regs not both in this run")

    def regs(k: pd.DataFrame) -> str:
        r = col(k, "m_num_regs").dropna()
        return fmt.integer(r.iloc[0]) if len(r) else "?"

    return judged(b["occ"].max() < a["occ"].max(),
                  f"best occupancy {fmt.percent(100 * b['occ'].max())} ({regs(b)} registers) "
                  f"vs {fmt.percent(100 * a['occ'].max())} ({regs(a)})")


def _low_loses(d: pd.DataFrame, c: Ceilings) -> Judgement:
    shares, n_low = [], 0
    for v in MEMORY_BOUND:
        k = _vec(d, v).dropna(subset=["gbps", "occ"])
        low = k[k["occ"] < LOW_OCCUPANCY]
        if low.empty or len(low) == len(k):
            continue
        shares += list(low["gbps"] / k["gbps"].max())
        n_low += len(low)
    if not shares:
        return no_data(f"no memory-bound point below {LOW_OCCUPANCY:.0%} occupancy beside "
                       "faster ones of the same kernel")
    r = float(pd.Series(shares).median())
    return judged(r < FULL_BANDWIDTH_SHARE,
                  f"median {fmt.percent(100 * r)} of their kernel's best bandwidth over "
                  f"{n_low} points below {LOW_OCCUPANCY:.0%} occupancy")


def _best_tile(d: pd.DataFrame, c: Ceilings) -> Judgement:
    mm = ok(d[d["variant"] == "matmul_tiled_dyn"]).dropna(subset=["time_median_s"])
    tile = col(mm, "m_best_tile").dropna()
    if mm.empty or tile.empty:
        return no_data("no tiled matmul point with the calculator's best tile")
    best_t = int(tile.iloc[0])
    at_best = mm[col(mm, "p_tile") == best_t]
    if at_best.empty:
        return no_data(f"the calculator's best tile T={best_t} was not measured (add it to "
                       "matmul_tiles)")
    fastest = mm.loc[mm["time_median_s"].idxmin()]
    t = at_best["time_median_s"].iloc[0]
    return judged(t / fastest["time_median_s"] <= TILE_SLACK,
                  f"T={best_t}: {fmt.seconds(t)}; fastest T={int(fastest['p_tile'])}: "
                  f"{fmt.seconds(fastest['time_median_s'])}")


def _full_but_slow(d: pd.DataFrame, c: Ceilings) -> Judgement:
    v = _vec(d, "vec_mul").dropna(subset=["gbps"])
    full = v[v["occ"] >= FULL_OCCUPANCY].dropna(subset=["threads"])
    if full.empty:
        return no_data("no vec_mul point at full theoretical occupancy")
    small = full.loc[full["threads"].idxmin()]
    best = v["gbps"].max()
    return judged(small["gbps"] < FULL_BANDWIDTH_SHARE * best,
                  f"vec_mul with {int(small['threads'])}-thread blocks: theoretical occupancy "
                  f"{fmt.percent(100 * small['occ'])}, {fmt.bandwidth(small['gbps'])} = "
                  f"{fmt.percent(100 * small['gbps'] / best)} of its best "
                  f"{fmt.bandwidth(best)} (slower: below {FULL_BANDWIDTH_SHARE:.0%})")


def _blocks_of_32(d: pd.DataFrame, c: Ceilings) -> Judgement:
    v = _vec(d, "vec_mul").dropna(subset=["time_median_s"]).set_index("threads")
    if not {32, 256} <= set(v.index):
        return no_data("vec_mul with 32- and 256-thread blocks not both in this run")
    t32, t256 = v.loc[32, "time_median_s"], v.loc[256, "time_median_s"]
    return judged(t32 / t256 >= SLOW_32,
                  f"vec_mul: {fmt.seconds(t32)} with 32 threads per block, "
                  f"{fmt.seconds(t256)} with 256: {fmt.ratio(t32 / t256)} the time")


def _underfilled(d: pd.DataFrame, c: Ceilings) -> Judgement:
    v = _vec(d, "vec_mul")
    v = v.assign(achieved=ncu(v, "m_ncu_achieved_occupancy_pct"))
    small = v[(v["threads"] <= SMALL_BLOCK)].dropna(subset=["achieved", "occ"])
    small = small[small["occ"] > 0].sort_values("threads")
    if small.empty:
        return no_data(f"no vec_mul block of {SMALL_BLOCK} threads or fewer profiled by "
                       "Nsight Compute (profile.ncu)")
    share = small["achieved"] / (100 * small["occ"])
    return judged(bool((share < UNDERFILLED).all()), "; ".join(
        f"{int(r['threads'])} threads: achieved {fmt.percent(r['achieved'])} of a "
        f"theoretical {fmt.percent(100 * r['occ'])}" for _, r in small.iterrows()))


def small_blocks_limiter(t: pd.DataFrame, c: Ceilings) -> str | None:
    """Course fact: what holds vec_mul's 32-thread blocks on this GPU, from the limits
    table (arithmetic, not a measurement: the driver's agreement is its check)."""
    v = _vec(t[t["experiment"] == "occupancy"], "vec_mul")
    one = v[v["threads"] == 32].dropna(subset=["occ"])
    if one.empty:
        return None
    r = one.iloc[0]
    limiter = str(r.get("m_limiter") or "unknown")
    return (f"From the limits table (arithmetic, which the driver confirms at every point "
            f"where the calculator's check is seen): vec_mul with 32-thread blocks holds "
            f"{fmt.integer(r.get('m_blocks_theory'))} blocks per SM, limited by {limiter}: "
            f"{fmt.percent(100 * r['occ'])} of the warp slots.")


# -- flips -----------------------------------------------------------------------------------
def _first(d: pd.DataFrame) -> pd.Series:
    return pd.Series(d.index == d.index[0], index=d.index)


def _of(variant: str, threads: int | None = None):  # noqa: ANN202 - a mask for a flip
    def mask(d: pd.DataFrame) -> pd.Series:
        m = d["variant"] == variant
        return m & (col(d, "p_block_size") == threads) if threads is not None else m
    return mask


def _low_points(d: pd.DataFrame) -> pd.Series:
    return d["variant"].isin(MEMORY_BOUND) & (col(d, "m_occupancy_theory") < LOW_OCCUPANCY)


def _smallest_full(d: pd.DataFrame) -> pd.Series:
    v = d[(d["variant"] == "vec_mul") & (col(d, "m_occupancy_theory") >= FULL_OCCUPANCY)]
    return _of("vec_mul", int(col(v, "p_block_size").min()))(d)


def _small_blocks_filled(d: pd.DataFrame) -> pd.DataFrame:
    """Nsight Compute finds the small blocks as full as the calculator says."""
    d = d.copy()
    m = (d["variant"] == "vec_mul") & (col(d, "p_block_size") <= SMALL_BLOCK)
    for c in [c for c in d.columns if c.startswith("m_ncu_achieved_occupancy_pct")]:
        d.loc[m, c] = 100 * col(d, "m_occupancy_theory")[m]
    return d


EXPLANATIONS = (occupancy_achieved, occupancy_knee)
CLAIMS = (
    Claim("every point is correct: launched kernels match the float64 reference, and "
          "block sizes that cannot launch are refused by calculator and driver alike",
          _correct, one_wrong, "correct"),
    Claim("the occupancy calculator agrees with the CUDA driver "
          "(cuOccupancyMaxActiveBlocksPerMultiprocessor) at every point", _calc_agrees,
          lambda d: with_value(d, _first, "m_calc_agrees", 0), "calc_agrees_driver",
          tool=True),
    Claim("the calculator picks the block size cuOccupancyMaxPotentialBlockSize picks",
          _api_agrees, lambda d: with_value(d, _first, "m_api_agrees", 0),
          "api_agrees_driver", tool=True),
    Claim("more registers per thread, fewer resident warps: vec_mul_regs' best occupancy is "
          "below vec_mul's", _regs_lower,
          lambda d: with_value(d, _of("vec_mul_regs"), "m_occupancy_theory", 1.0),
          "regs_lower_occupancy"),
    Claim("cuOccupancyMaxPotentialBlockSize picks, for each vector kernel, the largest "
          "measured block size at that kernel's best theoretical occupancy (the block sizes "
          "that reach it tie; the API keeps the largest)", _api_largest,
          lambda d: with_value(d, lambda x: x["variant"].isin(VEC), "m_api_block_size", 256),
          "api_picks_largest"),
    Claim(f"below {LOW_OCCUPANCY:.0%} theoretical occupancy a memory-bound vector kernel "
          f"(vec_mul, vec_mul_smem) keeps under {FULL_BANDWIDTH_SHARE:.0%} of its own best "
          "bandwidth (median of those points)", _low_loses,
          lambda d: with_value(d, _low_points, "gbps", col(d, "gbps").max()),
          "low_occupancy_loses"),
    Claim(f"the calculator's best square tile (largest tile at the best occupancy) takes at "
          f"most {TILE_SLACK}x the time of the fastest measured tile", _best_tile,
          lambda d: slower(d, lambda x: (x["variant"] == "matmul_tiled_dyn")
                           & (col(x, "p_tile") == col(x, "m_best_tile")), 2.0),
          "best_tile_near_fastest"),
    Claim("the smallest blocks reach full occupancy on paper yet run slower: the smallest "
          "vec_mul block at full theoretical occupancy stays below "
          f"{FULL_BANDWIDTH_SHARE:.0%} of vec_mul's best bandwidth", _full_but_slow,
          lambda d: slower(d, _smallest_full, 0.4), "full_but_slow"),
    Claim(f"vec_mul takes at least {SLOW_32}x as long with one-warp (32-thread) blocks as "
          "with 256-thread blocks", _blocks_of_32,
          lambda d: slower(d, _of("vec_mul", 32), 1 / 4), "blocks_of_32_slower"),
    Claim(f"blocks of {SMALL_BLOCK} threads or fewer leave warp slots empty: Nsight "
          f"Compute's achieved occupancy of vec_mul stays under {UNDERFILLED:.0%} of the "
          "theoretical (blocks that start and retire within microseconds)", _underfilled,
          _small_blocks_filled, "small_blocks_underfilled"),
)

LESSON = Lesson(
    title="Occupancy: block size, registers and shared memory against resident warps",
    caption=(
        "Occupancy is the share of an SM's warp slots a kernel can fill: resident blocks "
        "per SM are limited by the warp slots, the block slots, the register file (registers "
        "are allocated per warp in units of 256) and shared memory (per block, plus 1 KB "
        "reserved from cc 8.0). Look for: the few-register vec_mul at or near full occupancy "
        "for most block sizes, dipping where the block slots or the warp count do not "
        "divide evenly, and held by the block slots with one-warp blocks; the "
        "register-heavy kernel capped far lower, and with enough live values unable to "
        "launch its largest blocks at all; the shared-memory kernel starved at small "
        "blocks, where the per-block shared memory, not the threads, fills the SM. "
        "Theoretical occupancy is an upper bound, not a prediction: the smallest blocks can "
        "reach full occupancy on paper yet run slower; one hypothesis is that blocks that "
        "start and retire within microseconds leave warp slots empty (Nsight Compute's "
        "achieved occupancy, with profile.ncu on, measures it). The project's calculator "
        "must agree with the "
        "CUDA driver at every point. The claims below judge each of these on this run."
    ),
    figures={
        "occupancy": "Theoretical occupancy (project calculator: line; CUDA driver: crosses) "
        "and measured kernel time (right axis) against block size, one panel per kernel.",
        "bandwidth": "Achieved bandwidth of the vector kernels against their theoretical "
        "occupancy: memory-bound kernels need enough resident warps to reach full bandwidth.",
    },
    print_figure=("occupancy", 0),  # vec_mul's panel: four are not legible on paper
    print_pages=1.05,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    course_facts={"small_blocks_limiter": small_blocks_limiter,
                  "small_blocks_block_rate": block_cost.small_blocks_block_rate},
    try_this=[
        TryThis("occupancy.live_values: 32", "vec_mul_regs keeps fewer values live and uses fewer "
                "registers: its occupancy curve rises, and the largest blocks, which it could not "
                "launch, may launch again"),
        TryThis("occupancy.smem_bytes: 49152", "more dynamic shared memory per block: fewer blocks "
                "fit an SM, and vec_mul_smem's occupancy falls wherever shared memory, not the "
                "warps, is the limit (the small blocks)"),
        TryThis("occupancy.matmul_tiles: [8, 16, 32]", "the calculator's best tile must be among "
                "the measured ones; the claim on the best square tile compares its pick with the "
                "fastest measured tile"),
    ],
    questions=[
        Question(
            "Which resource limits vec_mul_regs at 256 threads per block (registers, shared "
            "memory, warps or blocks)? Compute it by hand from the registers per thread.",
            answers.register_limit),
        Question(
            "Occupancy went up but the kernel did not get faster: when is more occupancy "
            "useless?",
            answers.useless_occupancy),
        Question(
            "Why do the occupancy curves zig-zag with the block size instead of changing "
            "smoothly?",
            answers.zig_zag),
    ],
    sources={
        "256": "registers are allocated per warp in units of 256 (CUDA Occupancy Calculator, "
               "every compute capability since 3.0); also a block size of the grid",
        "8.0": "compute capability 8.0, from which the driver reserves 1 KB of shared memory "
               "per block (cudaDevAttrReservedSharedMemoryPerBlock)",
    },
)
