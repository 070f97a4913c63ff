"""CPU tests of the fast_math experiment: config, grid, the float64 reference, the error
metrics, the Guide-derived error bounds, the lesson's claims and the figure.

Every results frame below is SYNTHETIC TEST DATA: records fabricated from a simple
model, never measurements.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from cudalab import claims, fmt, results
from cudalab import config as cfg
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Point
from cudalab.experiments.fast_math import (
    FAST,
    STEP,
    VARIANTS,
    X_MAX,
    U,
    errors,
    f64,
    guide_bound,
    inputs,
    reference,
)

ROOT = Path(__file__).resolve().parent.parent

matplotlib.use("Agg")

NAME = "fast_math"
EXP = REGISTRY[NAME]


def validate(block: dict) -> dict:
    return cfg.validate({"experiments": {NAME: block}})["experiments"][NAME]


# -- config ---------------------------------------------------------------------------------
def test_defaults():
    b = validate({})
    assert b["sizes"] == [1 << 20, 1 << 24]
    assert 1 in b["iterations"] and max(b["iterations"]) == 256
    assert b["variants"] == VARIANTS
    assert b["tolerance_precise"] == 3e-6 and b["tolerance_fast"] == 5e-6


@pytest.mark.parametrize("block, where, says", [
    ({"iterations": [1000]}, "experiments.fast_math.iterations[0]", "<= 256"),
    ({"iterations": [0]}, "experiments.fast_math.iterations[0]", ">= 1"),
    ({"block": 100}, "experiments.fast_math.block", "allowed values: [64, 128, 256, 512, 1024]"),
    ({"variants": ["fastest"]}, "experiments.fast_math.variants[0]",
     "allowed values: ['precise', 'fast_math', 'intrinsics']"),
    ({"sizes": [0]}, "experiments.fast_math.sizes[0]", ">= 1"),
    ({"tolerance_precise": 0}, "experiments.fast_math.tolerance_precise", "> 0"),
    ({"tolerance_fast": 1e-7}, "experiments.fast_math.tolerance_fast", "below tolerance_precise"),
    ({"iteration": [1]}, "experiments.fast_math", "did you mean 'iterations'"),
])
def test_bad_blocks_name_the_key_and_what_is_allowed(block, where, says):
    with pytest.raises(ConfigError) as e:
        validate(block)
    assert where in str(e.value) and says in str(e.value), str(e.value)


def test_smoke_block_is_small():
    b = validate(dict(EXP.smoke))
    pts = EXP.points(b)
    assert 0 < len(pts) <= 12
    assert max(p.params["n"] for p in pts) <= 1 << 16
    assert any(p.params["n"] % b["block"] for p in pts)  # a partial last block
    assert any(p.params["iterations"] & (p.params["iterations"] - 1) for p in pts)  # 1/7


# -- grid -----------------------------------------------------------------------------------
def test_points_in_size_then_iteration_order_precise_first():
    b = validate({"sizes": [4096, 1000], "iterations": [64, 1],
                  "variants": ["intrinsics", "precise", "fast_math"], "block": 128})
    pts = EXP.points(b)
    assert len(pts) == 2 * 2 * 3
    keys = [(p.params["n"], p.params["iterations"]) for p in pts]
    assert keys == sorted(keys)
    assert [p.variant for p in pts[:3]] == ["precise", "fast_math", "intrinsics"]
    assert all(p.params["block"] == 128 and p.gpu for p in pts)
    assert len({p.point_id for p in pts}) == len(pts)


# -- reference and error metrics ------------------------------------------------------------
def test_f64_is_the_formula():
    for t in (-3.0, -0.6, 0.0, 0.5, 3.1):
        want = ((1.5 + math.sin(t)) * math.exp(-t * t / 2)
                + math.sqrt(2 + t * t) / (2 + math.cos(t)))
        assert f64(np.array([t]))[0] == pytest.approx(want, rel=1e-15)
    t = np.linspace(-math.pi, math.pi, 100_001)
    assert f64(t).min() > 0.47  # both terms positive: no cancellation


def test_reference_is_the_kernel_loop_in_float64():
    x = np.array([-3.1, -1.0, 0.0, 0.25, 2.9], np.float32)
    for it in (1, 3, 7):
        want = []
        for xi in x:
            acc = 0.0
            for k in range(it):
                t = float(np.float32(xi) * np.float32(1 - k * STEP))  # kernel's float32 t
                acc += ((1.5 + math.sin(t)) * math.exp(-t * t / 2)
                        + math.sqrt(2 + t * t) / (2 + math.cos(t)))
            want.append(acc / it)
        got = reference(x, it)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-14)
    np.testing.assert_array_equal(reference(x, 1), f64(x))


def test_inputs_stay_inside_minus_pi_pi():
    x = inputs(np.random.default_rng(0), 100_000)
    assert x.dtype == np.float32
    assert np.abs(x).max() <= X_MAX < math.pi
    assert x.min() < -3.1 and x.max() > 3.1
    assert np.array_equal(x, inputs(np.random.default_rng(0), 100_000))


def test_float32_emulation_of_the_precise_kernel_is_well_inside_its_tolerance():
    """numpy's float32 sin/cos/exp stand in for CUDA's: the reference is the kernel's
    arithmetic, so an IEEE-like float32 run must land far below the precise tolerance."""
    x = inputs(np.random.default_rng(1), 20_000)
    tol = validate({})["tolerance_precise"]
    for it in (1, 7, 64):
        s = np.zeros_like(x)
        c = np.zeros_like(x)
        for k in range(it):
            t = x * np.float32(1 - k * STEP)
            v = ((np.float32(1.5) + np.sin(t)) * np.exp(np.float32(-0.5) * t * t)
                 + np.sqrt(np.float32(2) + t * t) / (np.float32(2) + np.cos(t)))
            y = v - c
            tot = s + y
            c = (tot - s) - y
            s = tot
        out = s * np.float32(1 / it)
        assert out.dtype == np.float32
        max_abs, max_rel = errors(out, reference(x, it))
        assert max_rel < tol / 3, (it, max_rel)
        assert 0 < max_abs < 7 * max_rel  # |f| <= 6.9


def test_errors_metric():
    ref = np.array([1.0, 2.0, 0.01])
    assert errors(ref, ref) == (0.0, 0.0)
    a, r = errors(np.array([1.0, 2.002, 0.01]), ref)
    assert a == pytest.approx(0.002) and r == pytest.approx(0.001)
    # small references are divided by the floor (0.1), not by themselves
    a, r = errors(np.array([1.0, 2.0, 0.02]), ref)
    assert a == pytest.approx(0.01) and r == pytest.approx(0.1)
    assert errors(np.array([1.0, np.nan, 0.01]), ref) == (math.inf, math.inf)
    assert errors(np.array([]), np.array([])) == (0.0, 0.0)


# -- the error bounds -----------------------------------------------------------------------
def test_guide_bounds_and_tolerances():
    pre, fm, intr = (guide_bound(v) for v in VARIANTS)
    assert pre / U == pytest.approx(23.93, abs=0.01)
    assert fm / U == pytest.approx(37.98, abs=0.01)
    assert intr == pytest.approx(fm)  # the sqrt paths differ, the exp/sin term dominates
    b = validate({})
    assert b["tolerance_precise"] >= 2 * pre
    assert b["tolerance_fast"] >= 2 * max(fm, intr)
    assert b["tolerance_fast"] > b["tolerance_precise"]
    assert pre < fm
    with pytest.raises(KeyError):
        guide_bound("nope")


# -- expectations and figures on SYNTHETIC frames -------------------------------------------
def synthetic_record(variant, params, median_s, err, *, status="ok", speedup=1.0):
    """A fabricated raw record (SYNTHETIC TEST DATA), shaped like the runner's."""
    tol = 3e-6 if variant == "precise" else 5e-6
    n, it = params["n"], params["iterations"]
    return {
        "schema_version": results.SCHEMA_VERSION, "experiment": NAME, "variant": variant,
        "point_id": Point(NAME, variant, params).point_id, "params": params,
        "job_id": "synthetic", "status": status,
        "reason": "" if status == "ok" else f"max_rel_err = {err:.3g} exceeds tolerance {tol}",
        "timing": {"samples_s": [median_s] * 3, "median": median_s, "iqr": 0.0, "cv": 0.0,
                   "min": median_s, "mean": median_s, "std": 0.0, "n": 3, "batch": 1,
                   "timer": "cuda_event", "stop_reason": "converged", "n_throttled": 0},
        "work": {"flops": 19.0 * n * it, "bytes": 8.0 * n},
        "check": {"error": err, "tolerance": tol, "metric": "max_rel_err",
                  "passed": status == "ok", "detail": ""},
        "metrics": {"max_abs_err": 3 * err, "max_rel_err": err, "kernel_s": median_s,
                    "precise_s": median_s * speedup, "speedup": speedup, "checked": 4096,
                    "nonfinite": 0},
        "provenance": {"gpu_name": "SYNTHETIC TEST DATA"},
    }


def synthetic_frame(fast_speedup=4.0, fast_err=8e-7, wrong=()):
    """SYNTHETIC: time = max(memory time, compute time / speedup)."""
    recs = []
    for n in (1 << 20, 1 << 24):
        for it in (1, 16, 64, 256):
            mem = 8.0 * n / 3e12
            for v in VARIANTS:
                sp = 1.0 if v == "precise" else fast_speedup
                t = max(mem, n * it * 2e-12 / sp) + 2e-6
                pre = max(mem, n * it * 2e-12) + 2e-6
                err = 1.5e-7 if v == "precise" else fast_err
                st = "wrong" if (v, n, it) in wrong else "ok"
                recs.append(synthetic_record(v, {"n": n, "iterations": it, "block": 256}, t,
                                             err, status=st, speedup=pre / t))
    return results.build_table(recs)


def test_synthetic_frame_is_a_valid_table():
    df = synthetic_frame()
    assert results.check_table(df) == []
    assert {"m_max_abs_err", "m_max_rel_err", "m_speedup", "p_iterations"} <= set(df.columns)


def _claims(df):
    got = {r.key: r for r in claims.evaluate(NAME, df)}
    got.update({r.key: r for r in claims.evaluate_try_this(NAME, df) if r is not None})
    return got


def test_claims_seen_on_plausible_synthetic_data():
    ex = _claims(synthetic_frame())
    assert len(ex) == 6
    main = ["correct", "fast_gain", "less_accurate", "smaller_gain_at_one"]
    assert all(ex[k].passed for k in main), [(k, ex[k].evidence) for k in main]
    assert "24/24" in ex["correct"].evidence
    assert f"fast_math: {fmt.ratio(4.0)}" in ex["fast_gain"].evidence
    assert "256 iterations" in ex["fast_gain"].evidence
    assert f"precise {fmt.error(1.5e-7)}" in ex["less_accurate"].evidence
    assert f"intrinsics {fmt.error(8e-7)}" in ex["less_accurate"].evidence
    # memory-bound at 1 iteration in this model: no gain there, as the Try-this asks
    assert ex["one_iteration_no_gain"].passed is True


def test_claims_not_seen_when_the_data_says_so():
    ex = _claims(synthetic_frame(fast_speedup=0.9, fast_err=1e-7,
                                 wrong=(("intrinsics", 1 << 20, 16),)))
    assert [ex[k].passed for k in ("correct", "fast_gain", "less_accurate")] == [
        False, False, False]
    assert "23/24" in ex["correct"].evidence


def test_a_gain_at_one_iteration_contradicts_the_memory_bound_prediction():
    """The kernel is not memory-bound at 1 iteration where the precise functions cost
    more than the memory traffic: the Try-this prediction is then not seen."""
    df = synthetic_frame()
    one = (df["p_iterations"] == 1) & (df["variant"] == "precise")
    df.loc[one, "time_median_s"] *= 1.4
    ex = _claims(df)
    assert ex["one_iteration_no_gain"].passed is False
    assert fmt.ratio(1.4) in ex["one_iteration_no_gain"].evidence


def test_claims_need_the_variants_they_compare():
    df = synthetic_frame()
    ex = _claims(df[df["variant"] == "precise"])
    assert ex["correct"].passed is True
    assert all(r.passed is None for k, r in ex.items() if k != "correct")


def test_plot_time_and_error_side_by_side():
    df = synthetic_frame()
    fig = EXP.plot("time_error", df)
    ax_t, ax_e = fig.get_axes()
    assert "ms" in ax_t.get_ylabel() and ax_t.get_yscale() == "log"
    assert "relative error" in ax_e.get_ylabel() and ax_e.get_yscale() == "log"
    assert "16,777,216" in ax_t.get_title()
    assert len(ax_e.get_lines()) >= 2  # tolerance lines
    assert EXP.plot("time_error", df[df["status"] == "wrong"]) is None
    with pytest.raises(KeyError):
        EXP.plot("nope", df)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_fast_variants_constant():
    assert FAST == ["fast_math", "intrinsics"]


# -- the GPU code path on a FAKE GPU ----------------------------------------------------------
# No GPU here: a stand-in for pycuda.driver and GpuSession runs measure() through the real
# runner, with each kernel emulated in numpy. It checks the plumbing (argument lists against
# prepare(), grid sizes, buffers, poisoning, checks, metrics, records), not the GPU.
# test_atomics.py and test_sobel.py use it too.
class FakeAlloc:
    def __init__(self, nbytes):
        self.buf = np.zeros(nbytes, np.uint8)
        self.freed = False

    def free(self):
        self.freed = True


class FakeCuda:
    """The pycuda.driver calls the experiments make, on host memory."""

    def __init__(self):
        self.allocs = []
        self.symbols = {}  # fake device address -> FakeAlloc (module globals)

    def mem_alloc(self, nbytes):
        a = FakeAlloc(int(nbytes))
        self.allocs.append(a)
        return a

    def _mem(self, dev):
        mem = self.symbols[dev] if isinstance(dev, int) else dev
        assert not mem.freed, "use after free"
        return mem

    def memcpy_htod(self, dest, src):
        raw = np.ascontiguousarray(src).view(np.uint8).ravel()
        mem = self._mem(dest)
        assert raw.size <= mem.buf.size, "copy larger than the allocation"
        mem.buf[: raw.size] = raw

    def memcpy_dtoh(self, dest, src):
        out = dest.view(np.uint8).reshape(-1)
        out[:] = self._mem(src).buf[: out.size]

    def memset_d32(self, dest, value, count):
        self._mem(dest).buf[: 4 * count].view(np.uint32)[:] = value

    def memset_d8(self, dest, value, count):
        self._mem(dest).buf[:count] = value


class FakeFunction:
    def __init__(self, kernel, name):
        self.kernel, self.name, self.fmt = kernel, name, None

    def prepare(self, fmt):
        self.fmt = fmt
        return self

    def prepared_call(self, grid, block, *args, shared_size=0):
        assert self.fmt is not None and len(args) == len(self.fmt), (self.fmt, args)
        for code, a in zip(self.fmt, args):
            want = {"P": FakeAlloc, "i": int, "I": int, "f": float}[code]
            assert isinstance(a, want) or (code in "iIf" and isinstance(a, np.number)), (code, a)
        assert len(grid) in (2, 3) and len(block) == 3 and math.prod(block) <= 1024
        self.kernel.gpu.launches += 1
        self.kernel.gpu.emulators[self.name](self.kernel, grid, block, *args)


class FakeModule:
    def __init__(self, kernel):
        self.kernel = kernel

    def get_global(self, name):
        cuda = self.kernel.gpu.cuda
        if name not in self.kernel.globals:
            addr = 0x1000 + 0x100 * len(cuda.symbols)
            cuda.symbols[addr] = FakeAlloc(self.kernel.gpu.global_sizes[name])
            self.kernel.globals[name] = addr
        addr = self.kernel.globals[name]
        return addr, cuda.symbols[addr].buf.size


class FakeKernel:
    def __init__(self, gpu, source_file, defines, options):
        self.gpu, self.source_file = gpu, source_file
        self.defines, self.options = dict(defines), ["-O3", *options]
        self.source_hash = f"fake-{source_file}-{sorted(self.defines.items())}-{options}"
        self.globals = {}
        self.module = FakeModule(self)

    def function(self, name):
        assert name in self.gpu.emulators, f"no kernel {name}"
        return FakeFunction(self, name)


class FakeGpu:
    """GpuSession's interface; time is host time (WallTimer)."""

    index = 0
    info = {"gpu_name": "FAKE GPU (CPU test)", "gpu_uuid": "GPU-fake",
            "gpu_pci_bus_id": "0000:00:00.0", "compute_capability": "9.0"}

    def __init__(self, emulators, global_sizes=None):
        self.cuda = FakeCuda()
        self.emulators = emulators
        self.global_sizes = global_sizes or {}
        self.kernels = {}
        self.launches = 0

    def compile(self, source_file, defines=None, options=()):
        key = (source_file, tuple(sorted((defines or {}).items())), tuple(options))
        if key not in self.kernels:
            self.kernels[key] = FakeKernel(self, source_file, defines or {}, options)
        return self.kernels[key]

    def event_timer(self):
        from cudalab.harness import WallTimer

        return WallTimer()

    def synchronize(self):
        pass


def run_on_fake_gpu(name, block, gpu, tmp_path, monkeypatch, **measurement):
    """The real runner over `block` with `gpu` standing in for the device; the table.
    `measurement` overrides the (fast, unbatched) harness settings."""
    from cudalab import gpu as gpumod
    from cudalab.runner import run_experiment

    monkeypatch.setattr(gpumod, "open_session", lambda index=0: gpu)
    config = cfg.validate({
        # the fake device runs only this experiment's kernels: no measured ceilings
        "measurement": {"warmup": 1, "min_samples": 2, "max_samples": 3, "budget_s": 0.01,
                        "min_sample_s": 0, "ceilings": False, **measurement},
        "telemetry": {"nvidia_smi": False, "nvml": False},
        "experiments": {name: dict(block)},
    })
    manifest = run_experiment(config, name, tmp_path)
    recs = list(results.iter_records(tmp_path / "raw"))
    assert recs and manifest["counts"]["failed"] == 0, [r.get("reason") for r in recs]
    assert all(a.freed for a in gpu.cuda.allocs), "a device buffer was not freed"
    df = results.build_table(recs)
    assert results.check_table(df) == []
    return df


def _emulate_fast_math(kernel, grid, block, x_d, y_d, n, iterations, inv):
    x = x_d.buf.view(np.float32)[:n]
    y = y_d.buf.view(np.float32)
    covered = min(n, grid[0] * block[0])  # threads past n return
    s = np.zeros(covered, np.float32)
    for k in range(iterations):
        s += f64(x[:covered] * np.float32(1 - k * STEP)).astype(np.float32)
    out = s * np.float32(inv)
    if kernel.options[1:] or kernel.defines:  # the fast builds: a little less accurate
        out *= np.float32(1 + 8e-7)
    y[:covered] = out


def test_smoke_grid_through_the_runner_on_a_fake_gpu(tmp_path, monkeypatch):
    gpu = FakeGpu({"fast_math_kernel": _emulate_fast_math})
    df = run_on_fake_gpu(NAME, EXP.smoke, gpu, tmp_path, monkeypatch)
    assert (df["status"] == "ok").all(), df[["point_id", "reason"]].to_string()
    assert len(df) == len(EXP.points(validate(dict(EXP.smoke))))
    builds = {k.source_file: None for k in gpu.kernels.values()}
    # common/floor.cu: the job's floor
    assert builds == {"fast_math/fast_math.cu": None, "common/floor.cu": None}
    opts = {(tuple(k.options), tuple(k.defines)) for k in gpu.kernels.values()}
    assert opts == {(("-O3",), ()), (("-O3", "--use_fast_math"), ()),
                    (("-O3",), ("USE_INTRINSICS",))}
    fast = df[df["variant"] != "precise"]
    assert (fast["m_max_rel_err"] > 5e-7).all() and (fast["tolerance"] == 5e-6).all()
    pre = df[df["variant"] == "precise"]
    assert (pre["m_speedup"] == 1.0).all() and (pre["tolerance"] == 3e-6).all()
    assert df["m_speedup"].notna().all() and (df["m_nonfinite"] == 0).all()
    assert df["gflops"].notna().all() and df["gbps"].notna().all()
    assert set(df["m_checked"]) == {1000, 4096}  # n = 65536 checks a 4096-sample subset
    assert EXP.plot("time_error", df) is not None
    assert len(claims.evaluate(NAME, df)) == 4


def test_unwritten_outputs_fail_the_check(tmp_path, monkeypatch):
    def half(kernel, grid, block, x_d, y_d, n, iterations, inv):  # a wrong grid size
        _emulate_fast_math(kernel, (grid[0] // 2, 1), block, x_d, y_d, n, iterations, inv)

    gpu = FakeGpu({"fast_math_kernel": half})
    df = run_on_fake_gpu(NAME, {"sizes": [2048], "iterations": [1], "variants": ["precise"]},
                         gpu, tmp_path, monkeypatch)
    row = df.iloc[0]
    assert row["status"] == "wrong" and "1024 outputs not finite" in row["reason"]


def test_speedup_when_the_precise_point_was_reused_from_an_earlier_job(tmp_path, monkeypatch):
    block = {"sizes": [1000], "iterations": [3]}
    gpu = FakeGpu({"fast_math_kernel": _emulate_fast_math})
    run_on_fake_gpu(NAME, block | {"variants": ["precise"]}, gpu, tmp_path, monkeypatch)
    gpu2 = FakeGpu({"fast_math_kernel": _emulate_fast_math})
    df = run_on_fake_gpu(NAME, block, gpu2, tmp_path, monkeypatch)
    assert df.set_index("variant")["cached"].to_dict() == {
        "fast_math": False, "intrinsics": False, "precise": True}
    # the precise kernel was compiled and timed again in the second job, for the speedup
    assert any(not k.options[1:] and not k.defines for k in gpu2.kernels.values())
    assert df["m_precise_s"].notna().all() and df["m_speedup"].gt(0).all()


# -- the kernel source ----------------------------------------------------------------------
@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc not installed")
@pytest.mark.parametrize("flags, want, unwanted", [
    ([], ["sqrt.rn.f32", "div.rn.f32"], ["sin.approx", "cos.approx", "div.approx"]),
    (["--use_fast_math"], ["sin.approx.ftz", "cos.approx.ftz", "sqrt.approx", "div.approx"],
     ["div.rn", "sqrt.rn"]),
    (["-DUSE_INTRINSICS"], ["sin.approx.f32", "cos.approx.f32", "rsqrt.approx", "div.approx"],
     ["div.rn", "sqrt.rn", ".ftz"]),
])
def test_the_three_builds_use_the_functions_they_claim(flags, want, unwanted, tmp_path):
    """PTX of each build: the fast builds use the hardware approximations; the compensated
    sum survives --use_fast_math (nvcc does not re-associate)."""
    import subprocess

    ptx = tmp_path / "f.ptx"
    out = subprocess.run(["nvcc", "-O3", *flags, "-ptx",
                          str(ROOT / "cuda" / "fast_math/fast_math.cu"), "-o", str(ptx)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = ptx.read_text()
    for w in want:
        assert w in text, w
    for w in unwanted:
        assert w not in text, w
    # Kahan: s = sum + v; comp = (s - sum) - v  ->  one add and two subtractions per step
    assert text.count("sub.") >= 2 * text.count("sin.approx")
