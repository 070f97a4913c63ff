#!/usr/bin/env python3
"""What a short kernel's time is made of, measured five ways (issue 8), on a GPU machine.

For vector_add at 50 000 and 2^20 elements (256 threads) and the course's tiled matmul
160x240 . 240x320 (tile 16), prints in microseconds:

  host __call__      host time of one launch from Python through Function.__call__
  host prepared      host time of one launch through prepared_call
  one launch         CUDA events around a single launch on an idle stream
  back-to-back       events around 16 launches issued one by one, per launch
  queued             events around 256 launches queued behind a held stream, per launch
  harness            what the harness records (asynchronous=True: queued, calibrated batch)
  ncu                Nsight Compute's gpu__time_duration.sum, median of 20 launches (run with
                     --cache-control none --clock-control none: warm caches and the clocks
                     as found, as the harness measures; ncu locks base clocks by default)

  python scripts/bench_launch.py [--json out.json] [--no-ncu]
  python scripts/bench_launch.py --launch vector_add_50000 --count 20   # ncu's target

Nothing here changes GPU settings.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

PROBES = ["vector_add_50000", "vector_add_1048576", "matmul_tiled_160x240x320_t16"]
NCU_UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3,
             "ms": 1e-3, "second": 1.0, "s": 1.0}


@dataclass
class Probe:
    kernel: str  # the function name (ncu -k)
    func: Any
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple[Any, ...]  # typed, for Function.__call__
    launch: Callable[[], None]  # prepared_call on the default stream
    keep: Any = None  # device buffers, alive as long as the probe


def setup(session: Any, name: str) -> Probe:
    """A ready-to-launch kernel of `name` (one of PROBES) with random inputs."""
    cuda = session.cuda
    rng = np.random.default_rng(0)
    if name.startswith("vector_add_"):
        n = int(name.rsplit("_", 1)[1])
        bufs = [cuda.to_device(rng.random(n, dtype=np.float32)) for _ in range(2)]
        bufs.append(cuda.mem_alloc(4 * n))
        func = session.compile("vector_add/vector_add.cu").function("vector_add")
        func.prepare("PPPi")
        grid, block = ((n + 255) // 256, 1), (256, 1, 1)
        args = (*bufs, np.int32(n))
        return Probe("vector_add", func, grid, block, args,
                     lambda: func.prepared_call(grid, block, *bufs, n), bufs)
    if name == "matmul_tiled_160x240x320_t16":
        from cudalab.experiments.base import Point
        from cudalab.experiments.matmul import kernel_defines, launch_geometry

        m, k, n = 160, 240, 320
        point = Point("matmul", "tiled", {"m": m, "k": k, "n": n, "tile": 16})
        bufs = [cuda.to_device(rng.random(s, dtype=np.float32)) for s in ((m, k), (k, n))]
        bufs.append(cuda.mem_alloc(4 * m * n))
        func = session.compile("matmul/matmul.cu", kernel_defines(point)).function("matmul_tiled")
        func.prepare("PPPiii")
        grid, block = launch_geometry(point)
        args = (*bufs, np.int32(m), np.int32(n), np.int32(k))
        return Probe("matmul_tiled", func, grid, block, args,
                     lambda: func.prepared_call(grid, block, *bufs, m, n, k), bufs)
    raise SystemExit(f"error: unknown kernel {name!r}; choose from {', '.join(PROBES)}")


def ncu_times(name: str, count: int = 20) -> list[float] | str:
    """Nsight Compute's gpu__time_duration.sum of `count` launches, seconds each; or why
    there are none (no ncu, no permission to read the counters)."""
    ncu = shutil.which("ncu")
    if not ncu:
        return "ncu (Nsight Compute) is not on PATH"
    probe = setup_kernel_name(name)
    cmd = [ncu, "--csv", "--metrics", "gpu__time_duration.sum", "--cache-control", "none",
           "--clock-control", "none", "-k", probe, "-c", str(count), sys.executable,
           str(Path(__file__).resolve()), "--launch", name, "--count", str(count)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    if "ERR_NVGPUCTRPERM" in out:
        return "ncu may not read the GPU counters here (ERR_NVGPUCTRPERM)"
    times = parse_ncu_csv(r.stdout)
    if not times:
        return f"ncu reported no gpu__time_duration (exit {r.returncode}): {out[-600:]}"
    return times


def setup_kernel_name(name: str) -> str:
    return "vector_add" if name.startswith("vector_add_") else "matmul_tiled"


def parse_ncu_csv(text: str) -> list[float]:
    """gpu__time_duration.sum values (seconds) from `ncu --csv` output."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    out = []
    for row in csv.DictReader(lines):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            value = float(row["Metric Value"].replace(",", ""))
            out.append(value * NCU_UNITS[row.get("Metric Unit", "nsecond").strip()])
    return out


def launch_only(name: str, count: int) -> None:
    """ncu's target: `count` plain launches of the kernel, nothing else timed."""
    from cudalab.gpu import open_session

    s = open_session(0)
    p = setup(s, name)
    for _ in range(count):
        p.launch()
    s.synchronize()


def measure(session: Any, name: str) -> dict[str, float]:
    """Every way of timing one probe, seconds per launch."""
    from cudalab.harness import Harness, Settings

    p = setup(session, name)
    for _ in range(10):
        p.launch()
    out = session.launch_costs(p.func, p.grid, p.block, p.args, p.launch, reps=200)
    plain = session.event_timer()
    queued, why = session.queued_timer()
    if queued is None:
        raise SystemExit(f"error: queued timing unavailable: {why}")
    out["back_to_back_s"] = statistics.median(plain.time(p.launch, 16) / 16 for _ in range(50))
    out["queued_s"] = statistics.median(queued.time(p.launch, 256) / 256 for _ in range(50))
    t = Harness(Settings()).measure(p.launch, plain, asynchronous=True)
    out["harness_s"] = t.stats()["median"]
    out["harness_batch"] = t.batch
    out["harness_cv"] = t.stats()["cv"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launch", help="only launch this kernel --count times (for ncu)")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    if a.launch:
        launch_only(a.launch, a.count)
        return 0
    from cudalab.gpu import open_session

    session = open_session(0)
    cols = ["host_call_s", "host_prepared_call_s", "one_launch_s", "back_to_back_s",
            "queued_s", "harness_s", "ncu_s"]
    print(f"{session.info['gpu_name']}, all in us per launch")
    print(f"{'kernel':30s}" + "".join(f"{c[:-2]:>16s}" for c in cols))
    rows = {}
    for name in PROBES:
        r = measure(session, name)
        ncu = ncu_times(name) if not a.no_ncu else "not run (--no-ncu)"
        r["ncu_s"] = statistics.median(ncu) if isinstance(ncu, list) else float("nan")
        r["ncu_note"] = "" if isinstance(ncu, list) else ncu
        rows[name] = r
        print(f"{name:30s}" + "".join(f"{1e6 * r[c]:16.2f}" for c in cols)
              + (f"   ({r['ncu_note']})" if r["ncu_note"] else ""))
    if a.json:
        Path(a.json).write_text(json.dumps({"gpu": session.info, "probes": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
