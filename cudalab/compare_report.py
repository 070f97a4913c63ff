"""The comparison in the run's report: this run beside its baselines (a sweep's other GPU
models, report.baselines), the table the figures step writes once and the report reads,
and the report's comparison section (verdict counts, ratio figures, rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cudalab.compare import (
    DEFAULT_RULE,
    DEFAULT_THRESHOLD,
    VERDICTS,
    compare_pair,
    moved,
    shares_a_point,
)
from cudalab.compare_text import (
    baseline_gaps,
    class_floors_text,
    class_groups,
    fmt_seconds,
    no_trials_note,
)
from cudalab.result_folders import CompareError, Run, load_runs, split_by_gpu, table_points


# -- the report: baselines beside this run, and the course table ---------------------------------
def _this_run(df: pd.DataFrame, config: dict[str, Any]) -> list[Run]:
    return split_by_gpu(table_points(df, "this run's results"), config["run_name"],
                        Path("results"))


def baseline_folders(config: dict[str, Any]) -> list[str]:
    """What the run is set beside: a sweep's other models' folders, then report.baselines."""
    from cudalab import sweep

    return sweep.other_model_folders(config) + config["report"].get("baselines", [])


def baseline_comparison(df: pd.DataFrame, config: dict[str, Any]) -> pd.DataFrame | None:
    """This run (its first GPU) against every other GPU of the run (a GPU-model sweep) and
    every folder in report.baselines; ratio = this run's time / the baseline's."""
    this = _this_run(df, config)
    bases = this[1:] + [r for f in baseline_folders(config)
                        for r in load_runs(f, "report.baselines:")]
    if not bases:
        return None
    frames = []
    for b in bases:
        c = compare_pair(b, this[0], DEFAULT_THRESHOLD)
        if not shares_a_point(c):
            raise CompareError(f"report.baselines: {b.label} shares no grid point with this "
                               f"run ({config['run_name']})")
        frames.append(c)
    return pd.concat(frames, ignore_index=True)


def verdict_summary(cmp: pd.DataFrame) -> list[dict[str, Any]]:
    """Per baseline: GPU, matched points, verdict counts and the geometric-mean time ratio."""
    out = []
    for label, sub in cmp.groupby("baseline", sort=False):
        timed = sub["ratio"].dropna()
        counts = sub["verdict"].value_counts()
        out.append({"baseline": label, "gpu": sub["baseline_gpu"].iloc[0],
                    "matched": int(sub["verdict"].isin(["faster", "slower", "same"]).sum()),
                    **{v: int(counts.get(v, 0)) for v in VERDICTS},
                    "geomean_ratio": float(np.exp(np.log(timed).mean())) if len(timed) else None})
    return out


def ratio_figure(sub: pd.DataFrame, experiment: str, max_hue: int = 8):
    """The time ratios of one experiment's points by variant (a matplotlib Figure), hue =
    the baseline (pooled into boxes when there are many baselines). The strip plot's jitter
    is seeded: the same comparison draws the same figure."""
    from cudalab.figures import setup_style

    setup_style()  # the style of every other figure
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import seaborn as sns

    d = sub.dropna(subset=["ratio"])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    state = np.random.get_state()  # seaborn's jitter draws from numpy's global generator
    np.random.seed(0)
    try:
        if d["baseline"].nunique() <= max_hue:
            sns.stripplot(d, x="variant", y="ratio", hue="baseline", dodge=True, ax=ax, size=4)
        else:
            sns.boxplot(d, x="variant", y="ratio", ax=ax, color="#8da0cb")
    finally:
        np.random.set_state(state)
    ax.axhline(1.0, color="#333", lw=0.8)
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set(title=f"{experiment}: this run's time / the baseline's (< 1: this run is faster)",
           xlabel="variant", ylabel="time ratio")
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    return fig


def timed_experiments(cmp: pd.DataFrame) -> list[str]:
    """The experiments of a comparison with at least one time ratio (each gets a figure)."""
    return sorted(e for e, sub in cmp.groupby("experiment") if sub["ratio"].notna().any())


def _section_rows(sub: pd.DataFrame, max_rows: int) -> list[dict[str, Any]]:
    rows = sub.sort_values(["point_id", "baseline"]).head(max_rows)
    return [{"point": r.point_id, "baseline": r.baseline,
             "baseline_time": fmt_seconds(r.baseline_s), "this_time": fmt_seconds(r.this_s),
             "ratio": f"{r.ratio:.3f}" if pd.notna(r.ratio) else "",
             "bar": f"{100 * r.bar:.1f} % ({r.bar_from})" if pd.notna(r.bar) else "",
             "verdict": r.verdict} for r in rows.itertuples()]


def report_context(df: pd.DataFrame, config: dict[str, Any], cmp: pd.DataFrame | None,
                   figures: dict[str, str] | None = None,
                   course_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the report template's comparison blocks read (reports/templates/compare*.j2):
    course_rows (the table that opens the report) and comparison (None without baselines:
    summary, and per experiment rows + figure). cmp is the comparison table as the figures
    step wrote it (baseline_comparison, read_comparison), figures: experiment -> the ratio
    figure's data URI, as that step drew it (run_figures.draw_comparisons); course_rows: the
    course table as the run's claims.json holds it; nothing here compares or draws."""
    from cudalab import course

    this = _this_run(df, config)[0] if len(df) else None
    own = df if this is None or not this.gpu else df[df["gpu_name"].isin([this.gpu]) |
                                                     df["gpu_name"].isna()]
    rows = course_rows if course_rows is not None else course.course_table(own)
    ctx: dict[str, Any] = {"course_rows": rows, "course_counts": course.verdict_counts(rows),
                           "course_rule": course.verdict_rule(), "comparison": None}
    if cmp is None:
        return ctx
    max_rows = config["report"]["max_table_rows"]
    figures = figures or {}
    sections = {exp: {"rows": _section_rows(sub, max_rows), "n_rows": len(sub),
                      "figure": figures.get(exp)}
                for exp, sub in cmp.groupby("experiment")}
    ctx["comparison"] = {"this": this.label, "gpu": this.gpu,
                         "summary": verdict_summary(cmp), "sections": sections,
                         "threshold": DEFAULT_THRESHOLD, "k": DEFAULT_RULE.k,
                         "class_floors": class_floors_text(),
                         "by_class": class_groups(cmp, max_rows),
                         "n_moved": len(moved(cmp)),
                         "n_timed": int(cmp["ratio"].notna().sum()),
                         "no_trials": no_trials_note(cmp),
                         "baseline_gaps": baseline_gaps(cmp)}
    return ctx
