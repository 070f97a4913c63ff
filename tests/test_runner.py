"""The runner's own rules, through the real run_experiment on CPU-only test experiments:
the cache reuses only ok records, the stop rule honours min_samples, errors are classified by
type, a timed GPU result needs a check, the manifest carries the harness settings."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from cudalab import config as cfg
from cudalab import point_record, results, runner
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Check, Experiment, Point, Result
from cudalab.harness import Harness, Settings, Timing, WallTimer


class Counting(Experiment):
    """Two CPU points; `passes` decides whether their check passes; counts measure()."""

    name = "counting"
    schema = {"type": "object"}

    def __init__(self) -> None:
        self.calls = 0
        self.passes = True

    def points(self, block):
        return [Point(self.name, "cpu", {"i": i}, gpu=False) for i in range(2)]

    def measure(self, ctx, point):
        self.calls += 1
        t = ctx.harness.measure(lambda: None, WallTimer())
        return Result(t, flops=1.0, check=Check(0.0 if self.passes else 1.0, 0.5, "abs"))


def _config(measurement=None):
    # one trial: these tests count measure() calls (test_trials.py covers trials)
    return cfg.validate({"measurement": measurement or {"min_samples": 3, "budget_s": 0.01,
                                                        "trials": 1},
                         "experiments": {"counting": {}}})


@pytest.fixture
def counting():
    exp = Counting()
    REGISTRY["counting"] = exp
    yield exp
    REGISTRY.pop("counting")


def test_ok_records_are_reused_from_the_cache(counting, tmp_path):
    runner.run_experiment(_config(), "counting", tmp_path)
    runner.run_experiment(_config(), "counting", tmp_path)
    assert counting.calls == 2  # the second job measured nothing
    assert all(r["cached"] for r in results.iter_records(tmp_path / "raw"))


@pytest.mark.parametrize("status", ["wrong", "failed", "skipped", "not_measured"])
def test_a_cached_record_whose_status_is_not_ok_is_measured_again(counting, tmp_path, status):
    runner.run_experiment(_config(), "counting", tmp_path)
    path = tmp_path / "raw" / "counting" / "cpu-i0.json"
    rec = json.loads(path.read_text())
    results.write_json_atomic(path, rec | {"status": status})  # same cache key, not ok
    m = runner.run_experiment(_config(), "counting", tmp_path)
    assert counting.calls == 3, "the not-ok record was reused instead of measured again"
    assert m["points"] == {"cpu-i0": "ok", "cpu-i1": "ok"}
    assert not results.read_record(path).get("cached")


def test_a_wrong_point_is_measured_again_and_can_turn_ok(counting, tmp_path):
    counting.passes = False
    m = runner.run_experiment(_config(), "counting", tmp_path)
    assert m["counts"]["wrong"] == 2
    counting.passes = True
    m = runner.run_experiment(_config(), "counting", tmp_path)
    assert m["counts"]["ok"] == 2 and counting.calls == 4


def test_the_stop_rule_never_stops_before_min_samples():
    """Quiet samples (CV 0) converge at once; min_samples still holds, whatever the chunk."""
    for min_samples in (1, 7, 25, 64):
        s = Settings(warmup=0, min_samples=min_samples, max_samples=500, target_cv=0.5,
                     budget_s=60, min_sample_s=0)
        t = Harness(s).measure(lambda: None, _ConstantTimer())
        assert t.n >= min_samples, f"min_samples={min_samples}: stopped after {t.n}"
        assert t.stop_reason == "converged"


def test_a_spent_budget_still_waits_for_min_samples():
    """Noisy samples never converge and the budget (0 s) is spent at once: the job still
    takes min_samples before it stops."""
    for min_samples in (12, 40):
        s = Settings(warmup=0, min_samples=min_samples, max_samples=500, target_cv=1e-9,
                     budget_s=0.0, min_sample_s=0)
        t = Harness(s).measure(lambda: None, _NoisyTimer())
        assert t.n >= min_samples and t.stop_reason == "budget", (min_samples, t.n)


class _NoisyTimer:
    name = "fake"

    def __init__(self) -> None:
        self.k = 0

    def time(self, fn, reps):
        self.k += 1
        return (1e-3 if self.k % 2 else 3e-3) * reps


class _ConstantTimer:
    name = "fake"

    def time(self, fn, reps):
        for _ in range(reps):
            fn()
        return 1e-3 * reps


def test_manifest_carries_the_harness_and_config_hash_covers_it(counting, tmp_path):
    m1 = runner.run_experiment(_config({"min_samples": 3, "budget_s": 0.01}), "counting",
                               tmp_path / "a")
    m2 = runner.run_experiment(_config({"min_samples": 4, "budget_s": 0.01}), "counting",
                               tmp_path / "b")
    assert m1["harness"] == Settings(min_samples=3, budget_s=0.01).as_dict()
    assert m2["harness"]["min_samples"] == 4
    assert m1["provenance"]["config_hash"] != m2["provenance"]["config_hash"]
    rec = next(results.iter_records(tmp_path / "a" / "raw"))
    assert rec["provenance"]["config_hash"] == m1["provenance"]["config_hash"]


# -- error classes from the exception's type -------------------------------------------------
@pytest.fixture
def fake_pycuda(monkeypatch):
    """pycuda.driver's exception hierarchy (Error <- MemoryError, LaunchError, LogicError,
    RuntimeError; CompileError <- Error), as the runner finds it in sys.modules."""
    drv = types.ModuleType("pycuda.driver")
    drv.Error = type("Error", (Exception,), {})
    for name in ("MemoryError", "LaunchError", "LogicError", "RuntimeError", "CompileError"):
        setattr(drv, name, type(name, (drv.Error,), {}))
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    return drv


def test_errors_are_classified_by_type_not_by_message(fake_pycuda):
    drv = fake_pycuda
    kind = runner.gpu_error_kind
    assert kind(drv.MemoryError("cuMemAlloc failed")) == "out of GPU memory"
    assert kind(drv.LaunchError("cuLaunchKernel failed")) == "kernel launch failed"
    assert kind(drv.CompileError("nvcc compilation failed")) == "nvcc failed"
    assert kind(drv.LogicError("invalid handle")).startswith("CUDA call misused")
    # a message that merely mentions a launch or memory is not classified by its words
    assert kind(ValueError("could not launch: out of memory")) == "ValueError"
    assert kind(drv.Error("launch failed")) == "Error"
    assert kind(MemoryError()) == "out of host memory"


def test_without_pycuda_errors_keep_their_type_name(monkeypatch):
    monkeypatch.delitem(sys.modules, "pycuda.driver", raising=False)
    assert runner.gpu_error_kind(RuntimeError("launch failed")) == "RuntimeError"


# -- a timed GPU result needs a check -------------------------------------------------------
def _timing() -> Timing:
    return Harness(Settings(warmup=0, min_samples=2, max_samples=2, min_sample_s=0)).measure(
        lambda: None, _ConstantTimer())


def test_a_timed_gpu_result_without_a_check_is_refused():
    status, reason = point_record.judge(Result(_timing(), flops=1.0), gpu_point=True)
    assert status == "failed" and "without a correctness check" in reason


def test_a_declared_reason_lets_an_unchecked_gpu_result_pass():
    assert point_record.judge(Result(_timing()), True, no_check_reason="timer only") == ("ok", "")
    r = Result(_timing(), no_check_reason="copies of uninitialised memory")
    assert point_record.judge(r, gpu_point=True) == ("ok", "")
    # CPU points (a reference itself) and checked results are unaffected
    assert point_record.judge(Result(_timing()), gpu_point=False) == ("ok", "")
    bad = Result(_timing(), check=Check(2.0, 1.0, "abs"))
    assert point_record.judge(bad, gpu_point=True)[0] == "wrong"


# -- the job cache ---------------------------------------------------------------------------
class _Alloc:
    def __init__(self) -> None:
        self.freed = 0

    def free(self) -> None:
        self.freed += 1


def test_the_job_cache_keeps_one_value_per_slot_and_leaves_other_slots_alone():
    from cudalab.experiments.job_cache import JobCache

    cache = JobCache()
    kept = cache.keep("driver", lambda: object())
    assert cache.keep("driver", lambda: 1 / 0) is kept  # made once
    first = cache.one_per_slot("inputs", ("n", 1), lambda: {"dev": _Alloc()})
    out = cache.one_per_slot("out", ("out", 1), lambda: (_Alloc(), np.zeros(2)))
    assert cache.one_per_slot("inputs", ("n", 1), lambda: 1 / 0) is first
    second = cache.one_per_slot("inputs", ("n", 2), lambda: {"dev": _Alloc()})
    assert first["dev"].freed == 1 and second["dev"].freed == 0  # the old size is freed
    assert ("n", 1) not in cache and cache["driver"] is kept and cache[("out", 1)] is out
    assert out[0].freed == 0  # another slot: untouched


def test_cpu_threads_are_set_for_the_job_and_recorded(counting, tmp_path):
    """measurement.cpu_threads limits the BLAS threads of the job's CPU work (threadpoolctl)
    and is recorded with the BLAS library; 0 means the cores the job may use."""
    pytest.importorskip("threadpoolctl")
    runner.run_experiment(_config({"min_samples": 3, "budget_s": 0.01, "trials": 1,
                                   "cpu_threads": 1}), "counting", tmp_path)
    rec = next(iter(results.iter_records(tmp_path / "raw")))
    assert rec["provenance"]["cpu_threads"] == 1
    assert "(1 threads)" in rec["provenance"]["blas"]
    row = results.build_table([rec]).iloc[0]
    assert row["cpu_threads"] == 1
    # the interpreter that measured, a table column like the rest of the provenance
    assert row["python_executable"] == sys.executable
    runner.run_experiment(_config(), "counting", tmp_path / "all")
    rec = next(iter(results.iter_records(tmp_path / "all" / "raw")))
    assert rec["provenance"]["cpu_threads"] == runner._usable_cores()


def test_the_record_carries_the_launch_of_the_timed_kernel():
    """Result.launch goes into the record as grid, block, blocks and threads per block;
    a result without one (cuBLAS, host work) records None."""
    from cudalab.experiments.base import Launch

    r = Result(_timing(), check=Check(0.0, 1.0, "abs"), launch=Launch((3, 2), (128, 1, 1)))
    body = point_record.record_body(r, {}, "key", gpu_point=True)
    assert body["launch"] == {"grid": [3, 2], "block": [128, 1, 1], "blocks": 6,
                              "threads_per_block": 128}
    assert point_record.record_body(Result(_timing()), {}, "key")["launch"] is None
