"""The atomics lesson: its claims, each a predicate over this run's table with its threshold
and the data change that turns it over. Every number in a sentence comes from the table;
the only constants are the named thresholds below."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.atomics import answers
from cudalab.experiments.base import NOT_MEASURED, not_measured_evidence
from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    Lesson,
    TryThis,
    col,
    judged,
    no_data,
    ok,
    slower,
    with_value,
)
from cudalab.experiments.questions import Question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

SUMS = ("atomic_sum", "reduce_sum")
WARP = 32
# The 32 threads of a warp read the counter together, so a warp alone adds at most one: the
# racy count can never pass one per warp (1/32 of the increments), and a claim under that
# bound could not fail. What the race across SMs adds is measured against it: at the
# largest launch the count stays under this share of one increment per warp.
RACY_WARP_SHARE = 0.1
# The tree reduction is at least this much faster than per-element atomics at the largest n
# (n serialised atomics on one address against n / (2 block) of them).
REDUCE_GAIN = 10.0


def _measured(d: pd.DataFrame, variant: str) -> pd.DataFrame:
    v = d[d["variant"] == variant]
    return v[v["status"].astype(str) != NOT_MEASURED]


def _launch(r: pd.Series) -> str:
    return f"{int(r['p_grid'])} x {int(r['p_block'])}"


def racy_runs(racy: pd.DataFrame) -> dict[str, list[int]]:
    """'grid x block (expected N)' -> counts: the checked count, then its repeats
    (m_racy_repeats, JSON); launches without repeats are left out."""
    out: dict[str, list[int]] = {}
    if "m_racy_repeats" not in racy:
        return out
    for _, r in racy.dropna(subset=["m_racy_repeats", "m_counted"]).iterrows():
        counts = [int(r["m_counted"])] + [int(c) for c in json.loads(r["m_racy_repeats"])]
        out[f"{_launch(r)} (expected {fmt.integer(r['m_expected'])})"] = counts
    return out


# -- claims ----------------------------------------------------------------------------------
def _atomic_exact(d: pd.DataFrame, c: Ceilings) -> Judgement:
    atom = _measured(d, "atomic_counter")
    if atom.empty:
        return no_data("no atomic counter launch measured")
    counted, expected = col(atom, "m_counted"), col(atom, "m_expected")
    exact = atom[(atom["status"].astype(str) == "ok") & (counted == expected)]
    shown = counted.notna() & expected.notna()
    return judged(len(exact) == len(atom),
                  f"{len(exact)}/{len(atom)} launches exact"
                  + (f" (counted {fmt.integer(counted[shown].iloc[0])} of "
                     f"{fmt.integer(expected[shown].iloc[0])})" if shown.any() else ""))


def _racy(d: pd.DataFrame) -> pd.DataFrame:
    racy = _measured(d, "racy_counter")
    return racy[col(racy, "m_counted").notna() & col(racy, "m_expected").notna()]


def _warps(racy: pd.DataFrame) -> pd.Series:
    return col(racy, "p_grid") * -(-col(racy, "p_block") // WARP)


def _racy_across_warps(d: pd.DataFrame, c: Ceilings) -> Judgement:
    racy = _racy(d)
    if racy.empty:
        return no_data("no racy counter launch measured")
    big = racy.loc[col(racy, "m_expected").idxmax()]
    warps = float(_warps(big.to_frame().T).iloc[0])
    share = float(big["m_counted"]) / warps
    return judged(share < RACY_WARP_SHARE,
                  f"{_launch(big)}: counted {fmt.integer(big['m_counted'])} of "
                  f"{fmt.integer(big['m_expected'])}, {fmt.integer(warps)} warps: "
                  f"{fmt.ratio(share)} of one increment per warp")


def _racy_per_warp(d: pd.DataFrame, c: Ceilings) -> Judgement:
    racy = _racy(d)
    if racy.empty:
        return no_data("no racy counter launch measured")
    warps = _warps(racy)
    over = racy[col(racy, "m_counted") > warps]
    return judged(over.empty, "; ".join(
        f"{_launch(r)}: counted {fmt.integer(r['m_counted'])}, {fmt.integer(w)} warps"
        for (_, r), w in zip(racy.iterrows(), warps)))


def _racy_varies(d: pd.DataFrame, c: Ceilings) -> Judgement:
    runs = racy_runs(_measured(d, "racy_counter"))
    if not runs:
        return no_data("no racy counter launch with repeats")
    varies = [lab for lab, counts in runs.items() if len(set(counts)) >= 2]
    return judged(len(varies) == len(runs), "; ".join(
        f"{lab}: " + ", ".join(fmt.integer(x) for x in counts) for lab, counts in runs.items()))


def _sums_ok(d: pd.DataFrame, c: Ceilings) -> Judgement:
    sums = d[d["variant"].isin(SUMS)]
    done = sums[sums["status"].astype(str) != NOT_MEASURED]
    if done.empty:
        return no_data(not_measured_evidence(sums, "sum") if len(sums) else "no sum in this run")
    bad = done[done["status"].astype(str) != "ok"]
    return judged(bad.empty, f"{len(done) - len(bad)}/{len(done)} sums within tolerance"
                  + (f"; not ok: {', '.join(bad['point_id'].astype(str).head(5))}"
                     if len(bad) else ""))


def _largest_sums(d: pd.DataFrame) -> pd.DataFrame:
    s = ok(d[d["variant"].isin(SUMS)])
    return s[col(s, "p_n") == col(s, "p_n").max()].set_index("variant")


def _reduce_faster(d: pd.DataFrame, c: Ceilings) -> Judgement:
    big = _largest_sums(d)
    t = col(big, "time_median_s")
    if not set(SUMS) <= set(t.dropna().index):
        return no_data("both sums not timed at the largest n")
    r = t["atomic_sum"] / t["reduce_sum"]
    return judged(r >= REDUCE_GAIN,
                  f"reduction {fmt.seconds(t['reduce_sum'])}, atomics "
                  f"{fmt.seconds(t['atomic_sum'])}: {fmt.ratio(r)} at n = "
                  f"{fmt.integer(col(big, 'p_n').iloc[0])}")


# -- flips -----------------------------------------------------------------------------------
def _variant(name: str):  # noqa: ANN202 - a mask for a flip
    return lambda d: d["variant"] == name


def _racy_counts_all(d: pd.DataFrame) -> pd.DataFrame:
    """The race lost nothing: the racy count is the expected count."""
    d = d.copy()
    racy = d["variant"] == "racy_counter"
    d.loc[racy, "m_counted"] = col(d, "m_expected")[racy]
    return d


def _racy_one_per_warp(d: pd.DataFrame) -> pd.DataFrame:
    """Warps do not race each other: every warp's one increment survives."""
    d = d.copy()
    racy = d["variant"] == "racy_counter"
    d.loc[racy, "m_counted"] = _warps(d[racy])
    return d


def _racy_same_every_run(d: pd.DataFrame) -> pd.DataFrame:
    d = with_value(d, _variant("racy_counter"), "m_racy_repeats", "[5, 5, 5, 5, 5]")
    return with_value(d, _variant("racy_counter"), "m_counted", 5)


def _smallest_reduce(d: pd.DataFrame) -> pd.Series:
    return (d["variant"] == "reduce_sum") & (col(d, "p_n") == col(d, "p_n").min())


CLAIMS = (
    Claim("the atomicAdd counter counts every increment exactly", _atomic_exact,
          lambda d: with_value(d, _variant("atomic_counter"), "m_counted", 1_000_000),
          "atomic_exact"),
    Claim("at the largest launch the racy counter keeps under "
          f"{fmt.number(RACY_WARP_SHARE)} increment per warp: a warp's own 32 threads, "
          "reading together, leave at most one per warp (1/32 of the increments, by "
          "construction); below that, warps on different SMs overwrite each other's "
          "increments too", _racy_across_warps, _racy_one_per_warp, "racy_loses"),
    Claim("the racy counter's count changes between repeats of the same launch (at least "
          "2 different counts over the check and its repeats)", _racy_varies,
          _racy_same_every_run, "racy_varies"),
    Claim("both float sums are within the stated tolerance of the float64 sum", _sums_ok,
          lambda d: with_value(d, _smallest_reduce, "status", "wrong"), "sums_within_tolerance"),
    Claim(f"the tree reduction is at least {REDUCE_GAIN:g}x faster than per-element atomics "
          "at the largest n", _reduce_faster,
          lambda d: slower(d, _variant("reduce_sum"), 60.0), "reduce_faster"),
)
TRY_THIS = [
    TryThis("atomics.counter_launches: [[1, 32], [1, 1024], [1024, 1024]]", "one warp: the "
            "racy count is 1 (its 32 threads read 0 together and all write 1); one block: a "
            "few more; many blocks: still far below the expected count. Judged on every "
            "racy launch of the run: a warp adds at most one",
            Claim("every racy launch counts at most one increment per warp (the 32 threads "
                  "of a warp read the counter together)", _racy_per_warp, _racy_counts_all,
                  "racy_at_most_one_per_warp")),
    TryThis("atomics.sum_block: 1024", "bigger blocks in the reduction: fewer atomics (one "
            "per block) and a deeper tree; the time should change little and the error stay "
            "small"),
    TryThis("atomics.sum_sizes: [1000]", "a tiny sum: both kernels take microseconds, and "
            "the reduction's advantage shrinks because the launch itself is a large share "
            "of both times"),
]

LESSON = Lesson(
    title="Atomics: a racy counter, atomicAdd, and a float sum by atomics or reduction",
    headline="racy_loses",  # the lesson: a race loses increments; atomicAdd's is its fix
    caption=(
        "Counter: each of grid x block threads adds 1 to one global counter. The plain "
        "version reads, adds and writes back in three steps, so threads that read the same "
        "value overwrite each other's increments (the 32 threads of a warp read together: "
        "a warp adds at most 1). atomicAdd makes the read-modify-write indivisible. Look "
        "for: the racy count far below the expected count, and different from run to run; "
        "the atomic count exactly equal to it. Sum: adding n floats into one address with "
        "atomicAdd is correct but serialises all n additions on that address and rounds "
        "like a sequential sum; a shared-memory tree reduction per block followed by one "
        "atomicAdd per block does n / (2 block) atomics. Look for: the reduction much "
        "faster. Both sums add in an order that changes from run to run (the atomics' "
        "order is the order threads reach the address), so one run's error of each is one "
        "draw of a random quantity: which sum is closer to the float64 sum is a hypothesis "
        "here, not a claim; the spread of each error over repeated sums would test it. The "
        "claims below judge the rest on this run."
    ),
    figures={
        "counter": "Count reached by the racy and the atomic counter against the expected "
        "count (grid x block increments), log scale; the count the racy counter reached is "
        "written above its bar.",
        "sum": "Summing n floats: kernel time (left) and relative error against the float64 "
        "sum (right) of per-element atomicAdd and of the shared-memory tree reduction. "
        "Dashed line: the tolerance.",
    },
    print_figure=("counter", None),  # on paper: the racy counter's lost updates
    print_pages=0.75,  # its share of the A4 handout
    claims=CLAIMS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "A warp alone leaves at most one increment: why does the racy counter end below "
            "even that? What sets the value it ends at?",
            answers.racy_value),
        Question(
            "Why is a float sum by atomicAdd slow? Its error changes from run to run: how "
            "many runs would you need before saying which sum is the more accurate?",
            answers.float_sum),
        Question(
            "Would the racy count be the same on every run? Look at the run-by-run table.",
            answers.racy_repeats),
    ],
)
