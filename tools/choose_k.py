#!/usr/bin/env python3
"""Choose k of compare's verdict rule from two runs of unchanged code and a planted slowdown.

    python tools/choose_k.py RUN_A RUN_B [--planted RUN_P] [--planted-experiment NAME]
                             [--ks 0 0.5 1 ...] [--threshold 0.05] [--csv OUT.csv]

RUN_A and RUN_B: result folders (results/ or raw/ records) of the same code, measured with
trials (measurement.trials >= 2), ideally on two machines. RUN_P: the same code with one
kernel edited to do 10-20 % more DRAM traffic. For every candidate k (with and without the
class floors applied where both sides have trials) it prints how many of the timed points
of RUN_B against RUN_A are not "same" (by class) and how many slower, and how many of the
planted kernel points (10 us or more, made 10 % slower or more) RUN_P against RUN_A
catches; then the rule to take and, for it, the points that are still not "same".
The rule lives in cudalab/compare.py (K_TRIALS, CLASS_FLOORS_ALWAYS); docs/noise.md says
how to read this output. Exit 0 when a candidate meets the target, 1 when none does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cudalab import compare, compare_calibration, compare_text, result_folders

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", help="baseline: a run of unchanged code")
    ap.add_argument("run_b", help="another run of the same code")
    ap.add_argument("--planted", help="a run with a planted slowdown (same code otherwise)")
    ap.add_argument("--planted-experiment",
                    help="the experiment whose kernel was slowed (default: the one with the "
                         "most kernel points of 10 us or more made 10 %% slower)")
    ap.add_argument("--ks", type=float, nargs="+", default=list(compare_calibration.CANDIDATE_KS))
    ap.add_argument("--threshold", type=float, default=compare.DEFAULT_THRESHOLD)
    ap.add_argument("--csv", help="write the table here too")
    a = ap.parse_args(argv)
    try:
        base = result_folders.load_runs(a.run_a, "baseline")[0]
        same = result_folders.load_runs(a.run_b, "run")[0]
        planted = result_folders.load_runs(a.planted, "planted run")[0] if a.planted else None
    except result_folders.CompareError as exc:
        print(f"choose_k: {exc}", file=sys.stderr)
        return 2
    table = compare_calibration.choose_k(base, same, planted, a.planted_experiment, tuple(a.ks),
                             a.threshold)
    cols = [c for c in table.columns if c != "timed"]
    print(f"{base.label} against {same.label}: {table['timed'].iloc[0]} timed points"
          + (f"; planted: {planted.label}" if planted is not None else ""))
    print(compare_text.text_table([[_cell(r[c]) for c in cols] for _, r in table.iterrows()],
                             cols))
    rule, why = compare_calibration.recommend_k(table)
    print(f"\n{why}")
    if a.csv:
        table.to_csv(a.csv, index=False)
        print(f"wrote {a.csv}")
    shown = rule
    if shown is None:  # the closest candidate: which points keep it from the target
        best = table.sort_values(["not_same_pct", "k"]).iloc[0]
        shown = compare.Rule(float(best["k"]), bool(best["class_floors_always"]))
    cmp = compare.compare_pair(base, same, a.threshold, shown)
    print(f"\nThe unchanged pair with k = {shown.k:g}"
          + (" and the class floors always" if shown.class_floors_always else "") + ":"
          + "\n".join(compare_text.by_class(cmp)))
    if note := compare_text.no_trials_note(cmp):
        print(note)
    if rule is None:
        return 1
    print(f"\nSet K_TRIALS = {rule.k:g} and CLASS_FLOORS_ALWAYS = {rule.class_floors_always} "
          "in cudalab/compare.py, and the numbers above in docs/noise.md.")
    return 0


def _cell(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.2f}" if v != int(v) else f"{v:g}"
    return str(v)


if __name__ == "__main__":
    sys.exit(main())
