#!/usr/bin/env python3
"""One launch of matmul_pipelined per pipe tile of TILES.json, then one cuBLAS SGEMM, at
4096, through the experiment's own compile and launch geometry: for ncu.

  ncu -k regex:'matmul_pipelined|gemm' ... python tools/sgemm_ladder/profile_once.py TILES.json

The cudalab imported is the one installed or on PYTHONPATH (the sgemm-ladder reference,
reports/reference/NVIDIA-H100-80GB-HBM3/sgemm-ladder-2026-11-25/, was profiled with it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from cudalab.experiments import matmul as mm
from cudalab.experiments.base import Point
from cudalab.gpu import open_session


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
