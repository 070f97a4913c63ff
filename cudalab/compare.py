"""Compare result folders point by point: this run against a baseline (an earlier run,
another GPU, reports/reference/<gpu>/), with noise-aware verdicts.

A result folder is a run's `results/` or a `reports/reference/<gpu>/`: its raw records
(raw/<experiment>/[<gpu model>/]<point>.json, every sample kept) are read when present,
else its results.csv. A folder holding several GPUs (a Slurm GPU-model sweep) is split
into one run per GPU. Points are matched by (experiment, point_id): the point id is made
of the variant and every parameter, so points of different GPUs match and the GPU is what
is compared.

Verdict rule (in the manner of nvbench's compare script): with r = this time / baseline
time and each side's noise s = IQR / 1.349 / median of its samples (a robust relative
standard deviation), the combined noise is sqrt(s_base^2 + s_this^2) and the bar is
max(threshold, combined noise). r > 1 + bar is "slower", r < 1 / (1 + bar) is "faster",
anything between is "same". A difference must be larger than both the samples' spread and
the minimum relative threshold (default 5 %) to count. Two times taken by different timing
methods (the record's timer: launches queued behind a held stream, plain events, the host
clock) measure different things for a short kernel or copy (a queued time leaves the host's
launch cost out, a plain one has it in), so such a pair gets the verdict "other method" and
no ratio, never "slower" or "faster". A point either side left not measured (a run without a
GPU records its GPU points so, with no timing) gets the verdict "not measured": never slower
or faster, and never a reason for --fail-on-slower.

Between-run noise (docs/noise.md). The samples' spread is the noise within one process; it
cannot see what moves between processes and machines. So a point is timed in trials (3 by
default, its device buffers moved to fresh allocations between them: cudalab.trials), each
GPU job measures its resolution floor (the trial-to-trial spread of an empty and a tiny
kernel, seconds), and every point has a class, from its timer: "kernel" (launches queued
behind a held stream: GPU time), "host-synchronous" (plain events around work the host
issues call by call: pageable copies, multi-stream pipelines) and "host" (the host clock:
CPU references). The bar is

    max(threshold, the samples' combined noise, k x the combined trial spread, the floor)

with each side's trial spread (largest - smallest trial median) / median combined as
sqrt(a^2 + b^2), and the floor the two jobs' combined resolution floor over the shorter
time. A side measured without trials (a record from before trials, or measurement.trials 1)
has neither: the pair is judged with the class floors (CLASS_FLOORS: 0.5 us for a kernel,
which moved by 0.2-0.5 us between processes at 2-5 us; 40 % and 75 % of the time for host
work, which moved by up to 1.3x and 1.7x between two runs of unchanged code), and the
output says how many points were. A kernel whose launch has fewer blocks than the GPU has
SMs (the record's launch.blocks against provenance sm_count) is "small-grid": its one partial
wave runs on a few SMs, so its time follows those SMs' clocks and placement on one machine,
which its trials cannot see; its class floor (SMALL_GRID_FLOOR) always applies. A
host-bound point beyond its bar is "unstable", with the reason, and never gates
--fail-on-slower. The comparison lists every point that is not
"same" grouped by class, each with the term that set its bar. choose_k() (tools/choose_k.py)
picks k from two runs of unchanged code and a planted slowdown.
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

DEFAULT_THRESHOLD = 0.05
IQR_TO_SIGMA = 1.349  # IQR of a normal distribution in standard deviations
# Verdicts of a point, in the order they are counted.
VERDICTS = ("slower", "faster", "unstable", "same", "other method", "not measured", "not ok",
            "untimed", "only baseline", "only this")
# A point's class, from the timer that timed it (what else moves its time between runs).
CLASS_OF_METHOD = {"cuda_event_queued": "kernel", "cuda_event": "host-synchronous",
                   "perf_counter": "host"}
HOST_CLASSES = ("host-synchronous", "host")
CLASS_REASON = {
    "kernel": "GPU kernel time: gates --fail-on-slower",
    "small-grid": "a kernel launching fewer blocks than the GPU has SMs: its partial wave "
                  "runs on a few SMs, whose clocks and placement move it between machines; "
                  "gates --fail-on-slower beyond its class floor",
    "host-synchronous": "host-issued work (pageable copies, streams issued call by call): "
                        "host memory and scheduling move it between runs; never gates",
    "host": "host work (CPU reference: BLAS threads, host memory): moves between runs and "
            "machines; never gates",
}
# The smallest difference a kernel's time can show between two processes: 2-5 us kernels
# moved by 0.2-0.5 us between two runs of unchanged code on H100s.
FLOOR_S = 0.5e-6
# Per class, the floor of a pair that has no trials on some side: (seconds, fraction of the
# shorter time). Kernels: FLOOR_S; host work moved by up to 1.3x (pageable copies, streams)
# and 1.7x (the numpy reference at one BLAS thread) between two runs of unchanged code.
# A small grid's floor: matmul's 128-thread warp tiles with 4 and 6 blocks on the H100's 132
# SMs moved by up to 1.089x between two machines of unchanged code (trials agreeing within
# 1 % on each); the other 50 small-grid points stayed within 1.8 %. docs/noise.md.
SMALL_GRID_FLOOR = 0.10
CLASS_FLOORS = {"kernel": (FLOOR_S, 0.0), "small-grid": (FLOOR_S, SMALL_GRID_FLOOR),
                "host-synchronous": (0.0, 0.40), "host": (0.0, 0.75)}
# Classes whose floor applies whatever the rule: their trials agree on one machine while
# the machines differ, so no trial spread can stand for their between-run noise.
FLOOR_ALWAYS_CLASSES = ("small-grid",)
# How many combined trial spreads a difference must exceed (each side's spread is the range
# of its trial medians over their median). Chosen with tools/choose_k.py: docs/noise.md.
K_TRIALS = 3.0
# Whether the class floors also apply where both sides have trials (they always apply where
# one side has none). Two fresh H100 runs showed why: a pageable copy's or the numpy
# reference's trials agree within one process, yet move 1.1-1.5x to the next machine.
CLASS_FLOORS_ALWAYS = True


@dataclass(frozen=True)
class Rule:
    """The verdict's between-run terms: k and whether the class floors always apply."""

    k: float = K_TRIALS
    class_floors_always: bool = CLASS_FLOORS_ALWAYS


DEFAULT_RULE = Rule()
# The term that set a point's bar, in the order the max takes them.
BAR_TERMS = ("threshold", "samples' noise", "k x trial spread", "resolution floor",
             "class floor")
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


# -- verdicts ----------------------------------------------------------------------------------
def point_class(method: pd.Series, small_grid: pd.Series | None = None) -> pd.Series:
    """kernel / host-synchronous / host from the timer's name ('' where untimed); a kernel
    is small-grid where `small_grid` says so."""
    cls = method.map(lambda m: CLASS_OF_METHOD.get(m, "kernel" if m else ""))
    if small_grid is not None:
        cls = cls.where(~((cls == "kernel") & small_grid.fillna(False).astype(bool)),
                        "small-grid")
    return cls


def small_grid(m: pd.DataFrame) -> pd.Series:
    """Whether a merged point pair (compare_pair's columns) launched fewer blocks than the
    GPU of either side has SMs: a partial first wave. False where no side recorded both
    (records from before launch.blocks and sm_count, cuBLAS, host work)."""
    blocks = m["blocks"].fillna(m["blocks_base"])
    sms = np.fmax(m["sm_count"], m["sm_count_base"])
    return (blocks < sms).fillna(False).astype(bool)


def bars(m: pd.DataFrame, threshold: float, cls: pd.Series,
         rule: Rule = DEFAULT_RULE) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(bar, the term that set it, whether both sides have trials) of merged point pairs
    (compare_pair's columns: noise, trial_spread, floor_s and median_s, each also _base)."""
    shorter = np.minimum(m["median_s"], m["median_s_base"])
    both = m["trial_spread"].notna() & m["trial_spread_base"].notna()
    spread = np.sqrt(m["trial_spread"] ** 2 + m["trial_spread_base"] ** 2)
    floor = np.sqrt(m["floor_s"] ** 2 + m["floor_s_base"] ** 2) / shorter
    cfloor_s = cls.map(lambda c: CLASS_FLOORS.get(c, (0.0, 0.0))[0])
    cfloor_rel = cls.map(lambda c: CLASS_FLOORS.get(c, (0.0, 0.0))[1])
    # the class floor: where a side has no trials, where asked, for a kernel whose job
    # measured no floor, and always for the classes no trial spread stands for
    use_class = (~both | rule.class_floors_always
                 | (cls.isin(["kernel", "small-grid"]) & floor.isna())
                 | cls.isin(FLOOR_ALWAYS_CLASSES))
    terms = pd.DataFrame({
        "threshold": pd.Series(threshold, index=m.index, dtype=float),
        "samples' noise": np.sqrt(m["noise"].fillna(0) ** 2 + m["noise_base"].fillna(0) ** 2),
        "k x trial spread": (rule.k * spread).where(both, 0.0),
        "resolution floor": floor.where(both, 0.0),
        "class floor": np.maximum(cfloor_s / shorter, cfloor_rel).where(use_class, 0.0),
    })[list(BAR_TERMS)].astype(float).fillna(0.0)
    return terms.max(axis=1), terms.idxmax(axis=1), both


def verdicts(ratio: pd.Series, bar: pd.Series, cls: pd.Series | None = None) -> pd.Series:
    """faster / slower / same for time ratios (this / baseline) against the bar; a
    host-bound point beyond its bar is "unstable"."""
    out = pd.Series(np.where(ratio > 1 + bar, "slower",
                             np.where(ratio < 1 / (1 + bar), "faster", "same")),
                    index=ratio.index)
    if cls is not None:
        out = out.where(~(cls.isin(HOST_CLASSES) & out.isin(["slower", "faster"])),
                        "unstable")
    return out


def compare_pair(base: Run, run: Run, threshold: float = DEFAULT_THRESHOLD,
                 rule: Rule = DEFAULT_RULE) -> pd.DataFrame:
    """One row per point of either side: times, ratio (this / baseline), noise, bar and the
    term that set it, verdict."""
    keys = ["experiment", "point_id"]
    # a column a caller's points lack (a frame built before launch blocks) is empty
    m = base.points.reindex(columns=POINT_COLS).merge(
        run.points.reindex(columns=POINT_COLS), on=keys, how="outer", suffixes=("_base", ""),
        indicator=True)
    m["variant"] = m["variant"].fillna(m["variant_base"])
    ratio = m["median_s"] / m["median_s_base"]
    noise = np.sqrt(m["noise_base"].fillna(0) ** 2 + m["noise"].fillna(0) ** 2)
    method, method_base = m["method"].fillna(""), m["method_base"].fillna("")
    cls = point_class(method.where(method != "", method_base), small_grid(m))
    bar, bar_from, trials_both = bars(m, threshold, cls, rule)
    verdict = verdicts(ratio, bar, cls)
    timed = ratio.notna() & np.isfinite(ratio)
    both_ok = (m["status_base"] == "ok") & (m["status"] == "ok")
    other = timed & (method != "") & (method_base != "") & (method != method_base)
    verdict = verdict.where(~other, "other method")
    timed &= ~other  # no ratio across methods: it would compare different things
    verdict = verdict.where(timed | other, "untimed").where(both_ok, "not ok")
    verdict = verdict.where(m["_merge"] != "left_only", "only baseline")
    verdict = verdict.where(m["_merge"] != "right_only", "only this")
    # last: a point never measured on one side says so, whatever the other side holds
    unmeasured = (m["status_base"] == NOT_MEASURED) | (m["status"] == NOT_MEASURED)
    verdict = verdict.where(~unmeasured, "not measured")
    out = pd.DataFrame({
        "experiment": m["experiment"], "point_id": m["point_id"], "variant": m["variant"],
        "baseline": base.label, "run": run.label, "baseline_gpu": base.gpu, "gpu": run.gpu,
        "baseline_status": m["status_base"], "status": m["status"],
        "baseline_s": m["median_s_base"], "this_s": m["median_s"],
        "ratio": ratio.where(timed), "noise": noise.where(timed), "verdict": verdict,
        "baseline_method": method_base, "method": method, "class": cls,
        "trials": trials_both, "baseline_trial_spread": m["trial_spread_base"],
        "trial_spread": m["trial_spread"], "baseline_floor_s": m["floor_s_base"],
        "floor_s": m["floor_s"], "blocks": m["blocks"].fillna(m["blocks_base"]),
        "sm_count": np.fmax(m["sm_count"], m["sm_count_base"]),
        "bar": bar.where(timed), "bar_from": bar_from.where(timed),
    })
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def compare_runs(base: Run, runs: list[Run], threshold: float = DEFAULT_THRESHOLD,
                 rule: Rule = DEFAULT_RULE) -> pd.DataFrame:
    """Every run against the baseline; a run sharing no point with it is bad input."""
    frames = []
    for run in runs:
        c = compare_pair(base, run, threshold, rule)
        if shares_a_point(c):
            frames.append(c)
            continue
        raise CompareError(
            f"{run.label} shares no grid point with the baseline {base.label} "
            f"(experiments there: {', '.join(sorted(base.points['experiment'].unique()))}; "
            f"here: {', '.join(sorted(run.points['experiment'].unique()))})")
    return pd.concat(frames, ignore_index=True)


def shares_a_point(cmp: pd.DataFrame) -> bool:
    """Whether a comparison matched any point on both sides (measured or not)."""
    return bool((cmp["baseline_status"].notna() & cmp["status"].notna()).any())


def not_measured_note(cmp: pd.DataFrame) -> str:
    """One line per run with points not measured on either side ('' : none)."""
    lines = []
    for run, sub in cmp[cmp["verdict"] == "not measured"].groupby("run", sort=False):
        here = int((sub["status"] == NOT_MEASURED).sum())
        there = int((sub["baseline_status"] == NOT_MEASURED).sum())
        sides = ", ".join(x for x in (f"{here} in {run}" if here else "",
                                      f"{there} in the baseline" if there else "") if x)
        lines.append(f"not measured: {len(sub)} point(s) of {run} ({sides}; a run without a "
                     "GPU records its GPU points so): never slower or faster; the same command "
                     "on a GPU machine measures them")
    return "\n".join(lines)


def summary(cmp: pd.DataFrame) -> pd.DataFrame:
    """Verdict counts per compared run, plus its largest slowdown."""
    counts = pd.crosstab(cmp["run"], cmp["verdict"]).reindex(columns=VERDICTS, fill_value=0)
    counts = counts.reindex(cmp["run"].unique())
    counts.insert(0, "gpu", cmp.groupby("run", sort=False)["gpu"].first())
    counts["worst_ratio"] = cmp.groupby("run", sort=False)["ratio"].max()
    return counts.reset_index()


# -- text output --------------------------------------------------------------------------------
def fmt_seconds(s: float) -> str:
    if s is None or not np.isfinite(s):
        return ""
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _fmt_row(r: Any, with_run: bool) -> list[str]:
    ratio = f"{r.ratio:.3f}" if pd.notna(r.ratio) else ""
    noise = f"{100 * r.noise:.1f}%" if pd.notna(r.noise) else ""
    verdict = (f"other method ({r.baseline_method} / {r.method})"
               if r.verdict == "other method" else r.verdict)
    bar = f"{100 * r.bar:.1f}%" if pd.notna(r.bar) else ""
    return [r.point_id, *([r.run] if with_run else []), fmt_seconds(r.baseline_s),
            fmt_seconds(r.this_s), ratio, noise, bar, verdict]


def text_table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [head, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(f"{x:<{w}}" for x, w in zip(r, widths)).rstrip() for r in lines)


def format_text(cmp: pd.DataFrame, detail_runs: int = 5, rule: Rule = DEFAULT_RULE) -> str:
    """A table per experiment (every point when few runs are compared, else only the points
    that are not "same"), the verdict counts per run, then the points that are not "same"
    grouped by class with what set their bar."""
    n_runs = cmp["run"].nunique()
    few = n_runs <= detail_runs
    head = ["point", *(["run"] if n_runs > 1 else []), "baseline", "this", "ratio", "noise",
            "bar", "verdict"]
    out = [f"baseline: {cmp['baseline'].iloc[0]}"
           + (f" ({cmp['baseline_gpu'].iloc[0]})" if cmp["baseline_gpu"].iloc[0] else ""),
           *([f"this: {cmp['run'].iloc[0]} ({cmp['gpu'].iloc[0]})"] if n_runs == 1 else []),
           "ratio = this time / baseline time (> 1: slower); noise = combined spread of the "
           "samples; bar = max(threshold, noise, k x combined trial spread, resolution floor)"
           f" with k = {rule.k:g}, or the class floor where a side has no trials"
           + (" (class floors always)" if rule.class_floors_always
              else " (a small-grid kernel's always)")]
    for exp, sub in cmp.groupby("experiment", sort=True):
        shown = sub if few else sub[sub["verdict"] != "same"]
        out.append(f"\n== {exp}: {len(sub)} comparison(s)"
                   + ("" if few else f", {len(shown)} not 'same' shown") + " ==")
        if len(shown):
            out.append(text_table([_fmt_row(r, n_runs > 1) for r in shown.itertuples()], head))
    s = summary(cmp)
    out.append("\n== verdicts per run ==")
    rows = [[r["run"], r["gpu"], *[str(r[v]) for v in VERDICTS],
             f"{r['worst_ratio']:.3f}" if pd.notna(r["worst_ratio"]) else ""]
            for _, r in s.iterrows()]
    out.append(text_table(rows, ["run", "gpu", *VERDICTS, "worst ratio"]))
    out += by_class(cmp)
    if note := no_trials_note(cmp):
        out.append(note)
    out += baseline_gaps(cmp)
    if note := not_measured_note(cmp):
        out.append(note)
    return "\n".join(out)


def class_floors_text() -> str:
    """'0.5 us for kernel, 0.5 us or 10 % for small-grid, 40 % for host-synchronous, ...'."""
    return ", ".join(" or ".join(x for x in (f"{s * 1e6:g} us" if s else "",
                                             f"{100 * r:g} %" if r else "") if x) + f" for {c}"
                     for c, (s, r) in CLASS_FLOORS.items())


def no_trials_note(cmp: pd.DataFrame) -> str:
    """Which timed comparisons were judged with the class floors (a side without trials)."""
    timed = cmp[cmp["ratio"].notna()]
    old = int((~timed["trials"].astype(bool)).sum())
    if not old:
        return ""
    return (f"{old} of {len(timed)} timed comparison(s) have a side measured without trials "
            "(recorded before trials, or measurement.trials 1): no between-trial spread and "
            "no resolution floor, so they were judged by the samples' noise and the class "
            f"floors ({class_floors_text()})")


def baseline_gaps(cmp: pd.DataFrame) -> list[str]:
    """Per baseline, what it lacks that this run has (a reference made by older code): the
    experiments it did not measure, the points it lacks in the others, and trials (without
    them its timed points are judged by the class floors). [] where it lacks nothing."""
    lines = []
    for label, sub in cmp.groupby("baseline", sort=False):
        only = sub[sub["verdict"] == "only this"]
        new_exps = sorted(set(only["experiment"]) - set(sub.loc[sub["verdict"] != "only this",
                                                                 "experiment"]))
        more = int((~only["experiment"].isin(new_exps)).sum())
        timed = sub[sub["ratio"].notna()]
        no_trials = int(timed["baseline_trial_spread"].isna().sum())
        parts = []
        if new_exps:
            n = int(only["experiment"].isin(new_exps).sum())
            parts.append(f"the experiments {', '.join(new_exps)} ({n} points)")
        if more:
            parts.append(f"{more} points of the experiments both measured")
        if no_trials:
            parts.append(f"trials at {no_trials} of its {len(timed)} timed points (judged by "
                         "the class floors there)")
        if parts:
            lines.append(f"{label} lacks what this run has: {'; '.join(parts)}")
    return lines


def point_reason(r: Any) -> str:
    """'1.124x > 1 + bar 6.3 % (k x trial spread)': why a point is not 'same'."""
    side = ">" if r.ratio > 1 else "<"
    edge = "1 + bar" if r.ratio > 1 else "1 / (1 + bar)"
    return f"{r.ratio:.3f}x {side} {edge}, bar {100 * r.bar:.1f} % ({r.bar_from})"


def moved(cmp: pd.DataFrame) -> pd.DataFrame:
    """The timed points that are not 'same' (slower, faster, unstable)."""
    return cmp[cmp["verdict"].isin(["slower", "faster", "unstable"])]


def class_groups(cmp: pd.DataFrame, per_class: int = 12) -> list[dict[str, Any]]:
    """The points that moved (slower, faster, unstable) grouped by class: the class's
    reason, its verdict counts and ratio range, and up to `per_class` points, each with
    what set its bar (the report's block and the text output)."""
    out = []
    for cls, sub in moved(cmp).groupby("class", sort=True):
        sub = sub.sort_values(["experiment", "point_id", "baseline"])
        out.append({
            "class": cls, "reason": CLASS_REASON[cls], "n": len(sub),
            "counts": ", ".join(f"{n} {v}" for v, n in sub["verdict"].value_counts().items()),
            "ratios": f"{sub['ratio'].min():.2f}-{sub['ratio'].max():.2f}x",
            "rows": [{"experiment": r.experiment, "point": r.point_id, "baseline": r.baseline,
                      "run": r.run, "ratio": f"{r.ratio:.3f}", "verdict": r.verdict,
                      "why": point_reason(r)} for r in sub.head(per_class).itertuples()],
            "more": max(0, len(sub) - per_class)})
    return out


def by_class(cmp: pd.DataFrame, per_class: int = 12) -> list[str]:
    """class_groups as text: one line per class, one per point with what set its bar."""
    out = [f"\n== not 'same', by class: {len(moved(cmp))} of "
           f"{int(cmp['ratio'].notna().sum())} timed point(s) =="]
    multi = cmp["run"].nunique() > 1
    for g in class_groups(cmp, per_class):
        out.append(f"{g['class']}: {g['n']} ({g['counts']}; ratios {g['ratios']}): "
                   f"{g['reason']}")
        width = max(len(f"{r['experiment']}/{r['point']}") for r in g["rows"])
        for r in g["rows"]:
            name = f"{r['experiment']}/{r['point']}"
            out.append(f"  {name:<{width}}  {r['verdict']:<8}  {r['why']}"
                       + (f"  [{r['run']}]" if multi else ""))
        if g["more"]:
            out.append(f"  ... {g['more']} more (--csv has them all)")
    return out


# -- choosing k: two runs of unchanged code and a planted slowdown -------------------------------
CANDIDATE_KS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
TARGET_NOT_SAME = 0.01  # of the timed points, between two runs of unchanged code
PLANT_MIN_S = 10e-6  # a planted slowdown must be caught at kernels of 10 us or more ...
PLANT_MIN_RATIO = 1.10  # ... that it made 10 % slower or more


def planted_points(cmp: pd.DataFrame, experiment: str | None) -> pd.Series:
    """The points a planted slowdown must be caught at: kernels of PLANT_MIN_S or more (both
    sides) that it made PLANT_MIN_RATIO slower, in `experiment` (None: the experiment with
    the most such points). Small-grid kernels are not among them: their class floor
    (SMALL_GRID_FLOOR) lets a slowdown up to it pass."""
    hit = ((cmp["class"] == "kernel") & (cmp["ratio"] >= PLANT_MIN_RATIO)
           & (np.minimum(cmp["baseline_s"], cmp["this_s"]) >= PLANT_MIN_S))
    if experiment is None and hit.any():
        experiment = cmp.loc[hit, "experiment"].value_counts().idxmax()
    return hit & (cmp["experiment"] == experiment)


def choose_k(base: Run, same: Run, planted: Run | None = None,
             planted_experiment: str | None = None, ks: tuple[float, ...] = CANDIDATE_KS,
             threshold: float = DEFAULT_THRESHOLD) -> pd.DataFrame:
    """One row per candidate rule (k, with and without the class floors always): of the
    timed points of `base` against `same` (unchanged code), how many are not 'same' (and
    per class) and how many slower; against `planted`, how many of the planted points
    (planted_points) are caught, how many other points are slower, and whether
    --fail-on-slower exits 1. `ok`: at most TARGET_NOT_SAME not 'same', none slower, and
    (with a planted run) every planted point caught."""
    rows = []
    for always in (False, True):
        for k in ks:
            rule = Rule(k, always)
            c = compare_pair(base, same, threshold, rule)
            timed = c[c["ratio"].notna()]
            mv = moved(timed)
            row: dict[str, Any] = {
                "k": k, "class_floors_always": always, "timed": len(timed),
                "not_same": len(mv), "not_same_pct": 100 * len(mv) / max(1, len(timed)),
                "slower": int((timed["verdict"] == "slower").sum()),
                **{f"not_same_{cls}": int((mv["class"] == cls).sum()) for cls in CLASS_REASON}}
            ok = row["not_same"] <= TARGET_NOT_SAME * len(timed) and row["slower"] == 0
            if planted is not None:
                p = compare_pair(base, planted, threshold, rule)
                want = planted_points(p, planted_experiment)
                slower = p["verdict"] == "slower"
                row |= {"planted": int(want.sum()), "caught": int((want & slower).sum()),
                        "other_slower": int((~want & slower).sum()),
                        "planted_exit": int(slower.any())}
                ok = ok and row["planted"] > 0 and row["caught"] == row["planted"]
            rows.append(row | {"ok": ok})
    return pd.DataFrame(rows)


def recommend_k(table: pd.DataFrame) -> tuple[Rule | None, str]:
    """The rule to take and why: without the class floors where any k works there, the
    candidate nearest the middle of the k that work (margin both ways)."""
    for always in (False, True):
        good = table[table["ok"] & (table["class_floors_always"] == always)]
        if good.empty:
            continue
        lo, hi = good["k"].min(), good["k"].max()
        k = float(good.iloc[(good["k"] - (lo + hi) / 2).abs().argsort().iloc[0]]["k"])
        return Rule(k, always), (
            f"k = {k:g}{' with the class floors always' if always else ''}: every k from "
            f"{lo:g} to {hi:g} leaves at most {100 * TARGET_NOT_SAME:g} % of the unchanged "
            "pair's timed points not 'same', none slower"
            + (", and catches the planted slowdown" if "planted" in table else "")
            + "; the middle of that range keeps a margin both ways")
    best = table.sort_values(["not_same_pct", "k"]).iloc[0]
    return None, (f"no candidate meets the target: the fewest not 'same' is "
                  f"{best['not_same_pct']:.1f} % (k = {best['k']:g}, class floors always: "
                  f"{bool(best['class_floors_always'])}); see which class the points are in")


# -- the command ---------------------------------------------------------------------------------
def print_course(folders: list[str]) -> int:
    """`cudalab compare --course`: the course's numbers beside every folder (Markdown)."""
    from cudalab import course

    tables = {}
    for f in folders:
        load_points(Path(f), "run")  # the same checks: exists, holds results, schema
        tables[Path(f).name or str(f)] = course.run_table(Path(f))
    print(course.headline_markdown(tables))
    return 0


def run_command(folders: list[str], baseline: str | None, threshold: float,
                csv: str | None, fail_on_slower: bool, detail_runs: int = 5,
                course: bool = False, rule: Rule = DEFAULT_RULE) -> int:
    """`cudalab compare`: 0 done, 1 a point is slower and --fail-on-slower, 2 bad input."""
    if course:
        return print_course(([baseline] if baseline else []) + folders)
    if not 0 <= threshold < 10:
        raise CompareError(f"--threshold {threshold}: allowed values are 0 <= t < 10 "
                           "(a relative difference, 0.05 = 5 %)")
    base_folder = baseline if baseline is not None else (folders[0] if folders else None)
    rest = folders if baseline is not None else folders[1:]
    base_runs = load_runs(base_folder, "baseline") if base_folder else []
    runs = base_runs[1:] + [r for f in rest for r in load_runs(f, "run")]
    if not base_runs or not runs:
        raise CompareError("give at least two result folders (the first is the baseline), "
                           "or --baseline FOLDER and one more")
    cmp = compare_runs(base_runs[0], runs, threshold, rule)
    print(format_text(cmp, detail_runs, rule))
    if csv:
        try:
            safe_io.check_name(csv)
            write_comparison(cmp, Path(csv))
        except (safe_io.InputRefused, OSError) as exc:
            raise CompareError(f"--csv {safe_io.shown(csv)}: cannot write it: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        print(f"\nwrote {csv} ({len(cmp)} rows)")
    slower = cmp[cmp["verdict"] == "slower"]
    if fail_on_slower and len(slower):
        first = slower.iloc[0]
        print(f"\nFAIL: {len(slower)} kernel point(s) slower than the baseline by more than "
              f"their bar, e.g. {first['experiment']}/{first['point_id']} "
              f"({first['ratio']:.3f}x the time; bar {100 * first['bar']:.1f} %, "
              f"{first['bar_from']})")
        return 1
    return 0


# -- the report: baselines beside this run, and the course table ---------------------------------
def _this_run(df: pd.DataFrame, config: dict[str, Any]) -> list[Run]:
    return split_by_gpu(table_points(df, "this run's results"), config["run_name"],
                        Path("results"))


def baseline_folders(config: dict[str, Any]) -> list[str]:
    """What the run is set beside: a sweep's other models' folders, then report.baselines."""
    from cudalab import sweep

    return sweep.other_model_folders(config) + config["report"].get("baselines", [])


def write_comparison(cmp: pd.DataFrame | None, path: Path) -> None:
    """The comparison table, one row per (point, baseline): the figures step writes it once
    and the report renders it; `cudalab compare --csv` writes the same table. None (nothing
    to compare) writes an empty file, so a stale table never outlives its baselines."""
    with results.atomic_path(path) as tmp:
        if cmp is None:
            tmp.write_text("")
        else:  # text cells a spreadsheet would run (a point id "=cmd|...") neutralised
            safe_text.write_frame(cmp, tmp)


def read_comparison(path: Path) -> pd.DataFrame | None:
    """The table write_comparison wrote (None for its empty file): the same columns and
    types (floats exactly, as to_csv writes them in full)."""
    if path.stat().st_size == 0:
        return None
    cmp = pd.read_csv(path, keep_default_na=False, na_values=[""],
                      dtype={**dict.fromkeys(_TEXT_COLUMNS, "str"), "trials": "bool"})
    cmp[list(_EMPTY_IS_TEXT)] = cmp[list(_EMPTY_IS_TEXT)].fillna("")
    return safe_text.uncsv_frame(cmp, _TEXT_COLUMNS)


# the table's text columns (read as text even where every row left one empty); in these an
# empty cell is the text "" (a point without a timer), in the others it is missing (NaN)
_TEXT_COLUMNS = ("experiment", "point_id", "variant", "baseline", "run", "baseline_gpu", "gpu",
                 "baseline_status", "status", "verdict", "baseline_method", "method", "class",
                 "bar_from")
_EMPTY_IS_TEXT = ("baseline_method", "method", "class")


def baseline_comparison(df: pd.DataFrame, config: dict[str, Any]) -> pd.DataFrame | None:
    """This run (its first GPU) against every other GPU of the run (a GPU-model sweep) and
    every folder in report.baselines; ratio = this run's time / the baseline's."""
    this = _this_run(df, config)
    bases = this[1:] + [r for f in baseline_folders(config)
                        for r in load_runs(f, "report.baselines:")]
    if not bases:
        return None
    frames = []
    for b in bases:
        c = compare_pair(b, this[0], DEFAULT_THRESHOLD)
        if not shares_a_point(c):
            raise CompareError(f"report.baselines: {b.label} shares no grid point with this "
                               f"run ({config['run_name']})")
        frames.append(c)
    return pd.concat(frames, ignore_index=True)


def verdict_summary(cmp: pd.DataFrame) -> list[dict[str, Any]]:
    """Per baseline: GPU, matched points, verdict counts and the geometric-mean time ratio."""
    out = []
    for label, sub in cmp.groupby("baseline", sort=False):
        timed = sub["ratio"].dropna()
        counts = sub["verdict"].value_counts()
        out.append({"baseline": label, "gpu": sub["baseline_gpu"].iloc[0],
                    "matched": int(sub["verdict"].isin(["faster", "slower", "same"]).sum()),
                    **{v: int(counts.get(v, 0)) for v in VERDICTS},
                    "geomean_ratio": float(np.exp(np.log(timed).mean())) if len(timed) else None})
    return out


def ratio_figure(sub: pd.DataFrame, experiment: str, max_hue: int = 8):
    """The time ratios of one experiment's points by variant (a matplotlib Figure), hue =
    the baseline (pooled into boxes when there are many baselines). The strip plot's jitter
    is seeded: the same comparison draws the same figure."""
    from cudalab.figures import setup_style

    setup_style()  # the style of every other figure
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import seaborn as sns

    d = sub.dropna(subset=["ratio"])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    state = np.random.get_state()  # seaborn's jitter draws from numpy's global generator
    np.random.seed(0)
    try:
        if d["baseline"].nunique() <= max_hue:
            sns.stripplot(d, x="variant", y="ratio", hue="baseline", dodge=True, ax=ax, size=4)
        else:
            sns.boxplot(d, x="variant", y="ratio", ax=ax, color="#8da0cb")
    finally:
        np.random.set_state(state)
    ax.axhline(1.0, color="#333", lw=0.8)
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set(title=f"{experiment}: this run's time / the baseline's (< 1: this run is faster)",
           xlabel="variant", ylabel="time ratio")
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    return fig


def timed_experiments(cmp: pd.DataFrame) -> list[str]:
    """The experiments of a comparison with at least one time ratio (each gets a figure)."""
    return sorted(e for e, sub in cmp.groupby("experiment") if sub["ratio"].notna().any())


def _section_rows(sub: pd.DataFrame, max_rows: int) -> list[dict[str, Any]]:
    rows = sub.sort_values(["point_id", "baseline"]).head(max_rows)
    return [{"point": r.point_id, "baseline": r.baseline,
             "baseline_time": fmt_seconds(r.baseline_s), "this_time": fmt_seconds(r.this_s),
             "ratio": f"{r.ratio:.3f}" if pd.notna(r.ratio) else "",
             "bar": f"{100 * r.bar:.1f} % ({r.bar_from})" if pd.notna(r.bar) else "",
             "verdict": r.verdict} for r in rows.itertuples()]


def report_context(df: pd.DataFrame, config: dict[str, Any], cmp: pd.DataFrame | None,
                   figures: dict[str, str] | None = None,
                   course_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the report template's comparison blocks read (reports/templates/compare*.j2):
    course_rows (the table that opens the report) and comparison (None without baselines:
    summary, and per experiment rows + figure). cmp is the comparison table as the figures
    step wrote it (baseline_comparison, read_comparison), figures: experiment -> the ratio
    figure's data URI, as that step drew it (run_figures.draw_comparisons); course_rows: the
    course table as the run's claims.json holds it; nothing here compares or draws."""
    from cudalab import course

    this = _this_run(df, config)[0] if len(df) else None
    own = df if this is None or not this.gpu else df[df["gpu_name"].isin([this.gpu]) |
                                                     df["gpu_name"].isna()]
    rows = course_rows if course_rows is not None else course.course_table(own)
    ctx: dict[str, Any] = {"course_rows": rows, "course_counts": course.verdict_counts(rows),
                           "course_rule": course.verdict_rule(), "comparison": None}
    if cmp is None:
        return ctx
    max_rows = config["report"]["max_table_rows"]
    figures = figures or {}
    sections = {exp: {"rows": _section_rows(sub, max_rows), "n_rows": len(sub),
                      "figure": figures.get(exp)}
                for exp, sub in cmp.groupby("experiment")}
    ctx["comparison"] = {"this": this.label, "gpu": this.gpu,
                         "summary": verdict_summary(cmp), "sections": sections,
                         "threshold": DEFAULT_THRESHOLD, "k": DEFAULT_RULE.k,
                         "class_floors": class_floors_text(),
                         "by_class": class_groups(cmp, max_rows),
                         "n_moved": len(moved(cmp)),
                         "n_timed": int(cmp["ratio"].notna().sum()),
                         "no_trials": no_trials_note(cmp),
                         "baseline_gaps": baseline_gaps(cmp)}
    return ctx
