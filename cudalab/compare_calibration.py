"""Choosing k, the multiple of the trial spread in the comparison's bar (docs/noise.md):
from two runs of unchanged code (no point should be 'slower' or 'faster') and, optionally,
a run with a planted slowdown (which must be caught). tools/choose_k.py is its command.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from cudalab.compare import CLASS_REASON, DEFAULT_THRESHOLD, Rule, compare_pair, moved
from cudalab.result_folders import Run

# -- choosing k: two runs of unchanged code and a planted slowdown -------------------------------
CANDIDATE_KS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


TARGET_NOT_SAME = 0.01  # of the timed points, between two runs of unchanged code


PLANT_MIN_S = 10e-6  # a planted slowdown must be caught at kernels of 10 us or more ...


PLANT_MIN_RATIO = 1.10  # ... that it made 10 % slower or more


def planted_points(cmp: pd.DataFrame, experiment: str | None) -> pd.Series:
    """The points a planted slowdown must be caught at: kernels of PLANT_MIN_S or more (both
    sides) that it made PLANT_MIN_RATIO slower, in `experiment` (None: the experiment with
    the most such points). Small-grid kernels are not among them: their class floor
    (SMALL_GRID_FLOOR) lets a slowdown up to it pass."""
    hit = ((cmp["class"] == "kernel") & (cmp["ratio"] >= PLANT_MIN_RATIO)
           & (np.minimum(cmp["baseline_s"], cmp["this_s"]) >= PLANT_MIN_S))
    if experiment is None and hit.any():
        experiment = cmp.loc[hit, "experiment"].value_counts().idxmax()
    return hit & (cmp["experiment"] == experiment)


def choose_k(base: Run, same: Run, planted: Run | None = None,
             planted_experiment: str | None = None, ks: tuple[float, ...] = CANDIDATE_KS,
             threshold: float = DEFAULT_THRESHOLD) -> pd.DataFrame:
    """One row per candidate rule (k, with and without the class floors always): of the
    timed points of `base` against `same` (unchanged code), how many are not 'same' (and
    per class) and how many slower; against `planted`, how many of the planted points
    (planted_points) are caught, how many other points are slower, and whether
    --fail-on-slower exits 1. `ok`: at most TARGET_NOT_SAME not 'same', none slower, and
    (with a planted run) every planted point caught."""
    rows = []
    for always in (False, True):
        for k in ks:
            rule = Rule(k, always)
            c = compare_pair(base, same, threshold, rule)
            timed = c[c["ratio"].notna()]
            mv = moved(timed)
            row: dict[str, Any] = {
                "k": k, "class_floors_always": always, "timed": len(timed),
                "not_same": len(mv), "not_same_pct": 100 * len(mv) / max(1, len(timed)),
                "slower": int((timed["verdict"] == "slower").sum()),
                **{f"not_same_{cls}": int((mv["class"] == cls).sum()) for cls in CLASS_REASON}}
            ok = row["not_same"] <= TARGET_NOT_SAME * len(timed) and row["slower"] == 0
            if planted is not None:
                p = compare_pair(base, planted, threshold, rule)
                want = planted_points(p, planted_experiment)
                slower = p["verdict"] == "slower"
                row |= {"planted": int(want.sum()), "caught": int((want & slower).sum()),
                        "other_slower": int((~want & slower).sum()),
                        "planted_exit": int(slower.any())}
                ok = ok and row["planted"] > 0 and row["caught"] == row["planted"]
            rows.append(row | {"ok": ok})
    return pd.DataFrame(rows)


def recommend_k(table: pd.DataFrame) -> tuple[Rule | None, str]:
    """The rule to take and why: without the class floors where any k works there, the
    candidate nearest the middle of the k that work (margin both ways)."""
    for always in (False, True):
        good = table[table["ok"] & (table["class_floors_always"] == always)]
        if good.empty:
            continue
        lo, hi = good["k"].min(), good["k"].max()
        k = float(good.iloc[(good["k"] - (lo + hi) / 2).abs().argsort().iloc[0]]["k"])
        return Rule(k, always), (
            f"k = {k:g}{' with the class floors always' if always else ''}: every k from "
            f"{lo:g} to {hi:g} leaves at most {100 * TARGET_NOT_SAME:g} % of the unchanged "
            "pair's timed points not 'same', none slower"
            + (", and catches the planted slowdown" if "planted" in table else "")
            + "; the middle of that range keeps a margin both ways")
    best = table.sort_values(["not_same_pct", "k"]).iloc[0]
    return None, (f"no candidate meets the target: the fewest not 'same' is "
                  f"{best['not_same_pct']:.1f} % (k = {best['k']:g}, class floors always: "
                  f"{bool(best['class_floors_always'])}); see which class the points are in")
