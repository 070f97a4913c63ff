"""Result folders read as runs to compare: a run's `results/` or a `reports/reference/<gpu>/`.

Its raw records (raw/<experiment>/[<gpu model>/]<point>.json, every sample kept) are read
when present, else its results.csv. A folder holding several GPUs (a Slurm GPU-model sweep)
is split into one run per GPU. Every file is checked before it is read (size, schema):
a folder from elsewhere is input, not trusted.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cudalab import record_schema, results, safe_io, safe_text

IQR_TO_SIGMA = 1.349  # IQR of a normal distribution in standard deviations


NOT_MEASURED = "not_measured"  # the status of a GPU point of a run without a GPU


POINT_COLS = ["experiment", "point_id", "variant", "gpu", "status", "median_s", "noise",
              "n_samples", "method", "trial_spread", "floor_s", "blocks", "sm_count"]


# What compare needs of a raw record and of a results table (older schemas lack some); a
# timed record (status ok) also needs its timing: the others (not measured, skipped, failed)
# have none to compare.
RECORD_KEYS = ("experiment", "variant", "point_id", "status", "provenance")


TIMED_KEYS = ("timing",)


MAX_RECORD_BYTES = 64 * 1024 * 1024  # a record keeps every sample: about 10 kB


TABLE_COLS = ("experiment", "variant", "point_id", "status", "time_median_s", "time_iqr_s",
              "n_samples", "gpu_name")


class CompareError(Exception):
    """Bad input (a folder missing, empty, of an older schema, sharing no point)."""


@dataclass
class Run:
    label: str  # the folder as given, plus [GPU] when the folder holds several GPUs
    folder: Path
    gpu: str  # "" where no point ran on a GPU
    points: pd.DataFrame  # POINT_COLS, one row per (experiment, point_id)


# -- loading ---------------------------------------------------------------------------------
def _noise(q1: float, med: float, q3: float) -> float:
    return (q3 - q1) / IQR_TO_SIGMA / med if med > 0 else math.nan


def _record_row(rec: dict[str, Any]) -> dict[str, Any]:
    t = rec.get("timing") or {}
    ok = rec["status"] == "ok"
    samples = np.asarray(t.get("samples_s") or [], dtype=float) if ok else np.empty(0)
    samples = samples[np.isfinite(samples)]
    med = noise = math.nan
    if samples.size:
        q1, med, q3 = np.percentile(samples, [25, 50, 75])
        noise = _noise(q1, med, q3)
    return {"experiment": rec["experiment"], "point_id": rec["point_id"],
            "variant": rec["variant"], "gpu": (rec["provenance"] or {}).get("gpu_name") or "",
            "status": rec["status"], "median_s": med, "noise": noise,
            "n_samples": int(samples.size),
            "method": safe_text.printable(t.get("timer") or ""),
            "trial_spread": results.number(t.get("trial_spread")),
            "floor_s": results.number((rec.get("floor") or {}).get("floor_s")),
            "blocks": results.number((rec.get("launch") or {}).get("blocks")),
            "sm_count": results.number((rec["provenance"] or {}).get("sm_count"))}


def _from_records(folder: Path, files: list[Path], role: str) -> pd.DataFrame:
    """The points of a folder's records. A record that is not of the schema (not JSON, too
    large or deep, a list where a mapping belongs, a time that is not > 0) is named on
    stderr and left out; records of an older schema are an error that says what they lack."""
    rows, old = [], {}
    for path in files:
        try:
            rec = safe_io.read_json(path, MAX_RECORD_BYTES)
        except safe_io.InputRefused as exc:
            _left_out(role, folder, path, str(exc).removeprefix(safe_io.shown(path)))
            continue
        if not isinstance(rec, dict):
            _left_out(role, folder, path, record_schema.record_problem(rec))
            continue
        missing = [k for k in RECORD_KEYS + TIMED_KEYS * (rec.get("status") == "ok")
                   if k not in rec]
        version = rec.get("schema_version")
        if missing or version != results.SCHEMA_VERSION:
            old.setdefault((safe_text.printable(version)[:20], tuple(missing)),
                           []).append(safe_io.shown(path.name))
        elif why := record_schema.record_problem(rec):
            _left_out(role, folder, path, why)
        else:
            rows.append(_record_row(rec))
    if old:
        what = "; ".join(
            f"{len(names)} record(s) (e.g. {names[0]}) with schema_version {v}"
            + (f", missing {', '.join(m)}" if m else "") for (v, m), names in old.items())
        raise CompareError(
            f"{folder}: results written by an older schema: {what}. This cudalab reads "
            f"schema_version {results.SCHEMA_VERSION} records with keys "
            f"{', '.join(RECORD_KEYS)}, and timing where the status is ok "
            "(timing.samples_s holds the samples)")
    return pd.DataFrame(rows, columns=POINT_COLS)


def _left_out(role: str, folder: Path, path: Path, why: str) -> None:
    print(f"warning: {role} folder {safe_io.shown(folder)}: left out "
          f"{safe_io.shown(path)}: {why.strip(' :')}", file=sys.stderr)


def _numbers(df: pd.DataFrame, col: str) -> pd.Series:
    """A column as floats (NaN where it is missing, empty or not a number)."""
    if col not in df:
        return pd.Series(math.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce").astype(float)


def _texts(df: pd.DataFrame, col: str) -> pd.Series:
    """A column as printable text ('' where empty)."""
    if col not in df:
        return pd.Series("", index=df.index, dtype=object)
    col_ = df[col].astype(object)
    return col_.where(col_.notna(), "").map(safe_text.printable)


def table_points(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Points (POINT_COLS) of a results table; the spread comes from its IQR column. A row
    whose time is there but not a time > 0 (a negative, text, an infinity) is named on
    stderr and left out."""
    missing = [c for c in TABLE_COLS if c not in df.columns]
    if missing:
        raise CompareError(f"{source}: results written by an older schema: missing column(s) "
                           f"{', '.join(missing)}")
    status, med, iqr = _texts(df, "status"), _numbers(df, "time_median_s"), \
        _numbers(df, "time_iqr_s")
    given = df["time_median_s"].notna() & (status == "ok")
    bad = given & ~(np.isfinite(med) & (med > 0)) | (iqr < 0)
    for r in df[bad].head(20).itertuples():
        print(f"warning: {source}: left out the row of {safe_text.printable(r.point_id)}: "
              f"time_median_s {safe_text.printable(r.time_median_s)} is not a time > 0",
              file=sys.stderr)
    med = med.where(status == "ok")
    noise = (iqr / IQR_TO_SIGMA / med).where(med > 0)
    return pd.DataFrame({
        "experiment": _texts(df, "experiment"), "point_id": _texts(df, "point_id"),
        "variant": _texts(df, "variant"), "gpu": _texts(df, "gpu_name"),
        "status": status, "median_s": med, "noise": noise,
        "n_samples": _numbers(df, "n_samples").fillna(0).clip(0, 1e9).astype(int),
        "method": _texts(df, "timer"), "trial_spread": _numbers(df, "time_trial_spread"),
        "floor_s": _numbers(df, "time_floor_s"), "blocks": _numbers(df, "launch_blocks"),
        "sm_count": _numbers(df, "sm_count"),
    })[~bad][POINT_COLS].reset_index(drop=True)


def _checked_folder(folder: Path, role: str) -> Path:
    try:
        return safe_io.check_folder(folder)
    except safe_io.InputRefused as exc:
        raise CompareError(f"{role} folder {exc}") from None


def _records(folder: Path, role: str) -> list[Path]:
    """The record files of folder/raw (raw/<experiment>/[<gpu model>/]<point>.json): raw
    must lie inside the folder (`raw -> /` is refused, never walked), links in it are not
    followed, and what the walk leaves out is named."""
    raw = folder / "raw"
    if not os.path.lexists(raw):
        return []
    try:
        safe_io.resolved_inside(raw, folder)
        safe_io.check_folder(raw)
        walk = safe_io.walk_files(raw, ".json", max_depth=2, max_files=results.MAX_RECORDS,
                                  min_depth=1)
    except safe_io.InputRefused as exc:
        raise CompareError(f"{role} folder {safe_io.shown(folder)}: {exc}") from None
    for path, why in walk.skipped:
        _left_out(role, folder, path, why)
    return walk.files


def _table_file(csv: Path, role: str) -> pd.DataFrame:
    """A folder's results.csv (a regular file within the size limit), its text as written."""
    try:  # inside the folder: a results.csv linked to a file elsewhere is not read
        safe_io.resolved_inside(csv, csv.parent)
        data = safe_io.read_bytes(csv, results.MAX_TABLE_BYTES)
        return safe_text.uncsv_frame(pd.read_csv(io.BytesIO(data), low_memory=False))
    except (safe_io.InputRefused, ValueError, UnicodeDecodeError) as exc:
        raise CompareError(f"{role} table {safe_io.shown(csv)} cannot be read: "
                           f"{safe_text.printable(exc)}") from None


def load_points(folder: Path, role: str = "run") -> pd.DataFrame:
    """Every point of a result folder (POINT_COLS); CompareError names the folder."""
    folder = _checked_folder(Path(folder), role)
    raw, csv = folder / "raw", folder / "results.csv"
    files = _records(folder, role)
    if files:
        pts = _from_records(folder, files, role)
    elif os.path.lexists(csv):
        pts = table_points(_table_file(csv, role), safe_io.shown(csv))
    else:
        raise CompareError(f"{role} folder {safe_io.shown(folder)} holds no results: looked "
                           f"for {safe_io.shown(raw)}/<experiment>/<point>.json and "
                           f"{safe_io.shown(csv)}")
    if pts.empty:
        raise CompareError(f"{role} folder {safe_io.shown(folder)} holds no results (no "
                           "grid point; a record left out is named above)")
    dup = pts.duplicated(["experiment", "point_id", "gpu"])
    if dup.any():
        r = pts[dup].iloc[0]
        raise CompareError(f"{role} folder {safe_io.shown(folder)}: point "
                           f"{r['experiment']}/{r['point_id']} appears more than once for "
                           f"GPU {r['gpu'] or '(none)'}")
    return pts


def split_by_gpu(pts: pd.DataFrame, label: str, folder: Path) -> list[Run]:
    """One run per GPU of a folder; points that ran on no GPU (static analysis) belong to
    every one of them."""
    gpus = sorted(g for g in pts["gpu"].unique() if g)
    if len(gpus) <= 1:
        return [Run(label, folder, gpus[0] if gpus else "", pts.reset_index(drop=True))]
    return [Run(f"{label} [{g}]", folder, g,
                pts[pts["gpu"].isin([g, ""])].reset_index(drop=True)) for g in gpus]


def load_runs(folder: Path | str, role: str = "run") -> list[Run]:
    """The runs of a result folder: one per GPU; a GPU-model sweep's results/ (no raw/ of its
    own, one run folder per model in gpu/<model>/) gives one per model."""
    folder = _checked_folder(Path(folder), role)
    models = _model_folders(folder)
    if models and not os.path.lexists(folder / "raw"):
        return [r for m in models for r in load_runs(m, role)]
    return split_by_gpu(load_points(folder, role), safe_text.printable(folder), folder)


def _model_folders(folder: Path, most: int = 1000) -> list[Path]:
    """gpu/<model>/ folders holding a raw/ folder: real folders only (no link followed),
    the first `most` entries of gpu/ looked at."""
    gpu = folder / "gpu"
    if gpu.is_symlink() or not gpu.is_dir():
        return []
    with os.scandir(gpu) as it:
        entries = list(itertools.islice(it, most))
    return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)
                  and (Path(e.path) / "raw").is_dir() and not (Path(e.path) / "raw").is_symlink())
