"""The run folders of a GPU-model sweep (cudalab/sweep.py), the job counts the plan and the
workflow share, and the shell check that a job's modules are loaded (slurm_request)."""

from __future__ import annotations

import subprocess

import pytest

from cudalab import slurm_request, sweep


def test_folders_models_and_doctors():
    plain = {"slurm": {"gpu_models": [], "doctor": True}}
    two = {"slurm": {"gpu_models": ["a100", "h100"], "doctor": True}}
    assert sweep.folders(plain) == ["results"]
    assert sweep.folders(two) == ["results/gpu/a100", "results/gpu/h100"]
    assert sweep.measured_folder(two) == "results/gpu/a100"
    assert sweep.other_model_folders(two) == ["results/gpu/h100"]
    assert sweep.other_model_folders(plain) == []
    assert sweep.model_of("results") == "" and sweep.model_of("results/gpu/h100") == "h100"
    assert sweep.doctor_tag("results") == "doctor"
    assert sweep.doctor_tag("results/gpu/h100") == "doctor_h100"


@pytest.mark.parametrize("models,doctor,want", [
    ([], True, (3, 2, 1, 4)),  # 3 experiments (2 with GPU points) + 1 doctor
    (["a", "b"], True, (6, 6, 2, 8)),  # every sweep job asks for its model's GPU
    (["a", "b"], False, (6, 6, 0, 6)),
])
def test_job_counts(models, doctor, want):
    n = sweep.job_counts({"slurm": {"gpu_models": models, "doctor": doctor}},
                         ["x", "y", "z"], 2)
    assert (n.measure, n.gpu_measure, n.doctors, n.total) == want


def _guarded(modules: list[str], loaded: str) -> subprocess.CompletedProcess:
    script = "set -euo pipefail; { " + slurm_request.modules_guard(modules) + "echo RAN; }"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "LOADEDMODULES": loaded})


@pytest.mark.parametrize("modules,loaded,runs", [
    (["cuda/12.4"], "gcc/12:cuda/12.4", True),
    (["cuda"], "cuda/12.4", True),  # a default version: Lmod lists the full name
    (["cuda/12.4", "python/3.11"], "cuda/12.4", False),
    (["cuda/12"], "cuda/12.4", False),  # not a prefix of a version
    (["cuda/12.4"], "", False),
])
def test_modules_guard(modules, loaded, runs):
    p = _guarded(modules, loaded)
    assert ("RAN" in p.stdout) == runs and (p.returncode == 0) == runs, p
    if not runs:
        assert "is not loaded in this job" in p.stderr and "Fix slurm.modules" in p.stderr


def test_no_modules_no_guard():
    assert slurm_request.modules_guard([]) == ""
