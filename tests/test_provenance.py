"""Provenance on every row, and the cache: a measurement is reused only when everything that
affects it matches (point_record.cache_key). CPU-only: the CPU matmul through the real runner."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from cudalab import config as cfg
from cudalab import provenance, results
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Point
from cudalab.harness import Settings
from cudalab.point_record import GPU_KEY, block_settings, cache_key, code_hash
from cudalab.runner import run_experiment

ROOT = Path(__file__).resolve().parent.parent


def _run(config, out):
    run_experiment(config, "matmul", out)
    return {r["point_id"]: r for r in results.iter_records(out / "raw")}


@pytest.fixture
def cpu_validated(cpu_config):
    return cfg.validate(copy.deepcopy(cpu_config))


def test_second_run_reuses_every_point_and_changed_settings_remeasure(cpu_validated, tmp_path):
    out = tmp_path / "results"
    first = _run(cpu_validated, out)
    assert len(first) == 3 and all(r["status"] == "ok" for r in first.values())
    assert not any(r.get("cached") for r in first.values())

    second = _run(cpu_validated, out)
    assert all(r["cached"] for r in second.values()), "second run must reuse every point"
    for pid, r in second.items():  # the numbers are the first run's, untouched
        assert r["t_start"] == first[pid]["t_start"] and r["job_id"] == first[pid]["job_id"]
        assert r["timing"]["samples_s"] == first[pid]["timing"]["samples_s"]

    # harness settings changed -> every point measured again
    c = copy.deepcopy(cpu_validated)
    c["measurement"]["min_samples"] += 1
    third = _run(c, out)
    assert not any(r.get("cached") for r in third.values())
    assert all(r["t_start"] > second[pid]["t_start"] for pid, r in third.items())

    # a scalar setting of the experiment (its tolerance) changed -> measured again
    c2 = copy.deepcopy(c)
    c2["experiments"]["matmul"]["tolerance"] = 2e-4
    fourth = _run(c2, out)
    assert not any(r.get("cached") for r in fourth.values())

    # one more size: the old points stay cached, only the new one is measured
    c3 = copy.deepcopy(c2)
    c3["experiments"]["matmul"]["sizes"].append(40)
    fifth = _run(c3, out)
    assert len(fifth) == 4
    assert [pid for pid, r in fifth.items() if not r.get("cached")] == ["cpu-m40-k40-n40"]


def test_cache_key_covers_what_affects_a_measurement():
    gpu_pt = Point("matmul", "tiled", {"m": 64, "k": 64, "n": 64, "tile": 16})
    cpu_pt = Point("matmul", "cpu", {"m": 64, "k": 64, "n": 64}, gpu=False)
    env = {"gpu_uuid": "GPU-1", "driver_version": "580.159.04", "cuda_version": "13.0.0",
           "pycuda_version": "2026.1", "nvcc_version": "13.0.88", "host": "h",
           "cpu_model": "c", "numpy_version": "2.0", "slurm_job_id": "1", "timestamp": "t1"}

    class K:
        source_hash = "abc"
        options = ["-O3", "-DTILE=16"]

    block = {"enabled": True, "sizes": [64], "tolerance": 1e-4, "end_to_end": True}
    s = Settings()
    base = cache_key(gpu_pt, s, env, K, block, "code1")
    assert base == cache_key(gpu_pt, s, env | {"slurm_job_id": "2", "timestamp": "t2",
                                                "host": "other"}, K, block, "code1")
    for k in GPU_KEY:
        assert cache_key(gpu_pt, s, env | {k: "changed"}, K, block, "code1") != base, k
    k2 = type("K2", (), {"source_hash": "abd", "options": K.options})
    k3 = type("K3", (), {"source_hash": "abc", "options": ["-O2"]})
    assert cache_key(gpu_pt, s, env, k2, block, "code1") != base
    assert cache_key(gpu_pt, s, env, k3, block, "code1") != base
    assert cache_key(gpu_pt, Settings(cold_l2=True), env, K, block, "code1") != base
    assert cache_key(gpu_pt, s, env, K, block, "code2") != base
    assert cache_key(gpu_pt, s, env, K, block | {"end_to_end": False}, "code1") != base
    assert cache_key(gpu_pt, s, env, K, block | {"sizes": [64, 128]}, "code1") == base
    assert cache_key(gpu_pt, s, env, K, block | {"enabled": False}, "code1") == base
    # CPU points: the host matters, the GPU does not
    cpu = cache_key(cpu_pt, s, env, None, block, "code1")
    assert cpu == cache_key(cpu_pt, s, env | {"gpu_uuid": "GPU-2"}, None, block, "code1")
    assert cpu != cache_key(cpu_pt, s, env | {"host": "other"}, None, block, "code1")
    assert cpu != cache_key(cpu_pt, s, env | {"cpu_model": "x"}, None, block, "code1")
    assert block_settings(block) == {"end_to_end": True, "tolerance": 1e-4}


def test_code_hash_follows_the_measuring_code(tmp_path):
    h = code_hash(REGISTRY["matmul"])
    assert re.fullmatch(r"[0-9a-f]{16}", h) and h == code_hash(REGISTRY["matmul"])
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    h1 = provenance.source_hash([a, b])
    a.write_text("x = 2\n")
    assert provenance.source_hash([a, b]) != h1
    assert provenance.source_hash([tmp_path / "missing.py"])  # a missing file still hashes


@pytest.mark.parametrize("text, want", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct  2 21:10:13 UTC "
     "2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", "580.159.04"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
     "(dvs-builder@U16-I1-N08-05-2)  Thu Oct  2 20:52:29 UTC 2025\n", "580.159.04"),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.129.03  Thu Oct 19 18:42:21 UTC "
     "2023\n", "535.129.03"),
    ("garbage\n", ""),
])
def test_driver_version_from_proc(text, want, tmp_path):
    p = tmp_path / "version"
    p.write_text(text)
    assert provenance.nvidia_driver_version(p) == want
    assert provenance.nvidia_driver_version(tmp_path / "absent") == ""


def test_job_provenance_and_git_state():
    env = provenance.job_provenance("cfg123")
    for k in ("host", "cpu_model", "python_version", "numpy_version", "git_commit",
              "git_dirty", "slurm_job_id", "slurm_node", "slurm_partition",
              "cuda_visible_devices", "config_hash"):
        assert k in env, k
    assert env["config_hash"] == "cfg123" and env["host"]
    if (ROOT / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{40}", env["git_commit"])
        assert isinstance(env["git_dirty"], bool)
    else:
        assert env["git_commit"] == "unknown"


def test_every_cpu_row_carries_its_provenance(cpu_validated, tmp_path):
    recs = list(_run(cpu_validated, tmp_path / "results").values())
    df = results.build_table(recs)
    assert results.check_table(df) == []
    for col in ("host", "cpu_model", "git_commit", "config_hash", "timestamp", "job_id"):
        assert df[col].notna().all() and (df[col].astype(str) != "").all(), col
    assert df["git_dirty"].notna().all() or (df["git_commit"] == "unknown").all()
    # GPU-side provenance is empty on CPU rows (it is tested on the GPU: tests/gpu)
    assert df["gpu_name"].isna().all() and df["kernel_hash"].isna().all()
    assert df["n_throttled"].isna().all()  # no GPU clock to watch: unknown, not 0
    # the per-point timestamp is an ISO 8601 UTC time
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", t)
               for t in df["timestamp"])
    assert all(r["provenance"]["code_hash"] == code_hash(REGISTRY["matmul"]) for r in recs)


def test_the_interpreter_modules_and_nvcc_are_recorded(tmp_path, monkeypatch):
    """Which Python measured (and where cudalab came from), the modules the job loaded and
    the nvcc on PATH: a site's modules decide what measured."""
    import sys

    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("LOADEDMODULES", "cuda/12.4:python/3.11")
    monkeypatch.setenv("PATH", f"{nvcc.parent}:/usr/bin:/bin")
    p = provenance.job_provenance("h")
    assert p["python_executable"] == sys.executable
    assert p["cudalab_path"] == str(ROOT / "cudalab")
    assert p["loaded_modules"] == "cuda/12.4:python/3.11" and p["nvcc_path"] == str(nvcc)
    monkeypatch.delenv("LOADEDMODULES")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert provenance.software_environment() == {"loaded_modules": "", "nvcc_path": ""}
