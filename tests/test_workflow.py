"""The real Snakemake workflow, run end to end in a scratch directory (CPU-only grids)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

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


@pytest.mark.slow
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
    log = (workdir / "results" / "logs" / "measure_matmul.log").read_text()
    assert log.count("cached from") == 3, log  # the job's output goes to its log

    # drawn again by hand, without --config, the report describes this run (its own
    # results/config.json), though the folder has no config.yaml
    again = workdir / "again.html"
    r4 = subprocess.run([sys.executable, "-m", "cudalab.cli", "report", "--out", str(again)],
                        capture_output=True, text=True, cwd=workdir, timeout=300)
    assert r4.returncode == 0, r4.stderr[-2000:]
    assert "ci-cpu" in again.read_text()


MIXED = ("run_name: mixed\nmeasurement: {warmup: 1, min_samples: 3, max_samples: 20, "
         "budget_s: 0.05}\ntelemetry: {nvidia_smi: false, nvml: false}\n"
         "experiments:\n  matmul:\n    sizes: [16, 64]\n    variants: [cpu, tiled]\n"
         "    tiles: [16]\n")


@pytest.mark.slow
def test_without_a_gpu_cpu_points_are_measured_and_gpu_points_marked_not_measured(workdir):
    """Issue 12 item 3: plain snakemake on a GPU-less machine ends with a report; the GPU
    points are 'not_measured' (what was looked for), one short message, no traceback; a
    rerun measures the rest (here: still no GPU, so the CPU points come from the cache)."""
    cfg = workdir / "mixed.yaml"
    cfg.write_text(MIXED)
    env = {"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_ID": "", "SLURM_JOBID": ""}
    r = snakemake(workdir, "--configfile", str(cfg), env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert (workdir / "results" / "report.html").exists()
    assert "2 GPU point(s) were not measured: no GPU here (matmul 2)" in out
    assert "run the same command on a GPU machine" in out
    log = (workdir / "results" / "logs" / "measure_matmul.log").read_text()
    assert "Traceback" not in log and "Traceback" not in out
    assert log.count("not measured: no GPU here") == 1, log
    df = results.read_table(workdir / "results" / "results.csv")
    assert results.check_table(df) == []
    by = dict(zip(df["point_id"], df["status"]))
    assert by == {"cpu-m16-k16-n16": "ok", "cpu-m64-k64-n64": "ok",
                  "tiled-m16-k16-n16-tile16": "not_measured",
                  "tiled-m64-k64-n64-tile16": "not_measured"}
    gpu_rows = df[df["status"] == "not_measured"]
    assert gpu_rows["reason"].str.startswith("not measured: no GPU here (").all()
    assert gpu_rows["reason"].str.contains("CUDA_VISIBLE_DEVICES=''").all()
    assert gpu_rows["time_median_s"].isna().all() and gpu_rows["gflops"].isna().all()
    # the rerun (on a GPU machine it would measure the two GPU points) reuses the CPU points
    r2 = snakemake(workdir, "--configfile", str(cfg), env=env)
    out2 = r2.stdout + r2.stderr
    assert r2.returncode == 0, out2[-3000:]
    assert "2 GPU point(s) not measured yet" in out2
    log = (workdir / "results" / "logs" / "measure_matmul.log").read_text()
    assert log.count("cached from") == 2, log


def test_a_slurm_gpu_job_without_a_gpu_fails_loudly(workdir):
    cfg = workdir / "mixed.yaml"
    cfg.write_text(MIXED)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_ID": "4242",
           "SLURMD_NODENAME": "gpu07"}
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "measure", "matmul", "--config",
                        str(cfg), "--results", str(workdir / "results")], cwd=workdir,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 3, r.stderr
    assert "no usable CUDA GPU" in r.stderr and "CUDA_VISIBLE_DEVICES is ''" in r.stderr
    assert "Slurm job 4242 on node gpu07" in r.stderr and "asked for a GPU" in r.stderr
    assert "Traceback" not in r.stderr
    raw = workdir / "results" / "raw" / "matmul"
    assert not raw.exists() or not list(raw.glob("[!_]*.json"))  # no invented numbers


@pytest.mark.slow
def test_a_damaged_record_is_named_and_its_point_measured_again(workdir):
    """Issue 12 item 4: a truncated raw record is found at the next start, named, and its
    point re-measured (the job reruns although its manifest existed); never dropped."""
    r = snakemake(workdir, "--configfile", "config.cpu.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    victim = workdir / "results" / "raw" / "matmul" / "cpu-m64-k64-n64.json"
    text = victim.read_text()
    victim.write_text(text[: len(text) // 2])  # half a file, as a full disk would leave it
    r2 = snakemake(workdir, "--configfile", "config.cpu.yaml")
    out = r2.stdout + r2.stderr
    assert r2.returncode == 0, out[-3000:]
    assert f"damaged record {Path('results/raw/matmul/cpu-m64-k64-n64.json')}" in out
    assert "Nothing to be done" not in out
    log = (workdir / "results" / "logs" / "measure_matmul.log").read_text()
    assert log.count("cached from") == 2, log  # the two intact points
    assert results.read_record(victim)["status"] == "ok"
    df = results.read_table(workdir / "results" / "results.csv")
    assert len(df) == 3 and (df["status"] == "ok").all()
    r3 = snakemake(workdir, "--configfile", "config.cpu.yaml")
    assert "Nothing to be done" in r3.stdout + r3.stderr


def test_aggregate_names_a_damaged_record_it_leaves_out(workdir):
    raw = workdir / "results" / "raw" / "matmul"
    raw.mkdir(parents=True)
    (raw / "cpu-m1-k1-n1.json").write_text('{"schema_version": 1, "experi')
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "aggregate", "--results",
                        str(workdir / "results"), "--out", str(workdir / "t.csv")],
                       capture_output=True, text=True, timeout=120)
    assert "damaged record" in r.stderr and "cpu-m1-k1-n1.json" in r.stderr


@pytest.mark.slow
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


@pytest.mark.slow
def test_manifest_records_counts_and_seed(workdir):
    r = snakemake(workdir, "--configfile", "config.cpu.yaml")
    assert r.returncode == 0
    m = json.loads((workdir / "results/raw/matmul/_manifest.json").read_text())
    assert m["counts"]["ok"] == 3 and isinstance(m["seed"], int)
    assert m["telemetry"]["nvidia_smi"] == "not applicable"
    df = pd.read_csv(workdir / "results" / "results.csv")
    assert df["config_hash"].notna().all()


def test_a_dry_run_writes_nothing(workdir):
    """Nothing is written while Snakemake parses the workflow: results/config.json and the
    measure jobs' rerun records are written by the run itself (onstart, the jobs)."""
    r = snakemake(workdir, "-n", "--configfile", "config.cpu.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (workdir / "results").exists()


@pytest.mark.slow
def test_a_doctor_flag_left_by_a_killed_run_never_lets_measure_jobs_start_unchecked(workdir):
    """Ctrl-C removes the doctor's flag (onerror); one a killed Snakemake left is removed at
    the next start, which stops before any job, and the run after it checks again."""
    r = snakemake(workdir, "results/raw/matmul/_manifest.json", "--configfile", "config.cpu.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    flag = workdir / "results" / "doctor" / "doctor.ok"
    assert not flag.exists(), "temp(): removed once its measure job ended"
    flag.touch()  # as a killed run leaves it
    again = ("--configfile", "config.cpu.yaml", "--forcerun", "measure")
    r = snakemake(workdir, *again)
    assert r.returncode != 0 and "was left by a run that was killed" in r.stderr, r.stderr
    assert not flag.exists()
    r = snakemake(workdir, "-n", *again)
    assert r.returncode == 0 and "rule doctor:" in r.stdout + r.stderr, r.stdout[-3000:]
