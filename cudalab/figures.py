"""Seaborn figures: each experiment draws its own (Experiment.plot); this module gives them
one style and writes PNG + SVG atomically."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cudalab.experiments import REGISTRY
from cudalab.results import atomic_path


def setup_style() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook", palette="deep")


def save(fig, stem: Path) -> list[Path]:
    """stem.png and stem.svg, each written to a temp name then renamed."""
    import matplotlib.pyplot as plt

    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext, kw in (("png", {"dpi": 130}), ("svg", {})):
        path = stem.with_suffix(f".{ext}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, bbox_inches="tight", **kw)
        out.append(path)
    plt.close(fig)
    return out


def placeholder(title: str, why: str):
    """A figure that says why there is nothing to plot (keeps Snakemake outputs whole)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True, fontsize=11)
    return fig


def nothing_to_plot(sub: pd.DataFrame) -> str:
    """Why a figure has nothing to plot: points not measured (no GPU) are not measured,
    never counted as points that are not ok."""
    status = sub["status"].astype(str) if not sub.empty else pd.Series([], dtype=str)
    n_nm, n_bad = int((status == "not_measured").sum()), int((~status.isin(
        ["ok", "not_measured"])).sum())
    if n_bad:
        return f"no correct measurements to plot ({n_bad} points not ok: see the table)"
    if n_nm:
        why = sub.loc[status == "not_measured", "reason"].iloc[0]
        why = "" if pd.isna(why) else str(why).removeprefix("not measured: ").split(" (")[0]
        return f"not measured in this run: {n_nm} points" + (f" ({why})" if why else "")
    return "no data for this figure in this run's grid"


def draw_experiment(name: str, df: pd.DataFrame, out_dir: Path) -> dict[str, bool]:
    """Draw every declared figure of one experiment; returns name -> has data."""
    setup_style()
    exp = REGISTRY[name]
    sub = df[df["experiment"] == name]
    drawn = {}
    for fig_name in exp.lesson.figures:
        fig = exp.plot(fig_name, sub) if not sub.empty else None
        drawn[fig_name] = fig is not None
        if fig is None:
            fig = placeholder(f"{exp.lesson.title}: {fig_name}", nothing_to_plot(sub))
        save(fig, out_dir / name / fig_name)
    return drawn
