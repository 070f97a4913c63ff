"""Diagnostics of the wgmma rungs for ONE call on a lent H100/H200, every step in its own
process and time-boxed (a fault or a hang costs that step only), printed compactly:

  params    the parameter layout: the probe kernel (the rungs' parameter list) with the
            packing the rungs use, and with the first GPU run's packing (no padding)
  dump      TMA alone: k-slice 0 of a tile as the rungs load it, shared memory copied out and
            checked against the 128-byte swizzle of the expected bytes (A, B N-major, B^T)
  rung      per rung and precision: coded inputs whose products say which element of A and
            B every output got (A one-hot: C[m,n] = B[m%64, n]; B one-hot: C[m,n] =
            A[m, n%64]), then random inputs at small sizes against the float64 product,
            with a map of 16 x 16 blocks where wrong and a few tests of transposed operands
  time      4096^3: the rungs that passed, checked there too, against cuBLAS (TFLOP/s, %)
  memcheck  compute-sanitizer on one small launch of each rung (fp16, tf32); then
            racecheck if time is left

    python3 tools/wgmma_diag.py --cubins DIR [--out DIR] [--budget 225]

DIR holds the cubins prepare.sh builds (s4: STAGES=4 WS_BN=256, swap, s3, bn128, s6).
Needs pycuda, CuPy and numpy; the package cudalab on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# beside this file: a script's own folder comes first on its import path
from wgmma_bench import cublas_launch, inputs, time_it  # noqa: E402

RUNGS = ["wgmma_tma", "wgmma_pipe", "wgmma_ws", "wgmma_persist"]
PRECS = ["fp16", "bf16", "tf32", "fp16_bt"]
# (m, n, k): one tile; square (tests of transposed operands); 3 x 2 tiles of a grouped order;
# more tiles than an H100 has SMs (the persistent grid's blocks take several)
SMALL = [(128, 256, 64), (256, 256, 256), (384, 512, 192), (2048, 4096, 128)]
BUILDS = {"s4": (4, 256), "swap": (4, 256), "s3": (3, 256), "bn128": (4, 128), "s6": (6, 128)}


def say(*parts) -> None:
    print(*parts, flush=True)


def result(**kw) -> None:
    """A machine-readable line the driver process collects into results.json."""
    print("RESULT " + json.dumps(kw), flush=True)


# -- one process on the GPU ---------------------------------------------------------------
def gpu():
    import atexit

    import cupy as cp
    import pycuda.driver as cuda

    cuda.init()
    ctx = cuda.Device(0).retain_primary_context()
    ctx.push()
    atexit.register(ctx.pop)
    cp.cuda.Device(0).use()
    return cuda, cp


def base(prec: str) -> str:
    return "fp16" if prec == "fp16_bt" else prec


def run_rung(cuda, cp, mod, build, rung, prec, dev_a, dev_b, m, k, n) -> np.ndarray:
    """C (m x n, float32, NaN where unwritten) of one launch of `rung` on device-format
    inputs dev_a (m x k) and dev_b (k x n)."""
    from cudalab.experiments.tensor_cores import wgmma

    stages, bn = BUILDS[build]
    sms = cuda.Device(0).get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
    a, b = cp.asarray(dev_a), cp.asarray(dev_b)
    c = cp.full((m, n), np.nan, np.float32)
    scratch = cp.empty((n, k), dev_b.dtype)
    launch, _ = wgmma.launcher(mod, rung, base(prec), a.data.ptr, b.data.ptr, c.data.ptr, m,
                               k, n, sms, scratch_ptr=scratch.data.ptr, stages=stages, bn=bn,
                               kmajor_b=prec == "fp16_bt")
    launch()
    cp.cuda.Device().synchronize()
    return c.get()


def block_map(bad: np.ndarray, nan: np.ndarray, blk: int = 16) -> list[str]:
    """One character per blk x blk block: '.' right, 'x' wrong, 'n' unwritten (NaN)."""
    rows = []
    for i in range(0, bad.shape[0], blk):
        line = ""
        for j in range(0, bad.shape[1], blk):
            if nan[i:i + blk, j:j + blk].any():
                line += "n"
            else:
                line += "x" if bad[i:i + blk, j:j + blk].any() else "."
        rows.append(line)
    return rows


def blocks(rows: list[str]) -> str:
    chars = set("".join(rows))
    return f"all {chars.pop()}" if len(chars) == 1 else " ".join(rows)


def histogram(d: np.ndarray, mod: int, top: int = 4) -> str:
    """The most common differences got - want, taken mod `mod` into [-mod/2, mod/2)."""
    vals, counts = np.unique((d + mod // 2) % mod - mod // 2, return_counts=True)
    order = np.argsort(-counts)[:top]
    return " ".join(f"{vals[i]:+d}:{100 * counts[i] / d.size:.0f}%" for i in order)


# -- steps --------------------------------------------------------------------------------
def step_params(cuda, cp, cub: Path) -> None:
    from cudalab.experiments.tensor_cores import wgmma

    mod = cuda.module_from_file(str(cub / "s4.cubin"))
    m, k, n = 256, 512, 384
    a, b = cp.zeros((m, k), cp.float16), cp.zeros((k, n), cp.float16)
    c = cp.zeros((m, n), cp.float32)
    map_a, map_b = wgmma.tensor_maps("fp16", a.data.ptr, b.data.ptr, m, k, n, 256)
    args = (map_a, map_b, c.data.ptr, np.int32(m), np.int32(n), np.int32(k))
    sent = wgmma.params_sent(args)
    say(f"params sent: C={sent[0]:#x} M={m} N={n} K={k}")
    for fmt in (wgmma.PARAM_FORMAT, "128s128sPiii"):
        seen = wgmma.params_seen(mod, args, fmt)
        ok = seen == sent
        say(f"params {fmt:17} {'OK' if ok else 'MISMATCH'}: C={seen[0]:#x} M={seen[1]} "
            f"N={seen[2]} K={seen[3]} maps {'as sent' if seen[4:] == sent[4:] else 'differ'}")
        result(step="params", fmt=fmt, ok=ok, seen=seen, sent=sent)


def swizzle128(rows: np.ndarray) -> np.ndarray:
    """(R, 128) bytes as they lie in global memory -> their image in 128B-swizzled shared
    memory (16-byte chunk c of row r lands at chunk c ^ (r % 8), tiles 1024-byte aligned)."""
    ch = rows.reshape(rows.shape[0], 8, 16)
    out = np.empty_like(ch)
    r = np.arange(rows.shape[0])[:, None]
    out[r, np.arange(8)[None, :] ^ (r % 8)] = ch
    return out.reshape(rows.shape)


def compare_region(name: str, got: np.ndarray, plain: np.ndarray, item: int) -> bool:
    want = swizzle128(plain)
    bad = (got.reshape(-1, 16) != want.reshape(-1, 16)).any(axis=1)
    if not bad.any():
        say(f"  {name}: ok ({bad.size} chunks of 16 B)")
        return True
    unsw = (got == plain).all()
    i = int(np.argmax(bad))
    dt = np.uint16 if item == 2 else np.uint32
    g, w = got.reshape(-1, 16)[i].view(dt), want.reshape(-1, 16)[i].view(dt)
    say(f"  {name}: {bad.sum()}/{bad.size} chunks wrong{' (unswizzled copy)' if unsw else ''};"
        f" first at row {i // 8} chunk {i % 8}: got codes {list(g)} want {list(w)}")
    return False


def step_dump(cuda, cp, cub: Path) -> None:
    """Codes instead of numbers: element (r, c) of each matrix holds r * 256 + c (16-bit) or
    r * 65536 + c (32-bit), so a wrong chunk says where it came from."""
    from cudalab.experiments.tensor_cores import wgmma

    mod = cuda.module_from_file(str(cub / "s4.cubin"))
    m = k = n = 256
    for prec in ("fp16", "fp16_bt", "tf32"):
        item = 4 if prec == "tf32" else 2
        dt, shift = (np.uint32, 16) if item == 4 else (np.uint16, 8)
        bt = prec != "fp16"
        code = (np.arange(256, dtype=np.uint32)[:, None] << shift) | np.arange(256, dtype=np.uint32)
        A = code.astype(dt)
        Bm = (code + (1 if item == 2 else 0)).astype(dt)  # B (k x n), or B^T (n x k) if bt
        a, b = cp.asarray(A), cp.asarray(Bm)
        out = cp.zeros((256 * 128) // 4, cp.float32)
        map_a, map_b = wgmma.tensor_maps(base(prec), a.data.ptr, b.data.ptr, m, k, n, 128, bt)
        func = mod.get_function(f"tc_wgmma_dump_{prec}")
        func.prepare(wgmma.PARAM_FORMAT)
        wgmma.check_params(mod, (map_a, map_b, out.data.ptr, np.int32(m), np.int32(n), np.int32(k)))
        func.prepared_call((1, 1), (128, 1, 1), map_a, map_b, out.data.ptr, np.int32(m),
                           np.int32(n), np.int32(k), shared_size=(128 + 128) * 128 + 1024)
        cp.cuda.Device().synchronize()
        got = out.get().view(np.uint8).reshape(256, 128)
        e = 128 // item
        say(f"dump {prec}:")
        ok = compare_region("A (128 rows x 128 B)", got[:128], A[:128, :e].view(np.uint8), item)
        if bt:
            plain_b = Bm[:128, :e].view(np.uint8)
            ok &= compare_region("B^T (128 rows x 128 B)", got[128:], plain_b, item)
        else:
            for j in range(2):
                plain_b = np.ascontiguousarray(Bm[:e, 64 * j:64 * j + 64]).view(np.uint8)
                rows = got[128 + 64 * j:192 + 64 * j]
                ok &= compare_region(f"B box {j} ({e} k-rows x 64 n)", rows, plain_b, item)
        result(step="dump", prec=prec, ok=bool(ok))


def coded_probe(cuda, cp, mod, build, rung, prec, which: str) -> bool:
    """which='A': A one-hot (A[m,k] = k == m%64), B[k,n] = k + 64 (n%32): C[m,n] should be
    the code of (k=m%64, n%32). which='B': B one-hot (B[k,n] = k == n%64), A[m,k] = k +
    64 (m%32): C[m,n] the code of (k=n%64, m%32). Codes < 2048: exact in fp16 and tf32."""
    from cudalab.experiments.tensor_cores import numerics

    m, k, n = 128, 64, 256
    mi, ki, ni = np.arange(m)[:, None], np.arange(k)[None, :], np.arange(n)[None, :]
    if which == "A":
        A = (ki == mi % 64).astype(np.float32)
        B = (np.arange(k)[:, None] + 64 * (ni % 32)).astype(np.float32)
        want_k, want_q = np.broadcast_to(mi % 64, (m, n)), np.broadcast_to(ni % 32, (m, n))
    else:
        A = (ki + 64 * (mi % 32)).astype(np.float32)
        B = (np.arange(k)[:, None] == ni % 64).astype(np.float32)
        want_k, want_q = np.broadcast_to(ni % 64, (m, n)), np.broadcast_to(mi % 32, (m, n))
    p = base(prec)
    C = run_rung(cuda, cp, mod, build, rung, prec, numerics.device_input(A, p),
                 numerics.device_input(B, p), m, k, n)
    coded = np.isfinite(C) & (C == np.round(C)) & (C >= 0) & (C < 2048)
    v = np.where(coded, C, 0).astype(np.int64)
    got_k, got_q = v % 64, v // 64
    exact = coded & (got_k == want_k) & (got_q == want_q)
    line = f"  coded {which}-one-hot: {100 * exact.mean():5.1f}% exact"
    if not exact.all():
        line += (f", {100 * (~coded).mean():.0f}% not a code (NaN {np.isnan(C).mean():.0%});"
                 f" k got-want {histogram((got_k - want_k)[coded], 64)};"
                 f" {'n%32' if which == 'A' else 'm%32'} got-want "
                 f"{histogram((got_q - want_q)[coded], 32)}")
        for i, j in np.argwhere(~exact)[:3]:
            line += f"\n    C[{i},{j}]={C[i, j]:g} want {want_k[i, j] + 64 * want_q[i, j]}"
        say(line)
        say("    16x16 blocks, rows down: " + blocks(block_map(~exact, np.isnan(C))))
    else:
        say(line)
    result(step="coded", build=build, rung=rung, prec=prec, which=which, ok=bool(exact.all()),
           exact=float(exact.mean()))
    return bool(exact.all())


def random_check(cuda, cp, mod, build, rung, prec, m, k, n) -> bool:
    from cudalab.experiments.tensor_cores import numerics

    da, db, xa, xb = inputs(m, k, n, prec, seed=m + 3 * k + 7 * n)
    C = run_rung(cuda, cp, mod, build, rung, prec, da, db, m, k, n).astype(np.float64)
    ref = xa @ xb
    tol = numerics.check_tolerance(k)
    err = float(np.linalg.norm(np.nan_to_num(C, nan=1e30) - ref) / np.linalg.norm(ref))
    ok = bool(np.isfinite(C).all() and err <= tol)
    say(f"  random {m}x{n}x{k}: err {err:.2e} (tol {tol:.1e}) {'ok' if ok else 'WRONG'}")
    if not ok:
        bad = ~np.isclose(C, ref, rtol=0, atol=max(1e-3, 50 * tol) * np.abs(ref).max())
        blk = max(16, m // 32, n // 32)  # at most 32 x 32 characters
        say(f"    {bad.mean():.1%} wrong, NaN {np.isnan(C).mean():.1%}, zero "
            f"{(C == 0).mean():.1%}; {blk}x{blk} blocks: "
            + blocks(block_map(bad, np.isnan(C), blk)))
        for i, j in np.argwhere(bad)[:3]:
            say(f"    C[{i},{j}]={C[i, j]:.4g} want {ref[i, j]:.4g}")
        if m == n == k:
            for name, alt in (("C^T", ref.T), ("A B^T", xa @ xb.T), ("A^T B", xa.T @ xb)):
                if np.allclose(C, alt, rtol=0, atol=1e-2 * np.abs(alt).max()):
                    say(f"    equals {name}")
    result(step="random", build=build, rung=rung, prec=prec, m=m, k=k, n=n, err=err, ok=ok)
    return ok


def step_rung(cuda, cp, cub: Path, build: str, rung: str, precs: list[str]) -> None:
    mod = cuda.module_from_file(str(cub / f"{build}.cubin"))
    for prec in precs:
        say(f"rung {build}:{rung} {prec}")
        ok = True
        try:
            if prec != "bf16":  # codes above 256 are not exact in bf16
                for which in ("A", "B"):
                    ok &= coded_probe(cuda, cp, mod, build, rung, prec, which)
            for m, n, k in SMALL:
                ok &= random_check(cuda, cp, mod, build, rung, prec, m, k, n)
        except Exception as exc:  # noqa: BLE001 - a fault or a refused launch: say it, go on
            say(f"  error {type(exc).__name__}: {str(exc)[:300]}")
            ok = False
        result(step="rung", build=build, rung=rung, prec=prec, ok=bool(ok))
        say(f"  => {build}:{rung} {prec} {'CORRECT' if ok else 'WRONG'}")


def step_quick(cuda, cp, cub: Path) -> None:
    """One small launch of each rung (fp16, tf32), for the sanitizers."""
    mod = cuda.module_from_file(str(cub / "s4.cubin"))
    for rung in RUNGS:
        for prec in ("fp16", "tf32"):
            try:
                ok = random_check(cuda, cp, mod, "s4", rung, prec, 128, 128, 256)
                say(f"quick {rung} {prec} {'ok' if ok else 'WRONG'}")
            except Exception as exc:  # noqa: BLE001 - report and go on
                say(f"quick {rung} {prec} error {type(exc).__name__}: {exc}")


def step_time(cuda, cp, cub: Path, pairs: list[str], size: int = 4096) -> None:
    """cuBLAS per precision, then each build:rung:prec of `pairs`, checked first (96 sampled
    rows against float64) and timed only if right."""
    from cudalab.experiments.tensor_cores import numerics, wgmma

    m = k = n = size
    sms = cuda.Device(0).get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
    rows = np.random.default_rng(1).choice(m, size=96, replace=False)
    mods: dict = {}
    by_prec: dict[str, list[tuple[str, str]]] = {}
    for item in pairs:
        build, rung, prec = item.split(":")
        by_prec.setdefault(prec, []).append((build, rung))
    best: dict[str, float] = {}
    for prec in [p for p in PRECS if p in by_prec or p != "fp16_bt"]:
        p = base(prec)
        da, db, xa, xb = inputs(m, k, n, prec, seed=7)
        ref = xa[rows] @ xb
        tol = numerics.check_tolerance(k)
        a, b = cp.asarray(da), cp.asarray(db)
        c, scratch = cp.empty((m, n), np.float32), cp.empty((n, k), da.dtype)
        todo = [] if prec == "fp16_bt" else [("-", "cublas", cublas_launch(cp, p, a, b, c, m, k,
                                                                             n))]
        for build, rung in by_prec.get(prec, []):
            stages, bn = BUILDS[build]
            if build not in mods:
                mods[build] = cuda.module_from_file(str(cub / f"{build}.cubin"))
            launch, _ = wgmma.launcher(mods[build], rung, p, a.data.ptr, b.data.ptr, c.data.ptr,
                                       m, k, n, sms, scratch_ptr=scratch.data.ptr,
                                       stages=stages, bn=bn, kmajor_b=prec == "fp16_bt")
            todo.append((build, rung, launch))
        for build, rung, launch in todo:
            c.fill(np.nan)
            launch()
            cp.cuda.Device().synchronize()
            got = c[cp.asarray(rows)].get().astype(np.float64)
            err = float(np.linalg.norm(np.nan_to_num(got, nan=1e30) - ref) / np.linalg.norm(ref))
            ok = bool(np.isfinite(got).all() and err <= tol)
            tf = 2.0 * m * n * k / time_it(cp, launch, 30) / 1e12 if ok else float("nan")
            if rung == "cublas":
                best[p] = tf
            share = 100 * tf / best.get(p, float("nan"))
            say(f"time {size} {prec:7} {rung:14} {build:5} {tf:7.1f} TFLOP/s {share:6.1f}% of "
                f"cuBLAS  err {err:.1e} {'ok' if ok else 'WRONG'}")
            result(step="time", prec=prec, rung=rung, build=build, m=m, tflops=tf,
                   pct_cublas=share, err=err, ok=ok)


def child(a: argparse.Namespace) -> int:
    cuda, cp = gpu()
    kind, *rest = a.step.split(":")
    if kind == "params":
        step_params(cuda, cp, a.cubins)
    elif kind == "dump":
        step_dump(cuda, cp, a.cubins)
    elif kind == "rung":
        step_rung(cuda, cp, a.cubins, rest[0], rest[1], a.precs.split(","))
    elif kind == "quick":
        step_quick(cuda, cp, a.cubins)
    elif kind == "time":
        step_time(cuda, cp, a.cubins, a.pairs)
    return 0


# -- the driver: steps in processes, time-boxed ---------------------------------------------
def spawn(cmd: list[str], timeout: float) -> tuple[str, object]:
    """(output, return code or 'timeout'); on timeout the whole process group is killed (the
    python under compute-sanitizer too), so that nothing holds the GPU afterwards."""
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    except OSError as exc:
        return f"cannot start {cmd[0]}: {exc}", "not run"
    try:
        out, _ = p.communicate(timeout=timeout)
        return out.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return out.decode(errors="replace") + "\nTIMEOUT", "timeout"


class Driver:
    def __init__(self, a: argparse.Namespace):
        self.a, self.t0, self.results = a, time.time(), []
        self.log = open(a.out / "diag.log", "w") if a.out else None

    def left(self) -> float:
        return self.a.budget - (time.time() - self.t0)

    def echo(self, text: str) -> None:
        print(text, flush=True)
        if self.log:
            self.log.write(text + "\n")
            self.log.flush()

    def run(self, step: str, cap: float, extra: list[str] = (), wrap: list[str] = (),
            precs: str = "", save: str = "") -> str:
        t = min(cap, self.left() - 5)
        if t < 10:
            self.echo(f"[{time.time() - self.t0:5.0f} s] skip {step}: {self.left():.0f} s left")
            return ""
        cmd = [*wrap, sys.executable, __file__, "--cubins", str(self.a.cubins), "--step", step,
               "--precs", precs or self.a.precs, *extra]
        t1 = time.time()
        out, rc = spawn(cmd, t)
        if save and self.a.out:
            (self.a.out / save).write_text(out)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                self.results.append(json.loads(line[7:]))
            elif line.strip() and "PyCUDA ERROR" not in line and not line.startswith("---"):
                self.echo(line)
        self.echo(f"[{time.time() - self.t0:5.0f} s] {step}: rc {rc} in {time.time() - t1:.0f} s")
        return out

    def passed(self, build: str = "s4") -> list[str]:
        return [f"{r['build']}:{r['rung']}:{r['prec']}" for r in self.results
                if r.get("step") == "rung" and r["ok"] and r["build"] == build]



def sanitizer_summary(d: Driver, out: str) -> None:
    lines = [x for x in out.splitlines() if "ERROR SUMMARY" in x or "RACECHECK SUMMARY" in x
             or x.startswith("========= Invalid") or "Hazard" in x]
    for x in sorted(set(lines))[:8]:
        d.echo(f"  {x.strip()} (x{lines.count(x)})")


def plan(d: Driver) -> None:
    d.echo(f"wgmma diagnostics, budget {d.a.budget:.0f} s, cubins {d.a.cubins}")
    d.run("params", 30)
    d.run("dump", 30)
    for rung in RUNGS:
        d.run(f"rung:s4:{rung}", 45)
    s4 = {(r["rung"], r["prec"]): r["ok"] for r in d.results
          if r.get("step") == "rung" and r["build"] == "s4"}
    if any(s4.get((r, "fp16")) is False and s4.get((r, "fp16_bt")) for r in RUNGS):
        d.echo("fp16 with B N-major wrong, B^T right: the build with the N-major strides swapped")
        d.run("rung:swap:wgmma_ws", 30, precs="fp16,bf16")
    pairs = d.passed("s4") + d.passed("swap")
    for build, rungs in (("s3", RUNGS[1:]), ("bn128", RUNGS[2:]), ("s6", RUNGS[2:])):
        pairs += [f"{build}:{r}:{p}" for r in rungs for p in ("fp16", "bf16")
                  if f"s4:{r}:{p}" in pairs]
    if pairs:  # before the sanitizers, whose time is harder to foresee
        d.run("time", 75, extra=["--pairs", *pairs])
    out = d.run("quick", 80, wrap=["compute-sanitizer", "--tool", "memcheck",
                                   "--print-limit", "8"], save="memcheck.log")
    sanitizer_summary(d, out)
    if d.left() > 70:
        out = d.run("quick", 60, wrap=["compute-sanitizer", "--tool", "racecheck",
                                       "--print-limit", "8"], save="racecheck.log")
        sanitizer_summary(d, out)
    if d.a.out:
        (d.a.out / "results.json").write_text(json.dumps(d.results, indent=1))
    ok = sorted(f"{r['rung']}:{r['prec']}" for r in d.results
                if r.get("step") == "rung" and r["ok"] and r["build"] == "s4")
    d.echo(f"correct (s4): {' '.join(ok) or 'none'}; {time.time() - d.t0:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cubins", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None, help="folder for diag.log, results.json")
    ap.add_argument("--budget", type=float, default=225.0, help="wall seconds for all steps")
    ap.add_argument("--precs", default=",".join(PRECS))
    ap.add_argument("--step", help="(internal) run one step in this process")
    ap.add_argument("--pairs", nargs="*", default=[], help="(internal) BUILD:RUNG:PREC to time")
    a = ap.parse_args()
    if a.step:
        return child(a)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    plan(Driver(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
