"""Every GPU of the machine in a local run: how many GPU jobs at once, which GPU each takes
(real locks between real processes), and the workflow's use of it. This machine has no GPU,
so the GPU list comes from CUDALAB_TEST_GPUS (the module's seam for NVML)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from cudalab import gpu_slots
from cudalab.gpu_slots import Gpu

ROOT = Path(__file__).resolve().parent.parent
TWO = [Gpu(0, "GPU-aaaaaaaa-0000", "00000000:18:00.0", "NVIDIA H100"),
       Gpu(1, "GPU-bbbbbbbb-1111", "00000000:2A:00.0", "NVIDIA H100")]


def fake_env(gpus: list[Gpu]) -> dict[str, str]:
    return {gpu_slots.TEST_GPUS_ENV: json.dumps([g.__dict__ for g in gpus])}


def test_usable_gpus_follow_cuda_visible_devices_and_the_config_list():
    assert gpu_slots.usable_gpus({}, TWO, env={}) == TWO
    assert gpu_slots.usable_gpus({}, TWO, env={"CUDA_VISIBLE_DEVICES": "1"}) == TWO[1:]
    # a UUID prefix, as CUDA takes it; an entry that matches nothing ends the list
    assert gpu_slots.usable_gpus({}, TWO, env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb,7,0"}) \
        == TWO[1:]
    assert gpu_slots.usable_gpus({"gpus": [0]}, TWO, env={}) == TWO[:1]
    assert gpu_slots.usable_gpus({"gpus": ["GPU-bbbbbbbb-1111"]}, TWO, env={}) == TWO[1:]
    assert gpu_slots.usable_gpus({"gpus": [5]}, TWO, env={}) == []


def test_jobs_are_pinned_only_where_there_is_a_choice():
    assert gpu_slots.pins({}, TWO, env={})
    assert not gpu_slots.pins({}, TWO[:1], env={}), "one GPU: nothing changes"
    assert gpu_slots.pins({"gpus": [1]}, TWO[1:], env={}), "a list given: that GPU"
    assert not gpu_slots.pins({}, TWO, env={"SLURM_JOB_ID": "7"}), "Slurm pins its jobs"
    assert not gpu_slots.pins({"gpu_index": 1}, TWO, env={}), "gpu_index: chosen by hand"
    assert not gpu_slots.pins({}, [], env={})


def test_local_gpu_count(monkeypatch):
    monkeypatch.setenv(gpu_slots.TEST_GPUS_ENV, json.dumps([g.__dict__ for g in TWO]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert gpu_slots.local_gpu_count({}) == 2
    assert gpu_slots.local_gpu_count({"gpus": [1]}) == 1
    monkeypatch.setenv(gpu_slots.TEST_GPUS_ENV, "[]")
    assert gpu_slots.local_gpu_count({}) == 1, "no GPU: the GPU jobs still run, one at a time"


HOLDER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from cudalab import gpu_slots
    gpus = [gpu_slots.Gpu(**g) for g in json.loads(sys.argv[1])]
    c = gpu_slots.claim(gpus, sys.argv[3], folder=Path(sys.argv[2]), timeout_s=30)
    import os
    print(json.dumps({"uuid": c.gpu.uuid, "cvd": os.environ["CUDA_VISIBLE_DEVICES"],
                      "t": time.time()}), flush=True)
    time.sleep(float(sys.argv[4]))
""")


def _holder(lock: Path, prefer: str, hold_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps([g.__dict__ for g in TWO]),
                             str(lock), prefer, str(hold_s)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_two_processes_take_two_gpus_and_a_third_waits_for_one(tmp_path):
    t0 = time.time()
    a, b = _holder(tmp_path, "", 3.0), _holder(tmp_path, "", 3.0)
    first = [json.loads(p.stdout.readline()) for p in (a, b)]
    assert {f["uuid"] for f in first} == {g.uuid for g in TWO}, "never two jobs on one GPU"
    assert all(f["cvd"] == f["uuid"] for f in first), "each pinned to its GPU by UUID"
    c = _holder(tmp_path, TWO[1].uuid, 0.0)
    third = json.loads(c.stdout.readline())
    assert third["t"] - t0 >= 2.5, "the third job waited until a GPU was free"
    for p in (a, b, c):
        p.wait(timeout=30)


def test_a_killed_job_frees_its_gpu(tmp_path):
    a = _holder(tmp_path, TWO[0].uuid, 60.0)
    assert json.loads(a.stdout.readline())["uuid"] == TWO[0].uuid
    a.kill()
    a.wait()
    c = _holder(tmp_path, TWO[0].uuid, 0.0)
    assert json.loads(c.stdout.readline())["uuid"] == TWO[0].uuid
    c.wait(timeout=30)


def test_a_job_prefers_the_gpu_its_experiment_ran_on(tmp_path, monkeypatch):
    raw = tmp_path / "raw" / "vector_add"
    raw.mkdir(parents=True)
    (raw / "_manifest.json").write_text(json.dumps({"provenance": {"gpu_uuid": TWO[1].uuid}}))
    monkeypatch.setenv(gpu_slots.TEST_GPUS_ENV, json.dumps([g.__dict__ for g in TWO]))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    c = gpu_slots.claim_for_job({}, raw)
    try:
        assert c is not None and c.gpu == TWO[1]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == TWO[1].uuid
        assert c.provenance()["gpu_smi_index"] == 1
    finally:
        c.release()


def test_a_gpus_list_naming_no_gpu_is_refused_with_the_machines_gpus(monkeypatch):
    monkeypatch.setenv(gpu_slots.TEST_GPUS_ENV, json.dumps([g.__dict__ for g in TWO]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    why = gpu_slots.problem({"gpus": [5]})
    assert "gpus: [5]" in why and "GPU 0 (NVIDIA H100, 00000000:18:00.0)" in why
    assert gpu_slots.problem({"gpus": [1]}) == ""


def test_the_lock_folder_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = gpu_slots.lock_dir()
    assert folder.stat().st_mode & 0o077 == 0


MIXED = ("run_name: mixed\nmeasurement: {warmup: 1, min_samples: 3, max_samples: 20, "
         "budget_s: 0.05}\ntelemetry: {nvidia_smi: false, nvml: false}\n"
         "experiments:\n  matmul:\n    sizes: [16]\n    variants: [cpu, tiled]\n"
         "    tiles: [16]\n")


def _snakemake(workdir: Path, config: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    (workdir / "c.yaml").write_text(config)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
           str(workdir), "--cores", "2", "results/raw/matmul/_manifest.json",
           "--configfile", "c.yaml"]
    run_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",
                                                                 "SLURM_JOB_ID")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=workdir,
                          env={**run_env, "XDG_RUNTIME_DIR": str(workdir), **env})


@pytest.mark.slow
def test_the_workflow_runs_one_gpu_job_per_gpu_and_pins_each(tmp_path):
    r = _snakemake(tmp_path, MIXED, fake_env(TWO))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    given = re.search(r"Provided resources: .*gpu\D*(\d+)", out)
    assert given and given.group(1) == "2", "Snakemake was given one GPU job per GPU"
    assert "2 GPU(s), one GPU job on each at a time" in out
    log = (tmp_path / "results" / "logs" / "measure_matmul.log").read_text()
    # no pycuda here: the GPU points are not measured, but the job had pinned itself first
    assert "CUDA_VISIBLE_DEVICES='GPU-aaaaaaaa-0000'" in log, log[-2000:]


@pytest.mark.slow
def test_the_workflow_refuses_a_gpus_list_that_names_no_gpu(tmp_path):
    r = _snakemake(tmp_path, MIXED + "gpus: [3]\n", fake_env(TWO))
    assert r.returncode != 0
    assert "gpus: [3] names no usable GPU" in r.stdout + r.stderr
    assert not (tmp_path / "results" / "raw" / "matmul").exists()


def test_the_report_lists_each_gpu_with_the_experiments_it_measured():
    import pandas as pd

    from cudalab.report import gpus_used

    df = pd.DataFrame({
        "experiment": ["vector_add", "vector_add", "matmul", "matmul"],
        "timer": ["events", "events", "events", "perf_counter"],
        "gpu_name": ["NVIDIA H100"] * 4,
        "gpu_uuid": [TWO[0].uuid, TWO[0].uuid, TWO[1].uuid, TWO[0].uuid],
        "gpu_smi_index": pd.array([0, 0, 1, 0], dtype="Int64"),
        "gpu_pci_bus_id": ["0000:18:00.0", "0000:18:00.0", "0000:2A:00.0", "0000:18:00.0"]})
    rows = gpus_used(df)
    assert [(r["index"], r["experiments"], r["points"]) for r in rows] == \
        [(0, "vector_add", 2), (1, "matmul", 1)], "the numpy point is no GPU's"


def test_the_h100_reference_reads_back_with_one_gpu():
    from cudalab import results
    from cudalab.report import gpus_used

    df = results.read_table(ROOT / "reports/reference/NVIDIA-H100-80GB-HBM3/results.csv")
    rows = gpus_used(df)
    assert len(rows) == 1 and rows[0]["name"] == "NVIDIA H100 80GB HBM3"


def test_a_process_that_may_have_started_cuda_is_not_pinned(monkeypatch, tmp_path):
    """CUDA reads CUDA_VISIBLE_DEVICES once: a claim in a process that imported pycuda's
    driver (a test session) would lock one GPU and measure on another."""
    import types

    monkeypatch.setenv(gpu_slots.TEST_GPUS_ENV, json.dumps([g.__dict__ for g in TWO]))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setitem(sys.modules, "pycuda.driver", types.ModuleType("pycuda.driver"))
    assert gpu_slots.claim_for_job({}, tmp_path) is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_released_claim_frees_the_gpu_and_restores_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    c = gpu_slots.claim(TWO, folder=tmp_path, timeout_s=5)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == TWO[0].uuid
    c.release()
    c.release()  # twice is harmless
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    again = gpu_slots.claim(TWO[:1], folder=tmp_path, timeout_s=5)  # not left locked
    again.release()


def test_gpus_from_the_command_line_as_strings_are_accepted_and_used():
    """`snakemake --config gpus=[0]` hands the list over as ['0']: the schema takes it and the
    slots read it as nvidia-smi's index 0 (on the GPU machine it was refused before)."""
    from cudalab import config as cfg
    base = yaml.safe_load(Path("config.yaml").read_text())
    assert not cfg.schema_problems({**base, "gpus": ["0", "GPU-aaaaaaaa-0000"]})
    assert cfg.schema_problems({**base, "gpus": ["64"]}), "index 64 is out of range"
    assert cfg.schema_problems({**base, "gpus": ["0; rm -rf /"]})
    assert gpu_slots.usable_gpus({"gpus": ["0"]}, TWO, env={}) == TWO[:1]


def test_a_pinned_job_takes_its_share_of_the_cores(monkeypatch):
    """Jobs of a local multi-GPU run share the cores: each of N concurrent GPU jobs gets
    cores // N BLAS threads; an unpinned job (one GPU, Slurm) keeps them all."""
    from cudalab import runner
    monkeypatch.setattr(runner, "_usable_cores", lambda: 64)
    monkeypatch.setenv(gpu_slots.TEST_GPUS_ENV, json.dumps(
        [{"index": g.index, "uuid": g.uuid} for g in TWO + [Gpu(2, "GPU-cccccccc-2222", "", "G")]]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", TWO[0].uuid)  # as the claim pinned it
    slot = gpu_slots.Claim(TWO[0], fd=-1, cvd_before=None)
    assert runner.shared_cores({}, slot) == 21, "3 GPUs: 64 // 3"
    assert runner.shared_cores({"gpus": [0, 1]}, slot) == 32
    assert runner.shared_cores({}, gpu_slots.Claim(TWO[0], -1, cvd_before="0,1")) == 32
    assert runner.shared_cores({}, None) == 64
ALL_HOLDER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from cudalab import gpu_slots
    gpus = [gpu_slots.Gpu(**g) for g in json.loads(sys.argv[1])]
    c = gpu_slots.claim_all(gpus, folder=Path(sys.argv[2]), timeout_s=30)
    print(json.dumps({"gpus": [g.index for g in c.gpus], "t": time.time(),
                      "cvd": os.environ["CUDA_VISIBLE_DEVICES"]}), flush=True)
    time.sleep(float(sys.argv[3]))
""")


def test_a_job_between_gpus_locks_them_all_and_one_gpu_jobs_wait(tmp_path):
    a = _holder(tmp_path, TWO[1].uuid, 2.0)
    assert json.loads(a.stdout.readline())["uuid"] == TWO[1].uuid
    t0 = time.time()
    every = subprocess.Popen([sys.executable, "-c", ALL_HOLDER,
                              json.dumps([g.__dict__ for g in TWO]), str(tmp_path), "2.0"],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    got = json.loads(every.stdout.readline())
    assert got["t"] - t0 >= 1.5, "it waited for the GPU a one-GPU job held"
    assert got["gpus"] == [0, 1] and got["cvd"] == ",".join(g.uuid for g in TWO)
    c = _holder(tmp_path, "", 0.0)
    assert json.loads(c.stdout.readline())["t"] - got["t"] >= 1.5, \
        "a one-GPU job waits while the job between GPUs holds them all"
    for p in (a, every, c):
        p.wait(timeout=30)


def test_claim_all_releases_everything(tmp_path):
    c = gpu_slots.claim_all(TWO, folder=tmp_path, timeout_s=5)
    try:
        assert c.provenance()["gpu_slot_gpus"] == [0, 1]
    finally:
        c.release()
    for g in TWO:  # both free again: a plain claim of each gets it at once
        d = gpu_slots.claim([g], folder=tmp_path, timeout_s=1)
        d.release()


@pytest.mark.slow
def test_the_job_between_gpus_takes_them_all_and_runs_alone(tmp_path):
    conf = MIXED + "  interconnect:\n    size_mib: 1\n"
    (tmp_path / "c.yaml").write_text(conf)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
           str(tmp_path), "--cores", "2", "results/raw/matmul/_manifest.json",
           "results/raw/interconnect/_manifest.json", "--configfile", "c.yaml"]
    run_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",
                                                                 "SLURM_JOB_ID")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**run_env, "XDG_RUNTIME_DIR": str(tmp_path), **fake_env(TWO)})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    block = out[out.index("output: results/raw/interconnect/_manifest.json"):][:600]
    assert re.search(r"resources: .*\bgpu=2\b", block), block
    log = (tmp_path / "results" / "logs" / "measure_interconnect.log").read_text()
    both = ",".join(g.uuid for g in TWO)
    assert f"CUDA_VISIBLE_DEVICES='{both}'" in log, log[-2000:]
