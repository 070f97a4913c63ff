#!/usr/bin/env python3
"""Run-to-run stability and harness overhead of the measurement pipeline.

Runs the same small grid N times (default 2) through cudalab.runner.run_experiment, each run
into its own fresh temporary results folder (so nothing is cached), and prints per grid point:

- the run-to-run coefficient of variation (sample std / mean over the runs, ddof=1) of the
  point's headline metric: GFLOP/s where the experiment declares flops, else GB/s, else the
  median time. Target: <= 2 % on an idle H100.
- the harness overhead of the point: its wall time (t_end - t_start, unix time stamped by
  the runner around the whole point: kernel lookup/compile, inputs, correctness check,
  warm-up, batch calibration, telemetry reads, end-to-end phases, writing the record) minus
  the time spent inside timed samples (for the main timing and every phase timing:
  sum(samples_s) x batch, samples being per launch). Target: <= 0.3 s (judged on the median
  over points; a point that compiles a new kernel variant pays nvcc once, reported apart).
  It is split into the part inside the harness (warm-up launches, batch calibration, NVML
  reads, statistics: sum of the timings' wall_s minus timed samples) and the part outside it
  (compile, inputs and the CPU reference of a new size, correctness check, the record).

GPU grid (default): matmul tiled 2048 and 4096 with tiles 8, 16 and 32, plus vector_add at
2^24 and 2^26 elements with 256 threads if that experiment exists (only experiments in
cudalab.experiments.REGISTRY run; another named experiment runs its smoke grid).
`--cpu`: the CPU matmul (numpy) at 256 and 512, no GPU needed (telemetry not applicable).

Measurement settings are the config's (`--config`, default: the schema defaults); seeds are
fixed so every run multiplies the same matrices. Nothing here changes GPU clocks.

  python scripts/bench_stability.py --out bench.json           # on the GPU machine
  python scripts/bench_stability.py --cpu --out bench.csv      # anywhere
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cudalab import config as cfg  # noqa: E402
from cudalab import results  # noqa: E402
from cudalab.experiments import REGISTRY  # noqa: E402

CV_TARGET = 0.02
OVERHEAD_TARGET_S = 0.3

GPU_GRID: dict[str, dict[str, Any]] = {
    "matmul": {"sizes": [2048, 4096], "variants": ["tiled"], "tiles": [8, 16, 32]},
    "vector_add": {"sizes": [1 << 24, 1 << 26], "threads": [256]},
}
CPU_GRID: dict[str, dict[str, Any]] = {
    "matmul": {"sizes": [256, 512], "variants": ["cpu"]},
}


def build_config(base: dict[str, Any], grid: dict[str, dict[str, Any]], cpu: bool) -> dict:
    conf = {k: v for k, v in base.items() if k in ("measurement", "telemetry", "gpu_index")}
    conf["seed"] = base.get("seed") or 1
    conf["run_name"] = "bench-stability"
    conf["experiments"] = grid
    if cpu:
        conf["telemetry"] = {"nvidia_smi": False, "nvml": False}
    return cfg.validate(conf, source="bench_stability config")


def choose_grid(cpu: bool, names: list[str]) -> tuple[dict[str, dict], list[str]]:
    if cpu:
        return dict(CPU_GRID), []
    grid, notes = {}, []
    for name in names:
        if name not in REGISTRY:
            notes.append(f"{name}: not in this checkout's experiments, left out")
            continue
        block = dict(GPU_GRID.get(name) or REGISTRY[name].smoke)
        try:
            cfg.validate({"experiments": {name: dict(block)}})
        except cfg.ConfigError as exc:
            notes.append(f"{name}: bench grid not valid here ({exc}); using its smoke grid")
            block = dict(REGISTRY[name].smoke)
        grid[name] = block
    return grid, notes


def timed_s(timing: dict[str, Any] | None) -> float:
    """Seconds spent inside timed samples: samples are per launch, `batch` launches each."""
    if not timing:
        return 0.0
    return float(sum(timing.get("samples_s") or [])) * int(timing.get("batch") or 1)


def headline(row: dict[str, Any]) -> tuple[str, float]:
    for col in ("gflops", "gbps"):
        v = row.get(col)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            return col, float(v)
    return "time_median_s", float(row.get("time_median_s") or math.nan)


def point_rows(raw_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Per point of one run: headline metric, wall time, timed time, overhead."""
    recs = list(results.iter_records(raw_dir))
    table = results.build_table(recs)
    by_id = {(r["experiment"], r["point_id"]): r for r in table.to_dict("records")}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    seen_kernels: set[str] = set()
    for rec in sorted(recs, key=lambda r: r.get("t_start") or 0):
        key = (rec["experiment"], rec["point_id"])
        row = by_id[key]
        metric, value = headline(row) if rec.get("status") == "ok" else ("", math.nan)
        wall = float(rec.get("t_end") or 0) - float(rec.get("t_start") or 0)
        timings = [rec.get("timing") or {}] + list((rec.get("phases") or {}).values())
        kernel_s = timed_s(rec.get("timing"))
        phase_s = sum(timed_s(p) for p in timings[1:])
        harness_wall = sum(float(t.get("wall_s") or 0) for t in timings)
        khash = (rec.get("provenance") or {}).get("kernel_hash") or ""
        first = bool(khash) and khash not in seen_kernels
        seen_kernels.add(khash)
        out[key] = {
            "experiment": rec["experiment"], "point_id": rec["point_id"],
            "status": rec.get("status"), "metric": metric, "value": value,
            "wall_s": wall, "timed_s": kernel_s + phase_s, "kernel_timed_s": kernel_s,
            "overhead_s": wall - kernel_s - phase_s,
            "overhead_in_harness_s": harness_wall - kernel_s - phase_s,
            "overhead_outside_harness_s": wall - harness_wall,
            "n_samples": (rec.get("timing") or {}).get("n"),
            "n_throttled": (rec.get("timing") or {}).get("n_throttled"),
            "first_use_of_kernel": first,
        }
    return out


def _median(v: list[float]) -> float:
    return statistics.median(v) if v else math.nan


def cv(values: list[float]) -> float:
    v = [x for x in values if x is not None and not math.isnan(x)]
    if len(v) < 2 or statistics.fmean(v) == 0:
        return math.nan
    return statistics.stdev(v) / statistics.fmean(v)


def run_once(config: dict[str, Any], names: list[str], keep: Path | None, i: int
             ) -> tuple[dict, dict[str, Any]]:
    from cudalab.runner import run_experiment

    tmp = Path(tempfile.mkdtemp(prefix=f"cudalab-bench-{i}-", dir=keep))
    manifests = {}
    try:
        for name in names:
            manifests[name] = run_experiment(config, name, tmp)
        rows = point_rows(tmp / "raw")
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    tel = {n: m.get("telemetry", {}) for n, m in manifests.items()}
    prov = next(iter(manifests.values())).get("provenance", {}) if manifests else {}
    return rows, {"dir": str(tmp) if keep else "", "telemetry": tel, "provenance": prov}


def summarize(runs: list[dict], repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    keys = list(dict.fromkeys(k for r in runs for k in r))
    table = []
    for key in keys:
        per = [r.get(key) for r in runs]
        vals = [p["value"] if p else math.nan for p in per]
        over = [p["overhead_s"] if p else math.nan for p in per]
        first = next((p for p in per if p), {})
        table.append({
            "experiment": key[0], "point_id": key[1], "metric": first.get("metric", ""),
            **{f"value_run{i + 1}": v for i, v in enumerate(vals)},
            "cv": cv(vals),
            **{f"overhead_s_run{i + 1}": o for i, o in enumerate(over)},
            **{f"wall_s_run{i + 1}": (p or {}).get("wall_s", math.nan)
               for i, p in enumerate(per)},
            "overhead_s_median": statistics.median([o for o in over if not math.isnan(o)])
            if any(not math.isnan(o) for o in over) else math.nan,
            "first_use_of_kernel_run1": bool(first.get("first_use_of_kernel")),
            "n_throttled": [(p or {}).get("n_throttled") for p in per],
            "status": [(p or {}).get("status") for p in per],
        })
    cvs = [r["cv"] for r in table if not math.isnan(r["cv"])]
    # every point of every run; points that compiled a kernel in that run listed apart
    overs = [p["overhead_s"] for r in runs for p in r.values()]
    warm = [p["overhead_s"] for r in runs for p in r.values() if not p["first_use_of_kernel"]]
    summary = {
        "repeats": repeats, "points": len(table),
        "cv_median": statistics.median(cvs) if cvs else math.nan,
        "cv_max": max(cvs) if cvs else math.nan,
        "cv_target": CV_TARGET,
        "overhead_s_median": statistics.median(overs) if overs else math.nan,
        "overhead_s_max": max(overs) if overs else math.nan,
        "overhead_s_median_without_first_kernel_use": statistics.median(warm) if warm
        else math.nan,
        "overhead_target_s": OVERHEAD_TARGET_S,
        "overhead_in_harness_s_median": _median(
            [p["overhead_in_harness_s"] for r in runs for p in r.values()]),
        "overhead_outside_harness_s_median": _median(
            [p["overhead_outside_harness_s"] for r in runs for p in r.values()]),
        "not_ok": sum(1 for r in table for s in r["status"] if s != "ok"),
    }
    summary["cv_ok"] = bool(cvs) and summary["cv_max"] <= CV_TARGET
    summary["overhead_ok"] = bool(overs) and summary["overhead_s_median"] <= OVERHEAD_TARGET_S
    return table, summary


def print_table(table: list[dict[str, Any]], summary: dict[str, Any], repeats: int) -> None:
    runs = range(1, repeats + 1)
    head = (f"{'experiment':10s} {'point':34s} {'metric':8s} "
            + " ".join(f"{'run' + str(i):>10s}" for i in runs)
            + f" {'cv %':>6s} " + " ".join(f"{'ovh' + str(i) + ' s':>7s}" for i in runs)
            + "  throttled")
    print(head)
    print("-" * len(head))
    for r in table:
        vals = " ".join(f"{r[f'value_run{i}']:10.4g}" for i in runs)
        ovh = " ".join(f"{r[f'overhead_s_run{i}']:7.3f}" for i in runs)
        mark = " *" if r["first_use_of_kernel_run1"] else ""
        print(f"{r['experiment']:10s} {r['point_id'][:34]:34s} {r['metric'][:8]:8s} {vals} "
              f"{100 * r['cv']:6.2f} {ovh}  {r['n_throttled']}{mark}")
    s = summary
    print("-" * len(head))
    print(f"run-to-run CV of the headline metric: median {100 * s['cv_median']:.2f} %, "
          f"max {100 * s['cv_max']:.2f} % (target <= {100 * CV_TARGET:.0f} %): "
          + ("OK" if s["cv_ok"] else "NOT MET"))
    print(f"harness overhead per point (wall - timed samples): median "
          f"{s['overhead_s_median']:.3f} s, max {s['overhead_s_max']:.3f} s, median without "
          f"points that compiled a kernel {s['overhead_s_median_without_first_kernel_use']:.3f}"
          f" s (target <= {OVERHEAD_TARGET_S} s): " + ("OK" if s["overhead_ok"] else "NOT MET"))
    print(f"  of which inside the harness (warm-up, calibration, NVML reads) median "
          f"{s['overhead_in_harness_s_median']:.3f} s, outside it (compile, inputs, reference,"
          f" check, record) median {s['overhead_outside_harness_s_median']:.3f} s")
    print("* = the point compiled its kernel variant in run 1 (nvcc time is in its overhead)")
    if s["not_ok"]:
        print(f"{s['not_ok']} point results were not ok (see status in the output file)")


def write_out(path: Path, table: list[dict], summary: dict, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        import pandas as pd

        pd.DataFrame(table).to_csv(path, index=False)
    else:
        path.write_text(json.dumps({"summary": summary, "points": table, **meta}, indent=1,
                                   default=str))
    print(f"written: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="CPU matmul only (no GPU needed)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of the grid (default 2)")
    ap.add_argument("--experiments", default="matmul,vector_add",
                    help="GPU experiments to run (those not in this checkout are left out)")
    ap.add_argument("--config", help="take measurement/telemetry settings from this config")
    ap.add_argument("--out", help="write the table: .csv (per point) or .json (with summary)")
    ap.add_argument("--keep", help="keep each run's results under this folder")
    ap.add_argument("--strict", action="store_true", help="exit 1 if a target is not met")
    a = ap.parse_args(argv)
    if a.repeats < 2:
        ap.error("--repeats must be at least 2")
    base = cfg.load(a.config) if a.config else {}
    grid, notes = choose_grid(a.cpu, [n.strip() for n in a.experiments.split(",") if n.strip()])
    for n in notes:
        print(n, file=sys.stderr)
    if not grid:
        print("nothing to run", file=sys.stderr)
        return 2
    config = build_config(base, grid, a.cpu)
    keep = Path(a.keep).resolve() if a.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    runs, metas = [], []
    t0 = time.time()
    from cudalab.gpu import NoGpuError

    for i in range(a.repeats):
        try:
            rows, meta = run_once(config, list(grid), keep, i + 1)
        except NoGpuError as exc:
            print(f"error: {exc}\n(--cpu runs the CPU variant without a GPU)", file=sys.stderr)
            return 2
        runs.append(rows)
        metas.append(meta)
    table, summary = summarize(runs, a.repeats)
    summary["total_s"] = time.time() - t0
    prov = metas[0]["provenance"]
    print(f"\ncudalab bench_stability: {a.repeats} runs of {list(grid)} on "
          f"{prov.get('gpu_name') or prov.get('cpu_model') or '?'} ("
          f"{'CPU' if a.cpu else 'GPU'} mode, {summary['total_s']:.0f} s)")
    for i, m in enumerate(metas, 1):
        for name, tel in m["telemetry"].items():
            print(f"  run {i} {name}: nvidia-smi {tel.get('nvidia_smi')}, nvml {tel.get('nvml')}"
                  + (f" ({tel.get('nvidia_smi_reason') or tel.get('nvml_reason')})"
                     if tel.get('nvidia_smi_reason') or tel.get('nvml_reason') else ""))
    print()
    print_table(table, summary, a.repeats)
    if a.out:
        write_out(Path(a.out), table, summary,
                  {"mode": "cpu" if a.cpu else "gpu", "grid": grid,
                   "measurement": config["measurement"], "runs": metas})
    if a.strict and not (summary["cv_ok"] and summary["overhead_ok"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
