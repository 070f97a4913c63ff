"""Tensor cores without a GPU: the peak table, the rounding helpers, the derived tolerance
and input error, the grid and its schema, and the lesson's claims on made-up tables."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from cudalab import claims, results
from cudalab import config as cfg
from cudalab import tensor_peaks as tp
from cudalab.experiments import REGISTRY
from cudalab.experiments.lesson import State
from cudalab.experiments.tensor_cores import kernels, lesson, numerics, wgmma, wgmma_lesson

H100 = ("9.0", 132, 1_980_000)  # cc, SMs, boost clock in kHz (what the driver reports)
ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"
# the H100 run of the tensor-core notes (run 1: the fp16 hand kernels failed to load)
RUN1 = REFERENCE.parent / "tensor-cores-2026-11-25" / "results-run1.csv"
# the H100 run of the shipped tensor-core block with its wgmma rungs and Nsight Compute's
# operand counters (tools/gpu_tensor_cores.sh, 2026-11-27)
WGMMA_RUN = REFERENCE.parent / "tensor-cores-2026-11-27" / "results.csv"


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
    # cuBLAS 4 precisions, WMMA 3, mma 2 per tile; the wgmma rungs 3 each, the pipelined
    # ones at each stage count of the default sweep
    wg = 3 + 3 * 3 * len(wgmma.DEFAULT_STAGE_SWEEP)
    per_size = 4 + 3 + 2 * len(kernels.DEFAULT_MMA_TILES) + wg
    assert len(pts) == 3 * per_size
    assert {p.variant for p in pts} == set(kernels.VARIANTS)
    assert {p.params.get("stages") for p in pts if p.variant == "wgmma_ws"} == set(
        wgmma.DEFAULT_STAGE_SWEEP)
    without = exp.grid(cfg.validate({"experiments": {"tensor_cores": {
        "variants": ["wmma", "mma", "cublas"]}}}))
    assert len(without) == 3 * (per_size - wg)
    assert all(p.params["precision"] in kernels.RUNS[p.variant] for p in pts)
    assert [p.params["m"] for p in pts] == sorted(p.params["m"] for p in pts)
    assert len({p.point_id for p in pts}) == len(pts)
    smoke = exp.grid(cfg.validate({"experiments": {"tensor_cores": dict(exp.smoke)}}))
    assert {p.variant for p in smoke} == set(kernels.VARIANTS)
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
PEAK = {"fp32": 66_900.0, "tf32": 535_000.0, "fp16": 1_070_000.0, "bf16": 1_070_000.0}


def _row(variant, prec, tflops, err=math.nan, n=4096, status="ok", **extra):
    return {"experiment": "tensor_cores", "variant": variant, "p_precision": prec,
            "status": status, "point_id": f"{variant}-{prec}-{n}-{len(extra)}", "p_m": n,
            "p_k": n, "p_n": n, "flops": 2.0 * n**3, "bytes": 4.0 * 3 * n * n,
            "gflops": tflops * 1e3, "time_median_s": 2.0 * n**3 / (tflops * 1e12),
            "m_err_input": err, "m_peak_precision_gflops": PEAK[prec],
            "compute_capability": "9.0", "timer": "cuda_event_queued", **extra}


def _contradicted() -> pd.DataFrame:
    """A made-up run in which every claim of the lesson is contradicted."""
    return pd.DataFrame([
        _row("cublas", "fp32", 50, 1e-5, m_peak_precision_gflops=40_000.0),  # above its peak
        _row("cublas", "tf32", 80, 1e-3),  # 1.6x SGEMM; errs 3.6x FP16
        _row("cublas", "fp16", 100, 2.8e-4), _row("cublas", "bf16", 100, 2.8e-4),
        _row("wmma", "fp16", 100), _row("mma", "fp16", 90),  # WMMA ahead, at cuBLAS's speed
        _row("cublas", "fp32", 10, n=1024), _row("cublas", "fp16", 20, n=1024),  # same lead
        _row("mma", "fp16", math.nan, n=1024, status="wrong"),
        # wgmma: one stage 50, the pipeline 1.1x that, warp specialisation 60 (0.67x mma,
        # 60 % of cuBLAS FP16), BF16 at 50 %, TF32 at 50 % of cuBLAS TF32
        _row("wgmma_tma", "fp16", 50), _row("wgmma_pipe", "fp16", 55, p_stages=4),
        _row("wgmma_ws", "fp16", 60, p_stages=4, p_bn=256),
        _row("wgmma_ws", "bf16", 50, p_stages=4, p_bn=256),
        _row("wgmma_ws", "tf32", 40, p_stages=4, p_bn=256),
    ])


def _judge(key: str, df: pd.DataFrame) -> claims.ClaimResult:
    claim = next(c for c in claims.lesson_claims(REGISTRY["tensor_cores"]) if c.name == key)
    got = claims.evaluate_claim("tensor_cores", claim, df)
    assert got is not None
    return got


def _keys() -> list[str]:
    return [c.name for c in claims.lesson_claims(REGISTRY["tensor_cores"])]


WGMMA_KEYS = [c.name for c in wgmma_lesson.CLAIMS]


def _h100() -> pd.DataFrame:
    return results.read_table(WGMMA_RUN)


def test_the_lesson_states_its_claims_once_with_flips():
    exp = REGISTRY["tensor_cores"]
    assert exp.lesson is lesson.LESSON
    assert exp.lesson.claims is lesson.CLAIMS and exp.lesson.try_this is lesson.TRY_THIS
    assert len(_keys()) == len(set(_keys())) == len(lesson.CLAIMS) + 1
    assert all(c.flip is not None for c in claims.lesson_claims(exp))


@pytest.mark.parametrize("key", _keys())
def test_every_claim_is_seen_on_the_h100_run_and_its_flip_contradicts_it(key):
    """The H100 run of the shipped tensor-core block, wgmma rungs included: every claim
    seen, and its flip turns it to not seen (tests/test_claims.py flips it on every
    reference too)."""
    df = _h100()
    before = _judge(key, df)
    assert before.state is State.SEEN, before
    rows = df["experiment"] == "tensor_cores"
    claim = next(c for c in claims.lesson_claims(REGISTRY["tensor_cores"]) if c.name == key)
    after = _judge(key, pd.concat([df[~rows], claim.flip(df[rows].copy())],
                                  ignore_index=True))
    assert after.state is State.NOT_SEEN, after


@pytest.mark.parametrize("key", _keys())
def test_every_claim_is_contradicted_on_a_made_up_run_and_its_flip_restores_it(key):
    df = _contradicted()
    before = _judge(key, df)
    assert before.state is State.NOT_SEEN, before
    claim = next(c for c in claims.lesson_claims(REGISTRY["tensor_cores"]) if c.name == key)
    after = _judge(key, claim.flip(df.copy()))
    assert after.state is State.SEEN, after


@pytest.mark.parametrize("key", WGMMA_KEYS)
def test_a_run_before_the_rungs_leaves_their_claims_not_measured(key):
    """The H100 run of 2026-11-25 predates the rungs: their claims are not measured, with
    the reason, neither seen nor not seen."""
    got = _judge(key, results.read_table(RUN1))
    assert got.state is State.NOT_MEASURED and "measured ok at one size" in got.evidence


def test_the_h100_run_s_shares_of_cublas_are_the_issue_s_targets():
    """Issue 40's bar, on the H100 run: FP16 and BF16 wgmma at least 70 % of cuBLAS at
    4096, TF32 at least 60 %; the evidence names the best rung and both speeds."""
    assert wgmma_lesson.SHARE_OF_CUBLAS == {"fp16": 0.70, "bf16": 0.70, "tf32": 0.60}
    got = {r.key: r for r in claims.evaluate("tensor_cores", _h100())}
    for key, prec in (("wgmma_fp16_share", "FP16"), ("wgmma_bf16_share", "BF16"),
                      ("wgmma_tf32_share", "TF32")):
        r = got[key]
        assert r.state is State.SEEN and r.evidence.startswith(f"{prec} at n = 4"), r
        assert "wgmma persistent" in r.evidence and "of cuBLAS" in r.evidence, r


def test_the_h100_run_counts_the_operands_traffic():
    """Nsight Compute's counters on the H100 run: the mma.sync tile issues cp.async and
    ldmatrix, the warp-specialised wgmma rung TMA loads and neither, with fewer shared-memory
    wavefronts; the fact says so with the counts."""
    from cudalab import roofline, run_ceilings

    full = roofline.annotate(_h100())
    said = wgmma_lesson.shared_traffic_measured(full, run_ceilings.ceilings_of(full))
    assert said is not None and said.startswith("Nsight Compute counted, FP16 at n = 4"), said
    mma, ws = said.split("the warp-specialised wgmma rung")
    assert " 0 TMA load" in mma and "0 cp.async, 0 ldmatrix" in ws, said
    assert "fewer wavefronts" in said, said


def test_evidence_holds_the_numbers_read():
    got = {r.key: r for r in claims.evaluate("tensor_cores", _contradicted())}
    assert "1.60×" in got["tf32_over_fp32"].evidence
    assert "wrong: mma-fp16-1024" in got["correct"].evidence
    assert "125 %" in got["cublas_under_peak"].evidence
    assert "hand_under_cublas" not in got  # a share of cuBLAS alone proves no cause


def test_the_hand_kernel_s_gap_to_cublas_is_shown_with_its_cause_as_a_hypothesis():
    from cudalab.experiments.tensor_cores.lesson import hand_vs_cublas

    d = _contradicted()
    no_wgmma = d[~d["variant"].isin(wgmma.RUNGS)]
    said = hand_vs_cublas(no_wgmma, None)
    assert said.startswith("FP16 at n = 4") and "of cuBLAS" in said
    assert "Hypothesis for the gap (not measured" in said and "profile.ncu" in said
    # Ampere: no warpgroup MMA to blame, no hypothesis
    assert "Hypothesis" not in hand_vs_cublas(no_wgmma.assign(compute_capability="8.0"), None)
    # the run measured the wgmma rungs: their best share is said instead of a hypothesis
    said = hand_vs_cublas(d, None)
    assert "Hypothesis" not in said and "Measured in this run: the wgmma rungs" in said
    assert "= 60 % of cuBLAS" in said and "warp-specialised" in said.split("(")[-1], said


def test_missing_points_are_not_measured_and_missing_units_not_applicable():
    d = _contradicted()
    no_tf32 = d[d["p_precision"] != "tf32"]
    assert _judge("tf32_over_fp32", no_tf32).state is State.NOT_MEASURED
    failed = d.assign(status=np.where(d["p_precision"] == "tf32", "failed", d["status"]))
    assert _judge("tf32_over_fp32", failed).state is State.NOT_MEASURED
    assert _judge("error_tf32_like_fp16", d.assign(m_err_input=math.nan)).state \
        is State.NOT_MEASURED
    # a failed point gives no result: not judged, said so
    only_failed = d.assign(status=np.where(d["status"] == "wrong", "failed", d["status"]))
    r = _judge("correct", only_failed)
    assert r.state is State.SEEN and "1 points gave no result (failed" in r.evidence
    # a TF32 peak only 1x the FP32 one (GeForce Ada)
    geforce = d.assign(m_peak_precision_gflops=82_600.0)
    assert _judge("tf32_over_fp32", geforce).state is State.NOT_APPLICABLE
    assert _judge("fp16_over_tf32", d.assign(compute_capability="7.5")).state \
        is State.NOT_APPLICABLE
    # a chip the peak table does not know yet is judged, not ruled out
    assert _judge("fp16_over_tf32", d.assign(compute_capability="10.0")).state \
        is State.NOT_SEEN
    # a GPU-less run measured nothing: every claim not measured
    none = d.assign(status="not_measured", reason="no GPU")
    assert {r.state for r in claims.evaluate("tensor_cores", none)} == {State.NOT_MEASURED}


def test_facts_come_from_the_table():
    from cudalab import roofline, run_ceilings

    df = results.read_table(RUN1)
    full = roofline.annotate(df)
    c = run_ceilings.ceilings_of(full)
    peaks, errs, hand = (f(full, c) for f in lesson.EXPLANATIONS[:3])
    assert "TF32 tensor cores 535 TFLOP/s" in peaks and "n = 4" in peaks
    assert "rounding the inputs predicts" in errs and "BF16" in errs
    assert "of cuBLAS" in hand and "not measured: this run did not profile cuBLAS" in hand
    assert all(f(full.iloc[:0], c) is None for f in lesson.EXPLANATIONS)
    # a run without wgmma rows says nothing of them
    assert all(f(full, c) is None for f in wgmma_lesson.EXPLANATIONS)


def test_the_wgmma_facts_read_the_rungs():
    d = _contradicted().assign(p_bm=128, p_bn=[256 if v == "wgmma_ws" else 128 for v in
                                               _contradicted()["variant"]],
                               p_bk=64, p_wm=64, p_wn=64)
    ladder, depth, copies, counted = (f(d, None) for f in wgmma_lesson.EXPLANATIONS)
    assert counted is None  # not profiled: the counts are not said
    assert ladder.startswith("The rungs at the largest size measured: FP16: mma.sync 90")
    assert "wgmma warp-specialised 60.0 TFLOP/s, 60 % of cuBLAS" in ladder
    assert "TF32: wgmma warp-specialised 40.0 TFLOP/s, 50 % of cuBLAS" in ladder
    assert depth is None  # one stage count: no depth to compare
    deeper = pd.concat([d, pd.DataFrame([_row("wgmma_pipe", "fp16", 60, p_stages=2)])])
    depth = wgmma_lesson.pipeline_depth(deeper, None)
    assert "wgmma 1-stage: 1 stage" in depth and "wgmma pipeline: 2 stages" in depth
    # 128x128x64 mma.sync, 4 warps: (128*64 + 64*128) * 2 / 16 cp.async, 4 x 128 x 64 x 2 B
    assert "issues 2\u202f048 16-byte cp.async" in copies and "copy 64 KiB" in copies
    assert "issues 5 TMA copies from one thread" in copies


def _profiled(d: pd.DataFrame, counts: dict[str, dict[str, float]]) -> pd.DataFrame:
    """d with Nsight Compute's counts on the rows of the named variants (FP16, n = 4096)."""
    d = d.assign(m_ncu_status="not profiled: profile.ncu is off")
    for variant, values in counts.items():
        rows = (d["variant"] == variant) & (d["p_precision"] == "fp16") & (d["p_m"] == 4096)
        d.loc[rows, "m_ncu_status"] = "ok"
        for column, v in values.items():
            d.loc[rows, f"m_ncu_{column}"] = v
    return d


def test_the_measured_shared_memory_traffic_is_said_from_the_profiler():
    """The counts the H200's first ncu run gave for the mma.sync tile (tc_mma_fp16 at 4096:
    8 388 608 ldmatrix, 38 858 752 LSU shared wavefronts, 140 365 824 instructions) beside
    made-up wgmma ones: each count is said as measured, with the ratio of wavefronts."""
    mma = {"ldmatrix_inst": 8_388_608, "cp_async_inst": 2_097_152,
           "tma_load_inst": 0, "smem_lsu_wavefronts": 38_858_752, "warp_inst": 140_365_824}
    ws = {"ldmatrix_inst": 0, "cp_async_inst": 0, "tma_load_inst": 98_304,
          "smem_lsu_wavefronts": 388_587, "warp_inst": 9_000_000}
    got = wgmma_lesson.shared_traffic_measured(
        _profiled(_contradicted(), {"mma": mma, "wgmma_ws": ws}), None)
    assert got.startswith("Nsight Compute counted, FP16 at n = 4\u202f096: the mma.sync tile "
                          "2\u202f097\u202f152 cp.async, 8\u202f388\u202f608 ldmatrix, 0 TMA load, "
                          "38\u202f858\u202f752 shared-memory wavefronts"), got
    assert "the warp-specialised wgmma rung 0 cp.async, 0 ldmatrix, 98\u202f304 TMA load" in got
    assert "(100× fewer wavefronts)." in got, got
    # none through the load/store unit at all; a count not collected is left out
    ws0 = {k: v for k, v in ws.items() if k != "tma_load_inst"} | {"smem_lsu_wavefronts": 0}
    got = wgmma_lesson.shared_traffic_measured(
        _profiled(_contradicted(), {"mma": mma, "wgmma_ws": ws0}), None)
    assert got.endswith("(no wavefront at all).") and "TMA load" not in got.split("rung")[-1]
    # only one of the two profiled, or the counter not collected: nothing is said
    assert wgmma_lesson.shared_traffic_measured(
        _profiled(_contradicted(), {"mma": mma}), None) is None
    no_counter = _profiled(_contradicted(), {"mma": {"warp_inst": 1}, "wgmma_ws": {"warp_inst": 1}})
    assert wgmma_lesson.shared_traffic_measured(no_counter, None) is None


def test_the_shipped_metrics_give_the_traffic_columns():
    """The shipped config collects what the fact reads, under the columns it reads."""
    from cudalab import ncu_csv

    shipped = yaml.safe_load((ROOT / "config.yaml").read_text())["profile"]["metrics"]
    columns = {f"m_ncu_{ncu_csv.SHORT_NAMES[m]}" for m in shipped if m in ncu_csv.SHORT_NAMES}
    wanted = {c for c, _ in wgmma_lesson.TRAFFIC} | {wgmma_lesson.WAVEFRONTS,
                                                     wgmma_lesson.WARP_INST}
    assert wanted <= columns, wanted - columns


def test_the_wgmma_claims_are_not_applicable_before_hopper():
    d = _contradicted().assign(compute_capability="8.0")
    for key in ("wgmma_fp16_share", "wgmma_tf32_share", "wgmma_pipeline_pays",
                "wgmma_ws_over_mma"):
        got = _judge(key, d)
        assert got.state is State.NOT_APPLICABLE and "sm_90a" in got.evidence
    none = _contradicted()[lambda x: ~x["variant"].str.startswith("wgmma")]
    assert _judge("wgmma_bf16_share", none).state is State.NOT_MEASURED


def test_a_tile_that_cannot_fit_the_register_file_is_refused():
    t = {"bm": 256, "bn": 256, "bk": 32, "wm": 64, "wn": 64, "stages": 3}
    assert any("registers" in m for m in kernels.check_mma_tile(t))
    assert all(kernels.check_mma_tile(t) == [] for t in kernels.DEFAULT_MMA_TILES)


def test_the_ladder_and_depth_figures_draw_the_rungs():
    import matplotlib

    matplotlib.use("Agg")
    from cudalab import figcheck
    from cudalab import figures as run_figures
    from cudalab.experiments.tensor_cores import figures

    run_figures.setup_style()
    d = _contradicted()
    d = d[d["status"] == "ok"]
    fig = figures.plot("wgmma_ladder", d)
    assert figcheck.problems(fig) == []
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "wgmma, producer/consumer warpgroups" in labels and "cuBLAS" in labels
    assert "60%" in [t.get_text() for t in fig.axes[0].texts]  # ws FP16 over cuBLAS FP16
    assert figures.plot("pipeline_depth", d) is None  # one stage count only
    deeper = pd.concat([d, pd.DataFrame([_row("wgmma_pipe", "fp16", 70, p_stages=2)])])
    fig = figures.plot("pipeline_depth", deeper)
    assert fig is not None and fig.axes[0].get_xlabel() == "shared-memory stages"
    assert figcheck.problems(fig) == []
    assert figures.plot("wgmma_ladder", d[~d["variant"].str.startswith("wgmma")]) is None
