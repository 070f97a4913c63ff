"""Numbers as a reader wants them: formatted by kind, in one place.

One unit per quantity, scaled by magnitude: times in ns / µs / ms / s, bandwidth in GB/s or
TB/s, FLOP rates in GFLOP/s or TFLOP/s, sizes in B / KiB / MiB / GiB, all with 3
significant digits (integers of 4 or more digits keep every digit). Counts are grouped by
one thousands separator, the narrow no-break space (U+202F), so a number never splits;
ratios read "1.31×", percentages "94 %", and a float holding an integer prints as one.
Very small or very large values read "9.0 × 10⁻⁷", never "9e-07".
`cell(column, value)` picks the format of a results-table column from its name and
`header(column)` its heading; `html(text)` keeps a formatted number on one line in HTML.

No pandas import: the config loader formats its limits here too.
"""

from __future__ import annotations

import functools
import html as _html
import math
import re
import sys
from collections.abc import Callable
from typing import Any

EMPTY = ""
THOUSANDS = "\u202f"  # narrow no-break space: "1 048 576"
NBSP = "\u00a0"  # between a number and its unit where they must stay together
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def missing(v: Any) -> bool:
    """None, NaN, pd.NA and empty strings are all 'no value'."""
    if v is None:
        return True
    pd = sys.modules.get("pandas")  # pd.NA can only exist once pandas is imported
    if pd is not None and v is pd.NA:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v == ""


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def group(n: int) -> str:
    """An integer with thousands separators: 1048576 -> '1 048 576' (U+202F)."""
    return f"{n:,}".replace(",", THOUSANDS)


def sci(x: float, digits: int = 3) -> str:
    """Scientific notation for prose: 9e-07 -> '9.00 × 10⁻⁷' (no-break spaces)."""
    mantissa, exp = f"{x:.{max(digits - 1, 0)}e}".split("e")
    power = str(int(exp)).translate(_SUPERSCRIPT)
    return f"{mantissa}{NBSP}×{NBSP}10{power}"


def sig(x: float, digits: int = 3) -> str:
    """x with `digits` significant digits, plain notation for 1e-3 <= |x| < 1e15; integers
    of 4 or more digits keep every digit (2 595, not 2.6e+03), grouped."""
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    r = float(f"{x:.{max(digits - 1, 0)}e}")  # rounded first: 99.96 is 100, not 100.0
    ar = abs(r)
    if ar < 1e-3 or ar >= 1e15:
        return sci(x, digits)
    if ar >= 10 ** (digits - 1):
        return group(round(x))
    return f"{r:.{digits - 1 - math.floor(math.log10(ar))}f}"


def _numeric(f: Callable[..., str]) -> Callable[..., str]:
    """Formatter of a number: '' for no value, text that is no number as it is, else f of
    the float."""

    @functools.wraps(f)
    def wrapper(v: Any, *args: Any, **kw: Any) -> str:
        if missing(v):
            return EMPTY
        if isinstance(v, bool):
            return str(v).lower()
        x = _num(v)
        if x is None:
            return str(v)
        return f(x, *args, **kw) if math.isfinite(x) else str(x)

    return wrapper


@_numeric
def integer(x: float) -> str:
    """A count: 1048576 -> '1 048 576' (floats that hold an integer too)."""
    return group(int(x)) if x.is_integer() else sig(x)


@_numeric
def param(x: float) -> str:
    """A configured parameter, exact: 1000 stays 1000, 0.5 stays 0.5, 1e-4 stays 0.0001,
    text stays text; integers of 5 or more digits are grouped (16 777 216) so they read."""
    if x.is_integer():
        return group(int(x)) if abs(x) >= 1e4 else str(int(x))
    text = repr(x)
    if "e" not in text:
        return text
    mantissa, exp = text.split("e")  # Python's shortest exact digits, as prose
    return f"{mantissa}{NBSP}×{NBSP}10{str(int(exp)).translate(_SUPERSCRIPT)}"


@_numeric
def seconds(x: float) -> str:
    """A duration in the unit that puts it in [1, 1000): '9.02 µs', '16.8 ms', '1.25 s'."""
    r = abs(float(f"{x:.2e}"))  # the unit of the rounded value: 999.96 µs is 1.00 ms
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if r >= scale:
            return f"{sig(x / scale)} {unit}"
    return "0 s" if x == 0 else f"{sig(x / 1e-9)} ns"


@_numeric
def bandwidth(x: float) -> str:
    """GB/s (decimal) below 1000, TB/s from there: '54.8 GB/s', '3.35 TB/s'."""
    return f"{sig(x / 1e3)} TB/s" if abs(x) >= 999.5 else f"{sig(x)} GB/s"


@_numeric
def flop_rate(x: float) -> str:
    """GFLOP/s below 1000, TFLOP/s from there: '121 GFLOP/s', '49.0 TFLOP/s'."""
    return f"{sig(x / 1e3)} TFLOP/s" if abs(x) >= 999.5 else f"{sig(x)} GFLOP/s"


@_numeric
def percent(x: float, fraction: bool = False) -> str:
    """'77 %' (or from a fraction with fraction=True); below 10 two digits: '2.7 %'."""
    x = 100 * x if fraction else x
    return f"{sig(x, 2) if abs(x) < 9.95 else group(round(x))} %"


@_numeric
def ratio(x: float) -> str:
    """A speed-up or a ratio of two numbers: '1.31×', '12.3×', '459×' (never '459.3x');
    below 0.1 as a fraction, which reads better than digits after zeros: '1/38.9'."""
    if 0 < abs(x) < 0.1:
        return f"{'-' if x < 0 else ''}1/{sig(1 / abs(x))}"
    return f"{sig(x)}×"


@_numeric
def nbytes(x: float) -> str:
    """Binary units: '50 MiB', '31.2 MiB', '4 KiB', '100 B'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:  # whole units stay whole: 50 MiB, not 50.0 MiB
            v = x / scale
            return f"{group(int(v)) if v.is_integer() else sig(v)} {unit}"
    return f"{integer(x)} B"


@_numeric
def error(x: float) -> str:
    """A relative error: two significant digits, '6.3 × 10⁻⁶' below 1e-3."""
    return "0" if x == 0 else sig(x, 2)


def number(v: Any) -> str:
    """Anything else: integers exact, floats with 3 significant digits, text as is."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    return integer(v)


def short(v: Any) -> str:
    """Like number(), without trailing zeros: 4.2 (not 4.20), 50 (not 50.0); for small
    tables whose column headers carry the unit."""
    out = number(v)
    if "." in out and "×" not in out:
        out = out.rstrip("0").rstrip(".")
    return out


def _unit_of(f: Callable[..., str], top: float) -> tuple[str, float]:
    """The unit (and its size) that formatter f picks for a value of magnitude top."""
    if f is seconds:
        r = float(f"{top:.2e}")
        return next(((u, s) for u, s in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)) if r >= s),
                    ("ns", 1e-9))
    if f is nbytes:
        return next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
                     if top >= s), ("B", 1.0))
    big = top >= 999.5
    if f is bandwidth:
        return ("TB/s", 1e3) if big else ("GB/s", 1.0)
    if f is flop_rate:
        return ("TFLOP/s", 1e3) if big else ("GFLOP/s", 1.0)
    if f is percent:
        return "%", 1.0
    raise ValueError(f"span: no common unit for {getattr(f, '__name__', f)}")


def span(lo: Any, hi: Any, f: Callable[..., str]) -> str:
    """A range in one unit, the one its larger end needs: span(1200, 2600, bandwidth) ->
    '1.20–2.60 TB/s' (never '1 200–2.60 TB/s'). f: seconds, bandwidth, flop_rate, nbytes
    or percent."""
    if missing(lo) or missing(hi):
        return f(hi) if missing(lo) else f(lo)
    a, b = float(lo), float(hi)
    unit, scale = _unit_of(f, max(abs(a), abs(b)))
    if 0 < min(abs(a), abs(b)) / scale < 0.1:  # ends far apart: each in its own unit
        return f"{f(a)}–{f(b)}"
    ends = [sig(a / scale, 2 if f is percent and abs(a) < 9.95 else 3),
            sig(b / scale, 2 if f is percent and abs(b) < 9.95 else 3)]
    if f is percent:  # percentages of 10 or more read as whole numbers, as percent() does
        ends = [e if abs(v) < 9.95 else group(round(v)) for e, v in zip(ends, (a, b))]
    return f"{ends[0]}–{ends[1]} {unit}"


# A quantity given with the unit it was published in (the course's tables): the same
# scaling as the report's own numbers, so "0.0105 ms" reads "10.5 µs".
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
_SCALED_UNITS: dict[str, Callable[[float], str]] = {
    "GB/s": bandwidth, "TB/s": lambda v: bandwidth(1e3 * v), "MB/s": lambda v: bandwidth(v / 1e3),
    "GFLOP/s": flop_rate, "TFLOP/s": lambda v: flop_rate(1e3 * v),
    "B": nbytes, "KiB": lambda v: nbytes(v * 2**10), "MiB": lambda v: nbytes(v * 2**20),
    "GiB": lambda v: nbytes(v * 2**30),
}


def quantity(v: Any, unit: str) -> str:
    """v in `unit`, rescaled where the unit is a time, rate or size ('0.0105', 'ms' ->
    '10.5 µs'); '×…' units read as ratios ('1.19× the time'), '%…' as percentages ('25 %
    occupancy'); any other unit follows the number ('13 SMs')."""
    if missing(v):
        return EMPTY
    x = _num(v)
    if x is None:
        return f"{v} {unit}".strip()
    if unit in _TIME_UNITS:
        return seconds(x * _TIME_UNITS[unit])
    if unit in _SCALED_UNITS:
        return _SCALED_UNITS[unit](x)
    if unit.startswith("×"):
        return (ratio(x) + unit[1:]).strip()
    if unit.startswith("%"):
        return (percent(x) + unit[1:]).strip()
    return f"{number(x)} {unit}".strip()


def nobreak(text: str) -> str:
    """A formatted number that never splits across lines: its spaces become no-break
    spaces ('9.02 µs' -> '9.02\\u00a0µs'); the thousands separator already is one."""
    return text.replace(" ", NBSP)


def html(text: Any) -> str:
    """A formatted number as HTML that stays on one line: escaped, no-break spaces, in
    <span class="num"> (a stylesheet gives that class white-space: nowrap). Returned as
    markupsafe.Markup, so a Jinja filter does not escape it again."""
    from markupsafe import Markup

    s = "" if missing(text) else str(text)
    return Markup(f'<span class="num">{_html.escape(nobreak(s))}</span>') if s else Markup("")


def _pct_fraction(v: Any) -> str:
    return percent(v, fraction=True)


# Column name -> formatter, for the results table. Other columns are matched by their
# suffix: *_s durations, *_gbps bandwidths, *_gflops FLOP rates, *_bytes sizes, ...
COLUMN_FORMATS: dict[str, Callable[[Any], str]] = {
    "time_median_s": seconds, "time_iqr_s": seconds, "time_min_s": seconds,
    "time_mean_s": seconds, "time_cv": _pct_fraction,
    "n_samples": integer, "batch": integer, "n_throttled": integer,
    "gflops": flop_rate, "gbps": bandwidth, "pct_peak_gbps": percent,
    "pct_peak_gflops": percent, "pct_ceil_gbps": percent, "pct_ceil_gflops": percent,
    "error": error, "tolerance": error, "flops": integer, "bytes": nbytes,
    "m_ns_per_load": lambda v: seconds(_scaled(v, 1e-9)),
    "m_occupancy": _pct_fraction, "m_best_occupancy": _pct_fraction,
}
SUFFIX_FORMATS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("_us", lambda v: seconds(_scaled(v, 1e-6))), ("_ms", lambda v: seconds(_scaled(v, 1e-3))),
    ("_per_s", number), ("_s", seconds), ("_gbps", bandwidth), ("_gflops", flop_rate),
    ("_bytes", nbytes),
    ("_share", _pct_fraction), ("_fraction", _pct_fraction), ("_cv", _pct_fraction),
    ("_efficiency", _pct_fraction), ("_pct", percent), ("_speedup", ratio), ("_err", error))
PREFIX_FORMATS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("m_occupancy_", _pct_fraction), ("m_pct_", percent), ("pct_", percent))


def _scaled(v: Any, scale: float) -> Any:
    x = None if missing(v) or isinstance(v, bool) else _num(v)
    return v if x is None else x * scale


def cell(column: str, v: Any) -> str:
    """The text of one results-table cell, by column."""
    if column in COLUMN_FORMATS:
        return COLUMN_FORMATS[column](v)
    if column.startswith("p_"):
        return param(v)
    for prefix, f in PREFIX_FORMATS:
        if column.startswith(prefix):
            return f(v)
    for suffix, f in SUFFIX_FORMATS:
        if column.endswith(suffix):
            return f(v)
    return number(v)


# Headings of the table's own columns. A cell that carries its unit (an auto-scaled time,
# a rate, a size, a percentage) keeps it out of the heading; a bare number's unit is in it.
HEADERS = {
    "time_median_s": "median time", "time_iqr_s": "time IQR", "time_min_s": "min time",
    "time_mean_s": "mean time", "time_cv": "time CV", "n_samples": "samples",
    "batch": "launches per sample", "n_throttled": "throttled samples",
    "gflops": "FLOP rate", "gbps": "bandwidth", "pct_peak_gbps": "% DRAM peak",
    "pct_peak_gflops": "% FP32 peak", "pct_ceil_gbps": "% ceiling of level",
    "pct_ceil_gflops": "% of its FLOP roof", "memory_level": "level", "flops": "FLOPs",
    "bytes": "bytes moved", "working_set_bytes": "working set", "l2_bytes": "L2 size",
    "peak_mem_gbps": "DRAM peak", "peak_fp32_gflops": "FP32 peak",
    "ceil_dram_gbps": "DRAM ceiling", "ceil_l2_gbps": "L2 ceiling",
    "ceil_smem_gbps": "shared-memory ceiling", "ceil_fp32_gflops": "FP32 ceiling",
    "point_id": "point", "status": "status", "error": "error", "tolerance": "tolerance",
    "m_ns_per_load": "time per load",
}
_WORDS = {
    "l1": "L1", "l2": "L2", "dram": "DRAM", "sm": "SM", "smem": "shared memory",
    "fp32": "FP32", "fp64": "FP64", "h2d": "host→device", "d2h": "device→host",
    "regs": "registers", "num": "", "cc": "compute capability", "pcie": "PCIe",
    "gpu": "GPU", "cpu": "CPU", "api": "API", "ecc": "ECC", "max": "max", "min": "min",
    "abs": "absolute", "rel": "relative", "err": "error", "cv": "CV", "gbps": "bandwidth",
    "gflops": "FLOP rate", "calc": "(calculator)", "pct": "%",
}
# suffix -> (words that replace it, unit the heading names: the cells show a bare number)
_SUFFIX_HEADING = (("_per_s", "", "per s"), ("_s", "time", ""), ("_us", "time", ""),
                   ("_ms", "time", ""),
                   ("_bytes", "bytes", ""), ("_mhz", "", "MHz"), ("_khz", "", "kHz"),
                   ("_bits", "", "bits"), ("_pct", "", ""))


def _words(name: str) -> str:
    return " ".join(w for w in (_WORDS.get(p, p) for p in name.split("_")) if w)


def header(column: str) -> str:
    """A column's heading, readable and with its unit where the cells do not carry one:
    'time_median_s' -> 'median time', 'm_sm_clock_mhz' -> 'SM clock (MHz)',
    'm_ncu_l2_hit_rate_pct' -> 'L2 hit rate (ncu)'; parameters by their own name ('tile')."""
    if column in HEADERS:
        return HEADERS[column]
    if column.startswith("p_"):
        return column[2:]
    if m := re.fullmatch(r"m_occupancy_(\d+)", column):
        return f"occupancy at {m[1]} threads"
    name = column.removeprefix("m_")
    ncu = name.startswith("ncu_")
    name = name.removeprefix("ncu_")
    unit = ""
    for suffix, words, u in _SUFFIX_HEADING:
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)]
            extra = f"_{words}" if words and words not in stem.split("_") else ""
            name, unit = stem + extra, u
            break
    out = _words(name) or column
    return out + (" (ncu)" if ncu else "") + (f" ({unit})" if unit else "")
