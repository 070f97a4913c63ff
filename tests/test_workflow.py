"""The real Snakemake workflow, run end to end in a scratch directory (CPU-only grids)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from cudalab import results

ROOT = Path(__file__).resolve().parent.parent

SNAKEFILE = ROOT / "Snakefile"


def snakemake(workdir, *args, env=None, timeout=300):
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "--directory", str(workdir),
           "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                          env={**os.environ, **(env or {})})


def test_dry_run_of_the_shipped_config_plans_one_job_per_experiment(tmp_path):
    r = snakemake(tmp_path, "-n", "--configfile", str(ROOT / "config.yaml"))
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "cudalab plan:" in out
    assert "measure" in out and "html_report" in out


def test_bad_config_stops_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiments:\n  matmul:\n    tiles: [64]\n")
    r = snakemake(tmp_path, "--configfile", str(bad))
    assert r.returncode != 0
    assert "experiments.matmul.tiles[0]" in r.stderr and "[8, 16, 32]" in r.stderr
    assert not (tmp_path / "results").exists()


def test_cpu_workflow_end_to_end_then_nothing_to_redo(workdir):
    r = snakemake(workdir, "--configfile", "config.cpu.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    report = workdir / "results" / "report.html"
    assert report.exists()
    assert f"report written to {report.resolve()}" in r.stdout + r.stderr
    df = results.read_table(workdir / "results" / "results.csv")
    assert results.check_table(df) == []
    assert (df["status"] == "ok").all() and (df["variant"] == "cpu").all()
    assert len(df) == 3
    for ext in ("png", "svg"):
        assert (workdir / "results" / "figures" / "matmul" / f"gflops.{ext}").stat().st_size > 1000
    html = report.read_text()
    assert "data:image/png;base64," in html and "Matrix multiplication" in html
    assert (workdir / "results" / "logs" / "measure_matmul.log").read_text()

    r2 = snakemake(workdir, "--configfile", "config.cpu.yaml")
    assert r2.returncode == 0
    assert "Nothing to be done" in r2.stdout + r2.stderr

    # a forced rerun of the measure job reuses every measured point from disk
    r3 = snakemake(workdir, "--configfile", "config.cpu.yaml", "--forcerun", "measure")
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert (r3.stdout + r3.stderr).count("cached from") == 3


def test_gpu_job_without_gpu_fails_at_once_with_a_clear_message(workdir):
    cfg = workdir / "gpu.yaml"
    cfg.write_text("experiments:\n  matmul:\n    sizes: [64]\n    variants: [cpu, tiled]\n"
                   "    tiles: [16]\n")
    r = snakemake(workdir, "--configfile", str(cfg), env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode != 0
    log = (workdir / "results" / "logs" / "measure_matmul.log").read_text()
    assert "no usable CUDA GPU" in log and "CUDA_VISIBLE_DEVICES is ''" in log
    assert "No numbers were recorded" in log
    raw = workdir / "results" / "raw" / "matmul"
    assert not raw.exists() or not list(raw.glob("*.json"))  # no invented numbers


def test_snakemake_report_includes_the_figures(workdir):
    r = snakemake(workdir, "--configfile", "config.cpu.yaml")
    assert r.returncode == 0, r.stderr[-2000:]
    r = snakemake(workdir, "--configfile", "config.cpu.yaml", "--report", "sm-report.zip")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (workdir / "sm-report.zip").stat().st_size > 10_000
    # the single-file form too, with the figures' captions
    r = snakemake(workdir, "--configfile", "config.cpu.yaml", "--report", "sm-report.html")
    assert r.returncode == 0, r.stderr[-3000:]
    page = (workdir / "sm-report.html").read_text()
    assert len(page) > 10_000 and "matmul" in page


def test_manifest_records_counts_and_seed(workdir):
    r = snakemake(workdir, "--configfile", "config.cpu.yaml")
    assert r.returncode == 0
    m = json.loads((workdir / "results/raw/matmul/_manifest.json").read_text())
    assert m["counts"]["ok"] == 3 and isinstance(m["seed"], int)
    assert m["telemetry"]["nvidia_smi"] == "not applicable"
    df = pd.read_csv(workdir / "results" / "results.csv")
    assert df["config_hash"].notna().all()
