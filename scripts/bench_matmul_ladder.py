#!/usr/bin/env python3
"""The matmul ladder on a GPU, standalone: every step (naive, tiled, register, vec4, dbuf,
warptile) in every configuration of the default matmul block (every warp tile of the tile
search) and cuBLAS SGEMM, at each size, each checked against a float64 CPU product
(computed once per size) and timed with the harness, through the matmul experiment's own
measure() (same kernels, launch geometry, check and queued timing as a pipeline run).

  python scripts/bench_matmul_ladder.py                       # sizes 4096, 1000, 4100
  python scripts/bench_matmul_ladder.py --sizes 4096 160x240x320 --json ladder.json
  python scripts/bench_matmul_ladder.py --variants warptile cublas --budget 1.0

Prints one row per kernel configuration: variant, config, TFLOP/s, % of cuBLAS (same size,
same run), correct (rel_fro error against float64). Exit status 1 if any result is wrong.
Nothing here changes GPU settings.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from cudalab import config as cfg
from cudalab.experiments import matmul as mm
from cudalab.experiments.base import Skipped

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_SIZES = ["4096", "1000", "4100"]
STEPS = list(mm.LADDER)  # naive ... warptile, cublas


def parse_size(text: str) -> int | list[int]:
    """'4096' -> 4096 (square); '160x240x320' -> [M, K, N]."""
    parts = [int(p) for p in text.lower().split("x")]
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 3:
        return parts
    raise argparse.ArgumentTypeError(f"size {text!r}: give n or MxKxN")


def bench_block(sizes: list[int | list[int]], variants: list[str]) -> dict[str, Any]:
    """The validated matmul block of the benchmark: the defaults' tiles and tile search,
    float32, no end-to-end split."""
    return cfg.validate({"experiments": {"matmul": {
        "sizes": sizes, "variants": variants, "dtypes": ["float32"], "end_to_end": False,
    }}})["experiments"]["matmul"]


def with_pct_of_cublas(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row gets pct_cublas: its TFLOP/s as % of cuBLAS at the same size (NaN where
    cuBLAS did not run there)."""
    cub = {r["size"]: r["tflops"] for r in rows if r["variant"] == "cublas" and r["correct"]}
    return [r | {"pct_cublas": 100 * r["tflops"] / cub[r["size"]]
                 if r["size"] in cub and math.isfinite(r["tflops"]) else math.nan}
            for r in rows]


def format_table(rows: list[dict[str, Any]]) -> str:
    head = f"{'size':>12}  {'variant':<9} {'config':<36} {'TFLOP/s':>8} {'% cuBLAS':>9}  correct"
    lines = [head, "-" * len(head)]
    for r in rows:
        pct = "" if not math.isfinite(r["pct_cublas"]) else f"{r['pct_cublas']:.0f} %"
        tf = "" if not math.isfinite(r["tflops"]) else f"{r['tflops']:.2f}"
        ok = ("yes" if r["correct"] else "NO") + f" ({r['error']:.1e})" if r["status"] == "ok" \
            else r["status"]
        lines.append(f"{r['size']:>12}  {r['variant']:<9} {r['config']:<36} {tf:>8} {pct:>9}  {ok}")
    return "\n".join(lines)


def run(sizes: list[int | list[int]], variants: list[str], budget_s: float) -> list[dict]:
    import numpy as np

    from cudalab.experiments.base import RunContext
    from cudalab.gpu import open_session
    from cudalab.harness import Harness, Settings

    block = bench_block(sizes, variants)
    config = {"experiments": {"matmul": block}}
    session = open_session(0)
    exp = mm.Matmul()
    ctx = RunContext(gpu=session, harness=Harness(Settings(budget_s=budget_s)),
                     rng=np.random.default_rng(0), config=config, block=block)
    rows = []
    for point in exp.points(block):
        p = point.params
        rec = {"size": mm.size_label(p["m"], p["k"], p["n"]), "variant": point.variant,
               "config": mm.variant_label({"variant": point.variant}
                                          | {f"p_{k}": v for k, v in p.items()}),
               "params": p, "tflops": math.nan, "error": math.nan, "correct": False}
        try:
            res = exp.measure(ctx, point)
        except Skipped as exc:
            rows.append(rec | {"status": "skipped", "reason": str(exc)})
            continue
        med = res.timing.stats()["median"]
        rec |= {"status": "ok", "time_s": med, "tflops": res.flops / med / 1e12,
                "error": res.check.error, "correct": res.check.passed,
                "timer": res.timing.timer, "metrics": res.metrics}
        rows.append(rec)
        print(f"  {rec['size']} {rec['config']}: {rec['tflops']:.2f} TFLOP/s", file=sys.stderr)
    return with_pct_of_cublas(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", type=parse_size,
                    default=[parse_size(s) for s in DEFAULT_SIZES])
    ap.add_argument("--variants", nargs="+", choices=STEPS, default=STEPS)
    ap.add_argument("--budget", type=float, default=0.5, help="harness budget per point (s)")
    ap.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = ap.parse_args(argv)
    rows = run(args.sizes, args.variants, args.budget)
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=float))
    return 0 if all(r["correct"] for r in rows if r["status"] == "ok") else 1


if __name__ == "__main__":
    sys.exit(main())
