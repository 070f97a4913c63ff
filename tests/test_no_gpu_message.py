"""NoGpuError says the right thing: inside a Slurm job which job and node, what
CUDA_VISIBLE_DEVICES was and what to check; outside Slurm where GPU variants can run."""

from __future__ import annotations

import os

from cudalab.gpu import _no_gpu


def _clear_slurm(monkeypatch):
    for var in [v for v in os.environ if v.startswith("SLURM")]:
        monkeypatch.delenv(var)


def test_inside_a_slurm_job_names_node_devices_and_what_to_check(monkeypatch):
    _clear_slurm(monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu07")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    msg = str(_no_gpu("the driver reports 0 devices"))
    for needle in ["the driver reports 0 devices", "CUDA_VISIBLE_DEVICES is ''",
                   "Slurm job 4242 on node gpu07", "GPUs Slurm gave it: none",
                   "slurm.gpu_model", "admins", "No numbers were recorded"]:
        assert needle in msg, msg
    assert "or a Slurm GPU job" not in msg  # we are in one


def test_outside_slurm_points_to_a_gpu_machine_or_slurm(monkeypatch):
    _clear_slurm(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    msg = str(_no_gpu("the driver reports 0 devices"))
    assert "CUDA_VISIBLE_DEVICES is unset" in msg and "Slurm GPU job" in msg
    assert "node" not in msg
