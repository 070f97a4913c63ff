"""`cudalab compare`: the comparison as text (the verdicts grouped by class, each with the term
that set its bar), the command itself and its exit status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cudalab import safe_io
from cudalab.compare import (
    CLASS_FLOORS,
    CLASS_REASON,
    DEFAULT_RULE,
    VERDICTS,
    Rule,
    compare_runs,
    moved,
    summary,
    write_comparison,
)
from cudalab.result_folders import NOT_MEASURED, CompareError, load_points, load_runs


def not_measured_note(cmp: pd.DataFrame) -> str:
    """One line per run with points not measured on either side ('' : none)."""
    lines = []
    for run, sub in cmp[cmp["verdict"] == "not measured"].groupby("run", sort=False):
        here = int((sub["status"] == NOT_MEASURED).sum())
        there = int((sub["baseline_status"] == NOT_MEASURED).sum())
        sides = ", ".join(x for x in (f"{here} in {run}" if here else "",
                                      f"{there} in the baseline" if there else "") if x)
        lines.append(f"not measured: {len(sub)} point(s) of {run} ({sides}; a run without a "
                     "GPU records its GPU points so): never slower or faster; the same command "
                     "on a GPU machine measures them")
    return "\n".join(lines)


# -- text output --------------------------------------------------------------------------------
def fmt_seconds(s: float) -> str:
    if s is None or not np.isfinite(s):
        return ""
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _fmt_row(r: Any, with_run: bool) -> list[str]:
    ratio = f"{r.ratio:.3f}" if pd.notna(r.ratio) else ""
    noise = f"{100 * r.noise:.1f}%" if pd.notna(r.noise) else ""
    verdict = (f"other method ({r.baseline_method} / {r.method})"
               if r.verdict == "other method" else r.verdict)
    bar = f"{100 * r.bar:.1f}%" if pd.notna(r.bar) else ""
    return [r.point_id, *([r.run] if with_run else []), fmt_seconds(r.baseline_s),
            fmt_seconds(r.this_s), ratio, noise, bar, verdict]


def text_table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [head, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(f"{x:<{w}}" for x, w in zip(r, widths)).rstrip() for r in lines)


def format_text(cmp: pd.DataFrame, detail_runs: int = 5, rule: Rule = DEFAULT_RULE) -> str:
    """A table per experiment (every point when few runs are compared, else only the points
    that are not "same"), the verdict counts per run, then the points that are not "same"
    grouped by class with what set their bar."""
    n_runs = cmp["run"].nunique()
    few = n_runs <= detail_runs
    head = ["point", *(["run"] if n_runs > 1 else []), "baseline", "this", "ratio", "noise",
            "bar", "verdict"]
    out = [f"baseline: {cmp['baseline'].iloc[0]}"
           + (f" ({cmp['baseline_gpu'].iloc[0]})" if cmp["baseline_gpu"].iloc[0] else ""),
           *([f"this: {cmp['run'].iloc[0]} ({cmp['gpu'].iloc[0]})"] if n_runs == 1 else []),
           "ratio = this time / baseline time (> 1: slower); noise = combined spread of the "
           "samples; bar = max(threshold, noise, k x combined trial spread, resolution floor)"
           f" with k = {rule.k:g}, or the class floor where a side has no trials"
           + (" (class floors always)" if rule.class_floors_always
              else " (a small-grid kernel's always)")]
    for exp, sub in cmp.groupby("experiment", sort=True):
        shown = sub if few else sub[sub["verdict"] != "same"]
        out.append(f"\n== {exp}: {len(sub)} comparison(s)"
                   + ("" if few else f", {len(shown)} not 'same' shown") + " ==")
        if len(shown):
            out.append(text_table([_fmt_row(r, n_runs > 1) for r in shown.itertuples()], head))
    s = summary(cmp)
    out.append("\n== verdicts per run ==")
    rows = [[r["run"], r["gpu"], *[str(r[v]) for v in VERDICTS],
             f"{r['worst_ratio']:.3f}" if pd.notna(r["worst_ratio"]) else ""]
            for _, r in s.iterrows()]
    out.append(text_table(rows, ["run", "gpu", *VERDICTS, "worst ratio"]))
    out += by_class(cmp)
    if note := no_trials_note(cmp):
        out.append(note)
    out += baseline_gaps(cmp)
    if note := not_measured_note(cmp):
        out.append(note)
    return "\n".join(out)


def class_floors_text() -> str:
    """'0.5 us for kernel, 0.5 us or 10 % for small-grid, 40 % for host-synchronous, ...'."""
    return ", ".join(" or ".join(x for x in (f"{s * 1e6:g} us" if s else "",
                                             f"{100 * r:g} %" if r else "") if x) + f" for {c}"
                     for c, (s, r) in CLASS_FLOORS.items())


def no_trials_note(cmp: pd.DataFrame) -> str:
    """Which timed comparisons were judged with the class floors (a side without trials)."""
    timed = cmp[cmp["ratio"].notna()]
    old = int((~timed["trials"].astype(bool)).sum())
    if not old:
        return ""
    return (f"{old} of {len(timed)} timed comparison(s) have a side measured without trials "
            "(recorded before trials, or measurement.trials 1): no between-trial spread and "
            "no resolution floor, so they were judged by the samples' noise and the class "
            f"floors ({class_floors_text()})")


def baseline_gaps(cmp: pd.DataFrame) -> list[str]:
    """Per baseline, what it lacks that this run has (a reference made by older code): the
    experiments it did not measure, the points it lacks in the others, and trials (without
    them its timed points are judged by the class floors). [] where it lacks nothing."""
    lines = []
    for label, sub in cmp.groupby("baseline", sort=False):
        only = sub[sub["verdict"] == "only this"]
        new_exps = sorted(set(only["experiment"]) - set(sub.loc[sub["verdict"] != "only this",
                                                                 "experiment"]))
        more = int((~only["experiment"].isin(new_exps)).sum())
        timed = sub[sub["ratio"].notna()]
        no_trials = int(timed["baseline_trial_spread"].isna().sum())
        parts = []
        if new_exps:
            n = int(only["experiment"].isin(new_exps).sum())
            parts.append(f"the experiments {', '.join(new_exps)} ({n} points)")
        if more:
            parts.append(f"{more} points of the experiments both measured")
        if no_trials:
            parts.append(f"trials at {no_trials} of its {len(timed)} timed points (judged by "
                         "the class floors there)")
        if parts:
            lines.append(f"{label} lacks what this run has: {'; '.join(parts)}")
    return lines


def point_reason(r: Any) -> str:
    """'1.124x > 1 + bar 6.3 % (k x trial spread)': why a point is not 'same'."""
    side = ">" if r.ratio > 1 else "<"
    edge = "1 + bar" if r.ratio > 1 else "1 / (1 + bar)"
    return f"{r.ratio:.3f}x {side} {edge}, bar {100 * r.bar:.1f} % ({r.bar_from})"


def class_groups(cmp: pd.DataFrame, per_class: int = 12) -> list[dict[str, Any]]:
    """The points that moved (slower, faster, unstable) grouped by class: the class's
    reason, its verdict counts and ratio range, and up to `per_class` points, each with
    what set its bar (the report's block and the text output)."""
    out = []
    for cls, sub in moved(cmp).groupby("class", sort=True):
        sub = sub.sort_values(["experiment", "point_id", "baseline"])
        out.append({
            "class": cls, "reason": CLASS_REASON[cls], "n": len(sub),
            "counts": ", ".join(f"{n} {v}" for v, n in sub["verdict"].value_counts().items()),
            "ratios": f"{sub['ratio'].min():.2f}-{sub['ratio'].max():.2f}x",
            "rows": [{"experiment": r.experiment, "point": r.point_id, "baseline": r.baseline,
                      "run": r.run, "ratio": f"{r.ratio:.3f}", "verdict": r.verdict,
                      "why": point_reason(r)} for r in sub.head(per_class).itertuples()],
            "more": max(0, len(sub) - per_class)})
    return out


def by_class(cmp: pd.DataFrame, per_class: int = 12) -> list[str]:
    """class_groups as text: one line per class, one per point with what set its bar."""
    out = [f"\n== not 'same', by class: {len(moved(cmp))} of "
           f"{int(cmp['ratio'].notna().sum())} timed point(s) =="]
    multi = cmp["run"].nunique() > 1
    for g in class_groups(cmp, per_class):
        out.append(f"{g['class']}: {g['n']} ({g['counts']}; ratios {g['ratios']}): "
                   f"{g['reason']}")
        width = max(len(f"{r['experiment']}/{r['point']}") for r in g["rows"])
        for r in g["rows"]:
            name = f"{r['experiment']}/{r['point']}"
            out.append(f"  {name:<{width}}  {r['verdict']:<8}  {r['why']}"
                       + (f"  [{r['run']}]" if multi else ""))
        if g["more"]:
            out.append(f"  ... {g['more']} more (--csv has them all)")
    return out


# -- the command ---------------------------------------------------------------------------------
def print_course(folders: list[str]) -> int:
    """`cudalab compare --course`: the course's numbers beside every folder (Markdown)."""
    from cudalab import course

    tables = {}
    for f in folders:
        load_points(Path(f), "run")  # the same checks: exists, holds results, schema
        tables[Path(f).name or str(f)] = course.run_table(Path(f))
    print(course.headline_markdown(tables))
    return 0


def run_command(folders: list[str], baseline: str | None, threshold: float,
                csv: str | None, fail_on_slower: bool, detail_runs: int = 5,
                course: bool = False, rule: Rule = DEFAULT_RULE) -> int:
    """`cudalab compare`: 0 done, 1 a point is slower and --fail-on-slower, 2 bad input."""
    if course:
        return print_course(([baseline] if baseline else []) + folders)
    if not 0 <= threshold < 10:
        raise CompareError(f"--threshold {threshold}: allowed values are 0 <= t < 10 "
                           "(a relative difference, 0.05 = 5 %)")
    base_folder = baseline if baseline is not None else (folders[0] if folders else None)
    rest = folders if baseline is not None else folders[1:]
    base_runs = load_runs(base_folder, "baseline") if base_folder else []
    runs = base_runs[1:] + [r for f in rest for r in load_runs(f, "run")]
    if not base_runs or not runs:
        raise CompareError("give at least two result folders (the first is the baseline), "
                           "or --baseline FOLDER and one more")
    cmp = compare_runs(base_runs[0], runs, threshold, rule)
    print(format_text(cmp, detail_runs, rule))
    if csv:
        try:
            safe_io.check_name(csv)
            write_comparison(cmp, Path(csv))
        except (safe_io.InputRefused, OSError) as exc:
            raise CompareError(f"--csv {safe_io.shown(csv)}: cannot write it: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        print(f"\nwrote {csv} ({len(cmp)} rows)")
    slower = cmp[cmp["verdict"] == "slower"]
    if fail_on_slower and len(slower):
        first = slower.iloc[0]
        print(f"\nFAIL: {len(slower)} kernel point(s) slower than the baseline by more than "
              f"their bar, e.g. {first['experiment']}/{first['point_id']} "
              f"({first['ratio']:.3f}x the time; bar {100 * first['bar']:.1f} %, "
              f"{first['bar_from']})")
        return 1
    return 0
