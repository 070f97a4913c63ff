"""Trials: each timed point measured several times from scratch, the median trial kept, the
trials' spread recorded and used by compare as the point's between-run noise."""

from __future__ import annotations

import math

import pytest

from cudalab import config as cfg
from cudalab import results, runner, trials
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Check, Experiment, Point, Result
from cudalab.harness import Harness, Settings, Timing


class Drifting(Experiment):
    """One CPU point whose time differs per measure() call (as a fresh allocation's would):
    1, 3, 2 ms; records the settings each call saw."""

    name = "drifting"
    schema = {"type": "object"}

    def __init__(self, times=(1e-3, 3e-3, 2e-3), wrong_at: int | None = None) -> None:
        self.times, self.wrong_at, self.seen = list(times), wrong_at, []

    def points(self, block):
        return [Point(self.name, "cpu", {"i": 0}, gpu=False)]

    def measure(self, ctx, point):
        i = len(self.seen)
        self.seen.append(ctx.harness.settings)
        t = Timing(samples_s=[self.times[i % len(self.times)]] * 5, batch=1,
                   timer="perf_counter", stop_reason="converged")
        return Result(t, flops=1e6, metrics={"call": i},
                      check=Check(1.0 if i == self.wrong_at else 0.0, 0.5, "abs"))


@pytest.fixture
def drifting():
    exp = Drifting()
    REGISTRY["drifting"] = exp
    yield exp
    REGISTRY.pop("drifting")


def _config(**measurement):
    return cfg.validate({"measurement": {"budget_s": 0.3, "max_samples": 100, "trials": 3,
                                         **measurement},
                         "experiments": {"drifting": {}}})


def test_three_trials_share_the_budget_and_the_median_trial_is_the_point(drifting, tmp_path):
    runner.run_experiment(_config(), "drifting", tmp_path)
    assert len(drifting.seen) == 3
    assert all(s.budget_s == pytest.approx(0.1) for s in drifting.seen)
    assert {s.max_samples for s in drifting.seen} == {34}
    [rec] = results.iter_records(tmp_path / "raw")
    t = rec["timing"]
    assert t["median"] == pytest.approx(2e-3) and rec["metrics"]["call"] == 2
    assert [x["median"] for x in t["trials"]] == pytest.approx([1e-3, 3e-3, 2e-3])
    assert t["trial_spread"] == pytest.approx((3e-3 - 1e-3) / 2e-3)
    row = results.build_table([rec]).iloc[0]
    assert row["time_trial_spread"] == pytest.approx(1.0)
    assert row["gflops"] == pytest.approx(1e6 / 2e-3 / 1e9)  # the median trial's numbers


def test_one_trial_is_one_measurement_without_a_spread(drifting, tmp_path):
    runner.run_experiment(_config(trials=1), "drifting", tmp_path)
    assert len(drifting.seen) == 1 and drifting.seen[0].budget_s == 0.3
    [rec] = results.iter_records(tmp_path / "raw")
    assert "trials" not in rec["timing"]
    assert math.isnan(results.build_table([rec]).iloc[0]["time_trial_spread"])


def test_a_wrong_trial_is_the_point_and_ends_the_trials():
    exp = Drifting(wrong_at=1)
    h = Harness(Settings(trials=3))
    result, done = trials.measure_trials(lambda: exp.measure(_Ctx(h), None), h)
    assert len(done) == 2 and not result.check.passed
    assert h.settings == Settings(trials=3)  # restored


class _Ctx:
    def __init__(self, harness):
        self.harness = harness


def test_spread():
    assert trials.spread([{"median": 1.0}, {"median": 1.2}, {"median": 1.1}]) == \
        pytest.approx(0.2 / 1.1)
    assert math.isnan(trials.spread([{"median": 1.0}]))


def test_compare_takes_the_trial_spread_as_between_run_noise():
    """A 100 us kernel 8 % slower is 'slower' when its trials agree, 'same' when its trials
    spread by 10 % (placement moves it that much)."""
    import pandas as pd

    from cudalab import compare

    def run(t, spread):
        df = pd.DataFrame([{"experiment": "k", "point_id": "p", "variant": "p", "gpu": "G",
                            "status": "ok", "median_s": t, "noise": 0.001, "n_samples": 30,
                            "method": "cuda_event_queued", "trial_spread": spread}])
        return compare.Run("x", None, "G", df)

    tight = compare.compare_pair(run(100e-6, 0.01), run(108e-6, 0.01))
    loose = compare.compare_pair(run(100e-6, 0.10), run(108e-6, 0.02))
    assert tight["verdict"].iloc[0] == "slower" and tight["trials"].iloc[0]
    assert loose["verdict"].iloc[0] == "same"
