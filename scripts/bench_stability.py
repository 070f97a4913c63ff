#!/usr/bin/env python3
"""Do two runs of the whole grid agree? (issue 8: "two runs agree", "converge or say why")

Runs every enabled experiment of a config (default: config.yaml, the default grid) N times
(default 2), each run into its own fresh results folder, each experiment as its own
`cudalab measure` process (a fresh CUDA context, nothing cached), then prints and writes:

- agreement: the share of GPU points (timed with CUDA events) whose median time in the two
  runs differs by at most 5 % and by at most 2 % (max / min - 1, run 1 against run 2; with
  more runs, the largest pairwise ratio), overall and split at 100 us. Targets: >= 95 %
  within 5 %, >= 80 % within 2 %.
- convergence: the share of GPU points whose sample CV ended at or below target_cv
  (target >= 95 %), per run.
- overhead: per point, wall time minus the time inside timed samples (median over points;
  target <= 0.3 s), and each run's total time.

  python scripts/bench_stability.py --out reports/reference/<GPU>/stability   # GPU machine
  python scripts/bench_stability.py --config fast.yaml --experiments matmul     # anywhere
  python scripts/bench_stability.py --against results --runs 1 --out stability
      # run 1 is an earlier run of the same grid (e.g. the pipeline's results/ from a fresh
      # clone, another process): one more run is measured and compared with it

`--out PREFIX` writes PREFIX.json (every point, every number) and PREFIX.txt (the printout).
Nothing here changes GPU clocks.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from cudalab import config as cfg
from cudalab import results, timing_report

ROOT = Path(__file__).resolve().parent.parent

TARGETS = {"agree_5pct": 95.0, "agree_2pct": 80.0, "converged": 95.0, "overhead_s": 0.3}
SPLIT_S = 100e-6  # short points (launch noise) are reported apart


def measure_pass(i: int, config: Path, names: list[str], work: Path) -> dict[str, Any]:
    """One run: each experiment in its own `cudalab measure` process, into work/run<i>."""
    out = work / f"run{i}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    walls, failed = {}, {}
    t_run = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "cudalab.cli", "measure", name, "--config",
                            str(config), "--results", str(out)],
                           capture_output=True, text=True, cwd=ROOT, env=env)
        walls[name] = time.perf_counter() - t0
        if r.returncode != 0:
            failed[name] = f"exit {r.returncode}: {r.stderr.strip()[-400:]}"
        print(f"run {i} {name}: {walls[name]:.1f} s" + (" FAILED" if name in failed else ""),
              file=sys.stderr, flush=True)
    return {"dir": str(out), "wall_s": walls, "total_s": time.perf_counter() - t_run,
            "failed": failed}


def earlier_pass(results_dir: Path, names: list[str]) -> dict[str, Any]:
    """An earlier run of the grid (a results folder: the pipeline's, or a pass of this
    script) as a pass: its jobs' wall times from their manifests."""
    manifests = {m["experiment"]: m for m in results.read_manifests(results_dir / "raw")}
    missing = [n for n in names if n not in manifests]
    if missing:
        raise SystemExit(f"--against {results_dir}: no finished job for {', '.join(missing)}")
    walls = {n: manifests[n]["t_end"] - manifests[n]["t_start"] for n in names}
    return {"dir": str(results_dir), "wall_s": walls, "total_s": sum(walls.values()),
            "failed": {}, "earlier": True}


def timed_s(timing: dict[str, Any] | None) -> float:
    """Seconds spent inside timed samples: samples are per launch, `batch` launches each."""
    if not timing:
        return 0.0
    return float(sum(timing.get("samples_s") or [])) * int(timing.get("batch") or 1)


def overheads(raw: Path) -> dict[tuple[str, str], float]:
    """Per point: wall time minus the time inside the timed samples of all its timings."""
    out = {}
    for rec in results.iter_records(raw):
        timings = [rec.get("timing")] + list((rec.get("phases") or {}).values())
        wall = float(rec.get("t_end") or 0) - float(rec.get("t_start") or 0)
        out[(rec["experiment"], rec["point_id"])] = wall - sum(timed_s(t) for t in timings)
    return out


def point_times(raw: Path) -> dict[tuple[str, str], dict[str, Any]]:
    df = results.build_table(results.iter_records(raw))
    ok = df[(df["status"] == "ok") & df["time_median_s"].notna()]
    return {(r["experiment"], r["point_id"]): {"median_s": float(r["time_median_s"]),
                                               "timer": str(r["timer"])}
            for _, r in ok.iterrows()}


def compare(runs: list[dict[tuple[str, str], dict[str, Any]]]) -> list[dict[str, Any]]:
    """Points timed ok in every run, with the spread of their median times."""
    keys = sorted(set.intersection(*(set(r) for r in runs)))
    rows = []
    for key in keys:
        meds = [r[key]["median_s"] for r in runs]
        rows.append({"experiment": key[0], "point_id": key[1], "timer": runs[0][key]["timer"],
                     "gpu": runs[0][key]["timer"].startswith("cuda_event"),
                     **{f"median_s_run{i + 1}": m for i, m in enumerate(meds)},
                     "rel_diff": max(meds) / min(meds) - 1 if min(meds) > 0 else math.inf})
    return rows


def share(rows: list[dict[str, Any]], limit: float) -> float:
    return 100 * sum(r["rel_diff"] <= limit for r in rows) / len(rows) if rows else math.nan


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    gpu = [r for r in rows if r["gpu"]]
    pts = gpu or rows  # a CPU-only grid: its timed points
    short = [r for r in pts if r["median_s_run1"] <= SPLIT_S]
    long_ = [r for r in pts if r["median_s_run1"] > SPLIT_S]
    return {"points": "gpu" if gpu else "timed (no GPU points)", "n": len(pts),
            "agree_5pct": share(pts, 0.05), "agree_2pct": share(pts, 0.02),
            "n_short": len(short), "agree_5pct_short": share(short, 0.05),
            "agree_2pct_short": share(short, 0.02), "n_long": len(long_),
            "agree_5pct_long": share(long_, 0.05), "agree_2pct_long": share(long_, 0.02)}


def summarize(passes: list[dict[str, Any]], target_cv: float) -> tuple[list, dict[str, Any]]:
    raws = [Path(p["dir"]) / "raw" for p in passes]
    rows = compare([point_times(r) for r in raws])
    ovh = [o for r in raws for o in overheads(r).values()]
    conv = [timing_report.convergence(results.build_table(results.iter_records(r)), target_cv)
            for r in raws]
    summary = {
        "runs": len(passes), **agreement(rows),
        "converged_pct": [c["share_pct"] for c in conv],
        "not_converged": [[(p["experiment"], p["point_id"], round(p["cv_pct"], 2), p["note"])
                           for p in c["points"]] for c in conv],
        "overhead_s_median": statistics.median(ovh) if ovh else math.nan,
        "overhead_s_max": max(ovh) if ovh else math.nan,
        "total_s": [p["total_s"] for p in passes],
        "failed": [p["failed"] for p in passes], "targets": TARGETS,
    }
    summary["met"] = {
        "agree_5pct": summary["agree_5pct"] >= TARGETS["agree_5pct"],
        "agree_2pct": summary["agree_2pct"] >= TARGETS["agree_2pct"],
        "converged": all(c >= TARGETS["converged"] for c in summary["converged_pct"]),
        "overhead_s": summary["overhead_s_median"] <= TARGETS["overhead_s"],
    }
    return rows, summary


def report(rows: list[dict[str, Any]], s: dict[str, Any]) -> None:
    def ok(key: str) -> str:
        return "met" if s["met"][key] else "NOT MET"

    print(f"{s['runs']} runs of the grid; {s['n']} {s['points']} points timed ok in all")
    print(f"agree within 5 %: {s['agree_5pct']:.1f} % (target >= 95 %: {ok('agree_5pct')}); "
          f"within 2 %: {s['agree_2pct']:.1f} % (target >= 80 %: {ok('agree_2pct')})")
    print(f"  points <= 100 us ({s['n_short']}): {s['agree_5pct_short']:.1f} % within 5 %, "
          f"{s['agree_2pct_short']:.1f} % within 2 %; above ({s['n_long']}): "
          f"{s['agree_5pct_long']:.1f} % / {s['agree_2pct_long']:.1f} %")
    conv = ", ".join(f"{c:.1f} %" for c in s["converged_pct"])
    print(f"converged (sample CV <= target_cv), per run: {conv} (target >= 95 %: "
          f"{ok('converged')})")
    print(f"overhead per point (wall - timed samples): median {s['overhead_s_median']:.3f} s "
          f"(target <= 0.3 s: {ok('overhead_s')}), max {s['overhead_s_max']:.3f} s")
    print("total time per run: " + ", ".join(f"{t:.0f} s" for t in s["total_s"]))
    for i, f in enumerate(s["failed"], 1):
        for name, why in f.items():
            print(f"run {i}: {name} FAILED: {why}")
    worst = sorted(rows, key=lambda r: -r["rel_diff"])[:15]
    if worst:
        print("\nlargest run-to-run differences:")
        for r in worst:
            print(f"  {r['experiment']:12s} {r['point_id'][:44]:44s} "
                  f"{1e6 * r['median_s_run1']:10.2f} us {1e6 * r['median_s_run2']:10.2f} us "
                  f"{100 * r['rel_diff']:6.2f} %  {r['timer']}")
    for i, pts in enumerate(s["not_converged"], 1):
        print(f"\nrun {i}: {len(pts)} GPU points not converged or with a timing note:")
        for exp, pid, cv, note in pts:
            print(f"  {exp:12s} {pid[:44]:44s} cv {cv:6.2f} %  {note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config.yaml"))
    ap.add_argument("--experiments", default="", help="comma list (default: all enabled)")
    ap.add_argument("--runs", type=int, default=2, help="new runs to measure")
    ap.add_argument("--against", default="", help="an earlier run's results folder, taken "
                    "as run 1 (its wall times include whatever that run did after timing)")
    ap.add_argument("--work", default="", help="folder for the runs' results (default: temp)")
    ap.add_argument("--out", default="", help="write OUT.json and OUT.txt")
    ap.add_argument("--strict", action="store_true", help="exit 1 if a target is not met")
    a = ap.parse_args(argv)
    if a.runs + bool(a.against) < 2:
        ap.error("--runs: at least 2 runs are needed to compare (or 1 with --against)")
    config = cfg.load(a.config)
    names = [n for n in a.experiments.split(",") if n] or cfg.enabled_experiments(config)
    work = Path(a.work or tempfile.mkdtemp(prefix="cudalab-stability-"))
    passes = [earlier_pass(Path(a.against), names)] if a.against else []
    passes += [measure_pass(i, Path(a.config).resolve(), names, work)
               for i in range(len(passes) + 1, len(passes) + a.runs + 1)]
    rows, summary = summarize(passes, config["measurement"]["target_cv"])
    text = io.StringIO()
    with redirect_stdout(text):
        report(rows, summary)
    print(text.getvalue(), end="")
    if a.out:
        meta = {"config": a.config, "experiments": names, "measurement": config["measurement"],
                "work": str(work), "passes": passes}
        Path(a.out + ".json").write_text(json.dumps(
            {"summary": summary, "points": rows, "meta": meta}, indent=1, default=str))
        Path(a.out + ".txt").write_text(text.getvalue())
    return 1 if a.strict and not all(summary["met"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
