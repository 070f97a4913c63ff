"""Numbers as a reader wants them: formatted by kind, in one place.

Integers as integers with thousands separators, parameters exactly as configured, times in
ns / µs / ms / s, bandwidth in GB/s, FLOP rates in GFLOP/s or TFLOP/s, all with 3-4
significant digits and never in scientific notation where a unit can absorb the scale.
`cell(column, value)` picks the format of a results-table column from its name.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import pandas as pd

EMPTY = ""


def missing(v: Any) -> bool:
    """None, NaN, pd.NA and empty strings are all 'no value'."""
    if v is None or v is pd.NA:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and v == ""


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def sig(x: float, digits: int = 3) -> str:
    """x with `digits` significant digits, plain notation for 1e-3 <= |x| < 1e6; integers
    of 4 or more digits keep every digit (2595, not 2.6e+03) with separators."""
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 10 ** (digits - 1) and ax < 1e15:
        return f"{round(x):,}"
    if ax < 1e-3:
        return f"{x:.{max(digits - 1, 1)}e}"
    decimals = digits - 1 - math.floor(math.log10(ax))
    return f"{x:.{max(decimals, 0)}f}"


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
        return str(v) if x is None else f(x, *args, **kw)

    return wrapper


@_numeric
def integer(x: float) -> str:
    """1048576 -> '1,048,576' (floats that hold an integer too)."""
    return f"{int(x):,}" if x.is_integer() else sig(x)


@_numeric
def param(x: float) -> str:
    """A configured parameter, exact: 1000 stays 1000, 0.5 stays 0.5, text stays text."""
    return str(int(x)) if x.is_integer() else repr(x)


@_numeric
def seconds(x: float) -> str:
    """A duration in the unit that puts it in [1, 1000): '9.02 µs', '16.8 ms', '1.25 s'."""
    if x == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(x) >= scale:
            return f"{sig(x / scale)} {unit}"
    return f"{sig(x / 1e-9)} ns"


@_numeric
def bandwidth(x: float) -> str:
    """GB/s (decimal): '2,595 GB/s', '54.8 GB/s', '0.442 GB/s'."""
    return f"{sig(x)} GB/s"


@_numeric
def flop_rate(x: float) -> str:
    """GFLOP/s below 1000, TFLOP/s from there: '121 GFLOP/s', '49.0 TFLOP/s'."""
    return f"{sig(x / 1e3)} TFLOP/s" if abs(x) >= 1e3 else f"{sig(x)} GFLOP/s"


@_numeric
def percent(x: float, fraction: bool = False) -> str:
    """'77 %' (or from a fraction with fraction=True); small values keep 2 digits."""
    x = 100 * x if fraction else x
    return f"{sig(x, 2) if abs(x) < 10 else f'{x:.0f}'} %"


@_numeric
def ratio(x: float) -> str:
    """A speed-up: '1.69×', '444×'."""
    return f"{sig(x)}×"


@_numeric
def nbytes(x: float) -> str:
    """Binary units: '50 MiB', '31.2 MiB', '4 KiB', '100 B'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:  # whole units stay whole: 50 MiB, not 50.0 MiB
            v = x / scale
            return f"{int(v) if v.is_integer() else sig(v)} {unit}"
    return f"{integer(x)} B"


@_numeric
def error(x: float) -> str:
    """A relative error: two significant digits, scientific below 1e-3 ('6.3e-06')."""
    return "0" if x == 0 else (f"{x:.1e}" if abs(x) < 1e-3 else sig(x, 2))


def number(v: Any) -> str:
    """Anything else: integers exact, floats with 3 significant digits, text as is."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    return integer(v)


def short(v: Any) -> str:
    """Like number(), without trailing zeros: 4.2 (not 4.20), 50 (not 50.0); for small
    tables whose column headers carry the unit."""
    out = number(v)
    if "." in out and "e" not in out:
        out = out.rstrip("0").rstrip(".")
    return out


# Column name -> formatter, for the results table. Metric columns (m_*) are matched by
# their suffix: *_s are durations, *_gbps bandwidths, *_gflops FLOP rates, *_bytes sizes.
COLUMN_FORMATS = {
    "time_median_s": seconds, "time_iqr_s": seconds, "time_min_s": seconds,
    "time_mean_s": seconds, "time_cv": lambda v: percent(v, fraction=True),
    "n_samples": integer, "batch": integer, "n_throttled": integer,
    "gflops": flop_rate, "gbps": bandwidth, "pct_peak_gbps": percent,
    "pct_peak_gflops": percent, "error": error, "tolerance": error,
    "flops": integer, "bytes": nbytes,
}
SUFFIX_FORMATS = (("_s", seconds), ("_gbps", bandwidth), ("_gflops", flop_rate),
                  ("_bytes", nbytes), ("_share", lambda v: percent(v, fraction=True)),
                  ("_fraction", lambda v: percent(v, fraction=True)))


def cell(column: str, v: Any) -> str:
    """The text of one results-table cell, by column."""
    if column in COLUMN_FORMATS:
        return COLUMN_FORMATS[column](v)
    if column.startswith("p_"):
        return param(v)
    if column.startswith("m_"):
        for suffix, f in SUFFIX_FORMATS:
            if column.endswith(suffix):
                return f(v)
    return number(v)


def header(column: str) -> str:
    """A column's heading: the name without its p_/m_ prefix."""
    return column[2:] if column.startswith(("p_", "m_")) else column
