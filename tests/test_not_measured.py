"""A run without a GPU: every GPU point of the shipped config.yaml is recorded not_measured
(no timing, no check, no metrics). Each experiment's figures, expected effects, caption
claims, explanations, tables and "try this" must cope with such a table, and every check
on it must say "not measured": an effect that was never measured is never "not seen".

Two shapes of the same table: the metric columns (m_*) absent, as build_table makes them
from not-measured records alone, and present but empty, as when other rows carry them.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from cudalab import config as cfg
from cudalab import figures, report, results
from cudalab.experiments import REGISTRY
from cudalab.experiments.lesson import State

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
REASON = "not measured: no GPU here (no CUDA driver; CUDA_VISIBLE_DEVICES=unset)"


def _records(name: str, everything: bool) -> list[dict]:
    """not_measured records of every GPU point of `name` in the shipped config (everything:
    its CPU points too, as not_measured)."""
    conf = cfg.load(ROOT / "config.yaml")
    pts = REGISTRY[name].grid(conf)
    return [{"schema_version": results.SCHEMA_VERSION, "experiment": name,
             "variant": p.variant, "point_id": p.point_id, "params": p.params,
             "job_id": "test", "provenance": {}, "t_start": time.time(),
             "t_end": time.time(), "status": "not_measured", "reason": REASON}
            for p in pts if p.gpu or everything]


def _metric_names(name: str) -> list[str]:
    """The m_* columns the experiment's folder reads (found in its sources)."""
    src = "\n".join(p.read_text() for p in
                    sorted((ROOT / "cudalab" / "experiments" / name).glob("*.py")))
    return sorted(set(re.findall(r"\bm_[a-z0-9_]+", src)))


def not_measured_table(name: str, metric_cols: bool) -> pd.DataFrame:
    df = results.build_table(_records(name, everything=True))
    if metric_cols:
        for c in _metric_names(name):
            if c not in df:
                df[c] = np.nan
    return df


GPU_EXPERIMENTS = [n for n in REGISTRY if n != "static_analysis"]


@pytest.fixture(autouse=True)
def two_gpus_listed(monkeypatch):
    """NVML (the test's seam) lists two GPUs that CUDA cannot open: the grid of the lesson
    between GPUs, which follows the machine's GPUs, then has its GPU points too."""
    from cudalab.gpu_slots import TEST_GPUS_ENV

    monkeypatch.setenv(TEST_GPUS_ENV, '[{"index": 0, "uuid": "GPU-a"}, {"index": 1, '
                       '"uuid": "GPU-b"}]')


def test_every_experiment_has_gpu_points_in_the_default_config() -> None:
    """The table below is the one a GPU-less default run makes for each GPU experiment."""
    for name in GPU_EXPERIMENTS:
        assert _records(name, everything=False), name


@pytest.mark.parametrize("metric_cols", [False, True], ids=["m-absent", "m-nan"])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_all_not_measured(name: str, metric_cols: bool, tmp_path: Path) -> None:
    exp = REGISTRY[name]
    df = not_measured_table(name, metric_cols)
    assert len(df) and (df["status"] == "not_measured").all()
    assert not results.check_table(df)

    drawn = figures.draw_experiment(name, df, tmp_path)
    assert not any(drawn.values()), f"{name} drew a figure from no data: {drawn}"
    for fig in exp.lesson.figures:
        assert (tmp_path / name / f"{fig}.png").exists()

    sec = report._section(name, exp, report.roofline.annotate(df), tmp_path, 50, "raw",
                          report.roofline.annotate(df), {})
    assert sec["claims"] or not exp.lesson.claims
    for c in sec["claims"]:
        assert c.state is State.NOT_MEASURED, f"{name}: {c.statement!r} judged on no data"
        assert "not measured" in c.evidence, f"{name}: {c.statement!r}: {c.evidence}"
    assert not sec["contradictions"]
    assert sec["explanations"] == []  # nothing measured: nothing to explain
    assert sec["try_this"] == exp.lesson.try_this
    assert sec["counts"] == {"not_measured": len(df)}
    # not measured is not "not ok": the points are listed by reason, apart from failures
    assert sec["failures"] == []
    assert sec["not_measured"] == [{"reason": REASON.removeprefix("not measured: "),
                                    "n": len(df), "points": list(df["point_id"])}]
    assert figures.nothing_to_plot(df) == (f"not measured in this run: {len(df)} points "
                                           "(no GPU here)")


def test_a_failed_point_is_not_ok_and_a_not_measured_one_is_not() -> None:
    """The placeholder and the banner count each kind apart: a run with one failed point
    and GPU points not measured."""
    df = not_measured_table("vector_add", metric_cols=False)
    assert report.gpu_banner(df)["no_gpu"] is True
    assert report.gpu_banner(df)["n"] == len(df)
    failed = df.copy()
    failed.loc[failed.index[0], ["status", "reason"]] = ["failed", "launch failed"]
    assert figures.nothing_to_plot(failed) == ("no correct measurements to plot (1 points not "
                                               "ok: see the table)")
    assert report.gpu_banner(failed)["n"] == len(df) - 1
    measured = df.assign(status="ok", reason="", gpu_name="NVIDIA H100 80GB HBM3")
    assert report.gpu_banner(measured) is None
    some = measured.copy()
    some.loc[some.index[:3], ["status", "reason"]] = ["not_measured", REASON]
    assert report.gpu_banner(some)["no_gpu"] is False  # a GPU measured the rest


@pytest.mark.slow
def test_report_of_an_all_not_measured_run(tmp_path: Path) -> None:
    """The whole report of a run where no GPU point was measured renders, names the points
    as not measured, and says "not seen" nowhere."""
    df = results.build_table(r for n in REGISTRY for r in _records(n, everything=True))
    for name in REGISTRY:
        figures.draw_experiment(name, df, tmp_path / "figures")
    conf = cfg.load(ROOT / "config.yaml")
    out = report.render(df, tmp_path / "figures", conf, tmp_path / "report.html")
    page = out.read_text()
    assert 'data-state="not measured"' in page
    # the banner opens the page, right under the title
    header_end, banner = page.index("</header>"), page.index('<div class="banner no-gpu"')
    assert header_end < banner < page.index("<nav>")
    assert f"{len(df)} of {len(df)} points are <b>not measured</b>" in page
    assert "no GPU here" in page[banner:page.index("<nav>")]
    # never called "not ok", nor blamed on an old table; no template leftovers
    assert "not ok" not in page and "results from before the ceilings step" not in page
    assert "this run had no GPU" in page
    assert "measured, not measured" not in page
    assert "Computed from this run:</b> <span class=\"fact\">not measured" not in page
    for leftover in ("{{", "}}", "{%", ">None<", ">nan<", "undefined"):
        assert leftover not in page, leftover
    assert 'data-state="not seen"' not in page and 'class="fail"' not in page
    assert "contradicts the lesson" not in page
    assert "This run contradicts the lesson" not in page
