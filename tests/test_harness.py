"""The timing harness: stop rule, batching, statistics, observers (with fake timers)."""

from __future__ import annotations

import itertools
import math

import pytest
from fake_cuda import SimGpu

from cudalab.harness import (
    QUEUED_MAX_BATCH,
    Harness,
    Settings,
    Timing,
    WallTimer,
    stop_rule,
    summarize,
)

QUIET = Settings(warmup=2, min_samples=5, max_samples=50, target_cv=0.02, budget_s=60,
                 min_sample_s=1e-4)


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
    h = Harness(Settings(warmup=0, min_samples=3, min_sample_s=1e-4, min_sample_sync_s=0))
    t = h.measure(lambda: None, timer)
    assert t.batch == 128
    assert math.isclose(t.stats()["median"], 1e-6)
    t2 = h.measure(lambda: None, FakeTimer([1e-6]), batchable=False)
    assert t2.batch == 1


class FakeQueuedTimer(FakeTimer):
    """A timer whose queued variant is another FakeTimer (as gpu.EventTimer offers one)."""

    def __init__(self, durations):
        super().__init__(durations)
        self.q = FakeTimer(durations)
        self.q.name = "fake_queued"

    def queued(self):
        return self.q, ""


def test_work_timed_call_by_call_gets_longer_samples_than_queued_work():
    """Host jitter is in every call of work that is not queued: it is batched up to
    min_sample_sync_s (2 ms: 2048 launches of 1 us); queued work up to min_sample_s."""
    h = Harness(Settings(warmup=0, min_samples=3, min_sample_s=1e-4, min_sample_sync_s=2e-3))
    sync = h.measure(lambda: None, FakeQueuedTimer([1e-6]))
    queued = h.measure(lambda: None, FakeQueuedTimer([1e-6]), asynchronous=True)
    assert (sync.timer, sync.batch) == ("fake", 2048)
    assert (queued.timer, queued.batch) == ("fake_queued", 128)
    off = Harness(Settings(warmup=0, min_samples=3, min_sample_s=0)).measure(
        lambda: None, FakeQueuedTimer([1e-6]))
    assert off.batch == 1  # min_sample_s 0 switches batching off for both


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


# -- timing methods on a simulated device (tests/fake_cuda.py SimGpu) ------------------------
LAUNCH_S = 12e-6  # the host cost of a pycuda launch measured on an H100
KERNEL_S = 2e-6  # a kernel shorter than that (vector add of 50 000 floats)


def sim_timer(gpu, queued=True):
    """gpu.event_timer() as GpuSession makes it, on the simulated device."""
    from cudalab.gpu import EventTimer, QueuedEventTimer

    make = (lambda: (QueuedEventTimer(gpu, gpu.hold, gpu.flag), "")) if queued else None
    return EventTimer(gpu, None, make)


def test_plain_events_time_the_hosts_launch_rate_not_the_kernel():
    gpu = SimGpu(LAUNCH_S, KERNEL_S)
    t = Harness(QUIET).measure(gpu.launch, sim_timer(gpu))
    assert t.timer == "cuda_event"
    assert math.isclose(t.stats()["median"], LAUNCH_S, rel_tol=0.05)


def test_queued_timing_keeps_a_larger_launch_cost_out_of_the_kernel_time():
    gpu = SimGpu(LAUNCH_S, KERNEL_S)
    t = Harness(QUIET).measure(gpu.launch, sim_timer(gpu), asynchronous=True)
    assert t.timer == "cuda_event_queued" and t.method_note == ""
    assert t.stats()["median"] == pytest.approx(KERNEL_S, rel=1e-9)
    # calibrated with the same method: 2 us per launch -> 64 launches reach 100 us
    assert t.batch == 64
    assert t.as_dict()["harness"]["method"] == "cuda_event_queued"


def test_queued_batch_stays_below_the_pending_launch_limit():
    gpu = SimGpu(LAUNCH_S, 1e-9)
    t = Harness(QUIET).measure(gpu.launch, sim_timer(gpu), asynchronous=True)
    assert t.batch == QUEUED_MAX_BATCH
    assert t.stats()["median"] == pytest.approx(1e-9, rel=1e-6)


def test_long_kernels_keep_only_the_first_launch_cost_with_plain_events():
    # plain: the start event runs before the first launch reaches the device, so a sample
    # carries one launch cost; queued: none
    plain = Harness(QUIET).measure((g := SimGpu(LAUNCH_S, 80e-6)).launch, sim_timer(g))
    queued = Harness(QUIET).measure((h := SimGpu(LAUNCH_S, 80e-6)).launch, sim_timer(h),
                                    asynchronous=True)
    assert queued.stats()["median"] == pytest.approx(80e-6, rel=1e-9)
    assert plain.stats()["median"] == pytest.approx(80e-6 + LAUNCH_S / plain.batch, rel=1e-9)


def test_hold_timeout_discards_the_sample_and_falls_back_to_plain_events():
    # the host needs 256 x 12 us to queue a batch, the hold gives up after 0.5 ms
    gpu = SimGpu(LAUNCH_S, 1e-9, timeout_s=5e-4)
    t = Harness(QUIET).measure(gpu.launch, sim_timer(gpu), asynchronous=True)
    assert t.timer == "cuda_event"
    assert "fell back to cuda_event" in t.method_note and "timed out" in t.method_note
    assert t.as_dict()["timing_note"] == t.method_note
    assert math.isclose(t.stats()["median"], LAUNCH_S, rel_tol=0.05)


def test_without_a_queued_variant_the_reason_is_recorded():
    gpu = SimGpu(LAUNCH_S, KERNEL_S)
    from cudalab.gpu import EventTimer

    timer = EventTimer(gpu, None, lambda: (None, "the device cannot map host memory"))
    t = Harness(QUIET).measure(gpu.launch, timer, asynchronous=True)
    assert t.timer == "cuda_event"
    assert t.method_note == "queued timing unavailable: the device cannot map host memory"
    t2 = Harness(QUIET).measure(lambda: None, WallTimer(), asynchronous=True)
    assert t2.method_note == "perf_counter timer has no queued variant"


def test_synchronous_fns_keep_plain_event_timing():
    gpu = SimGpu(LAUNCH_S, KERNEL_S)
    t = Harness(QUIET).measure(gpu.launch, sim_timer(gpu), asynchronous=False)
    assert t.timer == "cuda_event" and t.method_note == ""


# -- the stop rule and the throttle rule -----------------------------------------------------
def test_cv_stop_rule_needs_min_samples_and_target_cv():
    s = Settings(min_samples=4, target_cv=0.1, budget_s=1.0)
    t = Timing(samples_s=[1.0, 1.0, 1.0], batch=1, timer="x", stop_reason="")
    assert stop_rule(t, s, 0.0) == ""  # quiet but too few
    t.samples_s.append(1.0)
    assert stop_rule(t, s, 0.0) == "converged"
    t.samples_s[:] = [1.0, 2.0, 1.0, 2.0]  # cv 0.38
    assert stop_rule(t, s, 0.5) == ""
    assert stop_rule(t, s, 1.0) == "budget"


def test_throttled_samples_are_dropped_from_the_statistics_and_counted():
    # chunk 1 (10 samples) throttled and slow, then clean and quiet
    obs = FakeObserver([True, False])
    h = Harness(Settings(warmup=0, min_samples=10, max_samples=100, target_cv=0.01,
                         budget_s=60, min_sample_s=0), observers=[obs])
    timer = FakeTimer([5e-3] * 10 + [1e-3] * 1000)
    t = h.measure(lambda: None, timer)
    d = t.as_dict()
    assert t.stop_reason == "converged"  # the slow throttled samples do not count
    assert d["median"] == 1e-3 and d["cv"] == pytest.approx(0, abs=1e-12)
    assert d["n"] == 30 and d["n_clean"] == 20 and d["n_throttled"] == 10
    assert len(d["samples_s"]) == 30  # every sample kept
    assert d["timing_note"] == ""


def test_a_point_with_too_few_clean_samples_is_marked():
    obs = FakeObserver([True, False])
    h = Harness(Settings(warmup=0, min_samples=10, max_samples=15, target_cv=0.01,
                         budget_s=60, min_sample_s=0), observers=[obs])
    t = h.measure(lambda: None, FakeTimer([5e-3] * 10 + [1e-3] * 100))
    assert t.stop_reason == "max_samples"
    assert t.as_dict()["timing_note"] == "too few clean samples: 5 < min_samples 10"
    assert t.stats()["median"] == 1e-3


def test_all_samples_throttled_keeps_numbers_and_says_so():
    h = Harness(Settings(warmup=0, min_samples=3, max_samples=6, target_cv=0.01,
                         budget_s=60, min_sample_s=0), observers=[FakeObserver([True])])
    t = h.measure(lambda: None, FakeTimer([2e-3]))
    assert t.stats()["median"] == 2e-3
    assert t.note == "all 6 samples throttled: statistics from throttled samples"


def test_harness_settings_travel_with_every_timing():
    s = Settings(warmup=1, min_samples=3, max_samples=5, target_cv=0.5, budget_s=0.1,
                 min_sample_s=0, cold_l2=False)
    d = Harness(s).measure(lambda: None, FakeTimer([1e-3])).as_dict()
    assert d["harness"] == {**s.as_dict(), "method": "fake"}
    override = Settings(warmup=0, min_samples=2, max_samples=2, min_sample_s=0)
    d2 = Harness(s).measure(lambda: None, FakeTimer([1e-3]), settings=override).as_dict()
    assert d2["harness"]["min_samples"] == 2 and d2["harness"]["warmup"] == 0


def test_hold_kernel_compiles_and_takes_the_flag_and_timeout(tmp_path):
    """cuda/common/hold.cu as GpuSession.compile builds it (real nvcc; no GPU needed): one kernel,
    extern "C" `hold(volatile int *, long long)`, which prepare("Pq") matches."""
    import shutil
    import subprocess

    from cudalab.gpu import CUDA_DIR

    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc not on PATH")
    ptx = tmp_path / "hold.ptx"
    subprocess.run([nvcc, "-O3", "-arch=sm_90", "--ptx", str(CUDA_DIR / "common/hold.cu"), "-o",
                    str(ptx)], check=True, capture_output=True)
    text = ptx.read_text()
    assert ".visible .entry hold(" in text
    assert ".param .u64 hold_param_0" in text and ".param .u64 hold_param_1" in text
    assert "clock64" in text or "%clock64" in text
    assert "ld.volatile.global.u32" in text  # the flag is re-read on every spin
