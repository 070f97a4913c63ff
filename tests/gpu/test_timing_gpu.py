"""On a GPU machine (pytest -m gpu): the harness's queued timing against Nsight Compute,
and the hold kernel's timeout on a real device (issue 8)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from cudalab.harness import Harness, Settings

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent


sys.path.insert(0, str(ROOT / "scripts"))
import bench_launch as bench  # noqa: E402 - a script, importable by its folder


@pytest.fixture(scope="module")
def session():
    from cudalab.gpu import open_session

    return open_session(0)


@pytest.mark.parametrize("name", bench.PROBES)
def test_queued_per_launch_time_agrees_with_nsight_compute(name, session):
    ncu = bench.ncu_times(name, count=20)
    if isinstance(ncu, str):
        pytest.skip(ncu)
    probe = bench.setup(session, name)
    t = Harness(Settings()).measure(probe.launch, session.event_timer(), asynchronous=True)
    assert t.timer == "cuda_event_queued", t.method_note
    ours, theirs = t.stats()["median"], statistics.median(ncu)
    assert abs(ours - theirs) <= max(0.10 * theirs, 0.5e-6), (
        f"{name}: harness {ours * 1e6:.2f} us vs ncu {theirs * 1e6:.2f} us")


def test_queued_time_is_below_the_hosts_launch_cost_for_a_short_kernel(session):
    probe = bench.setup(session, "vector_add_50000")
    costs = session.launch_costs(probe.func, probe.grid, probe.block, probe.args,
                                 probe.launch, reps=200)
    t = Harness(Settings()).measure(probe.launch, session.event_timer(), asynchronous=True)
    plain = Harness(Settings()).measure(probe.launch, session.event_timer())
    assert t.timer == "cuda_event_queued" and plain.timer == "cuda_event"
    kernel = t.stats()["median"]
    assert kernel < costs["host_call_s"] and kernel < costs["one_launch_s"]
    assert kernel < plain.stats()["median"]


def test_a_fn_that_blocks_the_host_times_out_the_hold_and_falls_back(session):
    probe = bench.setup(session, "vector_add_50000")

    def blocking() -> None:  # breaks the asynchronous contract: it waits for the GPU
        probe.launch()
        session.synchronize()

    s = Settings(warmup=1, min_samples=3, max_samples=5, min_sample_s=0)
    t = Harness(s).measure(blocking, session.event_timer(), asynchronous=True)
    assert t.timer == "cuda_event"
    assert "timed out" in t.method_note
    # the context is fine afterwards and the queued timer works again
    t2 = Harness(s).measure(probe.launch, session.event_timer(), asynchronous=True)
    assert t2.timer == "cuda_event_queued" and t2.method_note == ""


def test_cublas_and_pinned_copies_are_timed_queued(session):
    """cuBLAS (CuPy on the legacy default stream) and pinned async copies only enqueue work,
    so the experiments time them queued; the time is then device time, below one call's
    host cost for the course's small GEMM (seen: 8.3 us queued vs 30 us one call at a time)."""
    import numpy as np

    from cudalab.experiments import REGISTRY
    from cudalab.experiments.base import RunContext
    from cudalab.experiments.matmul import _import_cupy

    h = Harness(Settings(budget_s=0.2))
    ctx = RunContext(gpu=session, harness=h, rng=np.random.default_rng(0), config={},
                     block={"min_bytes": 4096, "max_bytes": 4096, "step": 4,
                            "directions": ["h2d"], "memory": ["pinned"]})
    tr = REGISTRY["transfer"]
    tr.prepare(ctx)
    res = tr.measure(ctx, tr.points(ctx.block)[0])
    assert res.check.passed and res.timing.timer == "cuda_event_queued", res.timing.method_note
    if isinstance(_import_cupy(), str):
        pytest.skip("CuPy is not importable: the cuBLAS half needs it")
    mm = REGISTRY["matmul"]
    block = {**mm.settings_in(None), "sizes": [[160, 240, 320]], "variants": ["cublas"],
             "end_to_end": False}
    ctx.block = block
    res = mm.measure(ctx, mm.points(block)[0])
    assert res.check.passed
    assert res.timing.timer == "cuda_event_queued", res.timing.method_note
    assert res.extra["queued"] is True
