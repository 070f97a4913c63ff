"""The timing harness: stop rule, batching, statistics, observers (with fake timers)."""

from __future__ import annotations

import itertools
import math

from cudalab.harness import Harness, Settings, WallTimer, summarize


class FakeTimer:
    """Returns prepared per-call durations; records how it was called."""

    name = "fake"

    def __init__(self, durations):
        self.durations = itertools.cycle(durations)
        self.calls = []

    def time(self, fn, reps):
        self.calls.append(reps)
        for _ in range(reps):
            fn()
        return sum(next(self.durations) for _ in range(reps))


def test_summary_statistics():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["mean"] == 2.5
    assert s["iqr"] == 1.5
    assert math.isclose(s["cv"], summarize([1, 2, 3, 4])["std"] / 2.5)
    assert math.isnan(summarize([])["median"])


def test_converges_on_quiet_samples_after_min_samples():
    h = Harness(Settings(warmup=2, min_samples=5, max_samples=100, min_sample_s=0))
    t = h.measure(lambda: None, FakeTimer([1e-3]))
    assert t.stop_reason == "converged"
    assert 5 <= t.n <= 10
    assert t.stats()["cv"] == 0


def test_noisy_samples_stop_at_max_samples_and_keep_all():
    h = Harness(Settings(warmup=0, min_samples=3, max_samples=37, target_cv=1e-6,
                         budget_s=60, min_sample_s=0))
    t = h.measure(lambda: None, FakeTimer([1e-3, 3e-3]))
    assert t.stop_reason == "max_samples" and t.n == 37
    assert len(t.samples_s) == 37


def test_budget_stops_noisy_measurement():
    h = Harness(Settings(warmup=0, min_samples=2, max_samples=10**6, target_cv=1e-9,
                         budget_s=0.05, min_sample_s=0))
    t = h.measure(lambda: None, WallTimer())
    assert t.stop_reason in ("budget", "converged")
    assert t.n >= 2


def test_short_samples_are_batched_and_reported_per_launch():
    timer = FakeTimer([1e-6])  # 1 us per launch, min sample 100 us -> batch 128
    h = Harness(Settings(warmup=0, min_samples=3, min_sample_s=1e-4))
    t = h.measure(lambda: None, timer)
    assert t.batch == 128
    assert math.isclose(t.stats()["median"], 1e-6)
    t2 = h.measure(lambda: None, FakeTimer([1e-6]), batchable=False)
    assert t2.batch == 1


def test_cold_runs_flush_before_every_sample_and_disable_batching():
    flushes = []
    h = Harness(Settings(warmup=0, min_samples=4, max_samples=4, cold_l2=True, min_sample_s=1),
                flush_l2=lambda: flushes.append(1))
    t = h.measure(lambda: None, FakeTimer([1e-6]))
    assert t.batch == 1 and len(flushes) == t.n == 4


class FakeObserver:
    def __init__(self, pattern):
        self.pattern = itertools.cycle(pattern)
        self.before = 0

    def before_batch(self):
        self.before += 1

    def after_batch(self):
        return {"throttled": next(self.pattern), "sm_clock_mhz_after": 1980}


def test_observers_flag_samples_of_throttled_chunks():
    obs = FakeObserver([False, True])
    h = Harness(Settings(warmup=0, min_samples=10, max_samples=30, target_cv=0,
                         budget_s=60, min_sample_s=0), observers=[obs])
    t = h.measure(lambda: None, FakeTimer([1e-3, 2e-3]))
    assert len(t.throttled) == t.n == 30
    assert obs.before == len(t.chunks)
    # chunk 1 (10 samples) ok, chunk 2 (20 samples) throttled
    assert t.throttled[:10] == [False] * 10 and all(t.throttled[10:])
    assert t.as_dict()["n_throttled"] == 20
