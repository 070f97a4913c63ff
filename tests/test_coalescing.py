"""CPU tests of the coalescing experiment (offset / stride copies, matrix transpose).

Every results frame below is SYNTHETIC TEST DATA: bandwidths fabricated from a sector-count
model with H100-like numbers, never measurements.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

from cudalab import claims, fmt, results
from cudalab import config as cfg
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.coalescing import (
    BLOCK_ROWS,
    TILE,
    TRANSPOSE_VARIANTS,
    gather_index,
    mismatches,
    read_sectors,
    stride_mask,
    transpose_grid,
)
from cudalab.experiments.lesson import State

matplotlib.use("Agg")

NAME = "coalescing"
EXP = REGISTRY[NAME]
PEAK = 3352.32


def validate(block: dict) -> dict:
    return cfg.validate({"experiments": {NAME: block}})["experiments"][NAME]


def synthetic_record(variant, params, gbps, *, nbytes, metrics=None, status="ok"):
    """A fabricated raw record (SYNTHETIC TEST DATA), shaped like the runner's."""
    pid = "-".join([variant] + [f"{k}{v}" for k, v in params.items()])
    median_s = nbytes / (gbps * 1e9)
    return {
        "schema_version": results.SCHEMA_VERSION, "experiment": NAME, "variant": variant,
        "point_id": pid, "params": params, "job_id": "synthetic", "status": status,
        "reason": "",
        "timing": {"samples_s": [median_s] * 3, "median": median_s, "iqr": 0.0, "cv": 0.0,
                   "min": median_s, "mean": median_s, "std": 0.0, "n": 3, "batch": 1,
                   "timer": "cuda_event", "stop_reason": "converged", "n_throttled": 0},
        "work": {"flops": math.nan, "bytes": nbytes, "peak_mem_gbps": PEAK},
        "check": {"error": 0.0 if status == "ok" else 5.0, "tolerance": 0.0,
                  "metric": "mismatched_elements", "passed": status == "ok", "detail": ""},
        "metrics": metrics or {}, "provenance": {"gpu_name": "SYNTHETIC H100"},
    }


def synthetic_frame(transpose=None, wrong=(), n=1 << 26, memcpy=3000, vec4=2850):
    """SYNTHETIC: GB/s = 3000 x 8 / (4 written + sectors read) bytes per element."""
    def gbps(sectors):
        return 3000 * 8 / (4 + sectors)

    recs = [synthetic_record("memcpy", {"n": n}, memcpy, nbytes=8.0 * n),
            synthetic_record("copy", {"n": n}, 2400, nbytes=8.0 * n,
                             metrics={"read_sectors": 4}),
            synthetic_record("copy_vec4", {"n": n}, vec4, nbytes=8.0 * n)]
    for o in range(33):
        sec = read_sectors(offset=o)
        recs.append(synthetic_record("offset", {"n": n, "offset": o}, gbps(sec), nbytes=8.0 * n,
                                     metrics={"read_sectors": sec},
                                     status="wrong" if ("offset", o) in wrong else "ok"))
    for s in range(1, 33):
        sec = read_sectors(stride=s)
        recs.append(synthetic_record("stride", {"n": n, "stride": s}, gbps(sec), nbytes=8.0 * n,
                                     metrics={"read_sectors": sec}))
    transpose = transpose or {"transpose_naive": 900, "transpose_tiled": 1500,
                              "transpose_padded": 2600}
    for size in (1000, 2048, 4096, 4100, 8192):
        for v, g in (transpose | {"memcpy": 2900}).items():
            recs.append(synthetic_record(v, {"size": size}, g * (0.6 if size == 1000 else 1),
                                         nbytes=8.0 * size * size))
    return results.build_table(recs)


# -- config ---------------------------------------------------------------------------------
def test_defaults_are_the_course_grid():
    b = validate({})
    assert b["offsets"] == list(range(33)) and b["strides"] == list(range(1, 33))
    assert 1000 in b["transpose_sizes"] and any(s % 32 for s in b["transpose_sizes"])
    assert b["n"] == 1 << 26


@pytest.mark.parametrize("block, where, says", [
    ({"strides": [0]}, "experiments.coalescing.strides[0]", "out of range"),
    ({"offsets": [-1]}, "experiments.coalescing.offsets[0]", "out of range"),
    ({"variants": ["transpose"]}, "experiments.coalescing.variants[0]", "allowed values"),
    ({"transpose_sizes": [0]}, "experiments.coalescing.transpose_sizes[0]", "out of range"),
    ({"n": 1024, "offsets": [0, 2048]}, "experiments.coalescing.offsets",
     "0 <= offset < n"),
    ({"stride": [2]}, "experiments.coalescing", "did you mean 'strides'"),
])
def test_bad_blocks_name_the_key(block, where, says):
    with pytest.raises(ConfigError) as e:
        validate(block)
    assert where in str(e.value) and says in str(e.value)


def test_smoke_block_is_small():
    pts = EXP.points(validate(dict(EXP.smoke)))
    assert 0 < len(pts) <= 16
    assert {"memcpy", "copy_vec4"} <= {p.variant for p in pts}


# -- grid -----------------------------------------------------------------------------------
def test_points():
    b = validate({"offsets": [1, 0], "strides": [2], "transpose_sizes": [64, 33]})
    pts = EXP.points(b)
    got = [(p.variant, p.params) for p in pts]
    n = b["n"]
    # memcpy first at every size: the points after it are compared with its time
    assert got[:6] == [("memcpy", {"n": n}), ("copy", {"n": n}), ("copy_vec4", {"n": n}),
                       ("offset", {"n": n, "offset": 0}), ("offset", {"n": n, "offset": 1}),
                       ("stride", {"n": n, "stride": 2})]
    assert [(v, p["size"]) for v, p in got[6:]] == [
        (t, s) for s in (33, 64) for t in ("memcpy", *TRANSPOSE_VARIANTS)]
    assert len({p.point_id for p in pts}) == len(pts)
    only = EXP.points(validate({"variants": ["transpose_naive"], "transpose_sizes": [8]}))
    assert [p.variant for p in only] == ["transpose_naive"]


# -- CPU references and helpers -------------------------------------------------------------
def test_gather_index():
    assert gather_index(5, offset=2).tolist() == [2, 3, 4, 0, 1]
    assert gather_index(8, stride=3).tolist() == [0, 3, 6, 1, 4, 7, 2, 5]
    assert gather_index(8, stride=2).tolist() == [0, 2, 4, 6, 0, 2, 4, 6]
    b = np.arange(10, dtype=np.float32)
    assert np.array_equal(b[gather_index(10, offset=3)], np.roll(b, -3))


@pytest.mark.parametrize("n", [1 << 20, 1 << 29])
@pytest.mark.parametrize("stride", [3, 32, 4096])
def test_kernel_index_arithmetic_matches_the_reference(n, stride):
    """The kernel computes (i * stride) & (n - 1) in wrapping 32-bit arithmetic for a power
    of two n: the same index as the exact modulo, even when i * stride overflows."""
    i = np.array([0, 1, n // 2 + 7, n - 1], dtype=np.uint64)
    exact = (i * np.uint64(stride)) % np.uint64(n)
    wrapped = ((i * np.uint64(stride)) & np.uint64(0xFFFFFFFF)) & np.uint64(stride_mask(n))
    assert np.array_equal(exact, wrapped)
    assert stride_mask(1000) == 0 and stride_mask(1024) == 1023


@pytest.mark.parametrize("offset, stride, sectors", [
    (0, 1, 4), (1, 1, 5), (7, 1, 5), (8, 1, 4), (32, 1, 4), (0, 2, 8), (0, 4, 16),
    (0, 8, 32), (0, 32, 32), (3, 32, 32),
])
def test_read_sectors(offset, stride, sectors):
    assert read_sectors(offset, stride) == sectors


def test_mismatches_are_exact_and_count_poison():
    e = np.array([1.0, -0.0, 3.0], np.float32)
    assert mismatches(e.copy(), e) == 0
    assert mismatches(np.array([1.0, 0.0, 3.0], np.float32), e) == 1  # -0.0 != 0.0 bitwise
    assert mismatches(np.array([1.0, np.nan, np.nan], np.float32), e) == 2


@pytest.mark.parametrize("size", [1, 31, 32, 33, 1000, 4100])
def test_transpose_grid_covers_the_matrix(size):
    gx, gy = transpose_grid(size)
    assert gx * TILE >= size > (gx - 1) * TILE and gy == gx
    assert TILE % BLOCK_ROWS == 0 and TILE * BLOCK_ROWS <= 1024


# -- claims and figures on SYNTHETIC frames ---------------------------------------------------
def _claims(df):
    return {r.key: r for r in claims.evaluate(NAME, df)}


def test_claims_on_plausible_synthetic_data():
    ex = _claims(synthetic_frame())
    measured = {k for k, e in ex.items() if e.state is not State.NOT_MEASURED}
    # no profiler counters in the synthetic frame: the claims that read them are not measured
    assert measured == set(ex) - {"offset_no_extra_dram", "stride2_traffic",
                                  "padding_removes_conflicts"}
    # the sector model has no cache: the extra sector of an offset comes from DRAM and
    # costs 1/9, more than the claim allows
    assert ex["offset_flat"].passed is False
    assert f"loses {fmt.percent(100 / 9)}" in ex["offset_flat"].evidence
    assert all(ex[k].passed for k in measured - {"offset_flat"}), \
        [(k, ex[k].evidence) for k in measured]
    assert "offset 0" in ex["stride_slow"].evidence and "stride 32" in ex["stride_slow"].evidence


def test_claims_not_seen_when_the_data_says_so():
    ex = _claims(synthetic_frame(
        transpose={"transpose_naive": 2000, "transpose_tiled": 1500,
                   "transpose_padded": 1400}, wrong={("offset", 3)}))
    assert ex["correct"].passed is False
    assert ex["tiled_beats_naive"].passed is False
    assert ex["padding_pays"].passed is False


def test_profiler_counters_judge_why():
    df = synthetic_frame()
    dram = {("offset", 0): 520e6, ("offset", 1): 521e6, ("stride", 1): 520e6,
            ("stride", 2): 795e6}
    df["m_ncu_status"] = "ok"
    for (v, x), b in dram.items():
        df.loc[(df["variant"] == v) & (df[f"p_{v}"] == x), "m_ncu_dram_bytes"] = b
    big = df["p_size"] == 8192
    df.loc[big & (df["variant"] == "transpose_tiled"), "m_ncu_smem_bank_conflicts"] = 6.6e7
    df.loc[big & (df["variant"] == "transpose_padded"), "m_ncu_smem_bank_conflicts"] = 0
    ex = _claims(df)
    assert ex["offset_no_extra_dram"].passed
    assert f"({fmt.ratio(521 / 520)})" in ex["offset_no_extra_dram"].evidence
    assert ex["stride2_traffic"].passed
    assert f"({fmt.ratio(795 / 520)})" in ex["stride2_traffic"].evidence
    assert ex["padding_removes_conflicts"].passed
    df.loc[(df["variant"] == "stride") & (df["p_stride"] == 2), "m_ncu_dram_bytes"] = 530e6
    df.loc[df["variant"] == "offset", "m_ncu_status"] = "failed"  # not profiled: no data
    ex = _claims(df)
    assert ex["stride2_traffic"].passed is False
    assert ex["offset_no_extra_dram"].state is State.NOT_MEASURED


@pytest.mark.parametrize("fig", list(EXP.lesson.figures))
def test_plots_draw_from_synthetic_frame(fig):
    import matplotlib.pyplot as plt

    f = EXP.plot(fig, synthetic_frame())
    assert f is not None
    ax = f.axes[0]
    assert ax.get_title() and ax.get_xlabel() and "GB/s" in ax.get_ylabel()
    plt.close(f)


def test_plots_without_their_variants_are_none():
    df = synthetic_frame()
    assert EXP.plot("transpose", df[df["variant"] == "copy"]) is None
    assert EXP.plot("stride", df[df["variant"] != "stride"]) is None
    with pytest.raises(KeyError):
        EXP.plot("bank_conflicts", df)


def test_memcpy_alone_draws_no_transpose_figure():
    df = synthetic_frame()
    assert EXP.plot("transpose", df[df["variant"] == "memcpy"]) is None


# -- the memcpy ceiling -------------------------------------------------------------------------
def test_the_best_copy_kernel_is_judged_against_memcpy():
    e = _claims(synthetic_frame(memcpy=3000, vec4=2850))["copy_near_memcpy"]
    bw, pct = fmt.bandwidth, fmt.percent
    assert e.passed
    assert f"copy_vec4 {bw(2850)} = {pct(95)} of cudaMemcpy {bw(3000)}" in e.evidence
    e = _claims(synthetic_frame(memcpy=3000, vec4=2600))["copy_near_memcpy"]
    assert e.passed is False and f"copy_vec4 {bw(2600)} = {pct(86.7)}" in e.evidence
    # the plain copy wins when it is the faster one
    e = _claims(synthetic_frame(memcpy=2500, vec4=2000))["copy_near_memcpy"]
    assert e.passed and e.evidence.startswith(f"copy {bw(2400)} = {pct(96)}")


def test_without_memcpy_rows_the_memcpy_claim_is_not_measured():
    df = synthetic_frame()
    e = _claims(df[df["variant"] != "memcpy"])["copy_near_memcpy"]
    assert e.state is State.NOT_MEASURED


def test_memcpy_lines_and_bars_in_the_figures():
    import matplotlib.pyplot as plt

    df = synthetic_frame()
    f = EXP.plot("offset", df)
    assert any("cudaMemcpy" in t.get_text() for t in f.axes[0].get_legend().get_texts())
    plt.close(f)
    f = EXP.plot("transpose", df)
    labels = [t.get_text() for t in f.axes[0].get_legend().get_texts()]
    assert "cudaMemcpy (same bytes)" in labels
    plt.close(f)


def test_vec4_grid_is_one_full_wave():
    from cudalab.experiments.coalescing import vec4_grid

    assert vec4_grid(132, 256, 2048) == 132 * 8
    assert vec4_grid(132, 1024, 1536) == 132
    assert vec4_grid(0, 256, 2048) == 8


# -- measure() through the runner on an emulated GPU -----------------------------------------------
def _f32(dev, n):
    return dev.buf[: 4 * n].view(np.float32)


def _emu_copy(kernel, grid, block, a, b, n):
    covered = min(n, grid[0] * block[0])
    _f32(a, n)[:covered] = _f32(b, n)[:covered]


def _emu_vec4(kernel, grid, block, a, b, n):
    threads = grid[0] * block[0]
    n4 = n // 4
    steps = -(-n4 // threads)  # the grid-stride loop covers every float4
    _f32(a, n)[: 4 * min(n4, steps * threads)] = _f32(b, n)[: 4 * n4]
    tail = min(n - 4 * n4, threads)
    _f32(a, n)[4 * n4: 4 * n4 + tail] = _f32(b, n)[4 * n4: 4 * n4 + tail]


def _emu_offset(kernel, grid, block, a, b, n, offset):
    _f32(a, n)[:] = _f32(b, n)[gather_index(n, offset=offset)]


def _emu_stride(kernel, grid, block, a, b, n, stride, mask):
    _f32(a, n)[:] = _f32(b, n)[gather_index(n, stride=stride)]


def _emu_transpose(kernel, grid, block, out, inp, rows, cols):
    _f32(out, rows * cols)[:] = _f32(inp, rows * cols).reshape(rows, cols).T.ravel()


def _fake_gpu():
    from test_fast_math import FakeCuda, FakeGpu

    class Cuda(FakeCuda):
        def memcpy_dtod_async(self, dst, src, nbytes):
            self._mem(dst).buf[:nbytes] = self._mem(src).buf[:nbytes]

    class Gpu(FakeGpu):
        def attr(self, name):
            return {"MULTIPROCESSOR_COUNT": 2, "MAX_THREADS_PER_MULTIPROCESSOR": 2048}[name]

    gpu = Gpu({"copy_coalesced": _emu_copy, "copy_vec4": _emu_vec4, "copy_offset": _emu_offset,
               "copy_stride": _emu_stride, **{t: _emu_transpose for t in TRANSPOSE_VARIANTS}})
    gpu.cuda = Cuda()
    return gpu


SMALL = {"n": 100_003, "offsets": [0, 5], "strides": [3], "transpose_sizes": [40]}


def run_on_fake_gpu(name, block, gpu, tmp_path, monkeypatch):
    """The real runner with `gpu` as the device (the job keeps its last buffer set: the
    process ends with it, so unlike test_fast_math's helper, nothing checks it was freed)."""
    from cudalab import gpu as gpumod
    from cudalab.runner import run_experiment

    monkeypatch.setattr(gpumod, "open_session", lambda index=0: gpu)
    config = cfg.validate({
        "measurement": {"warmup": 1, "min_samples": 2, "max_samples": 3, "budget_s": 0.01,
                        "min_sample_s": 0, "ceilings": False},
        "telemetry": {"nvidia_smi": False, "nvml": False},
        "experiments": {name: dict(block)}})
    run_experiment(config, name, tmp_path)
    df = results.build_table(results.iter_records(tmp_path / "raw"))
    assert results.check_table(df) == []
    # buffers of a size the job moved on from are freed
    assert sum(not a.freed for a in gpu.cuda.allocs) <= 2
    return df


def _count_memcpy_timings(monkeypatch) -> list[int]:
    """Counts of Coalescing._memcpy_timed calls (a checked and timed cudaMemcpy)."""
    calls = []
    real = type(EXP)._memcpy_timed

    def counted(self, ctx, bufs, count):
        calls.append(count)
        return real(self, ctx, bufs, count)

    monkeypatch.setattr(type(EXP), "_memcpy_timed", counted)
    return calls


def test_every_variant_is_correct_on_an_emulated_gpu(tmp_path, monkeypatch):
    gpu = _fake_gpu()
    timed = _count_memcpy_timings(monkeypatch)
    df = run_on_fake_gpu(NAME, SMALL, gpu, tmp_path, monkeypatch)
    assert (df["status"] == "ok").all(), df[["point_id", "reason"]].to_string()
    d = df.set_index("point_id")
    assert set(df["variant"]) == set(EXP.schema["properties"]["variants"]["default"])
    assert d.loc["memcpy-n100003", "error_metric"] == "mismatched_elements"
    # m_pct_of_memcpy on every point but memcpy itself, from the memcpy timed in the job
    others = df[df["variant"] != "memcpy"]
    assert others["m_pct_of_memcpy"].notna().all() and (others["m_pct_of_memcpy"] > 0).all()
    assert df[df["variant"] == "memcpy"]["m_pct_of_memcpy"].isna().all()
    # memcpy is timed by its own point only (once per trial): the other points reuse it;
    # the fake GPU's events are plain ones, whose points take host_trials (2) trials
    assert timed == [100_003] * 2 + [40 * 40] * 2
    # the working set is declared: both arrays
    assert d.loc["copy_vec4-n100003", "working_set_bytes"] == 8 * 100_003
    assert d.loc["transpose_padded-size40", "working_set_bytes"] == 8 * 40 * 40
    assert "m_read_sectors" in d and pd.isna(d.loc["copy_vec4-n100003", "m_read_sectors"])


def test_the_expected_output_is_made_where_the_check_runs(tmp_path, monkeypatch):
    """A later trial takes the first trial's check, so it makes no expected output: one
    gather per strided point, not one per trial (each costs the host about a second at
    2^26 floats)."""
    import cudalab.experiments.coalescing as co

    gathers = []
    real = co.gather_index
    monkeypatch.setattr(co, "gather_index", lambda *a, **k: gathers.append(a) or real(*a, **k))
    block = SMALL | {"variants": ["stride"], "strides": [3, 5]}
    df = run_on_fake_gpu(NAME, block, _fake_gpu(), tmp_path, monkeypatch)
    assert (df["status"] == "ok").all() and len(df) == 2
    assert len(gathers) == 2


def test_a_copy_without_its_memcpy_point_times_memcpy_itself(tmp_path, monkeypatch):
    gpu = _fake_gpu()
    timed = _count_memcpy_timings(monkeypatch)
    block = SMALL | {"variants": ["copy_vec4", "offset", "transpose_naive"]}
    df = run_on_fake_gpu(NAME, block, gpu, tmp_path, monkeypatch)
    assert (df["status"] == "ok").all() and df["m_pct_of_memcpy"].notna().all()
    assert timed == [100_003, 40 * 40]  # once per size, for the comparison


def test_a_vec4_kernel_that_skips_the_tail_is_wrong(tmp_path, monkeypatch):
    def no_tail(kernel, grid, block, a, b, n):
        _f32(a, n)[: 4 * (n // 4)] = _f32(b, n)[: 4 * (n // 4)]

    gpu = _fake_gpu()
    gpu.emulators["copy_vec4"] = no_tail
    df = run_on_fake_gpu(NAME, SMALL | {"variants": ["copy_vec4"]}, gpu, tmp_path, monkeypatch)
    assert df.iloc[0]["status"] == "wrong" and "3 of 100003 elements" in df.iloc[0]["reason"]
