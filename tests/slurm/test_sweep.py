"""A GPU-model sweep (issue 9) on the real one-node Slurm: slurm.gpu_models: [fake, h100]
(the test cluster's two gres types) makes one sbatch job per (experiment, model), each with
--gpus=<model>:1, results side by side in results/gpu/<model>/, and a report comparing them.
The grid is CPU-only (the fake GPUs cannot run kernels); the jobs still ask for the model's
GPU, as a sweep's jobs do."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest
from test_slurm import scontrol_job, snakemake_cmd, submitted, write_config

MODELS = ["fake", "h100"]


@pytest.fixture(scope="module")
def sweep(slurm_cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run-sweep")
    config = write_config(workdir, ["cpu"])
    import yaml

    cfg = yaml.safe_load(config.read_text())
    cfg["slurm"] = {"runtime_min": 10, "mem_mb": 512, "cpus_per_task": 1,
                    "gpu_models": MODELS}
    config.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(snakemake_cmd(workdir, config), cwd=workdir, capture_output=True,
                          text=True, timeout=300)
    return workdir, proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slurm
def test_one_job_per_model_with_its_gpu_type(sweep):
    workdir, rc, log = sweep
    assert rc == 0, log
    assert "GPU-model sweep (slurm.gpu_models): 1 experiment(s) x 2 model(s) = 2 sbatch" in log
    assert re.search(r"submitting 2 Slurm job\(s\).*matmul@fake \(--gpus=fake:1\), "
                     r"matmul@h100 \(--gpus=h100:1\)", log), log
    jobs = submitted(log)
    assert len(jobs) == 2, log
    by_model = {}
    for job_id, _ in jobs:
        info = scontrol_job(job_id)
        assert "JobState=COMPLETED" in info and "Comment=rule_measure_gpu_model" in info, info
        model = re.search(r"TresPerJob=gres:gpu:(\w+):1", info)
        assert model, f"no --gpus=<model>:1 in the job\n{info}"
        by_model[model.group(1)] = job_id
    assert sorted(by_model) == MODELS
    for m in MODELS:  # each model's records in its own folder, measured by its own job
        rows = pd.read_json(next((workdir / "results" / "gpu" / m / "raw" / "matmul")
                                 .glob("cpu-*.json")), typ="series")
        assert rows["provenance"]["slurm_job_id"] == by_model[m]
        assert rows["provenance"]["cuda_visible_devices"] != ""


@pytest.mark.slurm
def test_the_report_compares_the_models(sweep):
    workdir, rc, log = sweep
    assert rc == 0, log
    df = pd.read_csv(workdir / "results" / "results.csv", dtype=str)
    assert len(df) == 3  # the first model's points
    html = (workdir / "results" / "report.html").read_text()
    assert "This run against its baselines" in html and "results/gpu/h100" in html
    from cudalab import cli

    assert cli.main(["compare", str(workdir / "results")]) == 0  # one run per model
