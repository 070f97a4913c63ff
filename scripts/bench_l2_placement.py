#!/usr/bin/env python3
"""Does a one-thread L2 chase's latency depend on where its chain lies? (issue 8), on a GPU.

The latency experiment's `global_cg` chase at 1 KiB (8 cache lines) reads about 12 % longer
under Nsight Compute than in the timed run, and the kernel's own %globaltimer says the loads
themselves were slower there (cudalab/timing_report.py: the own-timer ratio). This script
walks the same chain from fresh allocations in ONE process (a spacer allocation of random
size before each moves it) and prints the kernel's own ns per load for each allocation: if
it moves with the allocation while the launches of one allocation agree, the L2 slices that
a few lines land in set the latency, and another process (ncu's child) may read another
value for the same chain.

  python scripts/bench_l2_placement.py [--allocations 24] [--sizes 1024 8192 65536]
                                       [--out PREFIX]     (PREFIX.txt: the printout)

Nothing here changes GPU settings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

STRIDE = 128  # one node per cache line, as the default grid
STEPS = 16384  # timed loads per launch, as the default grid


def spread(ns_per_alloc: list[float], launch_spread_ns: list[float]) -> dict[str, float]:
    """What the allocations' latencies say: min, median, max, max / min, and the largest
    spread (max - min) of one allocation's own launches."""
    v = np.asarray(ns_per_alloc, dtype=float)
    return {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max()),
            "max_over_min": float(v.max() / v.min()),
            "launch_spread": float(max(launch_spread_ns, default=0.0))}


def measure(sizes: list[int], allocations: int, seed: int = 1) -> list[str]:
    from cudalab.experiments.latency import ChainData, Chaser, make_chain
    from cudalab.gpu import open_session

    gpu = open_session(0)
    kernel = gpu.compile("latency/latency.cu")
    rng = np.random.default_rng(seed)
    lines = [f"{gpu.info['gpu_name']}: global_cg chase, {STEPS} loads per launch, "
             f"{allocations} allocations per working set, one process"]
    spacers = []  # kept alive, so every chain lands somewhere new
    for ws in sizes:
        chain = ChainData(make_chain(ws // STRIDE, rng), STRIDE)
        ns, launch_spread = [], []
        for _ in range(allocations):
            spacers.append(gpu.cuda.mem_alloc(int(rng.integers(1, 64)) * 4096))
            c = Chaser(gpu, kernel, "global_cg", chain, STEPS, capacity=16)
            try:
                for _ in range(8):  # 3 warm-up launches, 5 read
                    c.launch(chain.n)
                recs, _ = c.records()
            finally:
                c.free()
            per_load = recs[-5:, 3].astype(float) / STEPS
            ns.append(float(np.median(per_load)))
            launch_spread.append(float(np.ptp(per_load)))
        s = spread(ns, launch_spread)
        lines.append(f"{ws:>8} B ({chain.n} lines): ns per load min {s['min']:.1f}, median "
                     f"{s['median']:.1f}, max {s['max']:.1f} (max / min {s['max_over_min']:.3f});"
                     f" one allocation's 5 launches agree within {s['launch_spread']:.2f} ns")
        lines.append("    " + " ".join(f"{x:.1f}" for x in ns))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocations", type=int, default=24)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192, 65536])
    ap.add_argument("--out", help="write PREFIX.txt too")
    a = ap.parse_args(argv)
    bad = [s for s in a.sizes if s < 2 * STRIDE or s % STRIDE]
    if bad or a.allocations < 2:
        ap.error(f"--sizes must be multiples of {STRIDE} of at least {2 * STRIDE} bytes "
                 f"(got {bad}) and --allocations at least 2")
    text = "\n".join(measure(a.sizes, a.allocations))
    print(text)
    if a.out:
        Path(f"{a.out}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
