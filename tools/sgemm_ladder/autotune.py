#!/usr/bin/env python3
"""SGEMM tile search for the ladder's cp.async rungs (cuda/matmul_pipeline.cu), against
dbuf / warptile (cuda/matmul_ladder.cu) and cuBLAS SGEMM in the same process.

  python autotune.py build DIR          # compile every candidate to DIR/*.cubin (nvcc, no GPU)
  python autotune.py run DIR OUT.json   # GPU: check each against float64, time at 4096
  python autotune.py profile DIR CFG    # GPU, under ncu: one launch of each listed kernel

Timing: CUDA events around 10 back-to-back launches, 7 repeats, the median; inputs uniform
random float32; each kernel's output is poisoned (NaN) and checked against a float64 product
(cuBLAS DGEMM on float64 copies) before it is timed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# CUDALAB_ROOT: a clean copy of the project to run from (default: this checkout); the
# cudalab imported is the one installed or on PYTHONPATH (PYTHONPATH=$CUDALAB_ROOT for the copy's)
ROOT = Path(os.environ.get("CUDALAB_ROOT") or Path(__file__).resolve().parents[2])
CUDA = ROOT / "cuda" / "matmul"  # the matmul lesson's kernels
KEYS = ("bm", "bn", "bk", "wm", "wn", "wtm", "stages", "threads")


def candidates() -> list[dict[str, int]]:
    """The second search: the shapes that led the first one, k depth 16 or 32, 2-4 stages,
    both FFMA orders for the 128-thread tiles."""
    out = []
    for bm, bn in [(128, 128), (128, 64), (64, 128), (128, 256), (256, 128)]:
        for wm, wn in [(32, 64), (64, 32), (64, 64)]:
            if bm % wm or bn % wn:
                continue
            th = (bm // wm) * (bn // wn) * 32
            if th not in (128, 256):
                continue
            for wtm in (4, 8):
                if wm % wtm or wn % (4 * (32 // wtm)):
                    continue
                for bk in (16, 32):
                    for st in (2, 3, 4):
                        if st * 4 * bk * (bm + bn) <= 49152:
                            c = dict(zip(KEYS, (bm, bn, bk, wm, wn, wtm, st, th)))
                            out.append(c)
                            if th == 128 and wm * wn == 2048 and st == 2:
                                out.append(c | {"korder": 1})
    return out


def baselines() -> list[dict]:
    return [{"src": "matmul_ladder.cu", "kernels": ["matmul_dbuf"], "threads": 256,
             "bm": 128, "bn": 128, "defines": {"BM": 128, "BN": 128, "BK": 16, "TM": 8, "TN": 8}},
            {"src": "matmul_ladder.cu", "kernels": ["matmul_warptile"], "threads": 256,
             "bm": 128, "bn": 128, "defines": {"BM": 128, "BN": 128, "BK": 16, "WM": 32,
                                               "WN": 64, "WNITER": 2, "TM": 8, "TN": 4,
                                               "NTHREADS": 256}}]


def name_of(d: dict) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(d.items()))


def build_one(out: Path, src: str, defines: dict) -> dict:
    cub = out / f"{Path(src).stem}_{name_of(defines)}.cubin"
    cmd = ["nvcc", "-arch=sm_90", "-O3", "-cubin", "-Xptxas", "-v", "-o", str(cub),
           *[f"-D{k}={v}" for k, v in sorted(defines.items())], str(CUDA / src)]
    log = cub.with_suffix(".log")
    if not (cub.exists() and log.exists()):
        r = subprocess.run(cmd, capture_output=True, text=True)
        log.write_text(f"{r.returncode}\n{r.stderr}")
    rc, err = log.read_text().split("\n", 1)
    r = subprocess.CompletedProcess(cmd, int(rc), "", err)
    info: dict = {"cubin": cub.name, "ok": r.returncode == 0}
    for fn, body in re.findall(r"Compiling entry function '(\w+)'.*?\n(.*?)(?=Compiling|\Z)",
                               r.stderr, re.S):
        regs = re.search(r"Used (\d+) registers", body)
        spill = re.search(r"(\d+) bytes spill stores", body)
        info[fn] = {"regs": int(regs.group(1)) if regs else -1,
                    "spill": int(spill.group(1)) if spill else -1}
    if not info["ok"]:
        info["err"] = r.stderr[-400:]
    return info


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for c in candidates():
        d = {k.upper(): v for k, v in c.items() if k != "threads"} | {"NTHREADS": c["threads"]}
        jobs.append(("matmul_pipeline.cu", d, c, ["matmul_pipelined", "matmul_swizzled"]))
    for b in baselines():
        jobs.append((b["src"], b["defines"], b, b["kernels"]))
    with ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        infos = list(ex.map(lambda j: build_one(out, j[0], j[1]), jobs))
    index = []
    for (_src, d, c, kernels), info in zip(jobs, infos):
        for k in kernels:
            ki = info.get(k, {})
            index.append({"kernel": k, "cubin": info["cubin"], "ok": info["ok"],
                          "regs": ki.get("regs"), "spill": ki.get("spill"),
                          "bm": c["bm"], "bn": c["bn"], "threads": c["threads"],
                          "params": {kk: c[kk] for kk in (*KEYS, "korder") if kk in c} or d})
    (out / "index.json").write_text(json.dumps(index, indent=1))
    bad = [x for x in index if not x["ok"] or x["spill"]]
    print(f"{len(index)} kernels, {len(bad)} failed or spilled")


def _setup(n: int):
    import cupy as cp

    rng = cp.random.default_rng(0)
    a = rng.random((n, n), dtype=cp.float32) * 2 - 1
    b = rng.random((n, n), dtype=cp.float32) * 2 - 1
    return cp, a, b


def _launcher(cp, mods: dict, e: dict, a, b, c, m, k, n):
    path = e["cubin"]
    if path not in mods:
        mods[path] = cp.RawModule(path=str(path))
    f = mods[path].get_function(e["kernel"])
    grid = ((n + e["bn"] - 1) // e["bn"], (m + e["bm"] - 1) // e["bm"], 1)
    args = (a, b, c, cp.int32(m), cp.int32(n), cp.int32(k))
    return lambda: f(grid, (e["threads"], 1, 1), args)


def _cublas(cp, a, b, c):
    import cupy.cublas
    from cupy_backends.cuda.libs import cublas

    h = cp.cuda.device.get_cublas_handle()
    cublas.setMathMode(h, cublas.CUBLAS_DEFAULT_MATH)
    return lambda: cupy.cublas.gemm("N", "N", a, b, out=c)


def _time(cp, fn, reps: int = 10, rounds: int = 7) -> float:
    s, t = cp.cuda.Event(), cp.cuda.Event()
    fn()
    out = []
    for _ in range(rounds):
        s.record()
        for _ in range(reps):
            fn()
        t.record()
        t.synchronize()
        out.append(cp.cuda.get_elapsed_time(s, t) / reps)
    out.sort()
    return out[len(out) // 2] * 1e-3


def _err(cp, c, ref) -> float:
    return float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))


def _check_sizes(cp, mods, e, sizes) -> float:
    worst = 0.0
    rng = cp.random.default_rng(1)
    for m, k, n in sizes:
        a = rng.random((m, k), dtype=cp.float32) - 0.5
        b = rng.random((k, n), dtype=cp.float32) - 0.5
        c = cp.full((m, n), cp.nan, cp.float32)
        _launcher(cp, mods, e, a, b, c, m, k, n)()
        worst = max(worst, _err(cp, c, a.astype(cp.float64) @ b.astype(cp.float64)))
    return worst


def run(d: Path, out_json: str, n: int = 4096) -> None:
    index = [dict(x, cubin=d / x["cubin"]) for x in json.loads((d / "index.json").read_text())
             if x["ok"] and x["spill"] == 0]
    cp, a, b = _setup(n)
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    c = cp.empty((n, n), cp.float32)
    cub = _cublas(cp, a, b, c)
    flops = 2.0 * n ** 3
    cub_s = [_time(cp, cub)]
    mods: dict = {}
    rows = []
    for i, e in enumerate(index):
        fn = _launcher(cp, mods, e, a, b, c, n, n, n)
        c.fill(cp.nan)
        fn()
        err = _err(cp, c, ref)
        s = _time(cp, fn, 5, 5) if err < 1e-4 else float("nan")
        rows.append({k: v for k, v in e.items() if k != "cubin"} | {
            "cubin": e["cubin"].name, "err": err, "s": s, "tflops": flops / s / 1e12})
        if i % 60 == 59:
            cub_s.append(_time(cp, cub))
    c.fill(cp.nan)
    cub()
    cub_err = _err(cp, c, ref)
    cub_s.append(_time(cp, cub))
    cub_tf = flops / sorted(cub_s)[len(cub_s) // 2] / 1e12
    rows.sort(key=lambda r: -r["tflops"] if r["tflops"] == r["tflops"] else 0)
    # the leaders and the baselines again, longer, each right after cuBLAS
    again = rows[:12] + [r for r in rows[12:] if r["kernel"] in ("matmul_dbuf", "matmul_warptile")]
    for r in again:
        e = next(x for x in index if x["cubin"].name == r["cubin"] and x["kernel"] == r["kernel"])
        cub_s.append(_time(cp, cub))
        r["s"] = _time(cp, _launcher(cp, mods, e, a, b, c, n, n, n), 10, 9)
        r["tflops"] = flops / r["s"] / 1e12
    rows.sort(key=lambda r: -r["tflops"] if r["tflops"] == r["tflops"] else 0)
    odd = [(257, 263, 251), (1000, 1000, 1000), (4100, 4100, 4100), (160, 240, 320), (5, 7, 3)]
    best: dict[str, dict] = {}
    for r in rows:
        if r["kernel"] not in best and r["tflops"] == r["tflops"]:
            best[r["kernel"]] = r
    for kname, r in best.items():
        e = next(x for x in index if x["cubin"].name == r["cubin"] and x["kernel"] == kname)
        r["odd_err"] = _check_sizes(cp, mods, e, odd)
    res = {"n": n, "cublas_tflops": cub_tf, "cublas_samples_s": cub_s, "cublas_err": cub_err,
           "rows": rows, "best": best}
    Path(out_json).write_text(json.dumps(res, indent=1, default=str))
    print(f"cuBLAS SGEMM {cub_tf:.2f} TFLOP/s (err {cub_err:.1e}; samples "
          + ", ".join(f"{flops / s / 1e12:.2f}" for s in cub_s) + ")")
    print(f"{'kernel':<18}{'params':<62}{'regs':>5}{'TFLOP/s':>9}{'%cuBLAS':>8}  err")
    shown = [r for r in rows[:25]] + [r for r in best.values() if r not in rows[:25]]
    for r in shown:
        p = " ".join(f"{k}={v}" for k, v in r["params"].items())
        print(f"{r['kernel']:<18}{p:<62}{r['regs']:>5}{r['tflops']:>9.2f}"
              f"{100 * r['tflops'] / cub_tf:>7.1f}%  {r['err']:.1e}"
              + (f" odd {r['odd_err']:.1e}" if "odd_err" in r else ""))


def profile(d: Path, cfg: str, n: int = 4096) -> None:
    """One launch of each kernel of CFG (a run's JSON: its best per kernel) and of cuBLAS."""
    best = json.loads(Path(cfg).read_text())["best"]
    cp, a, b = _setup(n)
    c = cp.empty((n, n), cp.float32)
    mods: dict = {}
    for kname, r in best.items():
        e = dict(r, cubin=d / r["cubin"])
        _launcher(cp, mods, e, a, b, c, n, n, n)()
        cp.cuda.Device().synchronize()
        print("profiled", kname, r["params"], flush=True)
    _cublas(cp, a, b, c)()
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "build":
        build(Path(sys.argv[2]))
    elif mode == "run":
        run(Path(sys.argv[2]), sys.argv[3])
    elif mode == "profile":
        profile(Path(sys.argv[2]), sys.argv[3])
