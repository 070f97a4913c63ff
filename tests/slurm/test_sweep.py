"""A GPU-model sweep on the real one-node Slurm: slurm.gpu_models: [fake, h100] (the test
cluster's two gres types) makes one doctor job per model (a small allocation with that
model's GPU) and one measure job per (experiment, model) with --gpus=<model>:1, each model
a complete run folder results/gpu/<model>/ (its table and figures), and one report setting
the models side by side. The grid is CPU-only (the fake GPUs cannot run kernels); the jobs
still ask for the model's GPU, as a sweep's jobs do.

The first run is stopped with Ctrl-C pressed twice (SIGINT to its process group) as soon as a
doctor has passed: neither the doctors' flags nor a queued job may survive it, so the
resumed run checks both GPUs again before measuring."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import pandas as pd
import pytest
import yaml
from test_slurm import scontrol_job, snakemake_cmd, submitted, write_config

MODELS = ["fake", "h100"]


def _interrupted_run(workdir, config) -> str:
    """Start the sweep and, once a doctor's flag is there, press Ctrl-C twice as a user at a
    terminal does: SIGINT to the whole process group (`timeout`, Snakemake and its sbatch /
    squeue children), the second press while the first one's cleanup runs. `timeout -s INT`
    forwards each to Snakemake once more."""
    proc = subprocess.Popen(snakemake_cmd(workdir, config), cwd=workdir, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    flags = workdir / "results" / "doctor"
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 120:
        if any(flags.glob("*.ok")):
            for _ in range(2):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT)
                time.sleep(0.5)
            break
        time.sleep(0.2)
    return proc.communicate(timeout=120)[0]


def _queued(workdir) -> list[str]:
    """The run's jobs still in squeue (pending, running or completing)."""
    out = subprocess.run(["squeue", "--me", "-h", "-o", "%i|%k|%Z"], capture_output=True,
                         text=True, timeout=30).stdout
    return [line for line in out.splitlines()
            if line.split("|")[-1] == str(workdir.resolve())]


@pytest.fixture(scope="module")
def sweep(slurm_cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run-sweep")
    config = write_config(workdir, ["cpu"])
    cfg = yaml.safe_load(config.read_text())
    cfg["slurm"] = {"runtime_min": 10, "mem_mb": 512, "cpus_per_task": 1,
                    "gpu_models": MODELS}
    config.write_text(yaml.safe_dump(cfg))
    first = _interrupted_run(workdir, config)
    left = sorted(p.name for p in (workdir / "results" / "doctor").glob("*.ok"))
    queued = _queued(workdir)
    proc = subprocess.run(snakemake_cmd(workdir, config), cwd=workdir, capture_output=True,
                          text=True, timeout=300)
    return workdir, proc.returncode, proc.stdout + proc.stderr, first, left, queued


@pytest.mark.slurm
def test_ctrl_c_leaves_no_doctor_flag_and_the_doctors_run_again(sweep):
    workdir, rc, log, first, left, queued = sweep
    assert submitted(first, "doctor"), f"the first run got as far as a doctor\n{first}"
    # the second Ctrl-C did not cut the first one's cleanup short (cudalab/interrupts.py)
    assert "KeyboardInterrupt" not in first, first
    assert left == [], f"Ctrl-C left the doctors' flags {left}; the first run said:\n{first}"
    assert queued == [], f"Ctrl-C left jobs in squeue {queued}\n{first}"
    assert rc == 0, log
    assert len(submitted(log, "doctor")) == 2, f"both GPUs checked again\n{log}"


@pytest.mark.slurm
def test_one_doctor_and_one_measure_job_per_model(sweep):
    workdir, rc, log, *_ = sweep
    assert rc == 0, log
    # the plan's first line and the sweep line count the same jobs, the doctors included
    assert "cudalab plan: 2 experiment job(s) (2 need a GPU) + 2 doctor job(s)" in log, log
    assert "= 2 measure job(s) + 2 doctor job(s) (one per model)" in log, log
    assert re.search(r"submitting 4 Slurm job\(s\) with sbatch: doctor_fake \(--gpus=fake:1\), "
                     r"doctor_h100 \(--gpus=h100:1\), matmul@fake \(--gpus=fake:1\), "
                     r"matmul@h100 \(--gpus=h100:1\)", log), log
    for job_id, _ in submitted(log, "doctor"):
        info = scontrol_job(job_id)
        assert "JobState=COMPLETED" in info and "TimeLimit=00:10:00" in info, info
        assert "CPUs/Task=1" in info and "MinMemoryNode=512M" in info, "a small allocation"
    doctors = {m: (workdir / "results" / "doctor" / f"doctor_{m}.md").read_text()
               for m in MODELS}
    for m, table in doctors.items():
        assert f"gres gres:gpu:{m}:1" in table, f"doctor_{m} asked for its own GPU\n{table}"
        assert (workdir / "results" / "logs" / f"doctor_{m}.log").is_file()
    by_model = {}
    for job_id, _ in submitted(log):
        info = scontrol_job(job_id)
        assert "JobState=COMPLETED" in info, info
        model = re.search(r"TresPerJob=gres:gpu:(\w+):1", info)
        assert model, f"no --gpus=<model>:1 in the job\n{info}"
        assert f"Comment=rule_measure_wildcards_results_gpu_{model.group(1)}_matmul" in info
        by_model[model.group(1)] = job_id
    assert sorted(by_model) == MODELS
    for m in MODELS:  # each model's records in its own folder, measured by its own job
        folder = workdir / "results" / "gpu" / m
        rec = pd.read_json(next((folder / "raw" / "matmul").glob("cpu-*.json")), typ="series")
        assert rec["provenance"]["slurm_job_id"] == by_model[m]
        assert rec["provenance"]["cuda_visible_devices"] != ""
        assert (folder / "logs" / "measure_matmul.log").is_file()


@pytest.mark.slurm
def test_every_model_has_its_table_and_figures_and_one_report_compares_them(sweep):
    workdir, rc, log, *_ = sweep
    assert rc == 0, log
    for m in MODELS:
        df = pd.read_csv(workdir / "results" / "gpu" / m / "results.csv", dtype=str)
        assert len(df) == 3
        assert (workdir / "results" / "gpu" / m / "figures" / "matmul" / "gflops.png").is_file()
    html = (workdir / "results" / "report.html").read_text()
    assert "This run against its baselines" in html and "results/gpu/h100" in html
    from cudalab import cli

    assert cli.main(["compare", str(workdir / "results")]) == 0  # one run per model
