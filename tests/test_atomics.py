"""CPU tests of the atomics experiment: config, grid, the counter checks, the float-sum
tolerance (against simulated sequential float32 sums), the lesson's claims and the figures.

Every results frame below is SYNTHETIC TEST DATA: records fabricated from a simple
model, never measurements.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from cudalab import claims, fmt, results
from cudalab import config as cfg
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.atomics import (
    COUNTERS,
    RACY_MIN_SAMPLE_S,
    SUMS,
    U,
    counter_check,
    sum_error,
    sum_inputs,
    sum_tolerance,
)
from cudalab.experiments.base import Point

ROOT = Path(__file__).resolve().parent.parent

matplotlib.use("Agg")

NAME = "atomics"
EXP = REGISTRY[NAME]


def validate(block: dict) -> dict:
    return cfg.validate({"experiments": {NAME: block}})["experiments"][NAME]


# -- config ---------------------------------------------------------------------------------
def test_defaults_are_the_course_values():
    b = validate({})
    assert b["counter_launches"] == [[1024, 1024]]  # 1 048 576 increments
    assert (1 << 24) in b["sum_sizes"]
    assert b["variants"] == COUNTERS + SUMS
    assert b["sum_block"] == 256 and b["sum_tolerance_factor"] == 3.0


@pytest.mark.parametrize("block, where, says", [
    ({"counter_launches": [[1024, 2048]]}, "experiments.atomics.counter_launches[0]",
     "at most 1024"),
    ({"counter_launches": [[1 << 22, 1024]]}, "experiments.atomics.counter_launches[0]",
     "at most 2^31"),
    ({"counter_launches": [[1024]]}, "experiments.atomics.counter_launches[0]", "exactly 2"),
    ({"counter_launches": [[0, 32]]}, "experiments.atomics.counter_launches[0][0]", ">= 1"),
    ({"sum_block": 100}, "experiments.atomics.sum_block",
     "allowed values: [64, 128, 256, 512, 1024]"),
    ({"variants": ["cas_counter"]}, "experiments.atomics.variants[0]", "allowed values"),
    ({"sum_sizes": [1 << 29]}, "experiments.atomics.sum_sizes[0]", "<= 268435456"),
    ({"sum_tolerance_factor": 0}, "experiments.atomics.sum_tolerance_factor", "> 0"),
    ({"counter_launch": [[1, 1]]}, "experiments.atomics", "did you mean 'counter_launches'"),
])
def test_bad_blocks_name_the_key_and_what_is_allowed(block, where, says):
    with pytest.raises(ConfigError) as e:
        validate(block)
    assert where in str(e.value) and says in str(e.value), str(e.value)


def test_smoke_block_is_small():
    b = validate(dict(EXP.smoke))
    pts = EXP.points(b)
    assert 0 < len(pts) <= 10
    assert {p.variant for p in pts} == set(COUNTERS + SUMS)
    assert any(p.params.get("n", 0) % (2 * b["sum_block"]) for p in pts)  # partial block


# -- grid -----------------------------------------------------------------------------------
def test_points_counters_then_sums_in_size_order():
    b = validate({"counter_launches": [[1024, 1024], [64, 256]], "sum_sizes": [1 << 20, 1000],
                  "sum_block": 512})
    pts = EXP.points(b)
    assert [(p.variant, p.params) for p in pts] == [
        ("racy_counter", {"grid": 1024, "block": 1024}),
        ("atomic_counter", {"grid": 1024, "block": 1024}),
        ("racy_counter", {"grid": 64, "block": 256}),
        ("atomic_counter", {"grid": 64, "block": 256}),
        ("atomic_sum", {"n": 1000, "block": 512}),
        ("reduce_sum", {"n": 1000, "block": 512}),
        ("atomic_sum", {"n": 1 << 20, "block": 512}),
        ("reduce_sum", {"n": 1 << 20, "block": 512}),
    ]
    assert len({p.point_id for p in pts}) == len(pts) and all(p.gpu for p in pts)
    only = EXP.points(validate({"variants": ["reduce_sum"], "sum_sizes": [10]}))
    assert [p.variant for p in only] == ["reduce_sum"]


# -- counter checks -------------------------------------------------------------------------
def test_atomic_counter_must_be_exact():
    assert counter_check("atomic_counter", 1 << 20, 1 << 20).passed
    c = counter_check("atomic_counter", (1 << 20) - 1, 1 << 20)
    assert not c.passed and c.error == 1 and c.tolerance == 0


@pytest.mark.parametrize("counted, ok", [(1, True), (2200, True), (1 << 20, True),
                                         (0, False), ((1 << 20) + 5, False)])
def test_racy_counter_passes_any_count_the_race_can_produce(counted, ok):
    c = counter_check("racy_counter", counted, 1 << 20)
    assert c.passed is ok
    assert c.error == (0 if ok else (1 if counted == 0 else 5))
    assert "expected for the racy counter" in c.detail


def test_counter_kernel_is_really_racy():
    """The racy kernel must read and write through a volatile pointer (no atomic)."""
    src = (ROOT / "cuda" / "atomics/atomics.cu").read_text()
    body = src[src.index("void counter_racy"):]
    body = body[:body.index("}") + 1]
    assert "volatile unsigned int* counter" in body
    assert "*counter = *counter + 1;" in body and "atomic" not in body


# -- float sum tolerance --------------------------------------------------------------------
def test_sum_tolerance_scales_with_sqrt_n():
    assert sum_tolerance(1 << 20, 3.0) == pytest.approx(3 * 1024 * U)
    assert 1e-4 < sum_tolerance(1 << 20, 3.0) < 2e-4
    assert sum_tolerance(1 << 24, 3.0) == pytest.approx(4 * sum_tolerance(1 << 20, 3.0))
    assert sum_tolerance(1 << 24, 3.0) < 1e-3


def test_sum_error_metric():
    assert sum_error(10.0, 10.0, 10.0) == 0.0
    assert sum_error(10.5, 10.0, 10.0) == pytest.approx(0.05)
    assert sum_error(1.0, 0.0, 0.0) == 1.0
    assert sum_error(math.nan, 10.0, 10.0) == math.inf
    assert sum_error(math.inf, 10.0, 10.0) == math.inf


@pytest.mark.parametrize("n", [1000, 1 << 16, 1 << 20])
def test_a_sequential_float32_sum_in_random_order_passes(n):
    """What per-element atomics compute: a float32 running sum in some order."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        x = sum_inputs(rng, n)
        assert x.dtype == np.float32 and 0 <= x.min() and x.max() < 1
        ref = float(np.sum(x, dtype=np.float64))
        seq = float(np.cumsum(x[rng.permutation(n)], dtype=np.float32)[-1])
        err = sum_error(seq, ref, ref)
        tol = sum_tolerance(n, 3.0)
        assert err <= tol / 2, (n, seed, err, tol)
        # and the sqrt(n) u / 3 standard-deviation bound is the right scale
        assert err < 6 * math.sqrt(n) * U / 3


def test_a_wrong_sum_fails():
    """A block's worth of lost elements is caught; a single one cannot be, at this n: the
    float32 rounding error allowed (4.6e-5) exceeds one element's share (1.5e-5)."""
    n = 1 << 16
    x = sum_inputs(np.random.default_rng(0), n)
    ref = float(np.sum(x, dtype=np.float64))
    one_block_lost = ref - float(np.sum(x[:512], dtype=np.float64))
    assert sum_error(one_block_lost, ref, ref) > sum_tolerance(n, 3.0)


# -- expectations and figures on SYNTHETIC frames -------------------------------------------
def synthetic_record(variant, params, median_s, *, check, metrics, flops=math.nan,
                     nbytes=math.nan, status="ok"):
    """A fabricated raw record (SYNTHETIC TEST DATA), shaped like the runner's."""
    return {
        "schema_version": results.SCHEMA_VERSION, "experiment": NAME, "variant": variant,
        "point_id": Point(NAME, variant, params).point_id, "params": params,
        "job_id": "synthetic", "status": status,
        "reason": "" if status == "ok" else "check failed",
        "timing": {"samples_s": [median_s] * 3, "median": median_s, "iqr": 0.0, "cv": 0.0,
                   "min": median_s, "mean": median_s, "std": 0.0, "n": 3, "batch": 1,
                   "timer": "cuda_event", "stop_reason": "converged", "n_throttled": 0},
        "work": {"flops": flops, "bytes": nbytes},
        "check": check.as_dict(), "metrics": metrics,
        "provenance": {"gpu_name": "SYNTHETIC TEST DATA"},
    }


def synthetic_frame(racy_counted=2213, atomic_counted=None, reduce_speedup=40.0):
    """SYNTHETIC: a warp adds 1 in the racy counter; atomics serialise at 1 ns each."""
    recs = []
    for g, b in ((64, 256), (1024, 1024)):
        exp = g * b
        for v in COUNTERS:
            # a warp adds at most 1 (a count above the expected one breaks the race model)
            cap = exp if racy_counted > exp else exp // 32
            got = (min(racy_counted, cap) if v == "racy_counter"
                   else (exp if atomic_counted is None else atomic_counted))
            chk = counter_check(v, got, exp)
            recs.append(synthetic_record(
                v, {"grid": g, "block": b}, 5e-6 + exp * 1e-12, check=chk,
                status="ok" if chk.passed else "wrong",
                metrics={"counted": got, "expected": exp, "lost_fraction": (exp - got) / exp,
                         "updates_per_s": exp / 5e-6}))
    for n in (1 << 16, 1 << 20, 1 << 24):
        tol = sum_tolerance(n, 3.0)
        for v, t, err in (("atomic_sum", n * 1e-9, 0.1 * tol),
                          ("reduce_sum", 3e-6 + n * 1e-9 / reduce_speedup, 1e-7)):
            from cudalab.experiments.base import Check

            recs.append(synthetic_record(
                v, {"n": n, "block": 256}, t, flops=float(n), nbytes=4.0 * n,
                check=Check(err, tol, "rel_sum_err"),
                metrics={"sum": n / 2, "ref_sum": n / 2, "rel_err": err, "abs_err": err * n / 2,
                         "atomics_per_launch": n if v == "atomic_sum" else n // 512}))
    return results.build_table(recs)


def test_synthetic_frame_is_a_valid_table():
    df = synthetic_frame()
    assert results.check_table(df) == []
    assert {"m_counted", "m_expected", "m_lost_fraction", "p_grid", "p_n"} <= set(df.columns)


def _claims(df):
    got = {r.key: r for r in claims.evaluate(NAME, df)}
    got.update({r.key: r for r in claims.evaluate_try_this(NAME, df) if r is not None})
    return got


def test_claims_seen_on_plausible_synthetic_data():
    ex = _claims(synthetic_frame())
    assert len(ex) == 6  # no repeats in this frame: the run-to-run claim is not measured
    assert ex.pop("racy_varies").passed is None
    assert all(e.passed for e in ex.values()), [(e.claim, e.evidence) for e in ex.values()]
    assert "2/2 launches exact" in ex["atomic_exact"].evidence
    assert (f"1024 x 1024: counted {fmt.integer(2213)} of {fmt.integer(1 << 20)}, "
            f"{fmt.integer(1 << 15)} warps" in ex["racy_loses"].evidence)
    n = 1 << 24
    assert fmt.ratio(n * 1e-9 / (3e-6 + n * 1e-9 / 40)) in ex["reduce_faster"].evidence
    assert f"n = {fmt.integer(1 << 24)}" in ex["reduce_faster"].evidence


def test_claims_not_seen_when_the_data_says_so():
    ex = _claims(synthetic_frame(racy_counted=1 << 30, atomic_counted=1000,
                                 reduce_speedup=0.5))
    assert ex["atomic_exact"].passed is False and "0/2" in ex["atomic_exact"].evidence
    assert ex["racy_loses"].passed is False
    assert ex["racy_at_most_one_per_warp"].passed is False
    assert ex["reduce_faster"].passed is False


def test_the_racy_claim_fails_where_only_a_warp_s_own_threads_race():
    """One increment per warp survives (warps on different SMs do not overwrite each
    other): under 1/32 of the increments, as every racy launch is, yet the claim is not
    seen; the claim of the old wording (under half) held for any racy count."""
    warps = (1 << 20) // 32
    ex = _claims(synthetic_frame(racy_counted=warps))
    assert ex["racy_loses"].passed is False, ex["racy_loses"]
    assert f"counted {fmt.integer(warps)}" in ex["racy_loses"].evidence
    assert _claims(synthetic_frame(racy_counted=warps // 20))["racy_loses"].passed is True


def test_no_claim_ranks_the_two_sums_accuracy_on_one_draw():
    """The errors of both sums depend on an addition order that changes between runs (two
    H100 runs' atomics errors differed 27x): one run cannot rank them, so no claim does;
    the caption says it is a hypothesis and what would test it."""
    keys = {c.name for c in claims.lesson_claims(EXP)}
    assert "reduce_accurate" not in keys
    assert "hypothesis" in EXP.lesson.caption and "repeated sums" in EXP.lesson.caption


def test_plots_draw_with_units():
    df = synthetic_frame()
    fig = EXP.plot("counter", df)
    ax = fig.get_axes()[0]
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel()
    # the count itself, not a share of lost updates that rounds to 100 %
    assert {t.get_text() for t in ax.texts} == {f"{fmt.integer(2213)} counted",
                                                "512 counted"}
    fig = EXP.plot("sum", df)
    ax_t, ax_e = fig.get_axes()
    assert "ms" in ax_t.get_ylabel() and ax_t.get_xscale() == "log"
    assert "float64" in ax_e.get_ylabel()
    assert EXP.plot("counter", df[df["variant"].isin(SUMS)]) is None
    assert EXP.plot("sum", df[df["variant"].isin(COUNTERS)]) is None
    with pytest.raises(KeyError):
        EXP.plot("nope", df)
    import matplotlib.pyplot as plt

    plt.close("all")


# -- the GPU code path on a FAKE GPU (see test_fast_math.py) ----------------------------------
def _racy(kernel, grid, block, c_d):
    # SYNTHETIC race model: every warp reads the same value, so a warp adds 1
    c = c_d.buf[:4].view(np.uint32)
    c += np.uint32(max(1, grid[0] * block[0] // 32))


def _atomic(kernel, grid, block, c_d):
    c = c_d.buf[:4].view(np.uint32)
    c += np.uint32((grid[0] * block[0]) % (1 << 32))


def _sum(per_thread):
    def run(kernel, grid, block, x_d, o_d, n):
        if per_thread == 2:  # the tree kernel is compiled for its block size
            assert block[0] == kernel.defines["BLOCK"]
        x = x_d.buf.view(np.float32)[: min(n, grid[0] * block[0] * per_thread)]
        o = o_d.buf[:4].view(np.float32)
        if per_thread == 1:  # one float32 running sum, in some order
            o += np.cumsum(x[::-1], dtype=np.float32)[-1] if x.size else 0
        else:
            o += np.float32(np.sum(x, dtype=np.float64))
    return run


def _fake_gpu(**override):
    from test_fast_math import FakeGpu

    emus = {"counter_racy": _racy, "counter_atomic": _atomic, "sum_atomic": _sum(1),
            "sum_reduce": _sum(2)}
    return FakeGpu(emus | override)


def test_smoke_grid_through_the_runner_on_a_fake_gpu(tmp_path, monkeypatch):
    from test_fast_math import run_on_fake_gpu

    gpu = _fake_gpu()
    df = run_on_fake_gpu(NAME, EXP.smoke, gpu, tmp_path, monkeypatch, min_sample_s=1e-4)
    assert (df["status"] == "ok").all(), df[["point_id", "reason"]].to_string()
    d = df.set_index("point_id")
    racy = d.loc["racy_counter-grid1024-block1024"]
    assert racy["m_counted"] == 32768 and racy["m_expected"] == 1 << 20
    assert racy["m_lost_fraction"] == pytest.approx(1 - 1 / 32)
    atom = d.loc["atomic_counter-grid1024-block1024"]
    assert atom["m_counted"] == atom["m_expected"] == 1 << 20 and atom["error"] == 0
    # the race makes each launch's time vary: the racy counter's samples are longer, and
    # its own harness settings travel with its number; every other point keeps the job's
    sample_s = d["harness_min_sample_s"]
    assert sample_s["racy_counter-grid1024-block1024"] == RACY_MIN_SAMPLE_S
    assert {v for p, v in sample_s.items() if not p.startswith("racy")} == {1e-4}
    sums = df[df["variant"].isin(SUMS)]
    assert (sums["bytes"] == 4 * sums["p_n"]).all() and sums["gbps"].notna().all()
    red = d.loc["reduce_sum-n1000-block256"]
    assert red["m_atomics_per_launch"] == 2  # 1000 values, 512 per block
    rec = next(r for r in results.iter_records(tmp_path / "raw")
               if r["variant"] == "racy_counter")
    assert len(rec["extra"]["racy_repeats"]) == 5
    assert EXP.plot("counter", df) is not None and EXP.plot("sum", df) is not None
    ex = _claims(df)  # the repeats reach the table (m_racy_repeats) and a claim
    assert ex["racy_varies"].passed is False  # the fake race gives the same count each time
    assert ex["racy_at_most_one_per_warp"].passed is True


def test_a_lost_block_fails_the_sum_and_a_lost_increment_the_counter(tmp_path, monkeypatch):
    from test_fast_math import run_on_fake_gpu

    def short_sum(kernel, grid, block, x_d, o_d, n):
        _sum(2)(kernel, (grid[0] - 1, 1), block, x_d, o_d, n)

    def off_by_one(kernel, grid, block, c_d):
        _atomic(kernel, grid, block, c_d)
        c_d.buf[:4].view(np.uint32)[0] -= np.uint32(1)

    gpu = _fake_gpu(sum_reduce=short_sum, counter_atomic=off_by_one)
    df = run_on_fake_gpu(NAME, {"counter_launches": [[64, 256]], "sum_sizes": [1 << 16]},
                         gpu, tmp_path, monkeypatch)
    st = df.set_index("variant")["status"].to_dict()
    assert st == {"racy_counter": "ok", "atomic_counter": "wrong", "atomic_sum": "ok",
                  "reduce_sum": "wrong"}


# -- the kernel source ----------------------------------------------------------------------
def test_every_variant_names_a_kernel_of_the_source():
    import re

    from cudalab.experiments.atomics import KERNELS

    src = (ROOT / "cuda" / "atomics/atomics.cu").read_text()
    names = set(re.findall(r'extern "C" __global__ void (\w+)\(', src))
    assert set(KERNELS) == set(COUNTERS + SUMS) and set(KERNELS.values()) == names


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc not installed")
@pytest.mark.parametrize("block", [64, 256, 1024])
def test_source_compiles_for_every_block(block, tmp_path):
    import subprocess

    out = subprocess.run(["nvcc", "-O3", f"-DBLOCK={block}", "-Xptxas", "-v", "-c",
                          str(ROOT / "cuda" / "atomics/atomics.cu"), "-o", str(tmp_path / "a.o")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"{4 * block} bytes smem" in out.stderr  # the tree's shared array


def test_racy_counts_are_shown_run_by_run():
    """The committed H100 run: the racy counter's table gives every repeat's count."""
    ref = results.read_table(Path(__file__).resolve().parent.parent / "reports" / "reference"
                             / "NVIDIA-H100-80GB-HBM3" / "results.csv")
    d = ref[ref["experiment"] == "atomics"]
    [table] = EXP.tables(d)
    row = d[d["variant"] == "racy_counter"].iloc[0]
    counts = [int(row["m_counted"]), *json.loads(row["m_racy_repeats"])]
    assert len(counts) >= 2 and f"run {len(counts)}" in table["html"]
    cells = "".join(f"<td>{c}</td>" for c in counts)  # every run's count, in run order
    assert cells in table["html"] and fmt.integer(1 << 20) in table["html"]
