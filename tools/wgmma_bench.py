"""Standalone check and timing of the wgmma rungs against cuBLAS, for a lent GPU machine:
loads cubins built off the GPU (nvcc -cubin -gencode=arch=compute_90a,code=sm_90a), checks
every kernel against the float64 product of its rounded inputs (a sample of rows; the whole
output NaN-poisoned first, so an unwritten element fails), times it with CUDA events
(median of single-launch timings) beside cublasGemmEx of the same precision.

    python3 tools/wgmma_bench.py --cubins DIR [--sizes 4096] [--smoke] [--one BUILD:RUNG ...]

DIR holds <build>.cubin files (s4: STAGES=4 WS_BN=256; s2, s3, s6: other depths; bn128:
WS_BN=128; swap: the N-major strides exchanged; mma: the mma.sync rung for comparison).
--smoke runs each (build, rung) in its own process at small sizes first (a trap or a hang
costs that process only); the main pass times those that passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PRECS = ["fp16", "bf16", "tf32", "fp16_bt"]


def ctx_and_libs():
    import cupy as cp
    import pycuda.driver as cuda

    cuda.init()
    ctx = cuda.Device(0).retain_primary_context()
    ctx.push()
    cp.cuda.Device(0).use()
    return cuda, cp


def inputs(m: int, k: int, n: int, prec: str, seed: int):
    from cudalab.experiments.tensor_cores import numerics

    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    p = "fp16" if prec == "fp16_bt" else prec
    da, db = numerics.device_input(a, p), numerics.device_input(b, p)
    return da, db, numerics.exact_values(da, p), numerics.exact_values(db, p)


def cublas_launch(cp, prec, a, b, c, m, k, n):
    from cupy_backends.cuda.libs import cublas

    dtype, compute, mode = {"fp16": (2, 68, 0), "bf16": (14, 68, 0), "tf32": (0, 77, 3),
                            "fp32": (0, 68, 0)}[prec]
    h = cp.cuda.device.get_cublas_handle()
    alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)

    def launch():
        cublas.setMathMode(h, mode)
        cublas.gemmEx(h, 0, 0, n, m, k, alpha.ctypes.data, b.data.ptr, dtype, n, a.data.ptr,
                      dtype, k, beta.ctypes.data, c.data.ptr, 0, n, compute, -1)
    return launch


def mma_launcher(cuda, mod, prec, a, b, c, m, k, n):
    """The mma.sync rung, built with BM=128 BN=256 BK=32 WM=64 WN=64 STAGES=4 (256 threads)."""
    smem = 4 * 2 * (128 * (32 + 8) + 32 * (256 + 8))
    f = mod.get_function(f"tc_mma_{prec}")
    f.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    f.prepare("PPPiii")

    def launch():
        f.prepared_call(((m // 128) * (n // 256), 1), (256, 1, 1), a.data.ptr, b.data.ptr,
                        c.data.ptr, np.int32(m), np.int32(n), np.int32(k), shared_size=smem)
    return launch


def time_it(cp, launch, reps: int = 30) -> float:
    for _ in range(3):
        launch()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        launch()
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    return float(np.median(ts))


def check(cp, launch, c, ref_rows, rows, tol):
    c.fill(np.nan)
    launch()
    cp.cuda.Device().synchronize()
    out = c.get()
    finite = bool(np.isfinite(out).all())
    sub = out[rows].astype(np.float64)
    err = float(np.linalg.norm(sub - ref_rows) / np.linalg.norm(ref_rows))
    return err, finite, (finite and err <= tol)


def run_set(builds_rungs, sizes, cubins: Path, with_cublas: bool, out_rows: list, reps: int,
            precs=PRECS) -> None:
    cuda, cp = ctx_and_libs()
    from cudalab.experiments.tensor_cores import numerics, wgmma

    sms = cuda.Device(0).get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
    mods = {}
    for (m, k, n) in sizes:
        rows = np.random.default_rng(1).choice(m, size=min(m, 96), replace=False)
        for prec in precs:
            p = "fp16" if prec == "fp16_bt" else prec
            da, db, xa, xb = inputs(m, k, n, prec, seed=m + k + n)
            ref_rows = xa[rows] @ xb
            tol = numerics.check_tolerance(k)
            a, b = cp.asarray(da), cp.asarray(db)
            c = cp.empty((m, n), np.float32)
            scratch = cp.empty((n, k), da.dtype)
            flops = 2.0 * m * n * k
            todo = []
            if with_cublas and prec != "fp16_bt":
                todo.append(("cublas", "-", cublas_launch(cp, p, a, b, c, m, k, n), {}))
            for build, rung in builds_rungs:
                if build == "mma":
                    if prec not in ("fp16", "bf16"):
                        continue
                    if build not in mods:
                        mods[build] = cuda.module_from_file(str(cubins / "mma.cubin"))
                    launch = mma_launcher(cuda, mods[build], p, a, b, c, m, k, n)
                    todo.append(("mma", "mma", launch, {}))
                    continue
                stages = {"s2": 2, "s3": 3, "s5": 5, "s6": 6}.get(build, 4)
                bn = 128 if build in ("bn128", "s6") else 256
                if rung in ("wgmma_ws", "wgmma_persist") and n % bn:
                    continue
                if wgmma.shape_problems(rung, stages, bn):
                    continue
                if build not in mods:
                    mods[build] = cuda.module_from_file(str(cubins / f"{build}.cubin"))
                try:
                    launch, facts = wgmma.launcher(
                        mods[build], rung, p, a.data.ptr, b.data.ptr, c.data.ptr, m, k, n, sms,
                        scratch_ptr=scratch.data.ptr, stages=stages, bn=bn,
                        kmajor_b=prec == "fp16_bt")
                except Exception as exc:  # noqa: BLE001
                    out_rows.append({"m": m, "k": k, "n": n, "prec": prec, "build": build,
                                     "rung": rung, "status": f"setup: {exc}"})
                    print("SETUP FAIL", build, rung, prec, exc, flush=True)
                    continue
                todo.append((rung, build, launch, facts))
            for rung, build, launch, facts in todo:
                row = {"m": m, "k": k, "n": n, "prec": prec, "build": build, "rung": rung, **facts}
                try:
                    err, finite, ok = check(cp, launch, c, ref_rows, rows, tol)
                    row |= {"err": err, "finite": finite, "ok": ok, "tol": tol}
                    if ok or rung == "cublas":
                        s = time_it(cp, launch, reps)
                        row |= {"time_s": s, "tflops": flops / s / 1e12}
                    row["status"] = "ok" if ok else "WRONG"
                except Exception as exc:  # noqa: BLE001
                    row["status"] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
                out_rows.append(row)
                print(json.dumps(row), flush=True)


def smoke(cubins: Path, pairs, timeout: int = 90) -> dict:
    """Each (build, rung) in its own process at small sizes: which passed."""
    res = {}
    for build, rung in pairs:
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, "--cubins", str(cubins), "--one",
                                f"{build}:{rung}", "--sizes", "384,192,512", "512"],
                               capture_output=True, text=True, timeout=timeout)
            rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
            tail = (p.stdout + p.stderr)[-600:] if p.returncode else ""
        except subprocess.TimeoutExpired:
            rows, tail = [], "TIMEOUT"
        by = {r["prec"]: r.get("status") for r in rows}
        res[(build, rung)] = by
        print(f"smoke {build:6} {rung:14} {time.time() - t0:5.1f}s {by} {tail}", flush=True)
    return res


def parse_sizes(vals):
    out = []
    for v in vals:
        t = [int(x) for x in v.split(",")]
        out.append(tuple(t) if len(t) == 3 else (t[0],) * 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubins", type=Path, required=True)
    ap.add_argument("--sizes", nargs="+", default=["4096"])
    ap.add_argument("--one", nargs="+", metavar="BUILD:RUNG",
                    help="check these pairs only (no cuBLAS, three timed launches)")
    ap.add_argument("--precs", default=",".join(PRECS))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--extra", nargs="*", default=[], help="BUILD:RUNG pairs for the main pass")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "wgmma.json")
    a = ap.parse_args()
    sizes = parse_sizes(a.sizes)
    rows: list = []
    precs = a.precs.split(",")
    if a.one:
        run_set([tuple(x.split(":")) for x in a.one], sizes, a.cubins, False, rows, reps=3,
                precs=precs)
        return 0
    rungs = ["wgmma_tma", "wgmma_pipe", "wgmma_ws", "wgmma_persist"]
    main_pairs = [("s4", r) for r in rungs]
    if a.smoke:
        res = smoke(a.cubins, main_pairs)
        main_pairs = [pr for pr in main_pairs if any(s == "ok" for s in res[pr].values())]
        if any(v.get("fp16") != "ok" for v in res.values()):  # the N-major strides exchanged?
            swap = smoke(a.cubins, [("swap", "wgmma_ws")])
            if swap[("swap", "wgmma_ws")].get("fp16") == "ok":
                main_pairs += [("swap", r) for r in rungs]
    main_pairs += [tuple(x.split(":")) for x in a.extra]
    run_set(main_pairs, sizes, a.cubins, True, rows, a.reps, precs)
    a.out.write_text(json.dumps(rows, indent=1))
    print("\nprec    rung           build  TFLOP/s  %cuBLAS  err       ok")
    best = {}
    for r in rows:
        if r.get("rung") == "cublas" and "tflops" in r:
            best[(r["m"], r["prec"])] = r["tflops"]
    for r in rows:
        cb = best.get((r["m"], "fp16" if r["prec"] == "fp16_bt" else r["prec"]), float("nan"))
        tf = r.get("tflops", float("nan"))
        print(f"{r['m']:5} {r['prec']:7} {r['rung']:14} {r['build']:5} {tf:8.1f} "
              f"{100 * tf / cb:7.1f}  {r.get('err', float('nan')):.2e} {r.get('status')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
