"""On a GPU machine with Nsight Compute (pytest -m gpu): profile.ncu through the real runner.

A tiny grid (vector_add's smoke grid, matmul naive / conflicting / padded tiles at 512) is
run twice, counters off and on. With counters on every GPU point must be profiled, with
plausible values, each under its own kernel (the marker grouping found the right rows),
and the timings must be taken exactly as without them (same method, never under ncu).
Skipped where ncu is absent or may not read the counters (the reason is printed)."""

from __future__ import annotations

import copy
import math
import shutil

import pandas as pd
import pytest

from cudalab import config as cfg
from cudalab import profiler, results
from cudalab.experiments import REGISTRY
from cudalab.harness import PROFILE_TIMER
from cudalab.runner import run_experiment

pytestmark = pytest.mark.gpu

CONFIG = {
    "measurement": {"warmup": 1, "min_samples": 3, "max_samples": 20, "budget_s": 0.05},
    "telemetry": {"nvidia_smi": False, "nvml": False},
    "experiments": {
        # the block-rate probe (its own kernels, profiled under their names) is left out:
        # this grid checks the profiler on one kernel per variant
        "vector_add": dict(REGISTRY["vector_add"].smoke) | {"probe_blocks": []},
        "matmul": {"sizes": [512], "variants": ["naive", "tiled_conflict", "tiled_padded"],
                   "tiles": [32], "end_to_end": False},
    },
}
KERNEL = {"vector_add": "vector_add", "naive": "matmul_naive",
          "tiled_conflict": "matmul_tiled_conflict", "tiled_padded": "matmul_tiled_padded"}


def _run(results_dir, ncu: bool) -> tuple[pd.DataFrame, list[dict]]:
    config = cfg.validate(copy.deepcopy(CONFIG) | {"profile": {"ncu": ncu}})
    manifests = [run_experiment(config, name, results_dir) for name in ("vector_add", "matmul")]
    df = results.build_table(results.iter_records(results_dir / "raw"))
    assert results.check_table(df) == [] and (df["status"] == "ok").all(), df["reason"]
    return df.set_index("point_id"), manifests


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if shutil.which("ncu") is None:
        pytest.skip("ncu (Nsight Compute) is not on PATH")
    off, _ = _run(tmp_path_factory.mktemp("off"), ncu=False)
    on, manifests = _run(tmp_path_factory.mktemp("on"), ncu=True)
    gpu = on[on["timer"] != "perf_counter"]
    if (gpu["m_ncu_status"] == profiler.PERM_REASON).all():
        pytest.skip(profiler.PERM_REASON)
    return off, on, gpu, manifests


def test_every_gpu_point_is_profiled_under_its_own_kernel(runs):
    _, _, gpu, manifests = runs
    assert (gpu["m_ncu_status"] == "ok").all(), gpu["m_ncu_status"].to_dict()
    assert [m["profile"]["profiled"] for m in manifests] == [
        (gpu["experiment"] == e).sum() for e in ("vector_add", "matmul")]
    kernel = gpu["variant"].map(KERNEL).where(gpu["experiment"] == "matmul", "vector_add")
    assert (gpu["m_ncu_kernel"] == kernel).all(), gpu[["m_ncu_kernel"]]
    assert (gpu["m_ncu_kernels"] == 1).all()


def test_counters_are_plausible(runs):
    _, _, gpu, _ = runs
    for col in ("m_ncu_achieved_occupancy_pct", "m_ncu_theoretical_occupancy_pct",
                "m_ncu_dram_throughput_pct", "m_ncu_l2_throughput_pct"):
        assert gpu[col].between(0, 100).all() and (gpu[col] > 0).any(), gpu[col]
    hit = gpu["m_ncu_l2_hit_rate_pct"]
    assert hit[gpu["experiment"] == "matmul"].notna().all()
    # ncu's sector hit rate can read above 100 % for small kernels whose data all sits in
    # L2 (seen: 101.6 % on the H100, 110.6 % on the H200 for a 512^2 padded-tile matmul), so
    # no upper bound here; the lesson the report draws from it must hold: the naive matmul's
    # loads are mostly served by L2
    assert (hit.dropna() >= 0).all(), hit
    naive = hit[(gpu["experiment"] == "matmul") & (gpu["variant"] == "naive")]
    assert not naive.empty and (naive > 50).all(), naive
    assert (gpu["m_ncu_registers"] > 0).all() and (gpu["m_ncu_registers"] % 1 == 0).all()
    assert (gpu["m_ncu_top_stall"].str.len() > 0).all(), gpu["m_ncu_top_stall"]
    # the time pass (one pass, no replay, 5 launches) reads the harness's queued time:
    # within max(10 %, 0.5 us) (issue 8), at the clock the timings ran at
    assert (gpu["m_ncu_time_status"] == "ok").all() and (gpu["m_ncu_time_runs"] == 5).all()
    ours = gpu["time_median_s"] * 1e6
    gap = (gpu["m_ncu_time_us"] - ours).abs()
    assert (gap <= (0.1 * gpu["m_ncu_time_us"]).clip(lower=0.5)).all(), pd.DataFrame(
        {"ours_us": ours, "ncu_us": gpu["m_ncu_time_us"]})
    assert gpu["m_ncu_clock_mhz"].between(500, 5000).all(), gpu["m_ncu_clock_mhz"]


def test_bank_conflicts_show_where_the_course_says(runs):
    _, _, gpu, _ = runs
    mm = gpu[gpu["experiment"] == "matmul"].set_index("variant")["m_ncu_smem_bank_conflicts"]
    assert mm["naive"] == 0  # no shared memory at all
    assert mm["tiled_conflict"] > 10 * max(mm["tiled_padded"], 1), mm.to_dict()


def test_timings_are_taken_as_without_the_profiler(runs):
    off, on, _, _ = runs
    assert sorted(off.index) == sorted(on.index)
    assert (on["timer"] == off.loc[on.index, "timer"]).all()
    assert not (on["timer"] == PROFILE_TIMER).any()
    assert "m_ncu_status" not in off.columns
    assert all(math.isfinite(t) and t > 0 for t in on["time_median_s"])


def test_a_latency_chase_brings_its_own_timer_and_agrees_by_it(tmp_path):
    """The chase times itself (%globaltimer): the profiling child records that reading too,
    and where it moved (a chain of 8 to 128 cache lines lands in other L2 slices in ncu's
    process) the agreement scales the harness's time by it; every point must then agree."""
    from cudalab import timing_report

    if shutil.which("ncu") is None:
        pytest.skip("ncu (Nsight Compute) is not on PATH")
    config = cfg.validate({
        "measurement": CONFIG["measurement"], "telemetry": CONFIG["telemetry"],
        "profile": {"ncu": True},
        "experiments": {"latency": {"variants": ["global_cg"], "min_bytes": 1024,
                                    "max_bytes": 16384, "steps": 4096}}})
    run_experiment(config, "latency", tmp_path)
    df = results.build_table(results.iter_records(tmp_path / "raw"))
    assert (df["status"] == "ok").all(), df["reason"]
    if (df["m_ncu_status"] == profiler.PERM_REASON).all():
        pytest.skip(profiler.PERM_REASON)
    assert (df["m_ncu_time_status"] == "ok").all(), df["m_ncu_time_status"]
    own, ours = df["m_ncu_own_timer"], df["m_ns_per_load"]
    assert own.notna().all() and (own / ours).between(0.7, 1.4).all(), (own, ours)
    a = timing_report.ncu_agreement(df)
    assert a is not None and a["n"] == len(df) == 5 and a["own_n"] == 5
    assert a["n_agree"] == a["n"], a["worst"]
