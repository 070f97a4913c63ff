"""On a GPU machine (pytest -m gpu): the runner's issue-14/12 paths on a real device.

- verify_then_time poisons the output: a launch that writes nothing fails its check.
- a run with the GPU hidden (CUDA_VISIBLE_DEVICES='') records the GPU points not_measured
  and measures the CPU points; the same run with the GPU measures exactly the GPU points
  and reuses the CPU ones from the cache.
- a pycuda out-of-memory error is classified by its type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudalab import results

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent.parent

CONFIG = {"measurement": {"warmup": 1, "min_samples": 3, "max_samples": 20, "budget_s": 0.05},
          "telemetry": {"nvidia_smi": False, "nvml": False},
          "experiments": {"matmul": {"sizes": [64, 128], "variants": ["cpu", "tiled"],
                                     "tiles": [16], "end_to_end": False}}}


def _measure(out: Path, cvd: str | None) -> subprocess.CompletedProcess:
    """`cudalab measure matmul` in a fresh process (CUDA reads CUDA_VISIBLE_DEVICES once)."""
    cfg = out / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "cudalab.cli", "measure", "matmul",
                           "--config", str(cfg), "--results", str(out / "results")],
                          capture_output=True, text=True, timeout=600, env=env)


def test_hidden_gpu_gives_not_measured_then_the_gpu_run_measures_exactly_those(tmp_path):
    r = _measure(tmp_path, "")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("not measured: no GPU here") == 1
    raw = tmp_path / "results" / "raw"
    first = {x["point_id"]: x for x in results.iter_records(raw)}
    assert {k: v["status"] for k, v in first.items()} == {
        "cpu-m64-k64-n64": "ok", "cpu-m128-k128-n128": "ok",
        "tiled-m64-k64-n64-tile16": "not_measured",
        "tiled-m128-k128-n128-tile16": "not_measured"}
    r = _measure(tmp_path, os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("cached from") == 2  # the CPU points
    second = {x["point_id"]: x for x in results.iter_records(raw)}
    assert all(v["status"] == "ok" for v in second.values()), second
    for pid in ("tiled-m64-k64-n64-tile16", "tiled-m128-k128-n128-tile16"):
        assert second[pid]["check"]["passed"] and second[pid]["timing"]["n"] >= 3
        assert second[pid]["provenance"]["gpu_uuid"]


def test_verify_then_time_poisons_the_output_so_an_unwritten_result_fails():
    from cudalab.experiments import REGISTRY
    from cudalab.experiments.base import RunContext
    from cudalab.experiments.vector_add import check_sum
    from cudalab.gpu import open_session
    from cudalab.harness import Harness, Settings

    gpu = open_session(0)
    ctx = RunContext(gpu, Harness(Settings(warmup=0, min_samples=3, max_samples=3)),
                     np.random.default_rng(0), {}, {"tolerance": 1e-6})
    n = 4096
    a = np.ones(n, np.float32)
    host = np.zeros(n, np.float32)  # a stale, "correct-looking" host buffer must not pass
    c_d = gpu.cuda.mem_alloc(4 * n)
    gpu.cuda.memcpy_htod(c_d, a + a)  # the device buffer even holds the right sums
    try:
        check, timing = REGISTRY["vector_add"].verify_then_time(
            ctx, lambda: None, lambda c: check_sum(c, a, a, 1e-6), output=(c_d, host))
    finally:
        c_d.free()
    assert not check.passed and np.isnan(host).all()
    assert check.detail == f"{n} unwritten (NaN) elements" and timing.n == 3


def test_out_of_memory_is_classified_by_its_pycuda_type():
    import pycuda.driver as drv

    from cudalab.gpu import open_session
    from cudalab.runner import gpu_error_kind

    gpu = open_session(0)
    with pytest.raises(drv.MemoryError) as exc:
        gpu.cuda.mem_alloc(1 << 50)  # 1 PiB
    assert gpu_error_kind(exc.value) == "out of GPU memory"
