"""scripts/bench_stability.py: two fresh runs of a grid, their agreement and overhead."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_stability",
                                                  ROOT / "scripts" / "bench_stability.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_two_fresh_runs_through_cudalab_measure_on_the_cpu(bench, tmp_path):
    conf = tmp_path / "fast.yaml"
    conf.write_text("measurement: {warmup: 1, min_samples: 3, max_samples: 20, budget_s: 0.05}\n"
                    "experiments: {matmul: {variants: [cpu], sizes: [32, 48]}}\n")
    out = tmp_path / "stability"
    work = tmp_path / "work"
    assert bench.main(["--config", str(conf), "--work", str(work), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    s = data["summary"]
    assert s["runs"] == 2 and s["n"] == 2 and s["points"] == "timed (no GPU points)"
    assert s["failed"] == [{}, {}]
    assert 0 <= s["overhead_s_median"] < 1 and all(t > 0 for t in s["total_s"])
    # two separate results folders, each written by its own process
    for i in (1, 2):
        assert len(list((work / f"run{i}" / "raw" / "matmul").glob("cpu-*.json"))) == 2
    for p in data["points"]:
        assert p["median_s_run1"] > 0 and p["median_s_run2"] > 0 and p["rel_diff"] >= 0
    text = out.with_suffix(".txt").read_text()
    assert "agree within 5 %" in text and "overhead per point" in text
    assert data["meta"]["measurement"]["budget_s"] == 0.05  # settings from --config


def test_an_earlier_run_is_run_1(bench, tmp_path):
    """--against: an earlier results folder (here a first pass of the script) is run 1, and
    only one new run is measured; its numbers are compared like two fresh runs."""
    conf = tmp_path / "fast.yaml"
    conf.write_text("measurement: {warmup: 1, min_samples: 3, max_samples: 20, budget_s: 0.05}\n"
                    "experiments: {matmul: {variants: [cpu], sizes: [32, 48]}}\n")
    first = tmp_path / "first"
    assert bench.main(["--config", str(conf), "--work", str(first)]) == 0
    out, work = tmp_path / "stability", tmp_path / "work"
    assert bench.main(["--config", str(conf), "--work", str(work), "--out", str(out),
                       "--against", str(first / "run1"), "--runs", "1"]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    passes = data["meta"]["passes"]
    assert [p["dir"] for p in passes] == [str(first / "run1"), str(work / "run2")]
    assert passes[0]["earlier"] and not (work / "run1").exists()
    assert data["summary"]["runs"] == 2 and data["summary"]["n"] == 2
    with pytest.raises(SystemExit, match="no finished job for matmul"):
        bench.main(["--config", str(conf), "--against", str(tmp_path / "nothing"),
                    "--runs", "1"])


def _run(times):
    return {("e", f"p{i}"): {"median_s": t, "timer": "cuda_event_queued"}
            for i, t in enumerate(times)}


def test_agreement_shares_and_split_at_100_us(bench):
    a = _run([2e-6, 2e-6, 2e-6, 1e-3])
    b = _run([2.01e-6, 2.06e-6, 2.2e-6, 1e-3])  # 0.5 %, 3 %, 10 %, 0 %
    rows = bench.compare([a, b])
    ag = bench.agreement(rows)
    assert ag["points"] == "gpu" and ag["n"] == 4
    assert ag["agree_5pct"] == 75.0 and ag["agree_2pct"] == 50.0
    assert ag["n_short"] == 3 and ag["agree_5pct_short"] == pytest.approx(200 / 3)
    assert ag["agree_2pct_long"] == 100.0
    # a point missing from one run is not compared
    del b[("e", "p3")]
    assert len(bench.compare([a, b])) == 3
    assert math.isnan(bench.share([], 0.05))


def test_timed_seconds_are_per_launch_samples_times_batch(bench):
    assert bench.timed_s({"samples_s": [1.0, 2.0], "batch": 4}) == 12.0
    assert bench.timed_s(None) == 0.0
