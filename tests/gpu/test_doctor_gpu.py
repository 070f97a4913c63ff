"""`cudalab doctor` on a GPU machine: every CUDA line passes (pytest -m gpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_doctor_passes_on_a_gpu_machine(tmp_path):
    p = subprocess.run([sys.executable, "-m", "cudalab.cli", "doctor", "--config", "",
                        "--json", str(tmp_path / "d.json")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cudalab doctor: ok: GPU experiments can run here" in p.stdout, p.stdout
    checks = {c["name"]: c for c in json.loads((tmp_path / "d.json").read_text())["checks"]}
    for name in ("nvcc", "nvidia-smi", "pycuda", "driver", "GPU(s)", "kernel compiled and run"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["kernel compiled and run"]["value"].endswith(": ok")
    assert checks["driver runs nvcc's code"]["status"] in ("ok", "warn")
    assert "MiB" in checks["free GPU memory"]["value"]
    assert checks["ncu (Nsight Compute)"]["status"] in ("ok", "warn", "info")
