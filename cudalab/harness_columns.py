"""The timing harness' settings of a row as columns of the results table, one per setting
(harness_<setting>, typed), not JSON in one cell: pandas, a spreadsheet and the report read
them like any other column, and the schema says what each one is.

One column per field of harness.Settings, so a new setting gets its column: the description
below names it (the import fails on a setting without one). Two settings are columns of their
own already: the timing method is `timer`, and cold_l2 is `cold_l2`.

A table written before these columns kept the settings as JSON in a `harness` column (the
committed references): expand() turns it into the columns, the one place that reads it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pandas as pd

from cudalab.harness import Settings

PREFIX = "harness_"
LEGACY = "harness"  # the JSON column of older tables
OWN_COLUMNS = {"cold_l2": "cold_l2"}  # settings kept in a column of their own

_DESCRIPTIONS = {
    "warmup": "untimed runs before the first sample",
    "min_samples": "fewest timed samples before the stop rule may stop",
    "max_samples": "most timed samples",
    "target_cv": "the samples' coefficient of variation at which sampling stops",
    "budget_s": "time budget of the point's sampling, seconds (split over its trials)",
    "min_sample_s": "shortest sample of queued launches, seconds (launches are batched up to "
                    "it)",
    "min_sample_sync_s": "shortest sample of work timed one call after the other, seconds",
    "trials": "measurements of the point, its buffers moved between them",
    "trial_min_samples": "fewest samples of a trial after the first",
    "trial_warmup": "warm-up runs of a trial after the first",
    "host_trials": "trials of a host-bound point",
}
_DTYPES = {int: "Int64", float: "float64", bool: "boolean", "int": "Int64",
           "float": "float64", "bool": "boolean"}

COLUMNS: dict[str, tuple[str, str]] = {
    f"{PREFIX}{f.name}": (_DTYPES[f.type], f"harness setting {f.name}: {_DESCRIPTIONS[f.name]} "
                                          "(empty where not recorded)")
    for f in dataclasses.fields(Settings) if f.name not in OWN_COLUMNS
}


def row(settings: dict[str, Any] | None) -> dict[str, Any]:
    """A record's harness settings as the row's columns (None where not recorded)."""
    settings = settings or {}
    out: dict[str, Any] = {col: settings.get(col.removeprefix(PREFIX)) for col in COLUMNS}
    for key, col in OWN_COLUMNS.items():
        out[col] = settings.get(key)
    return out


def _parsed(cell: Any) -> dict[str, Any]:
    if cell is None or isinstance(cell, float) and math.isnan(cell) or cell is pd.NA:
        return {}
    try:
        got = json.loads(str(cell))
    except json.JSONDecodeError:
        return {}
    return got if isinstance(got, dict) else {}


def expand(df: pd.DataFrame, drop: bool = True) -> pd.DataFrame:
    """A table with the older JSON `harness` column: its settings as the columns (a column
    the table already fills is kept), the JSON column dropped unless drop is False."""
    if LEGACY not in df:
        return df
    parsed = df[LEGACY].map(_parsed)
    cols = {}
    for col, (dtype, _) in COLUMNS.items():
        key = col.removeprefix(PREFIX)
        if col not in df or df[col].isna().all():
            cols[col] = parsed.map(lambda s, k=key: s.get(k)).astype("object").astype(dtype)
    for key, col in OWN_COLUMNS.items():
        if col not in df or df[col].isna().all():
            cols[col] = parsed.map(lambda s, k=key: s.get(k)).astype("boolean")
    out = pd.concat([df.drop(columns=[c for c in cols if c in df]),
                     pd.DataFrame(cols, index=df.index)], axis=1)
    return out.drop(columns=[LEGACY]) if drop else out
