#!/usr/bin/env python3
"""The ladder's last steps at 4096 through the experiment's own measure() (pycuda, the
harness's queued event timing, the float64 check), cuBLAS SGEMM in the same process:
scripts/bench_matmul_ladder.py's run() with the pipe tiles set to the leaders of a tile
search (autotune.py run's JSON), or to the defaults.

  python run_ladder.py [AUTOTUNE.json | TILES.json] OUT.json

TILES.json: a list of pipe tiles (the optional korder too). Every module is
compiled first, in parallel, into pycuda's cache.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

from cudalab.experiments import matmul as mm

# CUDALAB_ROOT: a clean copy of the project to run from (default: this checkout); the
# cudalab imported is the one installed or on PYTHONPATH (PYTHONPATH=$CUDALAB_ROOT for the copy's)
ROOT = Path(os.environ.get("CUDALAB_ROOT") or Path(__file__).resolve().parents[2])

VARIANTS = os.environ.get("LADDER_VARIANTS", "dbuf warptile pipelined swizzled cublas").split()


def leaders(autotune_json: Path, n: int = 3) -> list[dict[str, int]]:
    """The n fastest pipe tiles of the search (either kernel, plain FFMA order)."""
    rows = json.loads(autotune_json.read_text())["rows"]
    out: list[dict[str, int]] = []
    for r in sorted(rows, key=lambda r: -r["tflops"] if math.isfinite(r["tflops"]) else 0):
        p = r["params"]
        if r["kernel"] in ("matmul_pipelined", "matmul_swizzled") and "korder" not in p:
            t = {k: int(p[k]) for k in mm.PIPE_KEYS}
            if t not in out:
                out.append(t)
        if len(out) == n:
            break
    return out


def prewarm(block: dict) -> None:
    """Compile every kernel module of the block into pycuda's cache, in parallel (the
    options exactly as GpuSession.compile passes them, the arch of the device: sm_90)."""
    from concurrent.futures import ThreadPoolExecutor

    from pycuda.compiler import compile as nvcc

    from cudalab.gpu import CUDA_DIR

    mods = {(mm.kernel_source(p), tuple(sorted(mm.kernel_defines(p).items())))
            for p in mm.Matmul().points(block) if p.variant not in ("cublas", "cpu")}

    def one(m):
        opts = ["-O3", "-lineinfo"] + [f"-D{k}={v}" for k, v in m[1]]
        nvcc((CUDA_DIR / m[0]).read_text(), options=opts, no_extern_c=True, arch="sm_90",
             include_dirs=[str(CUDA_DIR)])

    with ThreadPoolExecutor(16) as ex:
        list(ex.map(one, mods))


def main() -> int:
    *src, dst = sys.argv[1:]
    if src:
        got = json.loads(Path(src[0]).read_text())
        mm.DEFAULT_PIPE_TILES[:] = got if isinstance(got, list) else leaders(Path(src[0]))
    mm.DEFAULT_WARP_TILES[:] = mm.DEFAULT_WARP_TILES[2:3]  # the fastest at 4096 (ladder.txt)
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" /
                                                  "bench_matmul_ladder.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    prewarm(bench.bench_block([4096], VARIANTS))
    rows = bench.run([4096], VARIANTS, 1.0)
    print("pipe tiles:", mm.DEFAULT_PIPE_TILES)
    print(f"{'variant':<10}{'params':<70}{'TFLOP/s':>8}{'% cuBLAS':>9}  error")
    for r in rows:
        p = {k: v for k, v in r["params"].items() if k not in ("m", "k", "n")}
        print(f"{r['variant']:<10}{json.dumps(p):<70}{r['tflops']:>8.2f}"
              f"{r['pct_cublas']:>8.1f}%  {r['error']:.1e} {r.get('timer', '')}")
    Path(dst).write_text(json.dumps(rows, indent=1, default=float))
    return 0 if all(r["correct"] for r in rows if r["status"] == "ok") else 1


if __name__ == "__main__":
    sys.exit(main())
