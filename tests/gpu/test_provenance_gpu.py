"""On a GPU machine (pytest -m gpu): a small matmul run through the real runner fills every
provenance column of its GPU rows, and its telemetry (nvidia-smi + NVML) is complete, parsed
and on the points' clock. Nothing here changes clocks or any other GPU setting."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cudalab import config as cfg
from cudalab import nvml_clocks, results, telemetry, telemetry_report
from cudalab.runner import run_experiment

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent
HAVE_SMI = shutil.which("nvidia-smi") is not None


def _config(**measurement):
    return cfg.validate({
        "run_name": "gpu-provenance",
        "measurement": {"warmup": 2, "min_samples": 5, "max_samples": 50, "budget_s": 0.2,
                        **measurement},
        "telemetry": {"nvidia_smi": True, "nvml": True, "interval_ms": 50},
        "experiments": {"matmul": {"sizes": [256, 1024], "variants": ["cpu", "tiled"],
                                   "tiles": [16], "cpu_max_size": 256}},
    })


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("prov")
    t0 = time.time()
    manifest = run_experiment(_config(), "matmul", out)
    recs = list(results.iter_records(out / "raw"))
    return {"out": out, "manifest": manifest, "recs": recs, "t0": t0, "t1": time.time()}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_gpu_rows_carry_complete_provenance(job):
    df = results.build_table(job["recs"])
    assert results.check_table(df) == []
    gpu = df[df["variant"] != "cpu"]
    assert len(gpu) == 2 and (gpu["status"] == "ok").all(), gpu[["point_id", "reason"]]
    for col in ("gpu_name", "gpu_uuid", "compute_capability", "driver_version", "cuda_version",
                "pycuda_version", "nvcc_version", "nvcc_options", "kernel_hash", "host",
                "cpu_model", "git_commit", "config_hash", "timestamp", "job_id"):
        vals = gpu[col].astype("string")
        assert vals.notna().all() and (vals.str.strip() != "").all(), col
    r = gpu.iloc[0]
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", r["gpu_uuid"])
    assert re.fullmatch(r"\d+\.\d+", r["compute_capability"])
    # the NVIDIA driver version (580.159.04), not the CUDA driver API version (13.0)
    assert re.fullmatch(r"\d{3,}\.\d+(\.\d+)?", r["driver_version"]), r["driver_version"]
    assert r["nvcc_version"] != "unavailable" and re.match(r"\d+\.\d+", r["nvcc_version"])
    assert "-O3" in r["nvcc_options"] and "-DTILE=16" in r["nvcc_options"]
    assert re.fullmatch(r"[0-9a-f]{16}", r["kernel_hash"])
    head = subprocess.run(["git", "-c", f"safe.directory={ROOT}", "rev-parse", "HEAD"],
                          cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout: its commit, and whether it was dirty
        assert r["git_commit"] == head.stdout.strip()
        assert not pd_isna(r["git_dirty"])
    else:  # a copy without usable git metadata says so instead of guessing
        assert r["git_commit"] == "unknown"
    assert df["gpu_uuid"].nunique() == 1
    # Slurm columns exist on every row; inside a Slurm job they are filled
    for col in ("slurm_job_id", "slurm_node", "slurm_partition", "cuda_visible_devices"):
        assert col in df.columns
    if os.environ.get("SLURM_JOB_ID"):
        assert (df["slurm_job_id"] == os.environ["SLURM_JOB_ID"]).all()
        assert (df["slurm_node"].astype("string").str.strip() != "").all()


def pd_isna(v) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def test_driver_version_matches_nvidia_smi(job):
    if not HAVE_SMI:
        pytest.skip("nvidia-smi not on PATH")
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    smi_versions = {line.strip() for line in out.stdout.splitlines() if line.strip()}
    gpu = [r for r in job["recs"] if r["variant"] != "cpu"]
    assert {r["provenance"]["driver_version"] for r in gpu} <= smi_versions


def test_nvml_watched_every_gpu_sample(job):
    m = job["manifest"]
    assert m["telemetry"]["nvml"] == "ok", m["telemetry"]
    for r in job["recs"]:
        t = r["timing"]
        if r["variant"] == "cpu":
            assert t["n_throttled"] is None  # no GPU clock behind a CPU sample
            continue
        assert isinstance(t["n_throttled"], int) and 0 <= t["n_throttled"] <= t["n"]
        assert t["chunks"] and all(c["sm_clock_mhz_before"] > 0 and c["max_sm_clock_mhz"] > 0
                                   for c in t["chunks"])
        assert all(r["t_start"] <= c["t"] <= c["t_end"] <= r["t_end"] for c in t["chunks"])
        assert len(t["throttled"]) == t["n"]


@pytest.mark.skipif(not HAVE_SMI, reason="nvidia-smi not on PATH")
def test_nvidia_smi_telemetry_is_complete_and_on_the_points_clock(job):
    m, out = job["manifest"], job["out"]
    tel = m["telemetry"]
    assert tel["nvidia_smi"] == "ok", tel
    assert not tel["nvidia_smi_warnings"], tel["nvidia_smi_warnings"]
    # driver 580: the new field names were chosen from --help-query-gpu
    assert "clocks_event_reasons.active" in tel["nvidia_smi_fields"]
    assert tel["nvidia_smi_utc_offset_s"] is not None and tel["nvidia_smi_utc_offset_s"] % 900 == 0
    assert tel["nvidia_smi_samples"] >= 3
    # the sampler is gone
    assert tel["nvidia_smi_pid"] and not _alive(tel["nvidia_smi_pid"])
    tdir = out / "telemetry" / m["job_id"]
    for f in ("nvidia_smi.csv", "nvidia_smi_before.xml", "nvidia_smi_after.xml",
              "nvidia_smi_fields.txt", "phases.json"):
        assert (tdir / f).stat().st_size > 0, f
    assert "<nvidia_smi_log>" in (tdir / "nvidia_smi_before.xml").read_text()
    df = telemetry_report.load_samples(tdir / "nvidia_smi.csv", m)
    # the real header parsed into the logical columns, with numbers in them
    for col in telemetry.QUERY_FIELDS:
        if col in ("power.draw.instant", "enforced.power.limit", "temperature.memory",
                   "pstate"):
            continue  # optional
        assert col in df.columns, (col, list(df.columns))
    for col in ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu",
                "clocks_event_reasons.active", "pcie.link.gen.current"):
        assert df[col].notna().any(), col
    # one clock: every sample falls inside the job (±2 s for start-up and shut-down)
    assert df["t"].notna().all()
    assert df["t"].min() >= job["t0"] - 2 and df["t"].max() <= job["t1"] + 2, (
        df["t"].min() - job["t0"], df["t"].max() - job["t1"])
    # the figures step draws it
    secs = [s for s in telemetry_report.sections(out, out / "figures" / "_telemetry")
            if s["job_id"] == m["job_id"]]
    assert secs and Path(secs[0]["png"]).is_file(), secs
    assert secs[0]["status"] == ""


def test_nvml_observer_reads_the_gpu():
    from cudalab import gpu as gpumod

    session = gpumod.open_session(0)
    obs = nvml_clocks.NvmlClockObserver(0, 0.85, pci_bus_id=session.info["gpu_pci_bus_id"])
    assert obs.active, obs.status()
    obs.before_batch()
    info = obs.after_batch()
    assert info["max_sm_clock_mhz"] > 0 and info["sm_clock_mhz_after"] > 0
    facts = obs.device_facts()
    assert facts["gpu_uuid"] == session.info["gpu_uuid"] or not session.info["gpu_uuid"]
    obs.after_job()


def test_cold_l2_runs_measure_one_launch_per_sample(tmp_path):
    config = _config(cold_l2=True)
    config["experiments"]["matmul"] |= {"sizes": [256], "variants": ["tiled"],
                                        "end_to_end": False}
    m = run_experiment(config, "matmul", tmp_path)
    recs = list(results.iter_records(tmp_path / "raw"))
    assert m["counts"]["ok"] == 1 and recs[0]["timing"]["batch"] == 1
