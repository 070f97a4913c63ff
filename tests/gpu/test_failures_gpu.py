"""On a GPU: a failing grid point (out of memory, launch failure) is recorded with its
reason, points measured before it stay on disk, and the job goes on or stops cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudalab import config as cfg
from cudalab import results
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Check, Experiment, Point, Result

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent


class Faulty(Experiment):
    name = "faulty"
    title = "test-only failures"
    schema = {"type": "object", "properties": {"plan": {"type": "array", "uniqueItems": False}},
              "additionalProperties": False}

    def points(self, block):
        return [Point(self.name, v, {"i": i}) for i, v in enumerate(block["plan"])]

    def kernel_for(self, ctx, point):
        return ctx.gpu.compile(str(HERE / "faulty.cu"))

    def measure(self, ctx, point):
        cuda = ctx.gpu.cuda
        k = self.kernel_for(ctx, point)
        if point.variant == "oom":
            cuda.mem_alloc(1 << 50)  # 1 PiB
        if point.variant == "wild":
            k.function("wild_write")(cuda.mem_alloc(4), block=(1, 1, 1), grid=(1, 1))
            ctx.gpu.synchronize()
        n = 1024
        buf = cuda.mem_alloc(4 * n)
        f = k.function("fill")
        launch = lambda: f(buf, np.int32(n), np.float32(3), block=(256, 1, 1), grid=(4, 1))  # noqa: E731
        launch()
        out = np.empty(n, np.float32)
        cuda.memcpy_dtoh(out, buf)
        t = ctx.harness.measure(launch, ctx.gpu.event_timer())
        return Result(t, 0.0, 4.0 * n, Check(float(np.abs(out - 3).max()), 0, "max_abs"),
                      kernel=k)


def _run(plan, tmp_path):
    from cudalab.runner import run_experiment

    REGISTRY["faulty"] = Faulty()
    try:
        config = cfg.validate({"measurement": {"min_samples": 3, "budget_s": 0.02},
                               "telemetry": {"nvidia_smi": False},
                               "experiments": {"faulty": {"plan": plan}}})
        return run_experiment(config, "faulty", tmp_path)
    finally:
        REGISTRY.pop("faulty")


def test_out_of_memory_point_is_recorded_and_the_job_goes_on(tmp_path):
    m = _run(["ok", "oom", "ok"], tmp_path)
    assert m["points"] == {"ok-i0": "ok", "oom-i1": "failed", "ok-i2": "ok"}
    rec = json.loads((tmp_path / "raw/faulty/oom-i1.json").read_text())
    assert rec["reason"].startswith("out of GPU memory")


def test_launch_failure_keeps_earlier_points_and_fails_the_rest(tmp_path):
    # In a subprocess: an illegal address poisons the CUDA context of its process.
    code = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent.parent)!r}]\n"
            "from pathlib import Path\n"
            "import test_failures_gpu as t\n"
            f"m = t._run(['ok', 'wild', 'ok'], Path({str(tmp_path)!r}))\n"
            "print(m['points'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = {x["point_id"]: x for x in results.iter_records(tmp_path / "raw")}
    assert recs["ok-i0"]["status"] == "ok"
    assert recs["wild-i1"]["status"] == "failed"
    assert recs["ok-i2"]["status"] == "failed"
    assert "context was lost" in recs["ok-i2"]["reason"]
