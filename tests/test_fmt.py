"""cudalab.fmt: every kind of number the report prints."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pandas as pd
import pytest

from cudalab import fmt

T = "\u202f"  # the one thousands separator
NB = "\u00a0"


@pytest.mark.parametrize("v, want", [
    (1024, f"1{T}024"), (65536.0, f"65{T}536"), (1_048_576, f"1{T}048{T}576"), (7, "7"),
    (None, ""), (math.nan, ""), (pd.NA, ""), (-12345, f"-12{T}345"),
])
def test_integers_have_one_thousands_separator(v, want):
    assert fmt.integer(v) == want


def test_an_integer_is_never_printed_as_a_float():
    for f in (fmt.integer, fmt.number, fmt.short, fmt.param):
        assert ".0" not in f(1048576.0) and "1048576" not in f(1048576.0).replace(T, "x")


@pytest.mark.parametrize("v, want", [
    (1000, "1000"), (1024.0, "1024"), (0.5, "0.5"), (1e-4, "0.0001"), ("32x8", "32x8"),
    (True, "true"), (16_777_216.0, f"16{T}777{T}216"), (1.5e-7, f"1.5{NB}×{NB}10⁻⁷"),
])
def test_parameters_are_exact(v, want):
    assert fmt.param(v) == want


@pytest.mark.parametrize("v, want", [
    (9.02e-6, "9.02 µs"), (0.0168, "16.8 ms"), (1.25, "1.25 s"), (3.3e-10, "0.330 ns"),
    (4.5e-9, "4.50 ns"), (0.000229876, "230 µs"), (123.4, "123 s"), (2345.0, f"2{T}345 s"),
    (0, "0 s"), (0.102033, "102 ms"), (0.00099996, "1.00 ms"), (9.9996e-7, "1.00 µs"),
])
def test_times_pick_a_unit_and_3_significant_digits(v, want):
    assert fmt.seconds(v) == want


@pytest.mark.parametrize("f, v, want", [
    (fmt.bandwidth, 2595.4, "2.60 TB/s"), (fmt.bandwidth, 54.83, "54.8 GB/s"),
    (fmt.bandwidth, 0.4421, "0.442 GB/s"), (fmt.bandwidth, 999.6, "1.00 TB/s"),
    (fmt.flop_rate, 49012.0, "49.0 TFLOP/s"), (fmt.flop_rate, 121.3, "121 GFLOP/s"),
    (fmt.flop_rate, 66908.0, "66.9 TFLOP/s"),
    (fmt.nbytes, 50 * 2**20, "50 MiB"), (fmt.nbytes, 4096, "4 KiB"),
    (fmt.nbytes, 32_768_000, "31.2 MiB"), (fmt.nbytes, 100, "100 B"),
    (fmt.nbytes, 80 * 2**30, "80 GiB"),
])
def test_rates_and_sizes_scale_their_unit(f, v, want):
    assert f(v) == want


@pytest.mark.parametrize("v, want", [
    (1.3127, "1.31×"), (459.3, "459×"), (12.345, "12.3×"), (0.52, "0.520×"),
    (4321.0, f"4{T}321×"), (0.0257, "1/38.9"), (1.44e-5, f"1/69{T}444"),
])
def test_ratios_read_with_a_times_sign_and_sensible_digits(v, want):
    assert fmt.ratio(v) == want


def test_percentages():
    assert fmt.percent(94.2) == "94 %" and fmt.percent(77.3) == "77 %"
    assert fmt.percent(0.027, fraction=True) == "2.7 %"
    assert fmt.percent(9.96) == "10 %"


@pytest.mark.parametrize("v, want", [
    (9e-7, f"9.0{NB}×{NB}10⁻⁷"), (6.3e-6, f"6.3{NB}×{NB}10⁻⁶"), (0.00014, f"1.4{NB}×{NB}10⁻⁴"),
    (0.25, "0.25"), (0, "0"),
])
def test_small_errors_are_never_e_notation(v, want):
    assert fmt.error(v) == want


def test_no_e_notation_anywhere():
    for v in (1000.0, 1024.0, 65536.0, 2.5e7, 0.123, 9e-07, 1.5e-12, 3e20):
        for f in (fmt.number, fmt.sig, fmt.error, fmt.seconds):
            assert not re.search(r"\de[+-]?\d", f(v)), (f.__name__, v, f(v))
    assert fmt.number(1024.0) == f"1{T}024"
    assert fmt.sig(3e20) == f"3.00{NB}×{NB}10²⁰"


def test_rounding_to_the_next_decade_keeps_3_digits():
    assert fmt.sig(99.96) == "100" and fmt.sig(0.0009996) == "0.00100"
    assert fmt.sig(9.996) == "10.0"


def test_quantities_in_a_published_unit_are_rescaled():
    assert fmt.quantity(0.0105, "ms") == "10.5 µs"
    assert fmt.quantity(14320, "ms") == "14.3 s"
    assert fmt.quantity(66908, "GFLOP/s") == "66.9 TFLOP/s"
    assert fmt.quantity(1.19, "× the time") == "1.19× the time"
    assert fmt.quantity(25, "% occupancy") == "25 % occupancy"
    assert fmt.quantity(1024, "threads") == f"1{T}024 threads"
    assert fmt.quantity(None, "ms") == ""


def test_html_keeps_a_number_on_one_line():
    out = fmt.html("9.02 µs")
    assert out == f'<span class="num">9.02{NB}µs</span>'
    assert fmt.html("<1 ms") == f'<span class="num">&lt;1{NB}ms</span>'
    assert fmt.html(None) == "" and fmt.nobreak("1.31× the time") == f"1.31×{NB}the{NB}time"
    from jinja2 import Environment

    env = Environment(autoescape=True)
    env.filters["num"] = fmt.html
    assert env.from_string("{{ v | num }}").render(v="3 ms") == f'<span class="num">3{NB}ms</span>'


def test_cells_by_column():
    assert fmt.cell("time_median_s", 1.68e-2) == "16.8 ms"
    assert fmt.cell("m_h2d_s", 2e-5) == "20.0 µs"
    assert fmt.cell("gflops", 5300.0) == "5.30 TFLOP/s"
    assert fmt.cell("p_m", 1000.0) == "1000"
    assert fmt.cell("time_cv", 0.0024) == "0.24 %"
    assert fmt.cell("m_copy_share", 0.81) == "81 %"
    assert fmt.cell("n_samples", 2048.0) == f"2{T}048"
    assert fmt.cell("pct_ceil_gbps", 93.6) == "94 %"
    assert fmt.cell("m_ncu_time_us", 1841.664) == "1.84 ms"
    assert fmt.cell("m_ncu_l2_hit_rate_pct", 41.97) == "42 %"
    assert fmt.cell("m_occupancy_256", 1.0) == "100 %"
    assert fmt.cell("m_updates_per_s", 2617314432.65) == f"2{T}617{T}314{T}433"
    assert fmt.cell("m_max_rel_err", 4.16e-7) == f"4.2{NB}×{NB}10⁻⁷"


@pytest.mark.parametrize("column, want", [
    ("p_tile", "tile"), ("m_counted", "counted"), ("time_median_s", "median time"),
    ("pct_ceil_gbps", "% ceiling of level"), ("m_ncu_l2_hit_rate_pct", "L2 hit rate (ncu)"),
    ("m_ncu_time_us", "time (ncu)"), ("m_h2d_s", "host→device time"),
    ("m_sm_clock_mhz", "SM clock (MHz)"), ("m_num_regs", "registers"),
    ("m_occupancy_256", "occupancy at 256 threads"), ("m_bus_width_bits", "bus width (bits)"),
])
def test_headers_are_readable(column, want):
    assert fmt.header(column) == want


def test_every_reference_column_has_a_readable_header():
    df = pd.read_csv("reports/reference/NVIDIA-H100-80GB-HBM3/results.csv", nrows=1)
    for c in df.columns:
        h = fmt.header(c)
        assert h and not h.startswith(("m_", "p_")) and "_" not in h.replace(c[2:], ""), c


def test_short_drops_trailing_zeros():
    assert fmt.short(4.2) == "4.2" and fmt.short(50.0) == "50" and fmt.short(2.04) == "2.04"
    assert fmt.short(1234.5) == f"1{T}234" and fmt.short(None) == ""


def test_the_config_loader_can_use_it_without_pandas():
    code = "import sys, cudalab.fmt as f; f.integer(1); assert 'pandas' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("lo, hi, f, want", [
    (1200, 2600, fmt.bandwidth, "1.20–2.60 TB/s"), (10.2, 77.4, fmt.percent, "10–77 %"),
    (9.1e-6, 0.0021, fmt.seconds, "9.10 µs–2.10 ms"), (2**20, 3 * 2**30, fmt.nbytes, "1 MiB–3 GiB"),
    (1.5, 3.0, fmt.flop_rate, "1.50–3.00 GFLOP/s"), (None, 5.0, fmt.percent, "5.0 %"),
])
def test_a_range_has_one_unit(lo, hi, f, want):
    assert fmt.span(lo, hi, f) == want


def test_the_course_table_reads_on_a_projector():
    """The reference H100 run's course table: each number with its unit, rescaled, no
    e-notation, no comma, no integer as a float, and every empty cell says why."""
    from cudalab import course, results

    df = results.read_table("reports/reference/NVIDIA-H100-80GB-HBM3/results.csv")
    rows = course.course_table(df)
    assert len(rows) >= 10
    for r in rows:
        t = r["text"]
        for key in ("course_q", "this_q", "ratio_x", "k80_q", "course", "this", "ratio"):
            assert not re.search(r"\de[+-]?\d|,|(?<![.\d])\d{4}", t[key]), (key, t[key])
        for key in ("this", "ratio", "k80"):
            assert bool(t[f"{key}_q" if key != "ratio" else "ratio_x"]) != bool(t[f"{key}_why"])
    by = {r["lesson"]: r["text"] for r in rows}
    assert by["matmul 160×240 · 240×320: the GPU (naive kernel) against the CPU"]["course_q"] \
        == "35\u202f800×"
    assert by["the GPU's FP32 peak"]["this_q"].endswith(" TFLOP/s")
    assert by["latency: global memory (DRAM)"]["this_q"] == "685 cycles"
