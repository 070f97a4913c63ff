"""CPU tests of the measured ceilings: sizes and CPU references (against literal emulations
of the kernels in cuda/common/ceilings.cu), measure() on an emulated GPU (checks catch wrong
kernels, buffers are freed), the runner's plumbing (work, manifest, switch, failures), the
table's derived columns (memory level, % of ceiling, suspect) on SYNTHETIC records, old
tables, results/ceilings.csv, and nvcc on the kernel file.

Every number below that looks like a measurement is SYNTHETIC TEST DATA."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cudalab import ceilings, devicespec, results, runner
from cudalab import config as cfg
from cudalab.ceilings import (
    Ceilings,
    count_iota_mismatches,
    dram_buffer_bytes,
    fma_expected,
    fma_tolerance,
    l2_buffer_bytes,
    rotation_words,
    smem_expected,
)
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Check, Experiment, Point, Result
from cudalab.harness import Harness, Settings, Timing, WallTimer

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
H100 = {"COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0,
        "MULTIPROCESSOR_COUNT": 132, "CLOCK_RATE": 1_980_000, "MEMORY_CLOCK_RATE": 2_619_000,
        "GLOBAL_MEMORY_BUS_WIDTH": 5120, "L2_CACHE_SIZE": 50 * MiB,
        "MAX_THREADS_PER_MULTIPROCESSOR": 2048}
QUICK = Settings(warmup=0, min_samples=2, max_samples=3, budget_s=0.01, min_sample_s=0)


# -- sizes -----------------------------------------------------------------------------------
def test_dram_buffers_are_8x_l2_each_unless_memory_is_short():
    assert dram_buffer_bytes(50 * MiB, 80 << 30) == 400 * MiB  # 16 x L2 moved
    assert dram_buffer_bytes(50 * MiB, 1 << 30) == 128 * MiB  # a quarter of 1 GiB free
    assert dram_buffer_bytes(1 << 30, 1 << 40) == ceilings.MAX_BUFFER  # uint32 iota stays unique
    assert dram_buffer_bytes(0, 80 << 30) == 8 * ceilings.MIN_L2  # no L2 reported
    assert dram_buffer_bytes(50 * MiB, 0) == 0
    assert dram_buffer_bytes(50 * MiB + 12345, 80 << 30) % MiB == 0


def test_l2_buffers_fill_half_the_l2():
    for l2 in (40 * MiB, 50 * MiB, 60 * MiB, 6 * MiB, 4 * MiB):
        b = l2_buffer_bytes(l2)
        assert 2 * b <= l2 // 2 + 65536 and b % 65536 == 0 and b > 0.9 * l2 / 4, (l2, b)
        n4 = b // 16
        assert n4 >= 4 * ceilings.L2_SHIFT_F4  # the rotation wraps inside the buffer


# -- copy_f4: rotation and check ------------------------------------------------------------
def emulate_copy_f4(inp: np.ndarray, reps: int, shift: int, threads: int = 64,
                    blocks: int = 3, unroll: int = ceilings.COPY_UNROLL) -> np.ndarray:
    """copy_f4 as written in cuda/common/ceilings.cu, thread by thread (float4 = 4 uint32 words)."""
    src = inp.view(np.uint32).reshape(-1, 4)
    out = np.full_like(src, ceilings.POISON)
    n4, stride = len(src), threads * blocks
    for gid in range(stride):
        off = 0
        for _ in range(reps):
            i = gid
            while i + (unroll - 1) * stride < n4:
                vals = [src[(i + u * stride + off) % n4].copy() for u in range(unroll)]
                for u in range(unroll):
                    out[i + u * stride] = vals[u]
                i += unroll * stride
            while i < n4:
                out[i] = src[(i + off) % n4]
                i += stride
            off = (off + shift) % n4
    return out.reshape(-1)


@pytest.mark.parametrize("n4, reps, shift", [(1000, 1, 0), (1024, 5, 96), (777, 3, 700)])
def test_copy_f4_output_is_the_rotation_the_check_expects(n4, reps, shift):
    iota = np.arange(4 * n4, dtype=np.uint32)
    out = emulate_copy_f4(iota, reps, shift)
    rot = rotation_words(4 * n4, reps, shift)
    assert count_iota_mismatches(out, rot) == 0
    if rot:
        assert count_iota_mismatches(out, 0) > 0  # the rotation is not a formality
    broken = out.copy()
    broken[[5, 4 * n4 - 1]] = ceilings.POISON
    assert count_iota_mismatches(broken, rot) == 2


def test_iota_check_works_across_chunks(monkeypatch):
    monkeypatch.setattr(ceilings, "CHECK_CHUNK", 7)
    iota = np.arange(100, dtype=np.uint32)
    assert count_iota_mismatches(np.roll(iota, -37), 37) == 0
    assert count_iota_mismatches(iota, 0) == 0
    assert count_iota_mismatches(np.roll(iota, -36), 37) == 100


# -- smem_read -------------------------------------------------------------------------------
def emulate_smem_read(threads: int, iters: int) -> np.ndarray:
    """smem_read's per-thread sum, literally (loops, float32 accumulators)."""
    n_f4 = 4 * threads
    tile = [((k & 7), (k >> 3) & 7, (k >> 6) & 15, 1) for k in range(n_f4)]
    out = []
    for t in range(threads):
        acc = np.zeros(4, np.float32)
        base = t
        for _ in range(iters):
            for u in range(4):
                acc += np.asarray(tile[(base + u * threads) & (n_f4 - 1)], np.float32)
            base = (base + 32) & (n_f4 - 1)
        out.append(np.float32(acc[0] + acc[1] + acc[2] + acc[3]))
    return np.asarray(out, np.float64)


def test_smem_reference_matches_the_kernel_loop():
    assert np.array_equal(smem_expected(32, 9), emulate_smem_read(32, 9))
    assert np.array_equal(smem_expected(64, 40), emulate_smem_read(64, 40))


def test_smem_sums_are_exact_in_float32():
    worst = smem_expected(ceilings.SMEM_THREADS, ceilings.SMEM_ITERS).max()
    assert worst < 2 ** 24  # so the kernel's float32 sums equal the float64 reference


# -- fma_chains ------------------------------------------------------------------------------
def emulate_fma_chains(n_threads: int, steps: int) -> np.ndarray:
    """fma_chains in float32 (the product and sum in float64, then rounded once: an FMA)."""
    gid = np.arange(n_threads)
    m, c = np.float64(ceilings.FMA_M), np.float64(ceilings.FMA_C)
    x = np.stack([ceilings.fma_start(gid, k).astype(np.float32)
                  for k in range(ceilings.FMA_CHAINS)])
    for _ in range(steps):
        x = (x.astype(np.float64) * m + c).astype(np.float32)
    return x.sum(axis=0, dtype=np.float32).astype(np.float64)


def test_fma_closed_form_matches_float32_chains_within_the_tolerance():
    steps = ceilings.FMA_ITERS * ceilings.FMA_UNROLL
    got = emulate_fma_chains(1024, steps)
    err = np.max(np.abs(got - fma_expected(1024, steps)) / fma_expected(1024, steps))
    assert err <= fma_tolerance(steps)
    assert fma_tolerance(steps) < 1e-3


def test_fma_check_notices_a_missing_unrolled_body():
    steps = ceilings.FMA_ITERS * ceilings.FMA_UNROLL
    short = fma_expected(1024, steps - ceilings.FMA_UNROLL)
    full = fma_expected(1024, steps)
    assert np.min(np.abs(short - full) / full) > 5 * fma_tolerance(steps)


def test_best_rate_is_the_fastest_clean_sample():
    t = Timing(samples_s=[2e-3, 1e-3, 4e-3], batch=1, timer="x", stop_reason="budget",
               throttled=[False, True, False])
    assert ceilings.best_rate(4e9, t) == pytest.approx(2000.0)  # 4 GB in 2 ms (1 ms: throttled)


# -- devicespec ------------------------------------------------------------------------------
class AttrGpu:
    def __init__(self, attrs):
        self.attrs = attrs

    def attr(self, name):
        return self.attrs[name]


def test_shared_memory_peak_and_l2_size_from_driver_attributes():
    p = devicespec.memory_peaks(AttrGpu(H100))
    assert p["peak_smem_gbps"] == pytest.approx(132 * 128 * 1.98)  # 33 454 GB/s
    assert p["l2_bytes"] == 50 * MiB
    assert math.isnan(p["peak_l2_gbps"])  # no reliable formula (see memory_peaks)
    kepler = devicespec.memory_peaks(AttrGpu(H100 | {"COMPUTE_CAPABILITY_MAJOR": 3,
                                                     "COMPUTE_CAPABILITY_MINOR": 5}))
    assert kepler["peak_smem_gbps"] == pytest.approx(2 * p["peak_smem_gbps"])  # 8-byte banks
    assert all(math.isnan(v) for v in devicespec.memory_peaks(AttrGpu({})).values())


# -- measure() on an emulated GPU --------------------------------------------------------------
class Alloc:
    def __init__(self, nbytes):
        self.buf = np.zeros(nbytes, np.uint8)
        self.freed = False

    def free(self):
        self.freed = True


class EmuCuda:
    """The pycuda.driver calls ceilings.measure makes, on host memory."""

    def __init__(self, free_bytes=1 << 30):
        self.allocs, self.free_bytes, self.memcpys = [], free_bytes, 0

    def mem_get_info(self):
        return self.free_bytes, 2 * self.free_bytes

    def mem_alloc(self, n):
        self.allocs.append(Alloc(n))
        return self.allocs[-1]

    def memset_d32(self, dev, value, count):
        dev.buf[: 4 * count].view(np.uint32)[:] = value

    def memcpy_dtoh(self, host, dev):
        host.view(np.uint8).reshape(-1)[:] = dev.buf[: host.nbytes]

    def memcpy_dtod_async(self, dst, src, nbytes):
        self.memcpys += 1
        dst.buf[:nbytes] = src.buf[:nbytes]


class EmuFunction:
    num_regs, shared_size_bytes = 32, 0

    def __init__(self, emulate, smem=0):
        self.emulate, self.shared_size_bytes = emulate, smem

    def prepare(self, fmt):
        self.fmt = fmt

    def prepared_call(self, grid, block, *args):
        assert len(args) == len(self.fmt)
        self.emulate(grid[0] * block[0], *args)


def _fill(threads, a, n):
    a.buf[: 4 * n].view(np.uint32)[:] = np.arange(n, dtype=np.uint32)


def _copy(threads, out, inp, n4, reps, shift):
    # the kernel's result (each element moved once per pass; the last pass stays)
    rot = ((reps - 1) * shift) % n4
    src = inp.buf[: 16 * n4].view(np.uint32).reshape(-1, 4)
    out.buf[: 16 * n4].view(np.uint32).reshape(-1, 4)[:] = np.roll(src, -rot, axis=0)


def _smem(threads, out, iters):
    per_block = emulate_smem_read(ceilings.SMEM_THREADS, iters)
    out.buf[: 4 * threads].view(np.float32)[:] = np.tile(per_block, threads // len(per_block))


def _fma(threads, out, m, c, iters):
    vals = emulate_fma_chains(1024, iters * ceilings.FMA_UNROLL)
    out.buf[: 4 * threads].view(np.float32)[:] = vals[np.arange(threads) & 1023]


class EmuKernel:
    def __init__(self, emus):
        self.emus = emus

    def function(self, name):
        smem = 16384 if name == "smem_read" else 0
        return EmuFunction(self.emus[name], smem)


class EmuGpu:
    info = {"compute_capability": "9.0", "gpu_name": "EMULATED H100", "gpu_uuid": "GPU-emu"}

    def __init__(self, attrs=None, **override):
        emus = {"fill_iota": _fill, "copy_f4": _copy, "smem_read": _smem, "fma_chains": _fma}
        self.kernel = EmuKernel(emus | override)
        self.attrs = H100 | {"MULTIPROCESSOR_COUNT": 2, "L2_CACHE_SIZE": MiB} | (attrs or {})
        self.cuda = EmuCuda()
        self.compiled = []

    def attr(self, name):
        return self.attrs[name]

    def compile(self, source, defines=None, options=()):
        self.compiled.append((source, dict(defines or {})))
        return self.kernel

    def event_timer(self):
        return WallTimer()

    def synchronize(self):
        pass


@pytest.fixture(scope="module")
def emulated():
    gpu = EmuGpu()
    return gpu, ceilings.measure(gpu, Harness(QUICK), QUICK)


def test_measure_on_an_emulated_gpu_fills_every_key(emulated):
    gpu, c = emulated
    assert set(c.values) == set(ceilings.KEYS)
    for k in ceilings.MEASURED_KEYS:
        assert math.isfinite(c.values[k]) and c.values[k] > 0, (k, c.notes)
    assert c.notes == {} and c.errors == []
    assert c.values["ceil_dram_gbps"] == max(c.values["ceil_dram_memcpy_gbps"],
                                             ceilings.best_rate(
                                                 c.detail["dram_copy_f4"]["bytes"],
                                                 _timing(c.detail["dram_copy_f4"])))
    assert gpu.compiled == [("common/ceilings.cu", ceilings.DEFINES)]
    assert all(a.freed for a in gpu.cuda.allocs), "a device buffer was not freed"
    # 8 x L2 per DRAM buffer, a quarter of the L2 per L2 buffer; grid = SMs x 8 blocks
    assert c.detail["dram_copy_f4"]["working_set_bytes"] == 16 * MiB
    assert c.detail["l2_copy_f4"]["working_set_bytes"] == MiB // 2
    assert c.detail["smem_read"]["threads"] == 2 * 8 * ceilings.SMEM_THREADS
    assert c.values["l2_bytes"] == MiB and math.isnan(c.values["peak_l2_gbps"])


def _timing(d):
    return Timing(samples_s=[d["best_s"]], batch=1, timer="x", stop_reason="x")


def test_a_kernel_that_copies_wrong_gives_nan_and_says_why():
    def lazy(threads, out, inp, n4, reps, shift):
        _copy(threads, out, inp, n4, 1, 0)  # ignores the passes: the L2 output is unrotated

    gpu = EmuGpu(copy_f4=lazy)
    c = ceilings.measure(gpu, Harness(QUICK), QUICK)
    assert math.isnan(c.values["ceil_l2_gbps"])
    assert c.notes["ceil_l2_gbps"].startswith("check failed: L2 copy:")
    assert math.isfinite(c.values["ceil_dram_gbps"])  # one pass: right for DRAM
    assert math.isfinite(c.values["ceil_smem_gbps"]) and c.errors == []
    assert all(a.freed for a in gpu.cuda.allocs)


def test_a_wrong_float4_copy_leaves_the_dram_ceiling_to_memcpy():
    def nothing(threads, out, inp, n4, reps, shift):
        pass

    c = ceilings.measure(EmuGpu(copy_f4=nothing), Harness(QUICK), QUICK)
    assert c.values["ceil_dram_gbps"] == c.values["ceil_dram_memcpy_gbps"] > 0
    assert "cudaMemcpy alone" in c.notes["ceil_dram_gbps"]
    assert "check failed" in c.notes["ceil_dram_gbps"]


def test_wrong_shared_memory_and_fma_results_fail_their_checks():
    def off_by_one(threads, out, iters):
        _smem(threads, out, iters - 1)

    def short(threads, out, m, c, iters):
        _fma(threads, out, m, c, iters - 1)

    c = ceilings.measure(EmuGpu(smem_read=off_by_one, fma_chains=short), Harness(QUICK), QUICK)
    assert math.isnan(c.values["ceil_smem_gbps"]) and math.isnan(c.values["ceil_fp32_gflops"])
    assert "thread sums differ" in c.notes["ceil_smem_gbps"]
    assert "relative error" in c.notes["ceil_fp32_gflops"]


def test_an_error_in_one_ceiling_leaves_the_others():
    def boom(threads, out, iters):
        raise RuntimeError("launch failed")

    gpu = EmuGpu(smem_read=boom)
    c = ceilings.measure(gpu, Harness(QUICK), QUICK)
    assert math.isnan(c.values["ceil_smem_gbps"])
    assert c.notes["ceil_smem_gbps"] == "RuntimeError: launch failed"
    assert [str(e) for e in c.errors] == ["launch failed"]
    assert math.isfinite(c.values["ceil_fp32_gflops"])
    assert all(a.freed for a in gpu.cuda.allocs)


def test_short_free_memory_shrinks_the_dram_working_set_with_a_note():
    gpu = EmuGpu()
    gpu.cuda.free_bytes = 40 * MiB  # room for two 5 MiB buffers
    c = ceilings.measure(gpu, Harness(QUICK), QUICK)
    assert c.detail["dram_copy_f4"]["working_set_bytes"] == 10 * MiB
    assert "working set only 10.0 x L2" in c.notes["ceil_dram_gbps"]
    assert math.isfinite(c.values["ceil_dram_gbps"])


def test_a_compile_failure_makes_every_ceiling_nan():
    class NoNvcc(EmuGpu):
        def compile(self, *a, **k):
            raise OSError("nvcc not found")

    c = ceilings.measure(NoNvcc(), Harness(QUICK), QUICK)
    assert all(math.isnan(c.values[k]) for k in ceilings.MEASURED_KEYS)
    assert c.values["l2_bytes"] == MiB  # the theoretical keys stay
    assert all("did not compile" in c.notes[k] for k in ceilings.MEASURED_KEYS)
    assert "ceil_fp32_gflops: common/ceilings.cu did not compile" in c.note


# -- the runner -------------------------------------------------------------------------------
class GpuDouble(Experiment):
    """Two GPU points and a CPU point; its results carry a working set on the first."""

    name = "gpudouble"
    schema = {"type": "object"}
    no_check_reason = "a test double"

    def __init__(self, vs_peak=True):
        self.vs_device_peak = vs_peak

    def points(self, block):
        return [Point(self.name, "gpu", {"i": i}) for i in range(2)] + [
            Point(self.name, "cpu", {"i": 0}, gpu=False)]

    def measure(self, ctx, point):
        t = ctx.harness.measure(lambda: None, WallTimer())
        ws = 1e6 if point.params["i"] == 0 and point.gpu else math.nan
        return Result(t, bytes=1e9, check=Check(0.0, 0.0, "abs"), working_set=ws)


class Session:
    index = 0
    info = {"gpu_name": "SYNTHETIC H100", "gpu_uuid": "GPU-synthetic",
            "gpu_pci_bus_id": "0000:18:00.0", "compute_capability": "9.0"}
    cuda = None

    def attr(self, name):
        return H100[name]


SYNTHETIC_CEILINGS = {"ceil_dram_gbps": 3000.0, "ceil_dram_memcpy_gbps": 3000.0,
                      "ceil_l2_gbps": 7000.0, "ceil_smem_gbps": 31000.0,
                      "ceil_fp32_gflops": 63000.0, "peak_smem_gbps": 33454.08,
                      "peak_l2_gbps": math.nan, "l2_bytes": 50.0 * MiB}


def _run(tmp_path, monkeypatch, measurement=None, vs_peak=True, measure=None):
    from cudalab import gpu as gpumod

    calls = []

    def fake_measure(gpu, harness):
        calls.append(harness)
        if measure is not None:
            return measure()
        return Ceilings(dict(SYNTHETIC_CEILINGS), {}, {"dram_memcpy": {"bytes": 1.0}})

    monkeypatch.setitem(REGISTRY, "gpudouble", GpuDouble(vs_peak))
    monkeypatch.setattr(gpumod, "open_session", lambda index=0: Session())
    monkeypatch.setattr(ceilings, "measure", fake_measure)
    config = cfg.validate({
        "measurement": {"warmup": 0, "min_samples": 2, "max_samples": 3, "budget_s": 0.01,
                        "min_sample_s": 0, **(measurement or {})},
        "telemetry": {"nvidia_smi": False, "nvml": False},
        "experiments": {"gpudouble": {}}})
    manifest = runner.run_experiment(config, "gpudouble", tmp_path)
    recs = {r["point_id"]: r for r in results.iter_records(tmp_path / "raw")}
    return manifest, recs, calls


def test_ceilings_go_into_every_gpu_record_and_the_manifest(tmp_path, monkeypatch, capsys):
    manifest, recs, calls = _run(tmp_path, monkeypatch)
    assert len(calls) == 1  # once per job
    assert manifest["ceilings"] == SYNTHETIC_CEILINGS | {"peak_l2_gbps": pytest.approx(
        math.nan, nan_ok=True)}
    assert manifest["ceilings_note"] == "" and "dram_memcpy" in manifest["ceilings_detail"]
    for pid in ("gpu-i0", "gpu-i1"):
        work = recs[pid]["work"]
        assert work["ceil_l2_gbps"] == 7000.0 and work["peak_mem_gbps"] == pytest.approx(3352.32)
    assert recs["gpu-i0"]["work"]["working_set"] == 1e6
    assert "ceil_dram_gbps" not in recs["cpu-i0"]["work"]  # a CPU point has no device
    assert "ceilings" in capsys.readouterr().err  # one log line with the values
    df = results.build_table(recs.values()).set_index("point_id")
    assert results.check_table(df.reset_index()) == []
    assert df.loc["gpu-i0", "memory_level"] == "l2" and df.loc["gpu-i1", "memory_level"] == "dram"
    assert df.loc["cpu-i0", "memory_level"] == ""


def test_the_switch_off_keeps_the_theoretical_keys_and_says_why(tmp_path, monkeypatch):
    manifest, recs, calls = _run(tmp_path, monkeypatch, {"ceilings": False})
    assert calls == []
    assert all(math.isnan(manifest["ceilings"][k]) for k in ceilings.MEASURED_KEYS)
    assert manifest["ceilings"]["l2_bytes"] == 50 * MiB
    assert manifest["ceilings_note"] == "ceilings: measurement.ceilings is false"
    assert math.isnan(recs["gpu-i0"]["work"]["ceil_dram_gbps"])


def test_a_failing_ceilings_step_never_stops_the_job(tmp_path, monkeypatch):
    def broken():
        raise ValueError("no luck")

    manifest, recs, _ = _run(tmp_path, monkeypatch, measure=broken)
    assert manifest["counts"]["ok"] == 3
    assert manifest["ceilings_note"] == "ceilings: ValueError: no luck"
    assert all(math.isnan(manifest["ceilings"][k]) for k in ceilings.MEASURED_KEYS)


def test_experiments_not_compared_with_the_device_measure_no_ceilings(tmp_path, monkeypatch):
    manifest, recs, calls = _run(tmp_path, monkeypatch, vs_peak=False)
    assert calls == [] and "ceilings" not in manifest
    assert "ceil_dram_gbps" not in recs["gpu-i0"]["work"]


def test_the_config_switch_defaults_to_true_and_is_a_boolean():
    exps = {"vector_add": {}}
    assert cfg.validate({"experiments": exps})["measurement"]["ceilings"] is True
    with pytest.raises(ConfigError, match="measurement.ceilings"):
        cfg.validate({"measurement": {"ceilings": "yes"}, "experiments": exps})


def test_the_ceilings_switch_does_not_change_cached_points():
    """Points are reused across the switch: it changes no kernel timing, only the ceilings."""
    exps = {"vector_add": {}}
    a = cfg.validate({"experiments": exps})["measurement"]
    b = cfg.validate({"measurement": {"ceilings": False}, "experiments": exps})["measurement"]
    assert Settings.from_config(a) == Settings.from_config(b)


# -- table columns on SYNTHETIC records --------------------------------------------------------
def synthetic(pid, *, gbps=None, gflops=None, nbytes=1e9, flops=math.nan, ws=math.nan,
              ceil=None, cold=False, status="ok", peaks=True):
    """A SYNTHETIC record: the median time makes the given GB/s (or GFLOP/s)."""
    if gbps is not None:
        med = nbytes / gbps / 1e9
    else:
        med = flops / gflops / 1e9
    work = {"flops": flops, "bytes": nbytes, "working_set": ws}
    if peaks:
        work |= {"peak_mem_gbps": 3352.32, "peak_fp32_gflops": 66908.16}
    work |= SYNTHETIC_CEILINGS if ceil is None else ceil
    return {"schema_version": 1, "experiment": "synthetic", "variant": "v", "point_id": pid,
            "params": {}, "status": status, "reason": "", "job_id": "synthetic",
            "timing": {"median": med, "n": 3, "batch": 1, "timer": "cuda_event",
                       "harness": {"cold_l2": cold}},
            "work": work, "check": None, "metrics": {}, "provenance": {}}


def _row(rec):
    return results.build_table([rec]).iloc[0]


def test_a_working_set_within_l2_is_compared_with_the_l2_ceiling():
    r = _row(synthetic("a", gbps=3500, ws=32 * MiB))
    assert r["memory_level"] == "l2" and r["working_set_bytes"] == 32 * MiB
    assert r["pct_ceil_gbps"] == pytest.approx(50.0)  # of 7000
    assert r["pct_peak_gbps"] > 100  # above DRAM's theory, and rightly so: no suspect
    assert not r["suspect"]


def test_a_working_set_beyond_l2_is_compared_with_the_dram_ceiling():
    r = _row(synthetic("a", gbps=1500, ws=64 * MiB))
    assert r["memory_level"] == "dram" and r["pct_ceil_gbps"] == pytest.approx(50.0)
    assert not r["suspect"]


def test_without_a_declared_working_set_the_bytes_are_it():
    r = _row(synthetic("a", gbps=1500, nbytes=16 * MiB))
    assert r["working_set_bytes"] == 16 * MiB and r["memory_level"] == "l2"


def test_a_flushed_l2_makes_every_point_dram():
    r = _row(synthetic("a", gbps=1500, ws=MiB, cold=True))
    assert r["memory_level"] == "dram" and r["pct_ceil_gbps"] == pytest.approx(50.0)


def test_above_the_ceiling_is_suspect_at_once():
    assert _row(synthetic("a", gbps=3001, ws=64 * MiB))["suspect"]
    assert not _row(synthetic("a", gbps=3000, ws=64 * MiB))["suspect"]  # exactly 100 %
    assert _row(synthetic("a", gbps=7001, ws=MiB))["suspect"]
    f = _row(synthetic("f", gflops=64000, flops=1e12, nbytes=math.nan))
    assert f["pct_ceil_gflops"] == pytest.approx(100 * 64000 / 63000) and f["suspect"]
    assert f["memory_level"] == ""  # neither bytes nor a working set: no level


def test_without_measured_ceilings_the_theoretical_peak_decides():
    none = {k: math.nan for k in SYNTHETIC_CEILINGS} | {"l2_bytes": 50.0 * MiB}
    r = _row(synthetic("a", gbps=3400, ws=64 * MiB, ceil=none))
    assert math.isnan(r["pct_ceil_gbps"]) and r["suspect"]  # 101 % of 3352 GB/s
    r = _row(synthetic("a", gbps=3000, ws=64 * MiB, ceil=none))
    assert not r["suspect"]
    r = _row(synthetic("a", gbps=9000, ws=MiB, ceil=none))  # L2: no theory to compare
    assert r["memory_level"] == "l2" and pd.isna(r["suspect"])


def test_rows_without_a_speed_or_a_device_have_empty_ceiling_columns():
    wrong = _row(synthetic("a", gbps=9999, ws=64 * MiB, status="wrong"))
    assert math.isnan(wrong["pct_ceil_gbps"]) and pd.isna(wrong["suspect"])
    assert wrong["memory_level"] == "dram"  # where its working set lives is still known
    cpu = _row(synthetic("c", gbps=10, peaks=False, ceil={}))
    assert cpu["memory_level"] == "" and pd.isna(cpu["suspect"])
    assert math.isnan(cpu["ceil_dram_gbps"]) and math.isnan(cpu["l2_bytes"])


def test_records_from_before_the_ceilings_give_empty_columns():
    """The committed H100 records (tests/data/recorded_h100) have peaks but no ceilings."""
    recs = list(results.iter_records(ROOT / "tests" / "data" / "recorded_h100" / "raw"))
    df = results.build_table(recs)
    assert results.check_table(df) == []
    assert (df["memory_level"] == "").all() and df["suspect"].isna().all()
    assert df["ceil_dram_gbps"].isna().all() and df["pct_ceil_gbps"].isna().all()
    assert (df["working_set_bytes"].fillna(-1) == df["bytes"].fillna(-1)).all()


@pytest.mark.parametrize("ref", sorted((ROOT / "reports" / "reference").glob("*/results.csv")),
                         ids=lambda p: p.parent.name)
def test_committed_reference_tables_read_back_with_the_new_columns(ref):
    """Every committed reference reads back with the schema; one measured with the ceilings
    (H100 and H200 since 2026-11-26) has them on every GPU memory point, none suspect; one
    that predates them would come back with the columns empty."""
    df = results.read_table(ref)
    assert results.check_table(df) == []
    assert str(df["suspect"].dtype) == "boolean"
    if df["ceil_l2_gbps"].isna().all():
        assert (df["memory_level"] == "").all()
    else:
        gpu = df[df["memory_level"] != ""]
        assert set(gpu["memory_level"]) == {"dram", "l2"}
        assert gpu["ceil_dram_gbps"].notna().all() and not gpu["suspect"].any()


def test_new_columns_survive_the_csv_round_trip(tmp_path):
    recs = [synthetic("a", gbps=3500, ws=MiB), synthetic("b", gbps=3100, ws=64 * MiB),
            synthetic("c", gbps=10, peaks=False, ceil={})]
    df = results.build_table(recs)
    results.write_table(df, tmp_path / "results.csv")
    back = results.read_table(tmp_path / "results.csv").set_index("point_id")
    assert back.loc["a", "memory_level"] == "l2" and back.loc["c", "memory_level"] == ""
    assert bool(back.loc["b", "suspect"]) and pd.isna(back.loc["c", "suspect"])
    assert back.loc["b", "ceil_dram_gbps"] == 3000.0


# -- results/ceilings.csv ----------------------------------------------------------------------
def test_aggregate_writes_one_ceilings_row_per_gpu_job(tmp_path):
    from cudalab import cli

    raw = tmp_path / "results" / "raw"
    shutil.copytree(ROOT / "tests" / "data" / "recorded_h100" / "raw", raw)
    mpath = raw / "matmul" / "_manifest.json"
    m = json.loads(mpath.read_text())
    results.write_json_atomic(mpath, m | {"ceilings": SYNTHETIC_CEILINGS,
                                          "ceilings_note": "ceil_l2_gbps: SYNTHETIC"})
    out = tmp_path / "results" / "results.csv"
    assert cli.main(["aggregate", "--results", str(tmp_path / "results"), "--out", str(out),
                     "--manifests", str(mpath)]) == 0
    table = pd.read_csv(tmp_path / "results" / "ceilings.csv")
    assert list(table.columns) == ceilings.TABLE_COLUMNS
    assert len(table) == 1
    row = table.iloc[0]
    assert row["experiment"] == "matmul" and row["gpu_name"] == m["provenance"]["gpu_name"]
    assert row["ceil_l2_gbps"] == 7000.0 and math.isnan(row["peak_l2_gbps"])
    assert row["ceilings_note"] == "ceil_l2_gbps: SYNTHETIC"
    assert ceilings.ceilings_table([m]).empty  # a manifest without ceilings: no row


# -- the kernel file -------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_ceilings_cu_builds_for_sm90_without_spills(tmp_path):
    defines = [f"-D{k}={v}" for k, v in ceilings.DEFINES.items()]
    out = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", *defines,
                          "-o", str(tmp_path / "c.cubin"), str(ROOT / "cuda" / ceilings.SOURCE)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    log = out.stderr
    for name in ("fill_iota", "copy_f4", "smem_read", "fma_chains"):
        assert f"Function properties for {name}" in log, name
    assert " 0 bytes spill stores" in log and not re.search(r"[1-9]\d* bytes spill", log)
    smem = re.search(r"Compiling entry function 'smem_read'.*?(\d+) bytes smem", log, re.S)
    assert smem and int(smem.group(1)) == 16 * 4 * ceilings.SMEM_THREADS
