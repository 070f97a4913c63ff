"""The report's timing section: convergence listing and the launch-overhead table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_harness import FakeObserver, FakeTimer

from cudalab import config as cfg
from cudalab import report, results, timing_report
from cudalab.harness import Harness, Settings

RECORDED = Path(__file__).resolve().parent / "data" / "recorded_h100" / "raw"


def test_recorded_h100_points_above_target_cv_are_listed_with_their_cv():
    df = results.build_table(results.iter_records(RECORDED))
    c = timing_report.convergence(df, default_target=0.02)
    # 12 GPU points (CPU points are timed by perf_counter); 3 end above 2 %
    assert c["n_gpu"] == 12 and c["n_converged"] == 9
    assert c["share_pct"] == pytest.approx(75.0)
    listed = {r["point_id"]: r["cv_pct"] for r in c["points"]}
    assert set(listed) == {"naive-m160-k240-n320-tile16", "tiled-m160-k240-n320-tile16",
                           "tiled-m160-k240-n320-tile8"}
    assert listed["tiled-m160-k240-n320-tile8"] == pytest.approx(19.6513, rel=1e-4)
    assert timing_report.launch_overhead(df) == []  # recorded before launch costs existed


def _record(point_id: str, timing, metrics=None, params=None, experiment="vector_add",
            variant="gpu") -> dict:
    return {"schema_version": results.SCHEMA_VERSION, "experiment": experiment,
            "variant": variant, "point_id": point_id, "params": params or {"n": 50000},
            "status": "ok", "timing": timing.as_dict(), "metrics": metrics or {},
            "work": {"flops": 5e4, "bytes": 6e5}, "provenance": {"gpu_name": "sim"}}


def _timing(durations, target_cv, observers=(), **kw):
    s = Settings(warmup=0, min_samples=5, max_samples=20, target_cv=target_cv, budget_s=60,
                 min_sample_s=0, **kw)
    t = Harness(s, observers=list(observers)).measure(lambda: None, FakeTimer(durations))
    t.timer = "cuda_event_queued"  # as the queued timer names it
    return t


def test_convergence_uses_each_points_own_target_and_lists_notes(tmp_path):
    quiet = _timing([2e-6], 0.02)
    noisy = _timing([2e-6, 3e-6], 0.02)  # CV ~ 20 %, stops at max_samples
    loose = _timing([2e-6, 3e-6], 0.5)  # the same noise under a 50 % target converges
    throttled = _timing([2e-6], 0.02, observers=[FakeObserver([True])])
    recs = [_record("quiet", quiet), _record("noisy", noisy), _record("loose", loose),
            _record("throttled", throttled)]
    df = results.build_table(recs)
    assert results.check_table(df) == []
    c = timing_report.convergence(df)
    assert c["n_gpu"] == 4 and c["n_converged"] == 3
    by_id = {r["point_id"]: r for r in c["points"]}
    assert set(by_id) == {"noisy", "throttled"}
    assert by_id["noisy"]["stop_reason"] == "max_samples" and by_id["noisy"]["cv_pct"] > 10
    assert by_id["throttled"]["note"] == ("all 20 samples throttled: statistics from "
                                          "throttled samples")
    assert math.isclose(by_id["noisy"]["target_pct"], 2.0)
    assert by_id["noisy"]["why"] == by_id["throttled"]["why"] == ""  # vector_add: no reason


def test_a_point_that_did_not_converge_says_why_where_its_experiment_knows(tmp_path):
    noisy = _timing([2e-6, 3e-6], 0.02)
    recs = [_record("pageable-directionh2d-size4096", noisy, experiment="transfer",
                    variant="pageable"),
            _record("pinned-directionh2d-size4096", noisy, experiment="transfer",
                    variant="pinned"),
            _record("pinned-directiond2h-size4096", _timing([2e-6], 0.02),
                    experiment="transfer", variant="pinned")]
    c = timing_report.convergence(results.build_table(recs))
    why = {r["point_id"]: r["why"] for r in c["points"]}
    assert set(why) == {"pageable-directionh2d-size4096", "pinned-directionh2d-size4096"}
    assert "staged by the CPU" in why["pageable-directionh2d-size4096"]
    assert "root complex" in why["pinned-directionh2d-size4096"]


def test_report_keeps_host_launch_cost_one_launch_and_kernel_apart(tmp_path):
    costs = {"host_call_s": 12.1e-6, "host_prepared_call_s": 4.2e-6, "one_launch_s": 14.3e-6}
    recs = [_record("gpu-n50000-threads256", _timing([2.04e-6], 0.02), costs,
                    {"n": 50000, "threads": 256}),
            _record("gpu-n1000-threads256", _timing([1.5e-6, 3e-6], 0.02), costs,
                    {"n": 1000, "threads": 256})]
    df = results.build_table(recs)
    rows = timing_report.launch_overhead(df)
    r = next(x for x in rows if x["point_id"] == "gpu-n50000-threads256")
    assert r["m_host_call_us"] == pytest.approx(12.1)
    assert r["m_host_prepared_call_us"] == pytest.approx(4.2)
    assert r["m_one_launch_us"] == pytest.approx(14.3)
    assert r["time_median_us"] == pytest.approx(2.04)
    assert r["params"] == "n=50000, threads=256"
    config = cfg.validate({"run_name": "sim", "experiments": {"vector_add": {}}})
    html = report.render(df, tmp_path / "figures", config, tmp_path / "r.html").read_text()
    for needle in ['id="timing"', "Launch overhead, measured apart from the kernel",
                   "host time of one launch from Python, prepared_call", "<td>12.1</td>",
                   "<td>4.2</td>", "<td>14.3</td>", "<td>2.04</td>", "1 of 2 GPU points (50 %)",
                   "gpu-n1000-threads256", "Points that did not converge"]:
        assert needle in html, needle


def _profiled(point_id: str, us: float, ncu_us: float, kernels: int = 1,
              status: str = "ok", time_status: str | None = "ok") -> dict:
    """SYNTHETIC TEST DATA: a queued point whose record carries ncu counters (and the time
    pass's status unless None: a table of before the time pass)."""
    metrics = {"ncu_time_us": ncu_us, "ncu_status": status, "ncu_kernels": kernels}
    if time_status is not None:
        metrics["ncu_time_status"] = time_status
    return _record(point_id, _timing([us * 1e-6], 0.02), metrics=metrics)


def test_kernel_time_against_nsight_compute_within_10_percent_or_half_a_microsecond():
    df = results.build_table([
        _profiled("a", 100.0, 109.0),  # 9 %: agrees
        _profiled("b", 100.0, 125.0),  # 25 %: does not
        _profiled("c", 2.0, 2.45),  # 22 % but 0.45 us: agrees (the 0.5 us floor)
        _profiled("d", 2.0, 2.7),  # 0.7 us: does not
        _profiled("e", 100.0, 300.0, kernels=3),  # several kernels: not compared
        _profiled("f", 100.0, 300.0, status="not profiled: no kernel ran",
                  time_status="not profiled: no kernel ran"),
        _profiled("g", 100.0, 300.0, time_status="not profiled: ncu timed out after 600 s"),
    ])
    a = timing_report.ncu_agreement(df)
    assert (a["n"], a["n_agree"]) == (4, 2) and a["share_pct"] == pytest.approx(50.0)
    assert a["method"].startswith("ncu's time pass")
    # c and d are the short kernels (< 5 us): ncu reads 0.45 and 0.7 us more, median 0.575
    assert a["short_n"] == 2 and a["short_gap_us"] == pytest.approx(0.575)
    assert [r["point_id"] for r in a["worst"]] == ["d", "b"]  # largest gap first
    assert a["worst"][0]["ratio"] == pytest.approx(1.35)
    assert timing_report.ncu_agreement(df.drop(columns=["m_ncu_time_us"])) is None
    # a table of before the time pass: the counters' status decides, and the method says so
    old = timing_report.ncu_agreement(df.drop(columns=["m_ncu_time_status"]))
    assert old["n"] == 5 and old["method"].startswith("ncu's replayed duration")


def test_a_kernel_that_ran_at_another_speed_under_ncu_is_compared_by_its_own_timer():
    """SYNTHETIC TEST DATA: latency chases whose own timer (ns per load, %globaltimer in the
    kernel) read 12 % more in ncu's child than in the timed run: ncu's 12 % longer duration
    is then the kernel's speed there, not a timing that disagrees; where the own timer read
    the same, a 12 % gap still counts against the harness."""
    def chase(pid: str, us: float, ncu_us: float, ns: float, ncu_ns: float | None) -> dict:
        metrics = {"ncu_time_us": ncu_us, "ncu_status": "ok", "ncu_kernels": 1,
                   "ncu_time_status": "ok", "ns_per_load": ns}
        if ncu_ns is not None:
            metrics["ncu_own_timer"] = ncu_ns
        return _record(pid, _timing([us * 1e-6], 0.02), metrics=metrics,
                       experiment="latency", variant="global_cg",
                       params={"working_set": 1024})

    df = results.build_table([
        chase("moved", 2164.0, 2430.0, 131.8, 148.0),  # own timer +12.3 %: agrees
        chase("same", 2164.0, 2430.0, 131.8, 131.8),  # own timer unchanged: 12 % off
        chase("unread", 2164.0, 2170.0, 131.8, None),  # no own reading: compared as is
        _profiled("plain", 100.0, 109.0),  # not a latency point: compared as is
    ])
    a = timing_report.ncu_agreement(df)
    assert (a["n"], a["n_agree"], a["n_agree_raw"], a["own_n"]) == (4, 3, 2, 2)
    assert [r["point_id"] for r in a["worst"]] == ["same"]
    assert a["worst"][0]["own_ratio"] == pytest.approx(1.0)
    assert [r["point_id"] for r in a["own_moved"]] == ["moved"]
    assert a["own_moved"][0]["own_ratio"] == pytest.approx(148.0 / 131.8)
    assert a["own_moved"][0]["ratio"] == pytest.approx(2430.0 / 2164.0)
    ratio = timing_report.own_timer_ratio(df)
    assert ratio.notna().sum() == 2 and math.isnan(ratio[df["point_id"] == "plain"].iloc[0])


def test_reference_report_shows_the_ncu_agreement(tmp_path):
    # the last H100 reference run made with Nsight Compute on (the current reference ran the
    # shipped config, which does not profile)
    ref = Path(__file__).resolve().parent / "data" / "h100_profiled_2026-11-25.csv.gz"
    df = results.read_table(ref)
    a = timing_report.ncu_agreement(df)
    assert a is not None and a["n"] > 400 and a["n_agree"] / a["n"] > 0.8
    page = report.render(df[df["experiment"].isin(["vector_add", "device_query"])], tmp_path,
                         cfg.validate({"experiments": {"vector_add": {}}}),
                         tmp_path / "r.html").read_text()
    assert 'id="ncu-agreement"' in page and "10% or 0.5 µs, whichever is larger" in page
