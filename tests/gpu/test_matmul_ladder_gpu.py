"""On a GPU machine (pytest -m gpu): the matmul ladder's kernels (vec4, dbuf, warptile,
pipelined, swizzled) are correct against the float64 CPU product at sizes no tile divides
(1000, 4100, the course's 160x240.240x320, an odd size whose rows are no multiple of 4
floats, so no float4 path),
through the experiment's own measure(); float64 naive / tiled (and cuBLAS DGEMM where CuPy
is there) match the float64 reference to 1e-12; the benchmark script runs standalone."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudalab import config as cfg
from cudalab.experiments import matmul as mm
from cudalab.experiments.base import Point, RunContext, Skipped
from cudalab.harness import Harness, Settings

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
EXP = mm.Matmul()
SIZES = [(1000, 1000, 1000), (4100, 4100, 4100), (160, 240, 320), (257, 263, 251)]
QUICK = Settings(warmup=1, min_samples=3, max_samples=5, budget_s=0.02)


@pytest.fixture(scope="module")
def ctx():
    from cudalab.gpu import open_session

    block = cfg.validate({"experiments": {"matmul": {
        "sizes": [list(s) for s in SIZES], "dtypes": ["float32", "float64"],
        "end_to_end": False}}})["experiments"]["matmul"]
    return RunContext(gpu=open_session(0), harness=Harness(QUICK),
                      rng=np.random.default_rng(0), config={"experiments": {"matmul": block}},
                      block=block)


def _ladder_configs() -> list[tuple[str, dict]]:
    vec4 = mm.DEFAULT_VEC4_TILES + [t for t in mm.Matmul.smoke["vec4_tiles"]
                                    if t not in mm.DEFAULT_VEC4_TILES]
    return ([("vec4", t) for t in vec4] + [("dbuf", t) for t in vec4]
            + [("warptile", t) for t in mm.DEFAULT_WARP_TILES]
            + [(v, t) for v in mm.PIPELINE_KERNELS for t in mm.DEFAULT_PIPE_TILES])


# size-major: the experiment keeps one size's inputs and float64 reference at a time
CASES = [(mkn, v, t) for mkn in SIZES for v, t in _ladder_configs()]


@pytest.mark.parametrize("mkn, variant, tile", CASES,
                         ids=["x".join(map(str, s)) + f"-{v}-" + "-".join(map(str, t.values()))
                              for s, v, t in CASES])
def test_ladder_kernel_is_correct_against_float64(ctx, mkn, variant, tile):
    m, k, n = mkn
    point = Point("matmul", variant, {"m": m, "k": k, "n": n} | tile)
    res = EXP.measure(ctx, point)
    assert res.check.passed, (point.point_id, res.check)
    assert res.check.error < 1e-5  # float32 over K <= 4100: ~1e-7 relative
    # queued timing (prepared_call, asynchronous) and the compiled kernel's resources
    assert res.timing.timer == "cuda_event_queued", res.timing.method_note
    assert res.metrics["regs"] > 0 and res.metrics["regs"] <= 255
    want_smem = (mm.warp_geometry(tile)["smem"] if variant == "warptile"
                 else mm.pipe_geometry(tile)["smem"] if variant in mm.PIPELINE_KERNELS
                 else mm.vec4_smem_bytes(tile["bt"], tile["bk"], 2 if variant == "dbuf" else 1))
    assert res.metrics["smem_bytes"] == want_smem
    assert 0 < res.metrics["occupancy"] <= 1


F64 = [(mkn, v, t) for mkn in [(1000, 1000, 1000), (160, 240, 320), (257, 263, 251)]
       for v, t in [("naive", 16), ("tiled", 8), ("tiled", 16), ("tiled", 32), ("cublas", None)]]


@pytest.mark.parametrize("mkn, variant, tile", F64,
                         ids=["x".join(map(str, s)) + f"-{v}-{t}" for s, v, t in F64])
def test_float64_products_match_the_float64_reference(ctx, mkn, variant, tile):
    m, k, n = mkn
    params = {"m": m, "k": k, "n": n} | ({"tile": tile} if tile else {}) | {"dtype": "float64"}
    point = Point("matmul", variant, params)
    try:
        res = EXP.measure(ctx, point)
    except Skipped as exc:
        pytest.skip(str(exc))
    assert res.check.tolerance == 1e-12 and res.check.passed, (point.point_id, res.check)
    assert res.check.error < 1e-13  # a double sum of K products: ~sqrt(K) * 1.1e-16
    assert res.bytes == 8.0 * (m * k + k * n + m * n)
    # the same kernel in float32 errs by ~1e-7: the float64 module really is double
    f32 = EXP.measure(ctx, Point("matmul", variant, {x: v for x, v in params.items()
                                                     if x != "dtype"}))
    assert f32.check.error > 1e-9 > res.check.error
    if ctx.gpu.info["compute_capability"] in mm.FP64_RATIO:
        assert res.metrics["peak_fp64_gflops"] > 0 and res.metrics["pct_peak_fp64"] > 0


def test_bench_script_runs_standalone(tmp_path):
    out = tmp_path / "ladder.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_matmul_ladder.py"),
                        "--sizes", "1000", "--variants", "naive", "vec4", "warptile", "cublas",
                        "--budget", "0.05", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    ok = [x for x in rows if x["status"] == "ok"]
    assert {x["variant"] for x in ok} >= {"naive", "vec4", "warptile"}
    assert len([x for x in ok if x["variant"] == "warptile"]) == len(mm.DEFAULT_WARP_TILES)
    assert all(x["correct"] and x["tflops"] > 0 for x in ok)
    if any(x["variant"] == "cublas" for x in ok):
        assert all(math.isfinite(x["pct_cublas"]) for x in ok)
    assert "TFLOP/s" in r.stdout and "% cuBLAS" in r.stdout
