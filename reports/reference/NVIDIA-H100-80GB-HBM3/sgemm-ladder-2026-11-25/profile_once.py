#!/usr/bin/env python3
"""One launch of matmul_pipelined per pipe tile of TILES.json, then one cuBLAS SGEMM, at
4096, through the experiment's own compile and launch geometry: for ncu.

  ncu -k regex:'matmul_pipelined|gemm' ... python profile_once.py TILES.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("CUDALAB_ROOT") or Path(__file__).resolve().parents[4])
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from cudalab.experiments import matmul as mm  # noqa: E402
from cudalab.experiments.base import Point  # noqa: E402
from cudalab.gpu import open_session  # noqa: E402


def main() -> None:
    tiles = json.loads(Path(sys.argv[1]).read_text())
    gpu, n = open_session(0), 4096
    cuda = gpu.cuda
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (n, n)).astype(np.float32) for _ in range(2))
    a_d, b_d, c_d = (cuda.mem_alloc(a.nbytes) for _ in range(3))
    cuda.memcpy_htod(a_d, a)
    cuda.memcpy_htod(b_d, b)
    for t in tiles:
        p = Point("matmul", "pipelined", {"m": n, "k": n, "n": n} | t)
        f = gpu.compile(mm.kernel_source(p), mm.kernel_defines(p)).function("matmul_pipelined")
        f.prepare("PPPiii")
        grid, block = mm.launch_geometry(p)
        f.prepared_call(grid, block, a_d, b_d, c_d, n, n, n)
        gpu.synchronize()
        print("launched", t, flush=True)
    launch, _, sync, _ = mm._cublas_launcher(gpu, a_d, b_d, c_d, n, n, n)
    launch()
    sync()


if __name__ == "__main__":
    main()
