"""The report's comparison blocks: the course table at the top, baselines beside this run
(the points that moved grouped by class), a GPU-model sweep compared with itself; rendered
from the real H100 reference."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cudalab import cli, compare, compare_report, report, result_folders, results, run_figures
from cudalab import config as cfg

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
H200 = ROOT / "reports" / "reference" / "NVIDIA-H200"
QUIET = "naive-m4096-k4096-n4096-tile16"


@pytest.fixture(scope="module")
def h100():
    return results.read_table(REFERENCE / "results.csv")


@pytest.fixture(scope="module")
def slower_copy(tmp_path_factory) -> Path:
    """The reference with one matmul point made 20 % slower (this run is then faster)."""
    run = tmp_path_factory.mktemp("slower")
    for e in ("matmul", "device_query", "vector_add"):
        shutil.copytree(REFERENCE / "raw" / e, run / "raw" / e)
    path = run / "raw" / "matmul" / f"{QUIET}.json"
    rec = json.loads(path.read_text())
    rec["timing"]["samples_s"] = [1.2 * s for s in rec["timing"]["samples_s"]]
    path.write_text(json.dumps(rec))
    return run


def _config(**report_keys):
    return cfg.validate({"run_name": "h100-ref", "report": report_keys,
                         "experiments": {"matmul": {}, "vector_add": {}}})


def _render(df, config, tmp_path) -> str:
    out = report.render(df, tmp_path / "figures", config, tmp_path / "report.html")
    return out.read_text()


def _context(df, config) -> dict:
    """The comparison blocks' context from a comparison made here (the figures step's)."""
    return compare_report.report_context(df, config, compare_report.baseline_comparison(df, config))


@pytest.mark.slow
def test_course_table_opens_the_report(h100, tmp_path):
    html = _render(h100, _config(), tmp_path)
    main = html[html.index("<main>"):]
    assert main.index('id="course"') < main.index('id="device"')
    assert "The course's numbers beside this GPU" in main
    assert "Tesla K80" in main and 'class="claim-statement"' in main[:main.index('id="device"')]
    assert 'id="baselines"' not in main  # no baselines configured


@pytest.mark.slow
def test_baselines_in_the_report(h100, slower_copy, tmp_path):
    config = _config(baselines=[str(slower_copy), str(REFERENCE)])
    ctx = _context(h100, config)
    summary = {b["baseline"]: b for b in ctx["comparison"]["summary"]}
    assert summary[str(slower_copy)]["faster"] == 1  # the point made slower in the baseline
    assert summary[str(slower_copy)]["slower"] == 0
    assert summary[str(REFERENCE)]["faster"] == summary[str(REFERENCE)]["slower"] == 0
    assert summary[str(REFERENCE)]["geomean_ratio"] == pytest.approx(1.0)
    # points only this run has (it measured 11 experiments, the copy 3) are listed
    in_copy = h100["experiment"].isin(["matmul", "device_query", "vector_add"])
    assert summary[str(slower_copy)]["only this"] == int((~in_copy).sum())
    # the report compares nothing itself: without the figures step's table it stops
    with pytest.raises(result_folders.CompareError, match=r"_compare/comparison.csv is missing"):
        _render(h100, config, tmp_path)
    assert run_figures.draw_comparisons(h100, config, tmp_path / "figures") == 11
    html = _render(h100, config, tmp_path)
    assert "This run against its baselines" in html
    assert f"{slower_copy} lacks what this run has: the experiments atomics, " in html
    sec = html[html.index('<section id="matmul"'):]
    sec = sec[:sec.index("</section>")]
    assert sec.count("data:image/png;base64,") == 1
    assert re.search(rf"{QUIET}</td><td>{re.escape(str(slower_copy))}</td>.*?faster", sec, re.S)


def test_the_ratio_figures_are_drawn_once_and_the_same_each_time(h100, slower_copy, tmp_path):
    config = _config(baselines=[str(slower_copy)])
    figs = tmp_path / "figures"
    assert run_figures.draw_comparisons(h100, config, figs) == 2
    index = json.loads((figs / run_figures.COMPARE_DIR / "index.json").read_text())
    assert set(index) == {"matmul", "vector_add"}  # the experiments with a timed ratio
    first = {e: (figs / run_figures.COMPARE_DIR / f["png"]).read_bytes() for e, f in index.items()}
    run_figures.draw_comparisons(h100, config, figs)
    again = {e: (figs / run_figures.COMPARE_DIR / f["png"]).read_bytes() for e, f in index.items()}
    assert first == again  # the strip plot's jitter is seeded
    # no baseline: the folder and its (empty) index still exist, the figures step's output
    assert run_figures.draw_comparisons(h100, _config(), tmp_path / "none") == 0
    assert json.loads((tmp_path / "none" / "_compare" / "index.json").read_text()) == {}


@pytest.mark.slow
def test_the_points_that_moved_are_grouped_by_class_with_their_reason(h100, slower_copy,
                                                                     tmp_path):
    ctx = _context(h100, _config(baselines=[str(slower_copy)]))["comparison"]
    [g] = ctx["by_class"]
    assert g["class"] == "kernel" and g["n"] == 1 and g["counts"] == "1 faster"
    [row] = g["rows"]
    assert row["point"] == QUIET and row["verdict"] == "faster"
    assert row["why"].startswith("0.833x < 1 / (1 + bar), bar ")
    # the reference has trials on both sides: no note on points judged without them
    assert ctx["no_trials"] == "" and ctx["n_moved"] == 1
    run_figures.draw_comparisons(h100, _config(baselines=[str(slower_copy)]), tmp_path / "figures")
    html = _render(h100, _config(baselines=[str(slower_copy)]), tmp_path)
    block = html[html.index("Not the same, by class"):]
    assert "1 of " in block[:80] and QUIET in block
    assert "<th>unstable</th>" in html


@pytest.mark.slow
def test_the_comparison_is_written_once_and_read_back_as_it_was(h100, slower_copy, tmp_path):
    """The figures step writes the table; the report renders exactly what it compared."""
    config = _config(baselines=[str(slower_copy), str(H200)])
    cmp = compare_report.baseline_comparison(h100, config)
    run_figures.draw_comparisons(h100, config, tmp_path)
    back = run_figures.comparison_table(tmp_path, config)
    pd.testing.assert_frame_equal(back, cmp)  # NaN and "" kept apart, floats exact
    assert compare_report.report_context(h100, config, back) == _context(h100, config)
    # baselines dropped: the step writes an empty table, and no stale one is shown
    run_figures.draw_comparisons(h100, _config(), tmp_path)
    assert run_figures.comparison_table(tmp_path, _config()) is None


def test_bad_baseline_is_named_without_traceback(h100, tmp_path, capsys):
    (tmp_path / "results.csv").write_text("")
    h100.to_csv(tmp_path / "results.csv", index=False)
    conf = tmp_path / "config.yaml"
    for baseline, message in ((tmp_path / "missing", "does not exist"),
                              (tmp_path / "empty", "holds no results")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        conf.write_text(yaml.safe_dump({"report": {"baselines": [str(baseline)]},
                                        "experiments": {"matmul": {}}}))
        with pytest.raises(SystemExit) as exc:
            cli.main(["report", "--config", str(conf), "--table",
                      str(tmp_path / "results.csv"), "--figures", str(tmp_path / "f"),
                      "--results", str(tmp_path), "--out", str(tmp_path / "r.html")])
        rc, err = exc.value.code, capsys.readouterr().err
        # validate names the entry (its index and path) before the report reads anything
        assert rc == 2 and f"report.baselines[0]: '{baseline}' {message}" in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_baselines_key_is_in_the_schema():
    with pytest.raises(cfg.ConfigError, match="baselines"):
        cfg.validate({"report": {"baselines": "reports/reference"},
                      "experiments": {"matmul": {}}})
    assert _config()["report"]["baselines"] == []


def test_a_sweep_run_compares_its_gpus(h100, tmp_path):
    """A table holding two GPUs (a Slurm GPU-model sweep): the report compares them."""
    other = h100.copy()
    gpu = other["gpu_name"].notna()
    other.loc[gpu, "gpu_name"] = "NVIDIA H200"
    other.loc[gpu, "time_median_s"] = other.loc[gpu, "time_median_s"] * 0.5
    both = pd.concat([h100, other[gpu]], ignore_index=True)
    ctx = _context(both, _config())
    [s] = ctx["comparison"]["summary"]
    assert s["gpu"] == "NVIDIA H200" and ctx["comparison"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert s["slower"] > 300 and s["faster"] == 0  # the H100 takes twice the time
    assert s["geomean_ratio"] == pytest.approx(2.0)
    sms = ctx["course_rows"][0]
    assert sms["this"] == 132  # the course table is of the first GPU


def test_workflow_checks_baselines_at_start_up(tmp_path):
    """snakemake stops before any job with the folder named (a dry run is enough)."""
    import subprocess

    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"report": {"baselines": ["old/results"]},
                                    "experiments": {"matmul": {"variants": ["cpu"]}}}))
    proc = subprocess.run(["snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                           str(tmp_path), "--configfile", str(conf), "-n"],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "report.baselines[0]: 'old/results' does not exist" in out, out
    assert "Traceback" not in out



@pytest.mark.skipif(not H200.is_dir(), reason="no H200 reference committed")
def test_two_real_gpu_runs_compare_point_by_point(tmp_path):
    """The committed H100 and H200 references (two real GPUs, the same grid and code): every
    timed point is matched, both sides are named by their GPU, only static analysis rows
    differ (the swizzled rung is analysed at the tiles the run launches since 27411e5), the
    H200's larger DRAM bandwidth shows as faster memory-bound kernels, and the H200 report's
    comparison block is built with the H100 as its baseline."""
    [base] = result_folders.load_runs(REFERENCE)
    [h200] = result_folders.load_runs(H200)
    cmp = compare.compare_runs(base, [h200])
    unmatched = cmp[cmp["verdict"].isin(["only this", "only baseline", "not ok"])]
    assert set(unmatched["experiment"]) <= {"static_analysis"}
    timed = cmp[cmp["verdict"].isin(["faster", "slower", "same"])]
    assert len(timed) > 500 and set(timed["verdict"]) >= {"faster", "same"}
    faster = timed[timed["verdict"] == "faster"]
    assert {"coalescing", "vector_add"} <= set(faster["experiment"])  # DRAM-bound: HBM3e
    df = results.read_table(H200 / "results.csv")
    assert set(df["gpu_name"].dropna()) == {"NVIDIA H200"}
    assert (df["status"] == "ok").all()
    ctx = _context(df, _config(baselines=[str(REFERENCE)]))
    [row] = ctx["comparison"]["summary"]
    assert row["baseline"] == str(REFERENCE) and row["faster"] > 0
    # measured with the ceilings: every GPU memory point has its level, none is suspect
    gpu = df[df["memory_level"] != ""]
    assert set(gpu["memory_level"]) == {"dram", "l2"} and not gpu["suspect"].any()
