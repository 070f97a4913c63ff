"""The one result schema: raw per-point records (JSON, written atomically) and the tidy
results table (one row per grid point) that pandas builds from them.

Raw record: results/raw/<experiment>/<point_id>.json  (every sample kept)
Table:      results/results.csv (+ results.parquet when pyarrow is installed)

Table columns: the fixed COLUMNS below, plus `p_<name>` for each parameter of the point and
`m_<name>` for each extra metric an experiment reports (e.g. m_h2d_s). Speeds (time_*,
gflops, gbps) are left empty on rows whose status is not "ok": a wrong or failed point is
never a speed.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from cudalab import harness_columns, record_schema, safe_io, safe_text

# the raw record's version and statuses: the record schema's (record_schema.py)
from cudalab.record_schema import SCHEMA_VERSION, STATUSES  # noqa: F401

# name -> (pandas dtype, description). The tests enforce this; docs/results-schema.md lists it.
COLUMNS: dict[str, tuple[str, str]] = {
    "experiment": ("string", "experiment name (matmul, transfer, ...)"),
    "variant": ("string", "kernel / method variant (cpu, naive, tiled, ...)"),
    "point_id": ("string", "unique id of the grid point within the experiment"),
    "params": ("string", "all parameters of the point as JSON"),
    "status": ("string", "ok | wrong (failed its correctness check) | failed | skipped | "
                          "not_measured (a GPU point where no GPU was found)"),
    "reason": ("string", "why a point is not ok (error message, tolerance exceeded)"),
    "n_samples": ("Int64", "timed samples kept"),
    "batch": ("Int64", "launches per sample (samples are per launch)"),
    "timer": ("string", "timing method: cuda_event_queued (device time, launches queued "
              "ahead: no host launch cost), cuda_event (device time, launches issued one by "
              "one) or perf_counter (host time)"),
    "stop_reason": ("string", "converged | budget | max_samples"),
    "launch_blocks": ("Int64", "blocks in the grid of the timed kernel's launch (the "
                      "record's launch; empty where the experiment does not launch the kernel "
                      "itself: cuBLAS, host work): fewer than sm_count is cudalab compare's "
                      "small-grid class"),
    "launch_threads": ("Int64", "threads per block of that launch"),
    "time_median_s": ("float64", "median time of one launch / operation, seconds"),
    "time_iqr_s": ("float64", "interquartile range of the samples, seconds"),
    "time_cv": ("float64", "coefficient of variation of the samples (std / mean)"),
    "time_trial_spread": ("float64", "spread of the trials' medians, (largest - smallest) / "
                          "median: the point's between-run noise (NaN with one trial)"),
    "time_floor_s": ("float64", "the job's resolution floor, seconds: the larger trial-to-trial "
                     "spread (range of the trial medians) of an empty and a tiny kernel timed "
                     "as the points are (NaN: CPU points, one trial, or not measured)"),
    "time_min_s": ("float64", "fastest sample, seconds"),
    "time_mean_s": ("float64", "mean sample, seconds"),
    "n_throttled": ("Int64", "samples taken while the GPU was throttled (clock or reason): "
                    "kept in the record, left out of the statistics"),
    "timing_note": ("string", "why the timing needs care: too few clean (unthrottled) "
                    "samples, or a fallback from the queued method (empty: none)"),
    # the harness settings that produced the time, one typed column each (harness_columns)
    **harness_columns.COLUMNS,
    "flops": ("float64", "floating-point operations of one launch (declared by the experiment)"),
    "bytes": ("float64", "bytes one launch must move through device memory (declared)"),
    "gflops": ("float64", "flops / time_median_s / 1e9"),
    "gbps": ("float64", "bytes / time_median_s / 1e9 (GB/s, decimal)"),
    "pct_peak_gbps": ("float64", "gbps as % of the GPU's theoretical DRAM bandwidth "
                      "(empty for CPU points and PCIe experiments)"),
    "pct_peak_gflops": ("float64", "gflops as % of the GPU's theoretical FP32 peak "
                        "(empty for CPU points and PCIe experiments)"),
    "peak_mem_gbps": ("float64", "the GPU's theoretical DRAM bandwidth, GB/s (empty for CPU "
                      "points and PCIe experiments)"),
    "peak_fp32_gflops": ("float64", "the GPU's theoretical FP32 peak, GFLOP/s (empty for CPU "
                         "points and PCIe experiments)"),
    "ceil_dram_gbps": ("float64", "measured DRAM ceiling of the job's GPU, GB/s: the better "
                       "of a float4 streaming copy and cudaMemcpy device to device over 16 x "
                       "the L2 (empty where not measured)"),
    "ceil_l2_gbps": ("float64", "measured L2 ceiling, GB/s: a float4 copy over a hot working "
                     "set of half the L2 (empty where not measured)"),
    "ceil_smem_gbps": ("float64", "measured shared-memory read ceiling, GB/s (empty where not "
                       "measured)"),
    "ceil_fp32_gflops": ("float64", "measured FP32 ceiling, GFLOP/s: independent FMA chains "
                         "(empty where not measured)"),
    "l2_bytes": ("float64", "L2 cache size of the GPU, bytes (empty for CPU points and PCIe "
                 "experiments)"),
    "working_set_bytes": ("float64", "device memory one launch touches, bytes (declared by "
                          "the experiment; else its bytes)"),
    "memory_level": ("string", "where the working set lives: l2 (it fits in the L2 and the "
                     "L2 was not flushed), dram (otherwise), empty for CPU points, PCIe "
                     "experiments and records without the L2 size"),
    "pct_ceil_gbps": ("float64", "gbps as % of the measured ceiling of its memory level "
                      "(ceil_l2_gbps or ceil_dram_gbps)"),
    "pct_ceil_gflops": ("float64", "gflops as % of the measured FP32 ceiling"),
    "suspect": ("boolean", "faster than the ceiling it is compared with (above 100 % of "
                "ceil_* of its memory level, or of the theoretical peak where no ceiling was "
                "measured): the number needs explaining (empty: nothing to compare with)"),
    # derived by aggregate from the columns above and the run's ceilings (roofline.annotate)
    "cold_l2": ("boolean", "the harness flushed the L2 before every sample (its setting "
                "cold_l2; empty where not recorded)"),
    "intensity": ("float64", "arithmetic intensity, flops / bytes, FLOP/byte (empty without "
                  "both)"),
    "roof_gflops": ("float64", "the flat roof the point's gflops is judged against, GFLOP/s: "
                    "FP32 (measured ceiling first), FP64, or its input precision's "
                    "tensor-core peak (empty where none is known)"),
    "roof_name": ("string", "that roof's name (FP32, FP64, FP64 tensor-core, TF32 "
                  "tensor-core, ...)"),
    "suspect_why": ("string", "why a suspect point's speed cannot be taken at face value "
                    "(empty: not suspect)"),
    "error": ("float64", "error against the CPU reference (metric in error_metric)"),
    "tolerance": ("float64", "largest error that passes"),
    "error_metric": ("string", "how error is measured (e.g. rel_fro: ||C-R||_F / ||R||_F)"),
    "correct": ("boolean", "passed the correctness check (empty if no check applies)"),
    "t_start": ("float64", "unix time the point started (same clock as telemetry)"),
    "t_end": ("float64", "unix time the point ended"),
    "job_id": ("string", "the job that measured the point (keys its telemetry)"),
    "cached": ("boolean", "reused from an earlier job with identical provenance"),
    # provenance
    "gpu_name": ("string", "GPU model"),
    "gpu_uuid": ("string", "GPU UUID"),
    "gpu_smi_index": ("Int64", "the GPU's index as nvidia-smi numbers it (CUDA_VISIBLE_DEVICES "
                      "does not change it)"),
    "gpu_pci_bus_id": ("string", "PCI bus id of the GPU"),
    "compute_capability": ("string", "major.minor"),
    "sm_count": ("Int64", "streaming multiprocessors of the GPU (the driver's "
                 "MULTIPROCESSOR_COUNT)"),
    "driver_version": ("string", "NVIDIA driver version"),
    "cuda_version": ("string", "CUDA version pycuda was built against"),
    "pycuda_version": ("string", "pycuda version"),
    "nvcc_version": ("string", "nvcc version"),
    "nvcc_options": ("string", "options the kernel was compiled with"),
    "kernel_hash": ("string", "sha256 (16 hex) of kernel source + options"),
    "host": ("string", "host name"),
    "cpu_model": ("string", "host CPU"),
    "cpu_threads": ("Int64", "BLAS/OpenMP threads of the job's CPU work (measurement.cpu_threads)"),
    "blas": ("string", "the BLAS library numpy used, its version and thread count"),
    "python_executable": ("string", "the interpreter that measured (the one running Snakemake)"),
    "loaded_modules": ("string", "environment modules loaded in the job (LOADEDMODULES)"),
    "nvcc_path": ("string", "the nvcc on the job's PATH"),
    "slurm_job_id": ("string", "Slurm job id (empty outside Slurm)"),
    "slurm_node": ("string", "Slurm node"),
    "slurm_partition": ("string", "Slurm partition"),
    "cuda_visible_devices": ("string", "CUDA_VISIBLE_DEVICES of the job"),
    "git_commit": ("string", "commit of the code that measured"),
    "git_dirty": ("boolean", "tracked files differed from the commit"),
    "config_hash": ("string", "hash of the experiment's config block"),
    "timestamp": ("string", "ISO 8601 UTC time of the measurement"),
}

# Columns added with the measured ceilings: a table aggregated before them (the committed
# references) reads back with them empty.
CEILING_COLUMNS = ("peak_fp32_gflops", "ceil_dram_gbps", "ceil_l2_gbps", "ceil_smem_gbps",
                   "ceil_fp32_gflops", "l2_bytes", "working_set_bytes", "memory_level",
                   "pct_ceil_gbps", "pct_ceil_gflops", "suspect")
# The columns aggregate derives from the others and the run's ceilings (roofline.annotate);
# a table aggregated before them reads back with them empty, and roofline.load_table derives
# them.
DERIVED_COLUMNS = ("cold_l2", "intensity", "roof_gflops", "roof_name", "suspect_why")
# Columns a table written before them lacks: read back empty (an older reference stays
# readable); every other column must be there.
LATER_COLUMNS = (*CEILING_COLUMNS, *DERIVED_COLUMNS, "time_trial_spread", "time_floor_s",
                 "cpu_threads", "blas", "python_executable", "loaded_modules", "nvcc_path",
                 "launch_blocks", "launch_threads", "sm_count", "gpu_smi_index",
                 "gpu_pci_bus_id", *harness_columns.COLUMNS)

PROVENANCE_KEYS = [k for k in list(COLUMNS)[list(COLUMNS).index("gpu_name"):]]

# Free-form raw-record extras that become m_<name> columns (JSON text): the report checks
# and shows them (atomics: the racy counter's count on each repeat).
TABLE_EXTRAS = ("racy_repeats",)


# -- writing atomically ----------------------------------------------------------------------
@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write to; when the block ends without an error it
    replaces `path` in one rename, so a reader (a Snakemake step, a browser) never sees half
    a file, and a failed write leaves the old file as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# -- raw records ---------------------------------------------------------------------------
def write_json_atomic(path: Path, obj: Any) -> None:
    """Write a record through atomic_path, fsynced before the rename: a record on disk is
    whole even after the node loses power."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=_json_default)
        f.flush()
        os.fsync(f.fileno())


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON-able: {type(o)}")


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from disk, or None if it is missing, not a regular file, too large or
    deep (safe_io's limits), or not a whole JSON object."""
    try:
        obj = safe_io.read_json(path)
    except safe_io.InputRefused:
        return None
    return obj if isinstance(obj, dict) else None


def read_record(path: Path) -> dict[str, Any] | None:
    """A raw record with its Nsight Compute counters merged in (the profiler keeps them in
    a file of their own: counters_path), or None where the record cannot be used (unreadable,
    or not of the record schema: record_schema.record_problem)."""
    rec = read_json(path)
    if rec is None or record_schema.record_problem(rec):
        return None
    counters = read_json(counters_path(path))
    if counters and counters.get("cache_key") == rec.get("cache_key") \
            and counters.get("schema_version") == SCHEMA_VERSION:
        kept = {k: v for k, v in (rec.get("metrics") or {}).items()
                if not k.startswith("ncu_")}
        rec["metrics"] = kept | (counters.get("metrics") or {})
        rec["profile"] = counters.get("profile") or {}
    return rec


def counters_path(record: Path) -> Path:
    """<results>/profile/<experiment>/<point>.json for <results>/raw/<experiment>/<point>.json:
    outside raw/, so no reader of records takes it for one."""
    record = Path(record)
    return record.parent.parent.parent / "profile" / record.parent.name / record.name


def record_problem(path: Path) -> str:
    """Why a raw record file cannot be used ('' if it can)."""
    try:
        obj = safe_io.read_json(path)
    except safe_io.InputRefused as exc:
        return str(exc).removeprefix(safe_io.shown(path)).strip(" :")
    return record_schema.record_problem(obj)


# a run's records: raw/<experiment>/<point>.json, a few hundred per experiment
MAX_RECORDS = 200_000


def walk_records(raw_dir: Path, min_depth: int = 1) -> safe_io.Walk:
    """The record files under raw_dir (min_depth 0: <point>.json directly in it too) and the
    entries left out (links, FIFOs, sockets, devices, deeper folders), never following a
    link; an empty walk where raw_dir is no folder."""
    if not Path(raw_dir).is_dir():
        return safe_io.Walk()
    return safe_io.walk_files(raw_dir, ".json", max_depth=1, max_files=MAX_RECORDS,
                              min_depth=min_depth)


def record_paths(raw_dir: Path) -> list[Path]:
    """Every raw record file under raw_dir (<experiment>/<point>.json, or <point>.json
    directly in one experiment's folder); manifests (_*.json) are no records."""
    return walk_records(raw_dir, min_depth=0).files


def damaged_records(raw_dir: Path) -> list[tuple[Path, str]]:
    """(path, problem) of every raw record that cannot be read back."""
    return [(p, why) for p in record_paths(raw_dir) if (why := record_problem(p))]


def iter_records(raw_dir: Path) -> Iterable[dict[str, Any]]:
    """The readable records; a damaged one is named on stderr, never dropped in silence."""
    walk = walk_records(raw_dir)
    for p, why in walk.skipped:
        print(f"warning: left out {safe_io.shown(p)}: {why}", file=sys.stderr)
    for p in walk.files:
        rec = read_record(p)
        if rec is not None:
            yield rec
        else:
            print(f"warning: left out damaged record {safe_io.shown(p)} ({record_problem(p)}); "
                  "a rerun of the workflow measures its point again", file=sys.stderr)


# -- which records are this run's ----------------------------------------------------------
LEFT_OUT_FILE = "left_out.json"


def select_records(records: Iterable[dict[str, Any]], manifests: list[dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of this run: points of the current grid (each experiment's job manifest
    lists them) and, for GPU points, measured on a GPU of this run (the GPUs of the
    manifests: a GPU-model sweep has several). Returns (kept, summary of the left-out ones);
    summary["line"] says it in one line."""
    grid = {m["experiment"]: set(m.get("points") or ()) for m in manifests}
    gpus = {(j.get("provenance") or {}).get("gpu_uuid")
            for m in manifests for j in jobs_of(m)} - {None, ""}
    kept: list[dict[str, Any]] = []
    left: dict[str, dict[str, int]] = {}
    for rec in records:
        exp = rec.get("experiment")
        uuid = (rec.get("provenance") or {}).get("gpu_uuid")
        if rec.get("point_id") not in grid.get(exp, ()):
            why = "not_in_grid"
        elif _is_gpu_record(rec) and uuid not in gpus:
            why = "other_gpu"
        else:
            kept.append(rec)
            continue
        left.setdefault(why, {}).setdefault(exp, 0)
        left[why][exp] += 1
    return kept, _left_out_summary(len(kept), left, gpus)


def _is_gpu_record(rec: dict[str, Any]) -> bool:
    """A point measured on the GPU (its record names a GPU and was not timed on the host);
    CPU points of a GPU job carry the job's GPU too, and are kept across GPUs."""
    timer = (rec.get("timing") or {}).get("timer")
    return bool((rec.get("provenance") or {}).get("gpu_uuid")) and timer != "perf_counter"


def _left_out_summary(kept: int, left: dict[str, dict[str, int]], gpus: set[str]
                      ) -> dict[str, Any]:
    n_grid = sum(left.get("not_in_grid", {}).values())
    n_gpu = sum(left.get("other_gpu", {}).values())
    line = (f"aggregate: {kept} record(s) of this run's grid and GPU(s) in the table"
            + (f"; left out {n_grid + n_gpu} older record(s) under results/raw: "
               f"{n_grid} of points not in this config's grid, {n_gpu} measured on a GPU "
               f"other than this run's ({', '.join(sorted(gpus)) or 'none'})"
               if n_grid + n_gpu else ""))
    return {"kept": kept, "not_in_grid": n_grid, "other_gpu": n_gpu, "by_reason": left,
            "run_gpus": sorted(gpus), "line": line}


def read_manifests(raw_dir: Path, paths: Iterable[Path] | None = None) -> list[dict[str, Any]]:
    """The job manifests given (the workflow passes the current experiments'), else every
    results/raw/*/_manifest.json; unreadable ones are skipped."""
    found = sorted(Path(raw_dir).glob("*/_manifest.json")) if paths is None else list(paths)
    out = []
    for p in found:
        if (manifest := read_json(p)) is not None:
            out.append(manifest)
    return out


def jobs_of(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The measure jobs behind one lesson's manifest: itself, or the manifests of the shards
    it was merged from (cudalab.shards), each with its own GPU, telemetry and ceilings."""
    shards = manifest.get("shards")
    return [s for s in shards if isinstance(s, dict)] if isinstance(shards, list) else [manifest]


def read_left_out(results_dir: Path) -> dict[str, Any] | None:
    """The left-out summary aggregate wrote (for the report), None if there is none."""
    return read_json(Path(results_dir) / LEFT_OUT_FILE)


# -- the table -----------------------------------------------------------------------------
def _safe_div(a: Any, b: Any) -> float:
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return math.nan
    return a / b if b > 0 and not math.isnan(a) else math.nan


def number(v: Any) -> float:
    """A recorded value as a float, NaN where it is missing or not a number (an older
    record's field)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def memory_level(working_set: float, l2_bytes: float, cold_l2: bool) -> str:
    """'l2' when the working set fits in the L2 and the harness did not flush it before each
    sample, 'dram' otherwise; '' where either size is unknown (CPU points, PCIe experiments,
    records from before the L2 size was recorded)."""
    if not (math.isfinite(working_set) and math.isfinite(l2_bytes) and l2_bytes > 0):
        return ""
    return "l2" if working_set <= l2_bytes and not cold_l2 else "dram"


def ceiling_columns(work: dict[str, Any], timing: dict[str, Any], median: float
                    ) -> dict[str, Any]:
    """The measured-ceiling columns of a row, from its record's work (declared work, the
    device's peaks and the job's measured ceilings), its timing's cold_l2 setting and the
    median time (NaN for rows that are not ok: they carry no speed)."""
    flops, nbytes = number(work.get("flops")), number(work.get("bytes"))
    ws = number(work.get("working_set"))
    ws = ws if math.isfinite(ws) else nbytes
    cold = bool((timing.get("harness") or {}).get("cold_l2", False))
    level = memory_level(ws, number(work.get("l2_bytes")), cold)
    med = number(median)
    gbps, gflops = _safe_div(nbytes, med) / 1e9, _safe_div(flops, med) / 1e9
    ceil_gbps = number(work.get({"l2": "ceil_l2_gbps", "dram": "ceil_dram_gbps"}.get(level, "")))
    ceil_gflops = number(work.get("ceil_fp32_gflops"))
    pct_gbps = 100 * _safe_div(gbps, ceil_gbps)
    pct_gflops = 100 * _safe_div(gflops, ceil_gflops)
    return {
        "peak_fp32_gflops": number(work.get("peak_fp32_gflops")),
        "ceil_dram_gbps": number(work.get("ceil_dram_gbps")),
        "ceil_l2_gbps": number(work.get("ceil_l2_gbps")),
        "ceil_smem_gbps": number(work.get("ceil_smem_gbps")),
        "ceil_fp32_gflops": ceil_gflops,
        "l2_bytes": number(work.get("l2_bytes")),
        "working_set_bytes": ws,
        "memory_level": level,
        "pct_ceil_gbps": pct_gbps,
        "pct_ceil_gflops": pct_gflops,
        "suspect": _suspect(
            pct_gbps if math.isfinite(ceil_gbps) or level != "dram"
            else 100 * _safe_div(gbps, work.get("peak_mem_gbps")),
            pct_gflops if math.isfinite(ceil_gflops)
            else 100 * _safe_div(gflops, work.get("peak_fp32_gflops"))),
    }


def _suspect(*pcts: float) -> bool | None:
    """True if any compared percentage is above 100, None if none could be compared."""
    known = [p for p in pcts if math.isfinite(p)]
    return any(p > 100 for p in known) if known else None


def record_to_row(rec: dict[str, Any]) -> dict[str, Any]:
    t = rec.get("timing") or {}
    check = rec.get("check") or {}
    work = rec.get("work") or {}
    prov = rec.get("provenance") or {}
    ok = rec.get("status") == "ok"
    med = t.get("median", math.nan) if ok else math.nan
    row: dict[str, Any] = {
        "experiment": rec["experiment"],
        "variant": rec["variant"],
        "point_id": rec["point_id"],
        "params": json.dumps(rec.get("params", {}), sort_keys=True),
        "status": rec.get("status", "failed"),
        "reason": rec.get("reason", ""),
        "n_samples": t.get("n"),
        "batch": t.get("batch"),
        "timer": t.get("timer"),
        "stop_reason": t.get("stop_reason"),
        "launch_blocks": (rec.get("launch") or {}).get("blocks"),
        "launch_threads": (rec.get("launch") or {}).get("threads_per_block"),
        "time_median_s": med,
        "time_iqr_s": t.get("iqr", math.nan) if ok else math.nan,
        "time_cv": t.get("cv", math.nan) if ok else math.nan,
        "time_trial_spread": t.get("trial_spread", math.nan) if ok else math.nan,
        "time_floor_s": (rec.get("floor") or {}).get("floor_s", math.nan) if ok else math.nan,
        "time_min_s": t.get("min", math.nan) if ok else math.nan,
        "time_mean_s": t.get("mean", math.nan) if ok else math.nan,
        "n_throttled": t.get("n_throttled"),
        "timing_note": t.get("timing_note", ""),
        **harness_columns.row(t.get("harness")),
        "flops": work.get("flops", math.nan),
        "bytes": work.get("bytes", math.nan),
        "gflops": _safe_div(work.get("flops"), med) / 1e9,
        "gbps": _safe_div(work.get("bytes"), med) / 1e9,
        "pct_peak_gbps": 100 * _safe_div(_safe_div(work.get("bytes"), med) / 1e9,
                                          work.get("peak_mem_gbps")),
        "pct_peak_gflops": 100 * _safe_div(_safe_div(work.get("flops"), med) / 1e9,
                                           work.get("peak_fp32_gflops")),
        "peak_mem_gbps": work.get("peak_mem_gbps", math.nan),
        **ceiling_columns(work, t, med),
        "error": check.get("error", math.nan),
        "tolerance": check.get("tolerance", math.nan),
        "error_metric": check.get("metric"),
        "correct": check.get("passed"),
        "t_start": rec.get("t_start"),
        "t_end": rec.get("t_end"),
        "job_id": rec.get("job_id"),
        "cached": rec.get("cached", False),
    }
    for k in PROVENANCE_KEYS:
        row[k] = prov.get(k)
    for k, v in (rec.get("params") or {}).items():
        row[f"p_{k}"] = v
    for k in TABLE_EXTRAS:
        if k in (rec.get("extra") or {}):
            row[f"m_{k}"] = json.dumps(rec["extra"][k])
    for k, v in (rec.get("metrics") or {}).items():
        # extra metrics are speeds or counts measured with the point: blank them too if not ok
        row[f"m_{k}"] = v if ok or not isinstance(v, float) else math.nan
    return row


def build_table(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The table of the records, its derived columns empty (aggregate fills them)."""
    df = conform(pd.DataFrame([record_to_row(r) for r in records]))
    return df.sort_values(["experiment", "variant", "point_id"], kind="stable").reset_index(
        drop=True
    )


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """df in the schema's column order and dtypes, a column it lacks added empty."""
    df = df.copy()
    for col in COLUMNS:
        if col not in df:
            df[col] = pd.Series([None] * len(df), index=df.index, dtype="object")
    extra = sorted(c for c in df.columns if c not in COLUMNS)
    df = df[list(COLUMNS) + extra]
    for col, (dtype, _) in COLUMNS.items():
        df[col] = df[col].astype(dtype)
    return df.copy()  # one block per dtype: the per-column casts left the frame fragmented


def check_table(df: pd.DataFrame) -> list[str]:
    """Schema problems of a results table (empty list = valid)."""
    problems = []
    for col, (dtype, _) in COLUMNS.items():
        if col not in df.columns:
            problems.append(f"missing column {col}")
        elif str(df[col].dtype) != dtype and not (df[col].isna().all()):
            problems.append(f"column {col} has dtype {df[col].dtype}, expected {dtype}")
    for c in df.columns:
        if c not in COLUMNS and not c.startswith(("p_", "m_")):
            problems.append(f"unexpected column {c}")
    bad = set(df["status"].dropna()) - set(STATUSES) if "status" in df else set()
    if bad:
        problems.append(f"unknown status values {sorted(bad)}")
    if {"status", "gflops"} <= set(df.columns):
        leaked = df[(df["status"] != "ok") & df["gflops"].notna()]
        if len(leaked):
            problems.append(f"{len(leaked)} non-ok rows carry a speed")
    if {"experiment", "point_id"} <= set(df.columns) and df.duplicated(
        ["experiment", "point_id"]
    ).any():
        problems.append("duplicate (experiment, point_id) rows")
    return problems


MAX_TABLE_BYTES = 1024 ** 3  # results.csv of the default grid is about 1 MB


def read_table(path: Path) -> pd.DataFrame:
    """Read results.csv back with the schema's dtypes (a regular file of at most
    MAX_TABLE_BYTES: safe_io), its text cells as they were before write_table."""
    dtypes = {c: d for c, (d, _) in COLUMNS.items() if d not in ("boolean",)}
    data = io.BytesIO(safe_io.read_bytes(path, MAX_TABLE_BYTES))
    # bytes in memory carry no file name: the compression is told from the path's suffix
    # (a stored reference table is results.csv.gz)
    packed = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zip": "zip"}.get(Path(path).suffix)
    df = safe_text.uncsv_frame(pd.read_csv(data, dtype=dtypes, keep_default_na=True,
                                           compression=packed))
    df = harness_columns.expand(df)  # an older table's settings as JSON in one column
    for c, (d, _) in COLUMNS.items():
        if d == "boolean" and c in df:
            df[c] = df[c].map({True: True, False: False, "True": True, "False": False}).astype(
                "boolean"
            )
    missing = {c: pd.Series([None] * len(df), index=df.index, dtype="object").astype(
        COLUMNS[c][0]) for c in LATER_COLUMNS if c not in df}
    if missing:
        df = pd.concat([df, pd.DataFrame(missing, index=df.index)], axis=1)
    for col in ("memory_level", "suspect_why"):  # CSV writes '' as an empty cell
        df[col] = df[col].fillna("")
    if "peak_mem_gbps" not in df and "m_peak_gbps" in df:
        # a table aggregated before the peak had its own column (the H100 reference): the
        # memory experiments reported it as a metric then
        df["peak_mem_gbps"] = pd.to_numeric(df["m_peak_gbps"], errors="coerce")
    if "m_gpu_copy_share" not in df and {"m_h2d_s", "m_kernel_s", "m_d2h_s"} <= set(df):
        # a table recorded before matmul's time split kept the copies' share of the GPU time
        # (nvprof's: H2D + D2H over H2D + kernel + D2H) has the phases it is made of
        h2d, ker, d2h = (pd.to_numeric(df[c], errors="coerce")
                         for c in ("m_h2d_s", "m_kernel_s", "m_d2h_s"))
        share = (h2d + d2h) / (h2d + ker + d2h)
        df = pd.concat([df, share.where(df["experiment"] == "matmul")
                        .rename("m_gpu_copy_share")], axis=1)
    return df.copy()  # consolidated: the lessons' .assign() on a fragmented frame warns


def write_table(df: pd.DataFrame, csv_path: Path) -> list[Path]:
    """Write results.csv (and .parquet if pyarrow is there), each atomically."""
    written = []
    with atomic_path(csv_path) as tmp:  # text cells a spreadsheet would run neutralised
        safe_text.write_frame(df, tmp)
    written.append(csv_path)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return written
    pq = csv_path.with_suffix(".parquet")
    with atomic_path(pq) as tmp:
        df.to_parquet(tmp, index=False)
    written.append(pq)
    return written
