"""The vector_add lesson: its claims (each a predicate over this run's table with its
threshold and the data change that turns it over) and its facts (sentences computed from the
table). Every number in a sentence comes from the table; the only constants are the named
thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt, occupancy
from cudalab.experiments.flip import turn
from cudalab.experiments.lesson import (
    FULL_BANDWIDTH_SHARE,
    LARGE_FRACTION,
    Claim,
    Judgement,
    Lesson,
    TryThis,
    all_correct,
    col,
    judged,
    largest,
    no_data,
    ok,
    one_wrong,
    ref,
    slower,
)
from cudalab.experiments.questions import Question
from cudalab.experiments.vector_add import answers, block_rate

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

# The smallest vector is launch-bound: under this share of the largest vector's GB/s.
SMALL_SHARE = 0.5
# Blocks of 128 or more threads beat 32-thread blocks at least this much at the largest n.
WIDE_OVER_32 = 1.5
# 64-thread blocks already fill every warp slot: within this share of 1024-thread blocks.
FULL_64_SHARE = 0.9
MILLIONS = 1e6  # "millions of elements"
# A fixed cost per block sets a slow block size's time where its blocks, at the block rate
# the one-load probe measured at that size, account for at least this share of it.
BLOCK_SHARE = 0.6


def _gpu(d: pd.DataFrame) -> pd.DataFrame:
    """The vector-add points measured (not the block-rate probe's)."""
    d = ok(d)
    return d[d["variant"] == "gpu"].dropna(subset=["gbps"])


def _n(d: pd.DataFrame) -> str:
    return fmt.integer(d["p_n"].iloc[0])


# -- facts -----------------------------------------------------------------------------------
def vector_add_share(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The largest vector's best block size against the DRAM ceiling; L2-resident sizes."""
    d = _gpu(d)
    dram, what = ref(c)
    big = largest(d, "p_n")
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


def warp_slots_of_32(d: pd.DataFrame, c: Ceilings) -> str | None:
    """How many of an SM's warp slots 32-thread blocks can fill on this GPU."""
    rows = _gpu(d)[col(_gpu(d), "p_threads") == 32]
    cc = rows["compute_capability"].dropna() if "compute_capability" in rows else rows[:0]
    if rows.empty or cc.empty:
        return None
    regs = col(rows, "m_num_regs").dropna()
    o = occupancy.occupancy(str(cc.iloc[0]), 32, int(regs.iloc[0]) if len(regs) else 16)
    return (f"On this GPU (compute capability {cc.iloc[0]}) an SM holds at most "
            f"{o.active_blocks} blocks, so 32-thread blocks fill {o.active_warps} of its "
            f"{o.max_warps} warp slots ({fmt.percent(100 * o.occupancy)}), limited by "
            f"{o.limiter}.")


# -- claims ----------------------------------------------------------------------------------
def _large(d: pd.DataFrame, c: Ceilings) -> Judgement:
    dram, what = ref(c)
    big = largest(_gpu(d), "p_n")
    if big.empty or not math.isfinite(dram) or big["p_n"].iloc[0] < MILLIONS:
        return no_data("no vector of millions of elements in this run")
    g = big["gbps"].max()
    return judged(g >= LARGE_FRACTION * dram,
                  f"{fmt.bandwidth(g)} at n = {_n(big)}: {fmt.percent(100 * g / dram)} of the "
                  f"{what}")


def _small(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = _gpu(d)
    big, small = largest(d, "p_n"), d[col(d, "p_n") == col(d, "p_n").min()]
    if big.empty or small["p_n"].iloc[0] >= big["p_n"].iloc[0]:
        return no_data("one vector length only")
    r = small["gbps"].max() / big["gbps"].max()
    return judged(r < SMALL_SHARE,
                  f"best {fmt.bandwidth(small['gbps'].max())} at n = {_n(small)} in "
                  f"{fmt.seconds(small['time_median_s'].min())} vs "
                  f"{fmt.bandwidth(big['gbps'].max())} at n = {_n(big)} "
                  f"({fmt.percent(100 * r)})")


def _blocks_of_32(d: pd.DataFrame, c: Ceilings) -> Judgement:
    big = largest(_gpu(d), "p_n")
    b32 = big[col(big, "p_threads") == 32]["gbps"]
    wide = big[col(big, "p_threads") >= 128]["gbps"]
    if b32.empty or wide.empty:
        return no_data("32-thread blocks and blocks of 128 or more not both in this run")
    r = wide.max() / b32.iloc[0]
    return judged(r >= WIDE_OVER_32,
                  f"best block of 128 or more threads / 32 threads = {fmt.ratio(r)} "
                  f"({fmt.bandwidth(wide.max())} vs {fmt.bandwidth(b32.iloc[0])}) at "
                  f"n = {_n(big)}")


def _blocks_of_64(d: pd.DataFrame, c: Ceilings) -> Judgement:
    big = largest(_gpu(d), "p_n")
    b64 = big[col(big, "p_threads") == 64]["gbps"]
    b1024 = big[col(big, "p_threads") == 1024]["gbps"]
    if b64.empty or b1024.empty:
        return no_data("64- and 1024-thread blocks not both in this run")
    r = b64.iloc[0] / b1024.iloc[0]
    return judged(r >= FULL_64_SHARE,
                  f"64 threads {fmt.bandwidth(b64.iloc[0])} vs 1024 threads "
                  f"{fmt.bandwidth(b1024.iloc[0])} ({fmt.percent(100 * r)}) at n = {_n(big)}")


def block_rate_fact(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The probe's fitted block rates, GPU-wide, per kind and block size."""
    r = block_rate.rates(d).dropna(subset=["rate"])
    if r.empty:
        return None
    parts = [f"{kind.replace('_', '-')} blocks " + ", ".join(
        f"{fmt.sig(row.rate, 3)} at {row.threads} threads"
        for row in g.sort_values("threads").itertuples())
        for kind, g in r.groupby("kind")]
    return ("Block rate measured by the probe (blocks started and retired per ns, GPU-wide; "
            f"the slope of time against up to {int(r['counts'].max())} block counts): "
            + "; ".join(parts) + ".")


def _resident_warps(rows: pd.DataFrame, threads: int) -> str:
    """' (W resident warps per SM)' by the occupancy calculator, '' where unknown."""
    cc = rows["compute_capability"].dropna() if "compute_capability" in rows else rows[:0]
    if cc.empty:
        return ""
    regs = col(rows, "m_num_regs").dropna()
    try:
        o = occupancy.occupancy(str(cc.iloc[0]), threads, int(regs.iloc[0]) if len(regs)
                                else 16)
    except (KeyError, ValueError):
        return ""
    return f", {o.active_warps} resident warps per SM"


def _slow_sizes(d: pd.DataFrame) -> pd.DataFrame:
    """At the largest n, the block sizes under FULL_BANDWIDTH_SHARE of the best GB/s."""
    big = largest(_gpu(d), "p_n")
    return big[big["gbps"] < FULL_BANDWIDTH_SHARE * big["gbps"].max()] if len(big) else big


def _block_shares(d: pd.DataFrame) -> list[tuple[int, float, float, float]]:
    """(threads, blocks, measured s, probe s = blocks / one-load rate) of each slow size."""
    r = block_rate.rates(d)
    out = []
    for row in _slow_sizes(d).itertuples():
        t = int(row.p_threads)
        blocks = math.ceil(float(row.p_n) / t)
        rate = block_rate.rate_at(r, "one_load", t)
        out.append((t, blocks, float(row.time_median_s), blocks / (rate * 1e9)))
    return out


def _block_cost(d: pd.DataFrame, c: Ceilings) -> Judgement:
    if block_rate.probe_rows(d).empty:
        return no_data("no block-rate probe in this run (vector_add.probe_blocks)")
    if largest(_gpu(d), "p_n").empty:
        return no_data("no vector-add point measured")
    shares = _block_shares(d)
    if not shares:
        return no_data("no block size is slow at the largest n: nothing to explain")
    if any(not math.isfinite(p) for *_, p in shares):
        return no_data("the one-load probe has no block rate at the slow block sizes "
                       f"({', '.join(str(t) for t, *_ in shares)} threads)")
    rows = _gpu(d)
    holds = all(p / m >= BLOCK_SHARE for _, _, m, p in shares)
    return judged(holds, f"n = {_n(largest(rows, 'p_n'))}: " + "; ".join(
        f"{t} threads{_resident_warps(rows, t)}: {fmt.integer(b)} blocks in "
        f"{fmt.seconds(m)}, at the probe's rate {fmt.seconds(p)} "
        f"({fmt.percent(100 * p / m)})" for t, b, m, p in shares))


def _probe_cheap(d: pd.DataFrame) -> pd.DataFrame:
    """Blocks are cheap (latency hiding at work): the probe runs faster until the largest
    share its blocks account for is half the claim's threshold."""
    shares = [p / m for *_, m, p in _block_shares(d) if m > 0 and p > 0]
    return slower(d, block_rate.is_probe, BLOCK_SHARE / 2 / max(shares)) if shares else d


def _probe_explains(d: pd.DataFrame) -> pd.DataFrame:
    """Blocks are what costs: the probe slows until its block time equals the slowest
    share's measured time (every slow size then reaches at least that share)."""
    shares = [p / m for *_, m, p in _block_shares(d) if m > 0 and p > 0]
    return slower(d, block_rate.is_probe, 1 / min(shares)) if shares else d


def _threads(t: int):  # noqa: ANN202 - a mask for a flip
    return lambda d: col(d, "p_threads") == t


def _largest_n(d: pd.DataFrame) -> pd.Series:
    return col(d, "p_n") == col(d, "p_n").max()


EXPLANATIONS = (vector_add_share, warp_slots_of_32, block_rate_fact)
CLAIMS = (
    Claim("every GPU result matches the float64 sum",
          all_correct("points correct"), one_wrong, "correct"),
    Claim(f"millions of elements reach at least {LARGE_FRACTION:.0%} of the DRAM ceiling "
          "(measured where the run measured it, else theoretical)", _large,
          lambda d: slower(d, _largest_n, 3.0), "large_near_bandwidth"),
    Claim(f"the smallest vector reaches under {SMALL_SHARE:.0%} of the largest vector's "
          "GB/s (launch overhead dominates)", _small,
          lambda d: slower(d, lambda x: col(x, "p_n") == col(x, "p_n").min(), 1 / 60),
          "small_launch_bound"),
    Claim(f"at the largest n, blocks of 128 or more threads are at least {WIDE_OVER_32}x "
          "faster than blocks of 32 threads",
          _blocks_of_32, lambda d: slower(d, _threads(32), 1 / 4), "blocks_of_32_lag"),
    Claim("small blocks are slow because each block costs a fixed time: at the largest n, "
          f"every block size under {FULL_BANDWIDTH_SHARE:.0%} of the best GB/s spends at "
          f"least {BLOCK_SHARE:.0%} of its time starting and retiring its blocks (its block "
          "count over the block rate the one-load probe measured at that size); where "
          "too few resident warps to hide memory latency were the cause, the probe's blocks "
          "would be cheap and the share small",
          _block_cost, turn(_block_cost, _probe_cheap, _probe_explains), "fixed_cost_per_block"),
)
TRY_THIS = [
    TryThis("measurement.cold_l2: true", "the vectors small enough to fit in L2 lose GB/s: "
            "without the flush their inputs stay in L2 between samples, so the warm numbers "
            "exceed what DRAM can give"),
    TryThis("vector_add.sizes: [1000, 10000]", "microsecond kernels: the time stops falling "
            "with n because the launch itself dominates; GB/s is tiny"),
    TryThis("vector_add.threads: [32, 64, 1024]", "on paper 64-thread blocks can fill "
            "every warp slot of an SM where 32-thread blocks cannot (the fact above gives this "
            "GPU's numbers); whether full occupancy on paper makes them as fast as "
            "1024-thread blocks is judged here: where it does not, something other than "
            "resident warps (blocks scheduled per SM, memory requests in flight per block) "
            "limits them",
            Claim(f"at the largest n, 64-thread blocks reach at least {FULL_64_SHARE:.0%} of "
                  "the GB/s of 1024-thread blocks", _blocks_of_64,
                  lambda d: slower(d, _threads(64), 0.4), "blocks_of_64_full")),
]

LESSON = Lesson(
    title="Vector addition: one thread per element, block size and problem size",
    caption=(
        "c[i] = a[i] + b[i] on n float32 values, one thread per element in blocks of 32 to "
        "1024 threads (grid = ceil(n / block), with a bounds check for the last, partial "
        "block). Each element moves 12 bytes for one addition, so the speed to look at is "
        "GB/s against the card's DRAM bandwidth (dashed line). Look for: the course's "
        "50 000-element example taking a few microseconds, far below the bandwidth limit "
        "(launch overhead dominates: there is not enough work to fill the GPU); millions of "
        "elements reaching a large fraction of the bandwidth; and blocks of 32 threads "
        "lagging behind. Why small blocks lag has two candidate causes: an SM holds a "
        "limited number of blocks, so tiny blocks may leave it too few warps to hide memory "
        "latency; or each block costs a fixed time to launch and retire, so time follows "
        "the number of blocks. The run measures the second: the block-rate probe times "
        "empty and one-load kernels over block counts at every block size, and its rate "
        "predicts how long a block size's blocks alone take. Block sizes that hold the "
        "same resident warps per SM yet run at different speeds point the same way. The "
        "claims below judge the effects, and the cause, on this run."
    ),
    figures={
        "bandwidth": "Effective bandwidth (12 bytes per element / kernel time) against threads "
        "per block, one line per vector length; dashed: theoretical DRAM bandwidth.",
        "time": "Kernel time against vector length (log-log), one line per block size: flat "
        "while launch overhead dominates, then proportional to n.",
        "block_rate": "Block-rate probe: kernel time against the number of blocks launched "
        "(log-log), one line per block size, for empty blocks and blocks whose threads "
        "load one int each; the legend gives each line's fitted rate (blocks per ns, the "
        "inverse slope of time against blocks).",
    },
    print_figure=("bandwidth", None),  # on paper: the lesson's effect
    print_pages=0.72,  # its share of the A4 handout (0.64 with the block-rate claim unmeasured)
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "Why does vector_add count 12 bytes per element, and why is it bandwidth-bound "
            "rather than compute-bound?",
            answers.bytes_per_element),
        Question(
            "With n = 50 000 and 256 threads per block, how many blocks are launched, and how "
            "many threads of the last block do nothing?",
            answers.blocks_of_the_example),
        Question(
            "Why can 32-thread blocks not reach the bandwidth of 256-thread blocks even though "
            "the work is the same?",
            answers.small_blocks),
    ],
    sources={
        "12": "bytes per element: two float32 loads and one store (3 x 4 bytes)",
        "50 000": "the course's example size (the lecture's vector_add)",
        "256": "a block size of the grid (vector_add.threads)",
    },
)
