"""The teacher's answers to the atomics lesson's questions, computed from the run."""

from __future__ import annotations

import json
import math

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import NOT_MEASURED, Answer, Run, cite, have, not_measured, num

NO_RACY = ("no racy counter launch", "run atomics with the racy_counter variant")


def _racy(run: Run) -> pd.Series | None:
    d = run.ok()
    d = d[d["variant"].astype(str) == "racy_counter"].dropna(subset=["m_counted"])
    return None if d.empty else d.loc[pd.to_numeric(d["m_expected"]).idxmax()]


def _counts(r: pd.Series) -> list[int]:
    """The racy count of the timed launch and of its repeats."""
    extra = r.get("m_racy_repeats")
    try:
        more = [int(c) for c in json.loads(extra)] if isinstance(extra, str) else []
    except (ValueError, TypeError):
        more = []
    return [int(num(r["m_counted"])), *more]


def racy_value(run: Run) -> Answer:
    r, dev = _racy(run), run.device()
    if r is None:
        return not_measured(*NO_RACY)
    grid, block = num(r["p_grid"]), num(r["p_block"])
    warps = grid * math.ceil(block / 32)
    counted = num(r["m_counted"])
    work = [f"{cite(r, 'p_grid', fmt.integer)} blocks × {cite(r, 'p_block', fmt.integer)} "
            f"threads = {fmt.integer(warps)} warps: at most one increment each",
            f"{cite(r, 'm_counted', fmt.integer)} of {cite(r, 'm_expected', fmt.integer)}"]
    numbers = {"counted": counted, "warps": warps}
    text = (f"{fmt.integer(counted)} increments survive of {fmt.integer(warps)} warps. Every "
            "warp reads the counter, adds one and writes it back; all warps that read before "
            "any write lands write the same value. The final value is one more than what the "
            "last writer read: only a warp that reads after another's write has landed raises "
            "it further")
    if dev is not None and have(dev.get("m_sm_count")):
        per_sm = min(num(dev["m_max_warps_per_sm"]) // math.ceil(block / 32),
                     num(dev["m_max_blocks_per_sm"]))
        waves = math.ceil(grid / (per_sm * num(dev["m_sm_count"])))
        numbers["waves"] = waves
        work.append(f"resident blocks: {fmt.integer(per_sm)} per SM × "
                    f"{cite(dev, 'm_sm_count', fmt.integer)} SMs; waves = ceil("
                    f"{fmt.integer(grid)} / {fmt.integer(per_sm * num(dev['m_sm_count']))}) = "
                    f"{fmt.integer(waves)}")
        close = abs(counted - waves) <= 1
        text += (f". The grid runs in {fmt.integer(waves)} waves of resident blocks; "
                 + ("the count is close to that: each wave reads what the waves before it left "
                    "and adds one, the warps within a wave racing each other away."
                    if close else
                    "the count is not close to that, so something other than the waves "
                    "(the order in which warps reach L2) sets it on this run."))
    return Answer(text if text.endswith(".") else text + ".", work, numbers)


def _sums(run: Run) -> tuple[pd.Series, pd.Series] | None:
    d = run.ok().dropna(subset=["time_median_s"])
    n = pd.to_numeric(d.get("p_n"), errors="coerce")
    big = d[n == n.max()]
    a, b = (big[big["variant"].astype(str) == v] for v in ("atomic_sum", "reduce_sum"))
    return None if a.empty or b.empty else (a.iloc[0], b.iloc[0])


def float_sum(run: Run) -> Answer:
    got = _sums(run)
    if got is None:
        return not_measured("the atomic and the tree sums of one size",
                            "run atomics with atomic_sum and reduce_sum")
    a, b = got
    n, t = num(a["p_n"]), num(a["time_median_s"])
    slow = t / num(b["time_median_s"])
    per = t / n
    work = [f"{cite(a, 'time_median_s', fmt.seconds)} / {cite(b, 'time_median_s', fmt.seconds)}"
            f" = {fmt.ratio(slow)}",
            f"{fmt.seconds(t)} / {fmt.integer(n)} additions = {fmt.sig(per * 1e9)} ns each",
            f"errors: {cite(a, 'm_rel_err', fmt.error)}, {cite(b, 'm_rel_err', fmt.error)} "
            "(one run each)"]
    return Answer(f"Every one of the {fmt.integer(n)} additions goes to the same address, so "
                  "the L2 slice that owns it performs them one after another: "
                  f"{fmt.seconds(t)}, {fmt.sig(per * 1e9)} ns per addition, "
                  f"{fmt.ratio(slow)} the tree reduction, which adds in registers and shared "
                  "memory and leaves one atomic per block. Accuracy: the atomic sum adds in "
                  "whatever order the warps arrive, so its error is a random variable; the "
                  "tree adds in a fixed order and gives the same error every run. This run "
                  f"measured each once ({fmt.error(a['m_rel_err'])} against "
                  f"{fmt.error(b['m_rel_err'])}), so how many runs it takes is "
                  f"{NOT_MEASURED.lower()}: repeat the atomic sum many times, take "
                  "the spread of its error, and call one sum more accurate only where the "
                  "other's error lies outside that spread.", work,
                  {"slowdown": slow, "ns_per_addition": per * 1e9,
                   "atomic_rel_err": num(a["m_rel_err"]), "reduce_rel_err": num(b["m_rel_err"])})


def racy_repeats(run: Run) -> Answer:
    r = _racy(run)
    if r is None:
        return not_measured(*NO_RACY)
    counts = _counts(r)
    if len(counts) < 2:
        return not_measured("the racy counter was launched once", "run atomics with repeats "
                            "of the racy counter (m_racy_repeats)")
    lo, hi = min(counts), max(counts)
    work = [f"{cite(r, 'm_counted', fmt.integer)}; {cite(r, 'm_racy_repeats', str)}",
            f"{len(counts)} launches: from {lo} to {hi}"]
    text = (f"No: {len(counts)} launches of the same kernel counted "
            f"{', '.join(str(c) for c in counts)}. " if lo != hi else
            f"On this run all {len(counts)} launches counted {lo}, yet nothing guarantees it: ")
    text += ("Which warps read before which writes land depends on the timing of every SM "
             "and of L2, which changes from launch to launch; a race has no defined result.")
    return Answer(text, work, {"min": lo, "max": hi, "launches": len(counts)})
