"""The run's own figures, drawn by the figures step beside each lesson's: the roofline of the
run and of every experiment that asks for one (figures/_roofline/), the GPU telemetry of
every job and of the whole run (figures/_telemetry/), and the time ratios against the
report's baselines, one per experiment (figures/_compare/). Each folder holds an index.json
of what was drawn, with its caption, so the report embeds the figures without drawing.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from cudalab import figures, results, roofline, roofline_figure, telemetry_report
from cudalab.embed import data_uri
from cudalab.experiments import REGISTRY

ROOFLINE_DIR = "_roofline"
TELEMETRY_DIR = "_telemetry"
COMPARE_DIR = "_compare"
COMPARISON_CSV = "comparison.csv"  # in COMPARE_DIR: every (point, baseline) verdict
INDEX = "index.json"


def roofline_names(df: pd.DataFrame) -> list[str]:
    """The rooflines a table gets: the run's, and one per experiment in it that asks for one
    (Experiment.roofline)."""
    return [roofline_figure.RUN_FIGURE, *(n for n, e in REGISTRY.items()
                                          if e.roofline and (df["experiment"] == n).any())]


def draw_roofline(df: pd.DataFrame, name: str, out_dir: Path) -> dict[str, str] | None:
    """One roofline of the annotated table df ('run' or an experiment) into out_dir (PNG +
    SVG): {png, caption}, or None where there is nothing to draw."""
    figures.setup_style()
    exp = None if name == roofline_figure.RUN_FIGURE else name
    fig = roofline_figure.draw(df, exp)
    if fig is None:
        return None
    png = figures.save(fig, Path(out_dir) / name)[0]
    return {"png": str(png), "caption": roofline_figure.caption(df, exp)}


def draw(df: pd.DataFrame, results_dir: Path, figures_dir: Path,
         workers: int = 1) -> dict[str, int]:
    """Draw the rooflines of the table df and the telemetry of results_dir's jobs into
    figures_dir/_roofline and figures_dir/_telemetry (both made, even with nothing to
    draw: they are the figures step's declared outputs), each with its index; returns how
    many figures of each kind were drawn. workers > 1 draws them in that many processes
    (one figure a task: a run of several GPUs has a telemetry figure per job)."""
    roof_dir, tele_dir = Path(figures_dir) / ROOFLINE_DIR, Path(figures_dir) / TELEMETRY_DIR
    for d in (roof_dir, tele_dir):
        d.mkdir(parents=True, exist_ok=True)
    annotated = roofline.annotate(df) if len(df) else df
    names = roofline_names(annotated) if len(annotated) else []
    gpu_jobs = telemetry_report.gpu_jobs(Path(results_dir))
    drawn = _run([(draw_roofline, (annotated, n, roof_dir)) for n in names]
                 + [(telemetry_report.job_section, (Path(results_dir), tele_dir, m))
                    for m in gpu_jobs], workers)
    rooflines = {n: f for n, f in zip(names, drawn) if f is not None}
    jobs = drawn[len(names):]
    _write_index(roof_dir, {name: _relative(f, roof_dir) for name, f in rooflines.items()})
    figures.setup_style()
    summary = telemetry_report.run_summary(Path(results_dir), tele_dir)
    _write_index(tele_dir, {"jobs": [_relative(j, tele_dir) for j in jobs],
                            "summary": _relative(summary, tele_dir)})
    return {"roofline": len(rooflines),
            "telemetry": sum(bool(j["png"]) for j in jobs) + bool(summary)}


def _call(task: tuple[Callable[..., Any], tuple[Any, ...]]) -> Any:
    fn, args = task
    return fn(*args)


def _run(tasks: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], workers: int
         ) -> list[Any]:
    """Each task's result, in order: here, or in up to `workers` fresh processes (spawned:
    matplotlib's state is not forked)."""
    if workers <= 1 or len(tasks) <= 1:
        return [_call(t) for t in tasks]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=ctx) as pool:
        return list(pool.map(_call, tasks))


def draw_comparisons(df: pd.DataFrame, config: dict[str, Any], figures_dir: Path) -> int:
    """Compare this run with its baselines (report.baselines and, in a sweep, the other
    models' folders) once: the table (COMPARISON_CSV, which the report renders) and one
    time-ratio figure per experiment with a timed ratio, into figures_dir/_compare (made,
    with its index and an empty table, even with no baseline); returns how many figures."""
    from cudalab import compare, compare_report

    out_dir = Path(figures_dir) / COMPARE_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    cmp = compare_report.baseline_comparison(df, config) if len(df) else None
    compare.write_comparison(cmp, out_dir / COMPARISON_CSV)
    index = {}
    if cmp is not None:
        for exp in compare_report.timed_experiments(cmp):
            fig = compare_report.ratio_figure(cmp[cmp["experiment"] == exp], exp)
            png = figures.save(fig, out_dir / exp)[0]
            index[exp] = _relative({"png": str(png)}, out_dir)
    _write_index(out_dir, index)
    return len(index)


def _relative(entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The entry with its png named relative to its index's folder (a folder copied
    elsewhere, a committed reference, still finds its figures)."""
    png = entry.get("png")
    return entry | {"png": Path(png).relative_to(folder).as_posix()} if png else entry


def _write_index(folder: Path, index: dict[str, Any]) -> None:
    with results.atomic_path(folder / INDEX) as tmp:
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True))


def _read_index(folder: Path) -> dict[str, Any]:
    """A folder's index; {} where the figures step did not draw into it."""
    try:
        return json.loads((folder / INDEX).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _embedded(entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The entry as the report shows it: its figure as a data URI in src ('' if none)."""
    png = entry.get("png")
    out = {k: v for k, v in entry.items() if k != "png"}
    return out | {"src": data_uri(folder / png) if png else ""}


def comparison_table(figures_dir: Path, config: dict[str, Any]) -> pd.DataFrame | None:
    """The comparison table the figures step wrote (None where it compared nothing). Its
    absence is an error only where the config names baselines."""
    from cudalab import compare, compare_report, result_folders

    path = Path(figures_dir) / COMPARE_DIR / COMPARISON_CSV
    if path.exists():
        return compare.read_comparison(path)
    if compare_report.baseline_folders(config):
        raise result_folders.CompareError(
            f"{path} is missing: the run has baselines (report.baselines or a sweep's other "
            "models), and the figures step compares with them before the report "
            "(cudalab compare-figures)")
    return None


def read(figures_dir: Path) -> dict[str, Any]:
    """What the figures step drew into figures_dir, embedded for the report: rooflines
    (name -> {src, caption}), telemetry (one entry per GPU job: job_id, status, src,
    caption), telemetry_summary ({src, caption}; {} without samples) and comparisons
    (experiment -> data URI of its ratio figure)."""
    roof_dir, tele_dir = Path(figures_dir) / ROOFLINE_DIR, Path(figures_dir) / TELEMETRY_DIR
    cmp_dir = Path(figures_dir) / COMPARE_DIR
    tele = _read_index(tele_dir)
    summary = tele.get("summary") or {}
    return {"rooflines": {name: _embedded(f, roof_dir)
                          for name, f in _read_index(roof_dir).items()},
            "telemetry": [_embedded(j, tele_dir) for j in tele.get("jobs", [])],
            "telemetry_summary": _embedded(summary, tele_dir) if summary else {},
            "comparisons": {exp: _embedded(f, cmp_dir)["src"]
                            for exp, f in _read_index(cmp_dir).items()}}
