"""CPU tests of the vector_add experiment (and the helpers the memory experiments share).

Every results frame below is SYNTHETIC TEST DATA: records fabricated from a simple
bandwidth model with H100-like numbers, never measurements.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
from fake_cuda import FakeEvent

from cudalab import claims, devicespec, results
from cudalab import config as cfg
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import REL_FRO_CHUNK, Point, RunContext
from cudalab.experiments.shared import buffer_set, bytes_label, grid_size, size_label
from cudalab.experiments.vector_add import check_sum, reference, sum_error
from cudalab.harness import Harness, Settings

matplotlib.use("Agg")

NAME = "vector_add"
EXP = REGISTRY[NAME]
PEAK = 3352.32  # GB/s: 2 x 2619 MHz x 5120 bit / 8 (H100 SXM)


def validate(block: dict) -> dict:
    return cfg.validate({"experiments": {NAME: block}})["experiments"][NAME]


def synthetic_record(variant, params, median_s, *, nbytes, flops=math.nan, metrics=None,
                     status="ok", reason=""):
    """A fabricated raw record (SYNTHETIC TEST DATA), shaped like the runner's."""
    pid = "-".join([variant] + [f"{k}{v}" for k, v in params.items()])
    return {
        "schema_version": results.SCHEMA_VERSION, "experiment": NAME, "variant": variant,
        "point_id": pid, "params": params, "job_id": "synthetic", "status": status,
        "reason": reason,
        "timing": {"samples_s": [median_s] * 3, "median": median_s, "iqr": 0.0, "cv": 0.0,
                   "min": median_s, "mean": median_s, "std": 0.0, "n": 3, "batch": 1,
                   "timer": "cuda_event", "stop_reason": "converged", "n_throttled": 0},
        "work": {"flops": flops, "bytes": nbytes, "peak_mem_gbps": PEAK},
        "check": {"error": 0.0 if status == "ok" else 1.0, "tolerance": 1e-6,
                  "metric": "rel_l2", "passed": status == "ok", "detail": ""},
        "metrics": metrics or {}, "provenance": {"gpu_name": "SYNTHETIC H100"},
    }


def synthetic_frame(slow32: bool = True, wrong: tuple = ()):
    """SYNTHETIC: time = 2.5 us launch + 12 n bytes / bandwidth(block size)."""
    bw = {32: 1700, 64: 2600, 128: 3000, 256: 3050, 512: 3000, 1024: 2950}
    if not slow32:
        bw[32] = 3100
    recs = []
    for n in (50_000, 1 << 20, 1 << 24, 1 << 26):
        for t, g in bw.items():
            s = 2.5e-6 + 12 * n / (g * 1e9)
            st = "wrong" if (n, t) in wrong else "ok"
            recs.append(synthetic_record("gpu", {"n": n, "threads": t}, s, nbytes=12.0 * n,
                                         flops=float(n), status=st,
                                         metrics={"blocks": grid_size(n, t)}))
    return results.build_table(recs)


# -- config ---------------------------------------------------------------------------------
def test_defaults_are_the_course_grid():
    b = validate({})
    assert 50_000 in b["sizes"] and (1 << 24) in b["sizes"] and (1 << 26) in b["sizes"]
    assert b["threads"] == [32, 64, 128, 256, 512, 1024]
    assert b["tolerance"] == 1e-6


@pytest.mark.parametrize("block, where, says", [
    ({"threads": [48]}, "experiments.vector_add.threads[0]", "allowed values"),
    ({"sizes": [0]}, "experiments.vector_add.sizes[0]", "out of range"),
    ({"sizes": [1 << 29]}, "experiments.vector_add.sizes[0]", "out of range"),
    ({"sizes": "big"}, "experiments.vector_add.sizes", "wrong type"),
    ({"thread": [32]}, "experiments.vector_add", "did you mean 'threads'"),
    ({"tolerance": 0}, "experiments.vector_add.tolerance", "out of range"),
])
def test_bad_blocks_name_the_key(block, where, says):
    with pytest.raises(ConfigError) as e:
        validate(block)
    assert where in str(e.value) and says in str(e.value)


def test_smoke_block_is_small():
    b = validate(dict(EXP.smoke))
    pts = [p for p in EXP.points(b) if p.variant == "gpu"]
    assert 0 < len(pts) <= 12
    assert max(p.params["n"] for p in pts) <= 1 << 20
    probe = [p for p in EXP.points(b) if p.variant == "block_rate"]  # the checked kind
    assert 0 < len(probe) <= 6 and {p.params["kind"] for p in probe} == {"one_load"}


# -- grid -----------------------------------------------------------------------------------
def test_points_cover_sizes_by_threads_in_size_order():
    b = validate({"sizes": [1 << 20, 50_000], "threads": [256, 32], "probe_blocks": []})
    pts = EXP.points(b)
    assert [(p.params["n"], p.params["threads"]) for p in pts] == [
        (50_000, 32), (50_000, 256), (1 << 20, 32), (1 << 20, 256)]
    assert all(p.gpu and p.variant == "gpu" for p in pts)
    assert len({p.point_id for p in pts}) == len(pts)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 50_000, 1 << 24, (1 << 24) + 1])
@pytest.mark.parametrize("t", [32, 256, 1024])
def test_grid_covers_n_with_one_partial_block_at_most(n, t):
    g = grid_size(n, t)
    assert g * t >= n > (g - 1) * t
    assert grid_size(50_000, 256) == 196


# -- references and helpers -----------------------------------------------------------------
def test_reference_is_float64_sum():
    a = np.array([1e8, 1.0], np.float32)
    b = np.array([1.0, 2.0], np.float32)
    r = reference(a, b)
    assert r.dtype == np.float64
    assert r[0] == 100_000_001.0  # float32 would round this to 1e8
    assert r[1] == 3.0


def naive_sum_error(c, a, b) -> float:
    """The metric as first written: full float64 copies, norm(c - (a + b)) / norm(a + b)."""
    c64 = np.asarray(c).astype(np.float64)
    if not np.isfinite(c64).all():
        return math.inf
    r = a.astype(np.float64) + b.astype(np.float64)
    d = np.linalg.norm(r)
    return float(np.linalg.norm(c64 - r) / (d if d > 0 else 1.0))


def test_reference_into_a_buffer_equals_the_float64_sum():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1001).astype(np.float32)
    b = (rng.standard_normal(1001) * 1e-4).astype(np.float32)
    want = a.astype(np.float64) + b.astype(np.float64)
    assert np.array_equal(reference(a, b), want)
    buf = np.empty(1001)
    assert reference(a, b, out=buf) is buf and np.array_equal(buf, want)


@pytest.mark.parametrize("n", [1, 5, 50_000, REL_FRO_CHUNK + 1, 2 * REL_FRO_CHUNK + 12_345])
def test_blockwise_sum_error_equals_the_float64_formula(n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    c = a + b  # a float32 kernel's rounding: a small, nonzero error
    c[rng.integers(0, n, size=max(1, n // 1000))] += np.float32(1e-3)  # and a few wrong ones
    want = naive_sum_error(c, a, b)
    assert want > 0
    assert sum_error(c, a, b) == pytest.approx(want, rel=1e-12)
    assert sum_error(c, a, b, chunk=7) == pytest.approx(want, rel=1e-12)
    chk = check_sum(c, a, b, 1e-6)
    assert chk.metric == "rel_l2" and chk.detail == ""
    assert chk.error == pytest.approx(want, rel=1e-12) and chk.passed == (want <= 1e-6)


def test_check_sum_catches_unwritten_and_wrong_elements():
    rng = np.random.default_rng(1)
    n = 3 * REL_FRO_CHUNK + 7
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    good = check_sum(a + b, a, b, 1e-6)
    assert good.passed and good.detail == ""
    c = a + b
    c[[0, REL_FRO_CHUNK, n - 1]] = np.nan  # the last, partial block unwritten, and others
    bad = check_sum(c, a, b, 1e-6)
    assert bad.error == math.inf and not bad.passed
    assert bad.detail == "3 unwritten (NaN) elements"
    wrong = a + b
    wrong[n // 2] += 1.0
    w = check_sum(wrong, a, b, 1e-6)
    assert not w.passed and w.detail == "" and w.error == pytest.approx(
        naive_sum_error(wrong, a, b), rel=1e-12)
    with pytest.raises(ValueError, match="sizes differ"):
        sum_error(c[:-1], a, b)


# a numpy stand-in for pycuda: device buffers are numpy arrays, the kernel is a + b
class _Dev:
    def __init__(self, nbytes):
        self.buf = np.zeros(nbytes // 4, np.float32)
        self.freed = False

    def free(self):
        self.freed = True


class _Func:
    skip = 0  # elements at the end the "kernel" leaves unwritten (a bounds bug)

    def prepare(self, sig):
        assert sig == "PPPi"

    def prepared_call(self, grid, block, a_d, b_d, c_d, n):
        assert grid[0] * block[0] >= n
        m = n - _Func.skip
        c_d.buf[:m] = a_d.buf[:m] + b_d.buf[:m]

    def __call__(self, a_d, b_d, c_d, n, *, block, grid):  # Function.__call__
        assert isinstance(n, np.int32)
        self.prepared_call(grid, block, a_d, b_d, c_d, int(n))


class _FakeVecGpu:
    def __init__(self):
        from types import SimpleNamespace

        self.uploads = []
        self.cuda = SimpleNamespace(
            mem_alloc=_Dev, Event=FakeEvent,
            memcpy_htod=self._htod,
            memcpy_dtoh=lambda dst, src: dst.__setitem__(..., src.buf[:dst.size]),
            memset_d32=lambda dst, bits, n: dst.buf.view(np.uint32).__setitem__(
                slice(0, n), bits),
        )

    def _htod(self, dst, src):
        self.uploads.append(src)
        dst.buf[:src.size] = src

    def compile(self, source):
        from types import SimpleNamespace

        assert source == "vector_add/vector_add.cu"
        return SimpleNamespace(function=lambda name: _Func())

    def attr(self, name):
        raise KeyError(name)

    def event_timer(self):
        from cudalab.gpu import EventTimer

        return EventTimer(self.cuda)

    def synchronize(self):
        pass

    from cudalab.gpu import GpuSession

    launch_costs = GpuSession.launch_costs  # the real one, on the fake driver


def _fake_ctx():
    s = Settings(warmup=1, min_samples=3, max_samples=3, budget_s=0.001, min_sample_s=0)
    return RunContext(gpu=_FakeVecGpu(), harness=Harness(s), rng=np.random.default_rng(1),
                      config={}, block=validate({}))


def test_measure_checks_every_point_against_the_float64_sum_of_its_inputs(monkeypatch):
    ctx = _fake_ctx()
    n = REL_FRO_CHUNK + 3
    monkeypatch.setattr(_Func, "skip", 0)
    first = EXP.measure(ctx, Point(NAME, "gpu", {"n": n, "threads": 256}))
    assert first.check.passed and first.check.detail == "" and first.timing.n == 3
    blocks = -(-n // 256)  # the record says how many blocks the timed launch had
    assert (first.launch.blocks, first.launch.threads_per_block) == (blocks, 256)
    # the launch-overhead lesson: host cost of both launch paths and one launch alone
    costs = {k: first.metrics[k] for k in ("host_call_s", "host_prepared_call_s",
                                           "one_launch_s")}
    assert all(v > 0 for v in costs.values()), costs
    bufs = ctx.cache[("vector_add", n)]
    a, b = ctx.gpu.uploads  # the host inputs kept are the very arrays uploaded
    assert bufs["a"] is a and bufs["b"] is b and a.dtype == b.dtype == np.float32
    assert not any(isinstance(v, np.ndarray) and v.dtype == np.float64 for v in bufs.values())
    # the reused host output held the right sums: an unwritten element must still show
    monkeypatch.setattr(_Func, "skip", 1)
    res = EXP.measure(ctx, Point(NAME, "gpu", {"n": n, "threads": 1024}))
    assert len(ctx.gpu.uploads) == 2  # same n: the same inputs, no new draw
    assert res.check.error == math.inf and not res.check.passed
    assert res.check.detail == "1 unwritten (NaN) elements"
    # a new size draws fresh inputs
    monkeypatch.setattr(_Func, "skip", 0)
    assert EXP.measure(ctx, Point(NAME, "gpu", {"n": 1000, "threads": 32})).check.passed
    assert len(ctx.gpu.uploads) == 4 and list(ctx.cache) == [("vector_add", 1000)]


class _Gpu:
    def __init__(self, attrs):
        self.attrs = attrs

    def attr(self, name):
        return self.attrs[name]


def peak_dram_gbps(gpu):
    """The one path of the peak: devicespec.device_peaks, put in every record's work."""
    return devicespec.device_peaks(gpu)["peak_mem_gbps"]


def test_peak_dram_bandwidth_from_attributes():
    g = _Gpu({"MEMORY_CLOCK_RATE": 2_619_000, "GLOBAL_MEMORY_BUS_WIDTH": 5120})
    assert peak_dram_gbps(g) == pytest.approx(PEAK)
    assert math.isnan(peak_dram_gbps(_Gpu({})))  # attribute missing: NaN, no exception
    assert math.isnan(peak_dram_gbps(_Gpu({"MEMORY_CLOCK_RATE": 0,
                                           "GLOBAL_MEMORY_BUS_WIDTH": 5120})))


def test_the_peak_line_reads_the_peak_the_runner_puts_in_the_work():
    df = synthetic_frame()
    assert (df["peak_mem_gbps"] == PEAK).all() and "m_peak_gbps" not in df


class _Alloc:
    def __init__(self):
        self.freed = 0

    def free(self):
        self.freed += 1


def test_buffer_set_keeps_one_set_and_frees_the_previous():
    ctx = RunContext(None, Harness(Settings()), np.random.default_rng(0), {}, {})
    made = []

    def make(tag):
        def f():
            made.append(tag)
            return {"dev": _Alloc(), "host": np.zeros(3)}
        return f

    first = buffer_set(ctx, ("x", 1), make(1))
    assert buffer_set(ctx, ("x", 1), make(99)) is first and made == [1]
    second = buffer_set(ctx, ("x", 2), make(2))
    assert made == [1, 2] and first["dev"].freed == 1 and second["dev"].freed == 0


def test_labels():
    assert size_label(50_000) == "50,000"
    assert size_label(1 << 26) == "2^26"
    assert bytes_label(4096) == "4 KiB" and bytes_label(1 << 30) == "1 GiB"
    assert bytes_label(1000) == "1000 B"


# -- expectations and figures on SYNTHETIC frames ---------------------------------------------
def _claims(df):
    return {r.key: r for r in claims.evaluate("vector_add", df)}


def test_claims_seen_on_plausible_synthetic_data():
    ex = _claims(synthetic_frame())
    assert len(ex) == 5
    # the cause of the small blocks' lag needs the block-rate probe (tests/test_cause_claims.py)
    probe = ex.pop("fixed_cost_per_block")
    assert probe.passed is None and "probe" in probe.evidence
    assert all(e.passed for e in ex.values()), [(e.claim, e.evidence) for e in ex.values()]
    assert "of the theoretical DRAM ceiling" in ex["large_near_bandwidth"].evidence


def test_claims_not_seen_when_the_data_says_so():
    ex = _claims(synthetic_frame(slow32=False, wrong=((1 << 20, 64),)))
    assert ex["correct"].passed is False and "23/24" in ex["correct"].evidence
    assert ex["blocks_of_32_lag"].passed is False


def test_wrong_points_carry_no_speed():
    df = synthetic_frame(wrong=((1 << 20, 64),))
    row = df[df["point_id"] == "gpu-n1048576-threads64"].iloc[0]
    assert row["status"] == "wrong" and math.isnan(row["gbps"])
    assert results.check_table(df) == []


# the probe's figure draws the probe's rows: tests/test_cause_claims.py
@pytest.mark.parametrize("fig", [f for f in EXP.lesson.figures if f != "block_rate"])
def test_plots_draw_from_synthetic_frame(fig):
    import matplotlib.pyplot as plt

    f = EXP.plot(fig, synthetic_frame())
    assert f is not None
    ax = f.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(f)


def test_plot_of_nothing_is_none_and_unknown_names_raise():
    df = synthetic_frame()
    assert EXP.plot("bandwidth", df[df["status"] == "nope"]) is None
    with pytest.raises(KeyError):
        EXP.plot("no_such_figure", df)
