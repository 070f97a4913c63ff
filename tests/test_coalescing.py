"""CPU tests of the coalescing experiment (offset / stride copies, matrix transpose).

Every results frame below is SYNTHETIC TEST DATA: bandwidths fabricated from a sector-count
model with H100-like numbers, never measurements.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest

from cudalab import config as cfg
from cudalab import results
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


def synthetic_frame(transpose=None, wrong=(), n=1 << 26):
    """SYNTHETIC: GB/s = 3000 x 8 / (4 written + sectors read) bytes per element."""
    def gbps(sectors):
        return 3000 * 8 / (4 + sectors)

    recs = [synthetic_record("copy", {"n": n}, 3000, nbytes=8.0 * n,
                             metrics={"read_sectors": 4})]
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
        for v, g in transpose.items():
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


# -- grid -----------------------------------------------------------------------------------
def test_points():
    b = validate({"offsets": [1, 0], "strides": [2], "transpose_sizes": [64, 33]})
    pts = EXP.points(b)
    got = [(p.variant, p.params) for p in pts]
    n = b["n"]
    assert got[:4] == [("copy", {"n": n}), ("offset", {"n": n, "offset": 0}),
                       ("offset", {"n": n, "offset": 1}), ("stride", {"n": n, "stride": 2})]
    assert [(v, p["size"]) for v, p in got[4:]] == [
        (t, s) for s in (33, 64) for t in TRANSPOSE_VARIANTS]
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


# -- expectations and figures on SYNTHETIC frames ---------------------------------------------
def test_expectations_pass_on_plausible_synthetic_data():
    ex = EXP.expectations(synthetic_frame())
    assert len(ex) == 6
    assert all(e.passed for e in ex), [(e.claim, e.evidence) for e in ex]
    assert "offset 0" in ex[1].claim and "stride 32" in ex[1].claim


def test_expectations_fail_when_the_data_says_so():
    ex = EXP.expectations(synthetic_frame(
        transpose={"transpose_naive": 2000, "transpose_tiled": 1500,
                   "transpose_padded": 1400}, wrong={("offset", 3)}))
    by = {e.claim: e for e in ex}
    assert ex[0].passed is False
    assert next(e for c, e in by.items() if "faster than the naive" in c).passed is False
    assert next(e for c, e in by.items() if "padded tile" in c).passed is False


@pytest.mark.parametrize("fig", list(EXP.figures))
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
