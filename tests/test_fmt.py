"""cudalab.fmt: every kind of number the report prints."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cudalab import fmt


@pytest.mark.parametrize("v, want", [
    (1024, "1,024"), (65536.0, "65,536"), (1_048_576, "1,048,576"), (7, "7"),
    (None, ""), (math.nan, ""), (pd.NA, ""),
])
def test_integers_have_thousands_separators(v, want):
    assert fmt.integer(v) == want


@pytest.mark.parametrize("v, want", [
    (1000, "1000"), (1024.0, "1024"), (0.5, "0.5"), (1e-4, "0.0001"), ("32x8", "32x8"),
    (True, "true"),
])
def test_parameters_are_exact(v, want):
    assert fmt.param(v) == want


@pytest.mark.parametrize("v, want", [
    (9.02e-6, "9.02 µs"), (0.0168, "16.8 ms"), (1.25, "1.25 s"), (3.3e-10, "0.330 ns"),
    (4.5e-9, "4.50 ns"), (0.000229876, "230 µs"), (123.4, "123 s"), (2345.0, "2,345 s"),
    (0, "0 s"),
])
def test_times_pick_a_unit_and_3_to_4_significant_digits(v, want):
    assert fmt.seconds(v) == want


def test_rates_bandwidth_sizes_ratios():
    assert fmt.bandwidth(2595.4) == "2,595 GB/s"
    assert fmt.bandwidth(54.83) == "54.8 GB/s"
    assert fmt.bandwidth(0.4421) == "0.442 GB/s"
    assert fmt.flop_rate(49012.0) == "49.0 TFLOP/s"
    assert fmt.flop_rate(121.3) == "121 GFLOP/s"
    assert fmt.nbytes(50 * 2**20) == "50 MiB"
    assert fmt.nbytes(4096) == "4 KiB"
    assert fmt.nbytes(32_768_000) == "31.2 MiB"
    assert fmt.nbytes(100) == "100 B"
    assert fmt.ratio(1.6912) == "1.69×"
    assert fmt.percent(77.3) == "77 %"
    assert fmt.percent(0.027, fraction=True) == "2.7 %"
    assert fmt.error(6.3e-6) == "6.3e-06"
    assert fmt.error(0.25) == "0.25"


def test_no_scientific_notation_for_ordinary_numbers():
    for v in (1000.0, 1024.0, 65536.0, 2.5e7, 0.123):
        assert "e" not in fmt.number(v), v
    assert fmt.number(1024.0) == "1,024"


def test_cells_by_column():
    assert fmt.cell("time_median_s", 1.68e-2) == "16.8 ms"
    assert fmt.cell("m_h2d_s", 2e-5) == "20.0 µs"
    assert fmt.cell("gflops", 5300.0) == "5.30 TFLOP/s"
    assert fmt.cell("p_m", 1000.0) == "1000"
    assert fmt.cell("time_cv", 0.0024) == "0.24 %"
    assert fmt.cell("m_copy_share", 0.81) == "81 %"
    assert fmt.cell("n_samples", 2048.0) == "2,048"
    assert fmt.header("p_tile") == "tile" and fmt.header("m_counted") == "counted"


def test_short_drops_trailing_zeros():
    assert fmt.short(4.2) == "4.2" and fmt.short(50.0) == "50" and fmt.short(2.04) == "2.04"
    assert fmt.short(1234.5) == "1,234" and fmt.short(None) == ""
