"""devicespec's theoretical peaks: the FP32 and DRAM peaks with each precision's dense
tensor-core peak merged in (cudalab/tensor_peaks.py), GeForce boards halved."""

from __future__ import annotations

import math

import pytest

from cudalab import devicespec, tensor_peaks


def test_theoretical_peaks_carry_the_tensor_peaks():
    p = devicespec.theoretical_peaks("9.0", 132, 1_980_000, 2_619_000, 5120,
                                     name="NVIDIA H100 80GB HBM3")
    assert p["peak_fp32_gflops"] == pytest.approx(2 * 128 * 132 * 1.98)
    assert p["peak_fp16_tensor_gflops"] == pytest.approx(4096 * 132 * 1.98)
    assert p["peak_bf16_tensor_gflops"] == p["peak_fp16_tensor_gflops"]
    assert p["peak_tf32_tensor_gflops"] == pytest.approx(2048 * 132 * 1.98)
    assert p["peak_fp64_tensor_gflops"] == pytest.approx(256 * 132 * 1.98)
    assert set(tensor_peaks.tensor_peaks("9.0", 1, 1)) <= set(p)


def test_a_geforce_board_halves_fp32_accumulation_and_a_chip_without_a_unit_has_nan():
    pro = devicespec.theoretical_peaks("8.9", 142, 2_520_000, 2_250_000, 384,
                                       name="NVIDIA L40S")
    geforce = devicespec.theoretical_peaks("8.9", 128, 2_520_000, 2_250_000, 384,
                                           name="NVIDIA GeForce RTX 4090")
    assert geforce["peak_tf32_tensor_gflops"] == pytest.approx(256 * 128 * 2.52)
    assert pro["peak_tf32_tensor_gflops"] == pytest.approx(512 * 142 * 2.52)
    assert math.isnan(pro["peak_fp64_tensor_gflops"])
    old = devicespec.theoretical_peaks("6.1", 28, 1_582_000, 2_750_000, 352)  # Pascal
    assert math.isnan(old["peak_fp16_tensor_gflops"]) and old["peak_fp32_gflops"] > 0
