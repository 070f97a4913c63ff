"""Trials: each timed point measured several times, its device buffers moved to fresh
allocations in between (host inputs and the first check kept), the median trial kept, the
trials' spread recorded and used by compare as the point's between-run noise; the job's
resolution floor measured once per GPU job."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import config as cfg
from cudalab import results, runner, trials
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Check, Experiment, Point, Result
from cudalab.experiments.job_cache import JobCache
from cudalab.harness import Harness, Settings, Timing


class Drifting(Experiment):
    """One CPU point whose time differs per measure() call (as a fresh allocation's would):
    1, 3, 2 ms; records the settings each call saw."""

    name = "drifting"
    schema = {"type": "object"}

    def __init__(self, times=(1e-3, 3e-3, 2e-3), wrong_at: int | None = None,
                 timer: str = "cuda_event_queued") -> None:
        self.times, self.wrong_at, self.seen = list(times), wrong_at, []
        self.timer = timer  # a host timer makes the point host-bound: host_trials

    def points(self, block):
        return [Point(self.name, "cpu", {"i": 0}, gpu=False)]

    def measure(self, ctx, point):
        i = len(self.seen)
        self.seen.append(ctx.harness.settings)
        t = Timing(samples_s=[self.times[i % len(self.times)]] * 5, batch=1,
                   timer=self.timer, stop_reason="converged")
        return Result(t, flops=1e6, metrics={"call": i} | ({"first": True} if i == 0 else {}),
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
    # the first trial samples as one measurement would; the later ones need only a median
    assert [(s.warmup, s.min_samples) for s in drifting.seen] == [(3, 10), (1, 5), (1, 5)]
    [rec] = results.iter_records(tmp_path / "raw")
    t = rec["timing"]
    assert t["median"] == pytest.approx(2e-3) and rec["metrics"]["call"] == 2
    assert rec["metrics"]["first"]  # what only the first trial measured stays with the point
    assert [x["median"] for x in t["trials"]] == pytest.approx([1e-3, 3e-3, 2e-3])
    assert t["trial_spread"] == pytest.approx((3e-3 - 1e-3) / 2e-3)
    row = results.build_table([rec]).iloc[0]
    assert row["time_trial_spread"] == pytest.approx(1.0)
    assert row["gflops"] == pytest.approx(1e6 / 2e-3 / 1e9)  # the median trial's numbers


def test_a_host_timed_point_takes_host_trials(drifting, tmp_path):
    """A point its first trial timed with a host timer (host class: never gates) stops after
    host_trials trials, which still give its spread; a kernel takes all of them."""
    drifting.timer = "perf_counter"
    runner.run_experiment(_config(), "drifting", tmp_path)
    assert len(drifting.seen) == 2
    [rec] = results.iter_records(tmp_path / "raw")
    assert len(rec["timing"]["trials"]) == 2
    assert rec["timing"]["trial_spread"] == pytest.approx((3e-3 - 1e-3) / 3e-3)
    drifting.seen.clear()
    drifting.timer = "cuda_event"  # host-synchronous: pageable copies, streams
    runner.run_experiment(_config(host_trials=3, trials=4), "drifting", tmp_path / "b")
    assert len(drifting.seen) == 3


def test_later_trial_settings_never_exceed_the_first_trials():
    s = Settings(trials=3, warmup=0, min_samples=3, trial_min_samples=5, trial_warmup=1)
    later = trials.trial_settings(s, later=True)
    assert (later.warmup, later.min_samples) == (0, 3)
    assert trials.trial_settings(s) == trials.trial_settings(s, later=False)
    assert trials.trial_settings(s).min_samples == 3


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

    from cudalab import compare, result_folders

    def run(t, spread):
        df = pd.DataFrame([{"experiment": "k", "point_id": "p", "variant": "p", "gpu": "G",
                            "status": "ok", "median_s": t, "noise": 0.001, "n_samples": 30,
                            "method": "cuda_event_queued", "trial_spread": spread,
                            "floor_s": 20e-9}])
        return result_folders.Run("x", None, "G", df)

    tight = compare.compare_pair(run(100e-6, 0.01), run(108e-6, 0.01))
    loose = compare.compare_pair(run(100e-6, 0.10), run(108e-6, 0.02))
    assert tight["verdict"].iloc[0] == "slower" and tight["trials"].iloc[0]
    assert loose["verdict"].iloc[0] == "same"


# -- cheap trials: device buffers moved, host inputs and the first check kept -----------------
class FakeOOM(Exception):
    """pycuda.driver.MemoryError's stand-in (gpu_errors reads the class by name)."""


class DeviceAllocation:
    """pycuda's DeviceAllocation: an address, freed once; its bytes live in FakeCuda."""

    def __init__(self, cuda, addr, size):
        self.cuda, self.addr, self.size, self.freed = cuda, addr, size, False

    def __int__(self):
        return self.addr

    def free(self):
        if not self.freed:
            self.freed = True
            self.cuda.release(self)


class FakeCuda:
    """Device memory as CUDA's allocator hands it out: a freed block is the first one a
    request of its size gets again (so free-then-allocate reuses an address)."""

    def __init__(self, capacity=1 << 20):
        self.capacity, self.used, self.top = capacity, 0, 0x10000
        self.free_blocks: list[tuple[int, int]] = []
        self.mem: dict[int, bytearray] = {}
        self.allocs: list[DeviceAllocation] = []

    def mem_alloc(self, size):
        if self.used + size > self.capacity:
            raise FakeOOM(f"{size} bytes: {self.used} of {self.capacity} in use")
        fit = sorted(b for b in self.free_blocks if b[1] == size)
        if fit:
            self.free_blocks.remove(fit[0])
            addr = fit[0][0]
        else:
            addr, self.top = self.top, self.top + max(size, 256)
        self.used += size
        self.mem[addr] = bytearray(size)
        a = DeviceAllocation(self, addr, size)
        self.allocs.append(a)
        return a

    def release(self, a):
        self.used -= a.size
        self.free_blocks.append((a.addr, a.size))

    def mem_get_address_range(self, ptr):
        a = next(x for x in self.allocs if x.addr == ptr and not x.freed)
        return a.addr, a.size

    def memcpy_dtod(self, dst, src, size):
        self.mem[int(dst)][:size] = self.mem[int(src)][:size]

    def memcpy_htod(self, dst, src):
        b = np.ascontiguousarray(src).tobytes()
        self.mem[int(dst)][:len(b)] = b

    def memcpy_dtoh(self, dst, src):
        dst.view(np.uint8).reshape(-1)[:] = np.frombuffer(
            bytes(self.mem[int(src)][:dst.nbytes]), np.uint8)

    def memset_d32(self, dst, value, count):
        self.mem[int(dst)][:4 * count] = np.full(count, value, np.uint32).tobytes()

    def array(self, a, dtype=np.float32):
        return np.frombuffer(bytes(self.mem[int(a)]), dtype)


def test_the_cache_moves_every_device_buffer_new_before_free():
    cuda = FakeCuda()
    cache = JobCache()
    cache.holding = True  # as during a point's trials
    a, b, c = (cuda.mem_alloc(64) for _ in range(3))
    cuda.memcpy_htod(a, np.arange(16, dtype=np.float32))
    host = np.ones(4)
    cache["set"] = {"host": host, "a_d": a, "pair": (b, host), "nested": {"c": c},
                    "refs": {}}
    cache["count"] = 3.0
    assert cache.replace_device(cuda) == (3, 0)
    s = cache["set"]
    assert s["host"] is host and s["pair"][1] is host and cache["count"] == 3.0
    new = (s["a_d"], s["pair"][0], s["nested"]["c"])
    assert {int(x) for x in new}.isdisjoint({int(a), int(b), int(c)})
    assert cuda.array(new[0]).tolist() == list(range(16))  # the contents came along
    assert not any(x.freed for x in (a, b, c))  # held until the point's trials end
    cache.release_retired()
    assert all(x.freed for x in (a, b, c)) and not any(x.freed for x in new)


def test_a_buffer_without_room_for_a_second_copy_stays_in_place():
    cuda = FakeCuda(capacity=192)
    cache = JobCache()
    cache.holding = True
    a, b = cuda.mem_alloc(64), cuda.mem_alloc(64)
    cache["a"], cache["b"] = a, b
    # a moves into the free 64 bytes; b finds none, frees a's old copy (retired) and moves
    assert cache.replace_device(cuda) == (2, 0) and a.freed
    cache.release_retired()
    big = JobCache()
    big["x"] = cuda.mem_alloc(64)  # 192 of 192 in use: no room at all
    assert big.replace_device(cuda) == (0, 1)


def test_outside_a_points_trials_retiring_frees_at_once():
    """The profiler's child and scripts call measure() without the trials' loop: nothing
    retired may pile up there."""
    cuda = FakeCuda()
    cache = JobCache()
    a = cuda.mem_alloc(64)
    cache.retire(a)
    assert a.freed and cuda.used == 0


class Placing(Experiment):
    """GPU points on a fake device whose kernel time depends on where its input lies:
    y = 2 x. Input and output come from the job's buffer set; `own` allocates a scratch
    buffer in measure() and retires it (or frees it, `free_own`), as latency's chase does."""

    name = "placing"
    schema = {"type": "object"}
    vs_device_peak = False

    def __init__(self, free_own=False):
        self.free_own = free_own
        self.checks = self.launches = 0
        self.seen: list[tuple[int, int]] = []  # (input address, scratch address) per trial

    def points(self, block):
        return [Point(self.name, "gpu", {"n": n}) for n in (64, 128)]

    def measure(self, ctx, point):
        from cudalab.experiments import shared

        n = point.params["n"]
        cuda = ctx.gpu.cuda

        def make():
            x = np.arange(n, dtype=np.float32)
            bufs = {"x": x, "y": np.empty(n, np.float32), "x_d": cuda.mem_alloc(4 * n),
                    "y_d": cuda.mem_alloc(4 * n)}
            cuda.memcpy_htod(bufs["x_d"], x)
            return bufs

        bufs = shared.buffer_set(ctx, ("placing", n), make)
        scratch = cuda.mem_alloc(1000)
        self.seen.append((int(bufs["x_d"]), int(scratch)))
        x_d, y_d = bufs["x_d"], bufs["y_d"]

        def launch():
            self.launches += 1
            cuda.memcpy_htod(y_d, 2 * cuda.array(x_d)[:n])
            ctx.gpu.cost.append(1e-6 * (1 + (int(x_d) // 256 % 7) / 20))

        def check(y):
            self.checks += 1
            err = float(np.abs(y - 2 * bufs["x"]).max())
            return Check(err, 0.0, "max_abs")

        try:
            c, t = self.verify_then_time(ctx, launch, check, output=(y_d, bufs["y"]),
                                         asynchronous=True)
        finally:
            scratch.free() if self.free_own else ctx.cache.retire(scratch)
        return Result(t, float(n), 8.0 * n, c)


class PlacedTimer:
    """Queued events on the fake device: the batch's launches cost what their placement
    says."""

    name = "cuda_event_queued"

    def __init__(self, gpu):
        self.gpu = gpu

    def time(self, fn, reps):
        self.gpu.cost.clear()
        for _ in range(reps):
            fn()
        return sum(self.gpu.cost) if self.gpu.cost else 1e-6 * reps


class FakeFunc:
    def __init__(self, gpu, name):
        self.gpu, self.name = gpu, name

    def prepare(self, sig):
        self.sig = sig

    def prepared_call(self, grid, block, *args):
        addr = int(args[0]) if self.name == "floor_tiny" else 0
        self.gpu.cost.append(1e-6 + 1e-9 * (addr // 256 % 5))


class FakeKernel:
    def __init__(self, gpu):
        self.gpu = gpu

    def function(self, name):
        return FakeFunc(self.gpu, name)


class FakeGpu:
    index = 0
    info = {"gpu_name": "FAKE GPU (CPU test)", "gpu_uuid": "GPU-fake",
            "gpu_pci_bus_id": "0000:00:00.0", "compute_capability": "9.0"}

    def __init__(self, capacity=1 << 20):
        self.cuda = FakeCuda(capacity)
        self.cost: list[float] = []
        self.compiled: list[str] = []

    def compile(self, source_file, defines=None, options=()):
        self.compiled.append(source_file)
        return FakeKernel(self)

    def event_timer(self):
        return PlacedTimer(self)

    def synchronize(self):
        pass


@pytest.fixture
def placing(monkeypatch):
    from cudalab import gpu as gpumod

    exp = Placing()
    gpu = FakeGpu()
    monkeypatch.setattr(gpumod, "open_session", lambda index=0: gpu)
    REGISTRY["placing"] = exp
    yield exp, gpu
    REGISTRY.pop("placing")


def _gpu_config(**measurement):
    return cfg.validate({
        "measurement": {"warmup": 1, "min_samples": 3, "max_samples": 30, "budget_s": 0.03,
                        "ceilings": False, **measurement},
        "telemetry": {"nvidia_smi": False, "nvml": False},
        "experiments": {"placing": {}}})


def test_later_trials_move_the_buffers_and_reuse_the_first_check(placing, tmp_path):
    exp, gpu = placing
    m = runner.run_experiment(_gpu_config(), "placing", tmp_path)
    assert m["counts"]["ok"] == 2
    assert exp.checks == 2  # one check per point: trials 2 and 3 took the first one's
    assert len(exp.seen) == 6
    for point in (exp.seen[:3], exp.seen[3:]):
        inputs, scratch = zip(*point)
        assert len(set(inputs)) == 3, "a trial's input landed where an earlier one had"
        assert len(set(scratch)) == 3, "a retired buffer's address was handed out again"
    recs = {r["point_id"]: r for r in results.iter_records(tmp_path / "raw")}
    t = recs["gpu-n64"]["timing"]
    assert [x["moved"] for x in t["trials"]] == [0, 2, 2]
    assert [x["checks_reused"] for x in t["trials"]] == [0, 1, 1]
    assert all(x["trial_s"] > 0 for x in t["trials"]) and t["trial_spread"] > 0
    assert t["median"] == sorted(x["median"] for x in t["trials"])[1]
    # the retired and the moved-away allocations are freed once each point is done
    live = [a for a in gpu.cuda.allocs if not a.freed]
    assert len(live) == 2  # the last point's buffer set, still in the job's cache


def test_without_retiring_a_trial_gets_the_address_it_freed(monkeypatch, tmp_path):
    from cudalab import gpu as gpumod

    exp, gpu = Placing(free_own=True), FakeGpu()
    monkeypatch.setattr(gpumod, "open_session", lambda index=0: gpu)
    REGISTRY["placing"] = exp
    try:
        runner.run_experiment(_gpu_config(), "placing", tmp_path)
    finally:
        REGISTRY.pop("placing")
    assert len({s for _, s in exp.seen[:3]}) == 1


def test_the_floor_is_measured_once_per_gpu_job_and_recorded(placing, tmp_path):
    exp, gpu = placing
    m = runner.run_experiment(_gpu_config(), "placing", tmp_path)
    assert gpu.compiled.count(trials.FLOOR_SOURCE) == 1
    f = m["floor"]
    assert f["trials"] == 3 and f["timer"] == "cuda_event_queued"
    assert f["floor_s"] == max(f["empty_spread_s"], f["tiny_spread_s"]) > 0
    assert f["empty_spread_s"] == 0  # the empty kernel reads no buffer
    recs = list(results.iter_records(tmp_path / "raw"))
    assert all(r["floor"] == f for r in recs)
    df = results.build_table(recs)
    assert (df["time_floor_s"] == f["floor_s"]).all()


def test_one_trial_measures_no_floor_and_checks_every_time(placing, tmp_path):
    exp, gpu = placing
    m = runner.run_experiment(_gpu_config(trials=1), "placing", tmp_path)
    assert "floor" not in m and trials.FLOOR_SOURCE not in gpu.compiled
    assert exp.checks == 2 and len(exp.seen) == 2
    df = results.build_table(list(results.iter_records(tmp_path / "raw")))
    assert df["time_floor_s"].isna().all() and df["time_trial_spread"].isna().all()


def test_a_floor_that_cannot_be_measured_leaves_the_job_going(placing, tmp_path):
    exp, gpu = placing

    def broken(source_file, defines=None, options=()):
        if source_file == trials.FLOOR_SOURCE:
            raise RuntimeError("nvcc said no")
        return FakeKernel(gpu)

    gpu.compile = broken
    m = runner.run_experiment(_gpu_config(), "placing", tmp_path)
    assert m["counts"]["ok"] == 2 and math.isnan(m["floor"]["floor_s"])
    assert "nvcc said no" in m["floor"]["note"]


def test_a_later_trial_out_of_memory_frees_the_earlier_ones_and_runs_again(monkeypatch):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "pycuda.driver", types.SimpleNamespace(MemoryError=FakeOOM))
    cuda = FakeCuda(capacity=3 * 64)
    cache = JobCache()
    calls, attempts = [], []

    def measure():
        attempts.append(1)
        a = cuda.mem_alloc(64)
        calls.append(int(a))
        cache.retire(a)
        return Result(Timing(samples_s=[1e-3] * 3, batch=1, timer="t", stop_reason="x"),
                      check=Check(0.0, 0.0, "abs"))

    h = Harness(Settings(trials=5))
    _, done = trials.measure_trials(measure, h, cache, cuda)
    # room for three: the fourth trial ran out, freed the first three and ran again
    assert len(done) == 5 and len(attempts) == 6 and calls[3] == calls[0]
    assert cuda.used == 0  # every retired allocation freed at the end


class _Ctx2:
    def __init__(self, harness, gpu):
        self.harness, self.gpu = harness, gpu


@pytest.mark.parametrize("output, each, runs", [
    (True, None, 1), (True, True, 3), (True, False, 1),
    (False, None, 3), (False, True, 3), (False, False, 1)])
def test_which_checks_a_later_trial_runs(output, each, runs):
    """With an output the verification launch and copy run every trial and the first
    trial's Check stands for the later ones; a check without output (its own verification,
    which may prime the timing) runs every trial unless the experiment says it need not."""
    gpu = FakeGpu()
    cuda = gpu.cuda
    out_d, host = cuda.mem_alloc(16), np.empty(4, np.float32)
    h = Harness(Settings(warmup=0, min_samples=2, max_samples=2, trials=3))
    ctx = _Ctx2(h, gpu)
    seen = {"checks": 0, "launches": 0}

    def launch():
        seen["launches"] += 1
        cuda.memcpy_htod(out_d, np.ones(4, np.float32))

    def check(*args):
        seen["checks"] += 1
        return Check(0.0, 0.0, "abs")

    def measure():
        c, t = Experiment().verify_then_time(
            ctx, launch, check, output=(out_d, host) if output else None,
            check_each_trial=each, timer=PlacedTimer(gpu))
        return Result(t, check=c)

    trials.measure_trials(measure, h)
    assert seen["checks"] == runs
    if output:
        assert host.tolist() == [1.0] * 4  # this trial's output, copied back


def test_floor_summary():
    f = trials.floor_summary({"empty": [1.0e-6, 1.1e-6, 1.05e-6],
                              "tiny": [2.0e-6, 2.0e-6, 2.3e-6]}, "cuda_event_queued")
    assert f["empty_s"] == pytest.approx(1.05e-6) and f["tiny_s"] == pytest.approx(2.0e-6)
    assert f["floor_s"] == pytest.approx(0.3e-6) and f["trials"] == 3
    assert math.isnan(trials.floor_summary({"empty": [1e-6], "tiny": [1e-6]}, "")["floor_s"])
