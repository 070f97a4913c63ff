#!/usr/bin/env python3
"""SGEMM tuning of the ladder's cp.async rung (cuda/matmul/matmul_pipeline.cu) against cuBLAS SGEMM,
both in one process, at 4096.

  python tools/sgemm_tune.py build DIR [SWEEP]   # no GPU: nvcc each candidate to DIR/*.cubin
  python tools/sgemm_tune.py run DIR [OUT.json]  # GPU (CuPy): check, time, print a table
  python tools/sgemm_tune.py measure [OUT.json]  # GPU (pycuda): config.yaml's pipe tiles
                                                 # through the matmul experiment's measure()

build compiles with the options GpuSession.compile passes (-O3 -lineinfo, sm_90 for the
H100) and writes DIR/index.json (defines, registers, spills). run needs only CuPy and numpy:
every kernel's output is poisoned (NaN) and checked against a float64 product (cuBLAS DGEMM
on float64 copies) before it is timed. Timing: CUDA events around REPS back-to-back launches,
cuBLAS and the kernel alternating ROUNDS times, the median of each; the ratio of the two
medians is the kernel's share of cuBLAS, measured with the clocks of the same seconds. The
leaders are timed again, longer, and checked on odd sizes.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "cuda" / "matmul/matmul_pipeline.cu"
KERNEL = "matmul_pipelined"
TOL = 1e-4  # the matmul experiment's float32 tolerance (rel. Frobenius error)
ODD_SIZES = [(257, 263, 251), (1000, 1000, 1000), (4100, 4100, 4100), (160, 240, 320),
             (5, 7, 3)]

# (bm, bn, bk, wm, wn, wtm, threads): the search's leaders of the 2026-11-25 notes and their
# neighbours with more outputs per thread or more threads
TILES = [(64, 128, 16, 32, 64, 4, 128), (128, 64, 16, 64, 32, 8, 128),
         (128, 128, 16, 64, 64, 4, 128), (128, 128, 16, 32, 64, 4, 256),
         (256, 128, 16, 64, 64, 4, 256), (128, 256, 16, 64, 64, 4, 256),
         (64, 128, 32, 32, 64, 4, 128), (64, 128, 8, 32, 64, 4, 128),
         (128, 128, 8, 64, 64, 4, 128)]
SMEM = 48 * 1024  # static shared memory of a block
# the rung's default before this search: timed again beside the leaders
BASELINE = {"bm": 64, "bn": 128, "bk": 16, "wm": 32, "wn": 64, "wtm": 4, "stages": 2,
            "threads": 128}
OFF = {"fragdb": 0, "minb": 1, "korder": 0, "slab": 0, "group": 0}


def is_baseline(p: dict[str, int]) -> bool:
    """p is BASELINE, its tuning keys at their defaults (OFF)."""
    return {k: v for k, v in p.items() if OFF.get(k, -1) != v} == BASELINE


def sweep1() -> list[dict[str, int]]:
    """Tiles, stages, register double buffering (fragdb) with register caps (minb), and L2
    rasterisation (group)."""
    out = []
    for (bm, bn, bk, wm, wn, wtm, th), st, fd in itertools.product(TILES, range(2, 7), (0, 1)):
        if st * 4 * bk * (bm + bn) > SMEM or (st > 4 and bk > 8):
            continue
        base = {"bm": bm, "bn": bn, "bk": bk, "wm": wm, "wn": wn, "wtm": wtm, "stages": st,
                "threads": th, "fragdb": fd}
        # register caps that keep 3 (or 2) blocks of 128 threads on an SM
        caps = [1, 2, 3] if fd and th == 128 and wm * wn // 32 == 64 else [1]
        out += [base | {"minb": mb} for mb in caps]
    # L2 rasterisation: 8 block rows at a time, on the register-buffered 16-deep tiles
    out += [c | {"group": 8} for c in out if c["bk"] == 16 and c["fragdb"] and
            c["stages"] <= 3 and (c["bm"], c["bn"]) in ((64, 128), (128, 128))]
    return out


def _tile(bm, bn, bk, wm, wn, wtm, th, st, **kw) -> dict[str, int]:
    return {"bm": bm, "bn": bn, "bk": bk, "wm": wm, "wn": wn, "wtm": wtm, "stages": st,
            "threads": th, "fragdb": 0, "minb": 1} | kw


def sweep2() -> list[dict[str, int]]:
    """Around sweep 1's leaders: the FFMA order (korder), k depth 32 in 16-deep slabs (slab).
    (As run on 2026-11-26 it also had TUNROLL 2, an unroll pragma since removed.)"""
    out = []
    for (bk, st, slab), ko in itertools.product(((16, 2, 0), (16, 4, 0), (32, 2, 1)),
                                                (0, 1, 2)):
        t = _tile(64, 128, bk, 32, 64, 4, 128, st) | ({"slab": 1} if slab else {})
        out.append(t | {"korder": ko})
        if ko != 1:
            out += [t | {"korder": ko, "fragdb": 1, "minb": mb} for mb in (1, 3)]
    for (bm, bn), ko in itertools.product(((256, 128), (128, 256)), (0, 1, 2)):
        out.append(_tile(bm, bn, 16, 64, 64, 4, 256, 2, korder=ko))
    out += [_tile(128, 64, 32, 64, 32, 8, 128, 2, slab=1),
            _tile(128, 64, 32, 64, 32, 8, 128, 2, slab=1, fragdb=1)]
    return out


def sweep3() -> list[dict[str, int]]:
    """Sweep 2's leaders and the rung's old default, measured again."""
    return [_tile(128, 256, 16, 64, 64, 4, 256, 2, korder=2),
            _tile(256, 128, 16, 64, 64, 4, 256, 2, korder=2),
            _tile(64, 128, 16, 32, 64, 4, 128, 2, korder=2),
            _tile(64, 128, 16, 32, 64, 4, 128, 4, korder=2),
            _tile(64, 128, 32, 32, 64, 4, 128, 2, korder=2, slab=1, fragdb=1, minb=3),
            _tile(64, 128, 16, 32, 64, 4, 128, 2)]


SWEEPS = {"1": sweep1, "2": sweep2, "3": sweep3}


def defines(c: dict[str, int]) -> dict[str, int]:
    """nvcc -D defines of a candidate (the ladder's kernel_defines plus the tuning keys)."""
    return {("NTHREADS" if k == "threads" else k.upper()): v for k, v in c.items()}


def build_one(out: Path, c: dict[str, int]) -> dict[str, Any]:
    d = defines(c)
    name = "_".join(f"{k}{v}" for k, v in sorted(c.items()))
    cub = out / f"pipe_{name}.cubin"
    cmd = ["nvcc", "-cubin", "-arch=sm_90", "-O3", "-lineinfo", "-Xptxas", "-v", "-o",
           str(cub), *[f"-D{k}={v}" for k, v in sorted(d.items())], str(SOURCE)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    info: dict[str, Any] = {"cubin": cub.name, "params": c, "ok": r.returncode == 0}
    m = re.search(rf"Compiling entry function '{KERNEL}'.*?Used (\d+) registers", r.stderr, re.S)
    sp = re.search(rf"Compiling entry function '{KERNEL}'.*?(\d+) bytes spill stores",
                   r.stderr, re.S)
    info["regs"] = int(m.group(1)) if m else -1
    info["spill"] = int(sp.group(1)) if sp else -1
    if not info["ok"]:
        info["err"] = r.stderr[-600:]
    return info


def build(out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cands = SWEEPS[name]()
    with ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        index = list(ex.map(lambda c: build_one(out, c), cands))
    (out / "index.json").write_text(json.dumps(index, indent=1))
    bad = [x for x in index if not x["ok"] or x["spill"]]
    for x in bad:
        print("failed or spilled:", x["params"], x.get("err", f"spill {x['spill']}"))
    print(f"{len(index)} kernels in {out}, {len(bad)} failed or spilled")


# -- on the GPU -----------------------------------------------------------------------------
def _launcher(cp: Any, mods: dict, e: dict, a: Any, b: Any, c: Any, m: int, k: int, n: int):
    if e["cubin"] not in mods:
        mods[e["cubin"]] = cp.RawModule(path=str(e["cubin"]))
    f = mods[e["cubin"]].get_function(KERNEL)
    p = e["params"]
    grid = ((n + p["bn"] - 1) // p["bn"], (m + p["bm"] - 1) // p["bm"], 1)
    args = (a, b, c, cp.int32(m), cp.int32(n), cp.int32(k))
    return lambda: f(grid, (p["threads"], 1, 1), args)


def _cublas(cp: Any, a: Any, b: Any, c: Any):
    """cuBLAS SGEMM in plain FP32 (CUBLAS_DEFAULT_MATH: no TF32)."""
    import cupy.cublas
    from cupy_backends.cuda.libs import cublas

    cublas.setMathMode(cp.cuda.device.get_cublas_handle(), cublas.CUBLAS_DEFAULT_MATH)
    return lambda: cupy.cublas.gemm("N", "N", a, b, out=c)


def _seconds(cp: Any, fn, reps: int) -> float:
    s, t = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for _ in range(reps):
        fn()
    t.record()
    t.synchronize()
    return cp.cuda.get_elapsed_time(s, t) * 1e-3 / reps


def paired(cp: Any, kernel, cublas, rounds: int, reps: int) -> tuple[float, float]:
    """Median seconds of the kernel and of cuBLAS, timed alternately (one warm-up each)."""
    kernel()
    cublas()
    ks, cs = [], []
    for _ in range(rounds):
        cs.append(_seconds(cp, cublas, reps))
        ks.append(_seconds(cp, kernel, reps))
    return sorted(ks)[rounds // 2], sorted(cs)[rounds // 2]


def _err(cp: Any, c: Any, ref: Any) -> float:
    if bool(cp.isnan(c).any()):
        return float("nan")
    return float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))


def check_odd(cp: Any, mods: dict, e: dict) -> float:
    """The worst error over ODD_SIZES (edge blocks, K and N no multiple of the tile), fresh
    random inputs for each."""
    worst = 0.0
    rng = cp.random.default_rng(1)
    for m, k, n in ODD_SIZES:
        a = rng.random((m, k), dtype=cp.float32) * 2 - 1
        b = rng.random((k, n), dtype=cp.float32) * 2 - 1
        c = cp.full((m, n), cp.nan, cp.float32)
        _launcher(cp, mods, e, a, b, c, m, k, n)()
        err = _err(cp, c, a.astype(cp.float64) @ b.astype(cp.float64))
        worst = err if err != err else max(worst, err)
    return worst


def _row(e: dict, err: float, ks: float, cs: float, n: int) -> dict[str, Any]:
    fl = 2.0 * n ** 3
    return {"params": e["params"], "regs": e["regs"], "err": err, "s": ks, "cublas_s": cs,
            "tflops": fl / ks / 1e12, "cublas_tflops": fl / cs / 1e12, "pct": 100 * cs / ks}


def run(d: Path, out_json: Path | None, n: int = 4096, leaders: int = 8) -> None:
    import cupy as cp

    index = [dict(x, cubin=d / x["cubin"]) for x in json.loads((d / "index.json").read_text())
             if x["ok"] and x["spill"] == 0]
    rng = cp.random.default_rng(0)
    a = rng.random((n, n), dtype=cp.float32) * 2 - 1
    b = rng.random((n, n), dtype=cp.float32) * 2 - 1
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    c = cp.empty((n, n), cp.float32)
    cub = _cublas(cp, a, b, c)
    for _ in range(300):  # about a second of SGEMM: clocks and power settle first
        cub()
    c.fill(cp.nan)
    cub()
    cub_err = _err(cp, c, ref)
    mods: dict = {}
    rows = []
    for e in index:
        fn = _launcher(cp, mods, e, a, b, c, n, n, n)
        c.fill(cp.nan)
        fn()
        err = _err(cp, c, ref)
        ks, cs = paired(cp, fn, cub, 5, 10) if err < TOL else (float("nan"), float("nan"))
        rows.append(_row(e, err, ks, cs, n))
    rows.sort(key=lambda r: -r["pct"] if r["pct"] == r["pct"] else 0)
    again = rows[:leaders] + [r for r in rows[leaders:] if is_baseline(r["params"])]
    for r in again:  # again, longer, and on odd sizes
        e = next(x for x in index if x["params"] == r["params"])
        ks, cs = paired(cp, _launcher(cp, mods, e, a, b, c, n, n, n), cub, 9, 20)
        r["again"] = _row(e, r["err"], ks, cs, n)
        r["odd_err"] = check_odd(cp, mods, e)
    res = {"n": n, "cublas_err": cub_err, "rows": rows}
    if out_json:
        out_json.write_text(json.dumps(res, indent=1, default=str))
    print(table(rows, cub_err, leaders))


def table(rows: list[dict], cub_err: float, leaders: int) -> str:
    keys = ("bm", "bn", "bk", "wm", "wn", "wtm", "stages", "threads", "fragdb", "minb", "korder",
            "slab", "group")
    lines = [f"cuBLAS SGEMM error {cub_err:.1e}; % = cuBLAS median / kernel median, same rounds",
             f"{'tile':<48}{'regs':>5}{'TFLOP/s':>9}{'cuBLAS':>8}{'%':>7}"
             f"{'again':>8}{'cuBLAS':>8}{'%':>7}  err / odd sizes"]
    shown = rows[:max(leaders, 30)]
    for r in shown + [r for r in rows if is_baseline(r["params"]) and r not in shown]:
        p = r["params"]
        t = " ".join(f"{k}{p[k]}" for k in keys if k in p)
        ag = r.get("again")
        more = (f"{ag['tflops']:>8.2f}{ag['cublas_tflops']:>8.2f}{ag['pct']:>6.1f}%"
                if ag else " " * 23)
        odd = f" / {r['odd_err']:.1e}" if "odd_err" in r else ""
        lines.append(f"{t:<48}{r['regs']:>5}{r['tflops']:>9.2f}{r['cublas_tflops']:>8.2f}"
                     f"{r['pct']:>6.1f}%{more}  {r['err']:.1e}{odd}")
    return "\n".join(lines)


def measure(out_json: Path | None, n: int = 4096) -> None:
    """The pipelined rung at n through the matmul experiment's own measure() (pycuda, the
    harness's timing, the float64 CPU check), on config.yaml's pipe tiles and BASELINE, with
    dbuf and cuBLAS in the same process: scripts/bench_matmul_ladder.py's run()."""
    import importlib.util

    import yaml

    from cudalab.experiments import matmul as mm

    tiles = yaml.safe_load((ROOT / "config.yaml").read_text())["experiments"]["matmul"][
        "pipe_tiles"]
    mm.DEFAULT_PIPE_TILES[:] = tiles + [BASELINE]  # the schema's default: this very list
    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" /
                                                  "bench_matmul_ladder.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.run([n], ["dbuf", "pipelined", "cublas"], 1.0)
    print(bench.format_table(rows))
    if out_json:
        out_json.write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "2")
    elif sys.argv[1] == "run":
        run(Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    elif sys.argv[1] == "measure":
        measure(Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    else:
        sys.exit(__doc__)
