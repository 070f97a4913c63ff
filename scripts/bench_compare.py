"""Benchmark: `cudalab compare` and the report's baseline blocks on many run folders.

Builds N synthetic run folders from the H100 reference (every sample of a folder scaled by
a node factor around 1, a few points made 20 % slower), then times

  1. `cudalab compare REFERENCE FOLDER_1 ... FOLDER_N --csv ...` (a subprocess, imports included)
  2. the report's comparison (cudalab.compare.baseline_comparison, then report_context)
     with the N folders as report.baselines

Target (issue 9): comparing 100 folders of the default grid under 30 s on a laptop.

  python scripts/bench_compare.py [--runs 100] [--work /tmp/cudalab-bench-compare]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"


def make_folders(work: Path, n: int, seed: int = 1) -> list[Path]:
    rng = np.random.default_rng(seed)
    records = [(p.relative_to(REFERENCE), json.loads(p.read_text()))
               for p in sorted((REFERENCE / "raw").glob("*/[!_]*.json"))]
    folders = []
    for i in range(n):
        dest = work / f"node{i:03d}"
        factor = rng.normal(1.0, 0.02)
        slow = set(rng.choice(len(records), size=3, replace=False))
        for j, (rel, rec) in enumerate(records):
            rec = dict(rec, timing=dict(rec.get("timing") or {}))
            f = factor * (1.2 if j in slow else 1.0)
            rec["timing"]["samples_s"] = [s * f for s in rec["timing"].get("samples_s") or []]
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec))
        folders.append(dest)
    return folders


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cudalab-bench-compare"))
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    t0 = time.perf_counter()
    folders = make_folders(a.work, a.runs)
    print(f"built {a.runs} folders from {REFERENCE.name} in {time.perf_counter() - t0:.1f} s")

    cmd = [sys.executable, "-m", "cudalab.cli", "compare", str(REFERENCE),
           *map(str, folders), "--csv", str(a.work / "compare.csv")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    t_cli = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    summary = proc.stdout[proc.stdout.index("== verdicts per run =="):].splitlines()
    print("\n".join(summary[:5]) + f"\n  ... ({a.runs} runs in all)")
    print(f"cudalab compare, {a.runs} folders vs the reference: {t_cli:.1f} s "
          f"(target < 30 s)")

    import pandas as pd

    from cudalab import compare_report, results
    from cudalab import config as cfg

    df = results.read_table(REFERENCE / "results.csv")
    config = cfg.validate({"run_name": "reference", "experiments": {"matmul": {}},
                           "report": {"baselines": [str(f) for f in folders]}})
    t0 = time.perf_counter()
    ctx = compare_report.report_context(df, config, compare_report.baseline_comparison(df, config))
    t_rep = time.perf_counter() - t0
    n = pd.DataFrame(ctx["comparison"]["summary"])[["faster", "slower", "same"]].sum()
    print(f"report comparison blocks with {a.runs} baselines: {t_rep:.1f} s "
          f"({n['slower']} slower, {n['faster']} faster, {n['same']} same)")
    return 0 if t_cli < 30 else 1


if __name__ == "__main__":
    raise SystemExit(main())
