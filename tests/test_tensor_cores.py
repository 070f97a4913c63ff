"""Tensor cores without a GPU: the peak table, the rounding helpers, the derived tolerance
and input error, the grid and its schema, and the lesson's claims on made-up tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cudalab import config as cfg
from cudalab import tensor_peaks as tp
from cudalab.experiments import REGISTRY
from cudalab.experiments.tensor_cores import kernels, lesson, numerics

H100 = ("9.0", 132, 1_980_000)  # cc, SMs, boost clock in kHz (what the driver reports)


# -- peaks ---------------------------------------------------------------------------------
def test_h100_sxm_peaks():
    cc, sms, khz = H100
    assert tp.tensor_peak_gflops(cc, "fp64", sms, khz) / 1e3 == pytest.approx(66.9, abs=0.1)
    # the datasheet's FP16 / TF32 figures are at a 1.83 GHz tensor clock
    assert tp.tensor_peak_gflops(cc, "fp16", sms, 1_830_000) / 1e3 == pytest.approx(989.4,
                                                                                  abs=0.5)
    assert tp.tensor_peak_gflops(cc, "tf32", sms, 1_830_000) / 1e3 == pytest.approx(494.7,
                                                                                  abs=0.5)
    assert tp.tensor_peak_gflops(cc, "bf16", sms, khz) == tp.tensor_peak_gflops(cc, "fp16",
                                                                                 sms, khz)
    assert tp.tensor_peak_gflops(cc, "fp16", sms, khz) / 1e3 == pytest.approx(1070.5, abs=0.5)
    peaks = tp.tensor_peaks((9, 0), sms, khz)
    assert peaks["peak_tf32_tensor_gflops"] * 2 == peaks["peak_fp16_tensor_gflops"]


def test_other_chips_and_unknowns():
    # A100 SXM: 108 SMs at 1.41 GHz: 312 FP16, 156 TF32, 19.5 FP64 tensor
    assert tp.tensor_peak_gflops("sm_80", "fp16", 108, 1_410_000) / 1e3 == pytest.approx(
        311.9, abs=0.2)
    assert tp.tensor_peak_gflops("8.0", "fp64", 108, 1_410_000) / 1e3 == pytest.approx(
        19.5, abs=0.1)
    # RTX A6000 (84 SMs, 1.8 GHz): 77.4 TF32; a GeForce board of the same cc halves it
    assert tp.tensor_peak_gflops("8.6", "tf32", 84, 1_800_000) / 1e3 == pytest.approx(
        77.4, abs=0.1)
    assert tp.tensor_peak_gflops("8.6", "tf32", 84, 1_800_000, geforce=True) / 1e3 == \
        pytest.approx(38.7, abs=0.1)
    assert math.isnan(tp.tensor_peak_gflops("8.9", "fp64", 142, 2_520_000))
    assert math.isnan(tp.tensor_peak_gflops("7.5", "fp16", 40, 1_500_000))
    assert math.isnan(tp.tensor_peak_gflops("9.0", "fp16", 0, 1_500_000))
    assert tp.cc_key("sm_90a") == "9.0" and tp.cc_key((8, 9)) == "8.9"
    assert tp.is_geforce("NVIDIA GeForce RTX 4090") and not tp.is_geforce("NVIDIA H100")
    with pytest.raises(ValueError):
        tp.flops_per_clock_per_sm("9.0", "fp8")


# -- rounding --------------------------------------------------------------------------------
def test_rounding_matches_numpy_and_keeps_the_right_bits():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 100_000).astype(np.float32)
    # round_mantissa(x, 10) is fp16's rounding for normal fp16 values
    normal = np.abs(x) > 2.0**-14
    np.testing.assert_array_equal(numerics.round_mantissa(x, 10)[normal],
                                  x.astype(np.float16).astype(np.float32)[normal])
    assert not (numerics.to_tf32(x).view(np.uint32) & 0x1FFF).any()
    bits = numerics.to_bf16_bits(x)
    back = numerics.bf16_bits_to_f64(bits)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0**-8)
    # ties go to even: 1 + 2^-8 (half a bf16 ulp) rounds down to 1, 1 + 3 * 2^-8 up
    t = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8], np.float32)
    np.testing.assert_array_equal(numerics.bf16_bits_to_f64(numerics.to_bf16_bits(t)),
                                  [1.0, 1 + 2.0**-6])
    for prec in numerics.PRECISIONS:
        dev = numerics.device_input(x, prec)
        assert np.all(np.abs(numerics.exact_values(dev, prec) - x)
                      <= np.abs(x) * numerics.unit_roundoff(prec) + 2.0**-25)


def test_products_of_every_precision_are_exact_in_fp32():
    assert all(numerics.products_exact(p) for p in numerics.PRECISIONS)


# -- tolerance and input error --------------------------------------------------------------
@pytest.mark.parametrize("prec", ["fp16", "bf16", "tf32"])
def test_fp32_accumulation_stays_inside_the_tolerance(prec):
    """A product of rounded inputs summed in float32 (numpy's SGEMM), against the float64
    product of the same inputs, at K = 1024: inside the derived tolerance; the error
    against the unrounded product is close to u_in / sqrt 3."""
    rng = np.random.default_rng(2)
    k = 1024
    a = rng.uniform(-1, 1, (64, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, 64)).astype(np.float32)
    ra = numerics.exact_values(numerics.device_input(a, prec), prec)
    rb = numerics.exact_values(numerics.device_input(b, prec), prec)
    c32 = ra.astype(np.float32) @ rb.astype(np.float32)
    ref = ra @ rb
    err = np.linalg.norm(c32 - ref) / np.linalg.norm(ref)
    assert err < numerics.check_tolerance(k) / 10
    exact = a.astype(np.float64) @ b.astype(np.float64)
    err_in = np.linalg.norm(c32 - exact) / np.linalg.norm(exact)
    assert 0.8 < err_in / numerics.expected_input_error(prec) < 1.25


def test_tolerance_numbers():
    assert numerics.check_tolerance(4096) == pytest.approx(3.26e-4, rel=0.01)
    assert numerics.expected_input_error("fp16") == numerics.expected_input_error("tf32")
    assert numerics.expected_input_error("bf16") / numerics.expected_input_error("fp16") == 8
    assert numerics.expected_input_error("fp16") == pytest.approx(2.82e-4, rel=0.01)
    assert numerics.expected_input_error("fp32") == 0
    # a wrong result (another product entirely) errs far above the tolerance
    assert numerics.check_tolerance(16384) < 0.02


# -- grid and schema ---------------------------------------------------------------------------
def test_default_grid_and_smoke_grid():
    exp = REGISTRY["tensor_cores"]
    pts = exp.grid(cfg.validate({"experiments": {"tensor_cores": {}}}))
    per_size = 4 + 3 + 2 * len(kernels.DEFAULT_MMA_TILES)
    assert len(pts) == 3 * per_size
    assert all(p.params["precision"] in kernels.RUNS[p.variant] for p in pts)
    assert [p.params["m"] for p in pts] == sorted(p.params["m"] for p in pts)
    assert len({p.point_id for p in pts}) == len(pts)
    smoke = exp.grid(cfg.validate({"experiments": {"tensor_cores": dict(exp.smoke)}}))
    assert {p.variant for p in smoke} == {"wmma", "mma", "cublas"}
    assert exp.check_config(dict(exp.smoke) | {"mma_tiles": kernels.DEFAULT_MMA_TILES}) == []


@pytest.mark.parametrize("block, needle", [
    ({"sizes": [1000]}, "multiple of 256"),
    ({"sizes": [[512, 300, 512]]}, "multiple of 256"),
    ({"mma_tiles": [{"bm": 64, "bn": 64, "bk": 32, "wm": 64, "wn": 64, "stages": 3}]},
     "threads"),
    ({"mma_tiles": [{"bm": 256, "bn": 256, "bk": 64, "wm": 64, "wn": 64, "stages": 5}]},
     "shared memory"),
])
def test_bad_blocks_are_refused(block, needle):
    with pytest.raises(cfg.ConfigError, match=needle):
        cfg.validate({"experiments": {"tensor_cores": block}})


def test_mma_geometry_and_compile_variants():
    t = kernels.DEFAULT_MMA_TILES[0]
    assert kernels.mma_threads(t) == 128
    assert kernels.mma_smem_bytes(t) == 3 * 2 * (128 * 72 + 64 * 136)
    cvs = REGISTRY["tensor_cores"].compile_variants(None)
    assert len(cvs) == 2 * len(kernels.DEFAULT_MMA_TILES)
    assert cvs[0].defines == {"BM": 128, "BN": 128, "BK": 64, "WM": 64, "WN": 64, "STAGES": 3}
    assert cvs[0].dynamic_smem == kernels.mma_smem_bytes(t)


# -- the lesson's claims ---------------------------------------------------------------------
def _row(variant, prec, tflops, err, status="ok", **extra):
    return {"experiment": "tensor_cores", "variant": variant, "p_precision": prec,
            "status": status, "point_id": f"{variant}-{prec}", "p_m": 4096, "p_k": 4096,
            "p_n": 4096, "flops": 2.0 * 4096**3, "gflops": tflops * 1e3, "m_err_input": err,
            "m_pct_peak_precision": 50.0, **extra}


def _table(hand=400.0):
    return pd.DataFrame([
        _row("cublas", "fp32", 50, 1e-7), _row("cublas", "tf32", 350, 4e-4),
        _row("cublas", "fp16", 700, 4e-4), _row("cublas", "bf16", 700, 3.2e-3),
        _row("wmma", "fp16", 200, 4e-4), _row("mma", "fp16", hand, 4e-4),
    ])


def test_claims_on_a_made_up_table():
    states = {fn.__name__: fn(_table()) for _, fn in lesson.CLAIMS}
    assert states["hand_fp16_near_cublas"][0] == lesson.NOT_SEEN
    assert "57%" in states["hand_fp16_near_cublas"][1]
    for name in ("every_point_correct", "tf32_faster_than_fp32", "fp16_faster_than_tf32",
                 "bf16_faster_than_tf32", "tf32_and_fp16_err_alike", "bf16_err_about_8x_fp16",
                 "fp32_far_more_accurate", "mma_faster_than_wmma", "cublas_under_tensor_peak"):
        assert states[name][0] == lesson.SEEN, (name, states[name])
    assert lesson.hand_fp16_near_cublas(_table(hand=560))[0] == lesson.SEEN
    assert len(lesson.evaluate(_table())) == len(lesson.CLAIMS)


def test_claims_without_the_points():
    none = _table().iloc[:0]
    assert lesson.tf32_faster_than_fp32(none)[0] == lesson.NOT_APPLICABLE
    nm = _table()
    nm.loc[nm["p_precision"] == "tf32", "status"] = "not_measured"
    assert lesson.tf32_faster_than_fp32(nm)[0] == lesson.NOT_MEASURED
    bf16_only = pd.concat([_table().iloc[:4], pd.DataFrame(
        [_row("wmma", "bf16", 170, 2e-3), _row("mma", "bf16", 300, 2e-3)])])
    state, ev = lesson.mma_faster_than_wmma(bf16_only)
    assert state == lesson.SEEN and ev.startswith("bf16"), ev
    failed = _table()
    failed.loc[0, "status"] = "failed"
    assert lesson.every_point_correct(failed)[0] == lesson.NOT_SEEN


def test_a_tile_that_cannot_fit_the_register_file_is_refused():
    t = {"bm": 256, "bn": 256, "bk": 32, "wm": 64, "wn": 64, "stages": 3}
    assert any("registers" in m for m in kernels.check_mma_tile(t))
    assert all(kernels.check_mma_tile(t) == [] for t in kernels.DEFAULT_MMA_TILES)
