"""Measured ceilings: what this GPU really reaches, beside the theoretical peaks.

At the start of every GPU job the runner measures, once, with the job's harness:

  ceil_dram_gbps         the better of a float4 streaming copy and cudaMemcpy device to device,
                         over a working set of 16 x the L2 (two buffers of 8 x L2; less where
                         free memory is short, with a note)
  ceil_dram_memcpy_gbps  the device-to-device cudaMemcpy alone
  ceil_l2_gbps           the float4 copy over a hot working set of half the L2, repeated
                         inside one launch
  ceil_smem_gbps         shared-memory reads (float4, no bank conflicts)
  ceil_fp32_gflops       independent FMA chains, 2 flops per FMA

and adds the theoretical `peak_smem_gbps`, `peak_l2_gbps` and the device's `l2_bytes`
(cudalab.devicespec). Bytes are counted as the experiments count them: a copy moves each
byte twice (read + write). A ceiling is the best the chip did: its fastest clean sample (the
table's gbps of a point is its median), so a point above 100 % of a ceiling is suspect.

Every kernel's result is checked first (copies bit for bit, the shared-memory sums exactly,
the FMA chains against their closed form in float64); a ceiling whose check fails, or whose
measurement raises, is NaN and its note says why. pycuda is only touched through `gpu`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cudalab import devicespec
from cudalab.harness import Harness, Settings, Timing
from cudalab.kernel_sources import CEILINGS_SOURCE
from cudalab.results import number

MEASURED_KEYS = ("ceil_dram_gbps", "ceil_dram_memcpy_gbps", "ceil_l2_gbps", "ceil_smem_gbps",
                 "ceil_fp32_gflops")
THEORETICAL_KEYS = ("peak_smem_gbps", "peak_l2_gbps", "l2_bytes")
KEYS = MEASURED_KEYS + THEORETICAL_KEYS

# A short measurement per ceiling (the whole step must cost well under 2 s); the L2 is never
# flushed here: the L2 ceiling is a hot one, and batching stays on.
SETTINGS = Settings(warmup=3, min_samples=10, max_samples=200, target_cv=0.01, budget_s=0.2,
                    min_sample_s=1e-4, cold_l2=False)

SOURCE = CEILINGS_SOURCE
COPY_UNROLL = 4
SMEM_THREADS = 256
FMA_CHAINS = 8
FMA_UNROLL = 16
DEFINES = {"COPY_UNROLL": COPY_UNROLL, "SMEM_THREADS": SMEM_THREADS,
           "FMA_CHAINS": FMA_CHAINS, "FMA_UNROLL": FMA_UNROLL}
COPY_THREADS = 256
FMA_THREADS = 256

DRAM_L2_FACTOR = 8  # each DRAM buffer is 8 x L2: 16 x L2 moved, far beyond any cache
FREE_FRACTION = 0.25  # of the free device memory, at most, for the two DRAM buffers
MAX_BUFFER = 1 << 31  # bytes per buffer: uint32 iota values stay unique
L2_FRACTION = 4  # each L2 buffer is L2 / 4: in + out = half the L2
L2_REPS = 32  # passes over the L2 buffers per launch: 16 x L2 moved per launch
L2_SHIFT_F4 = 1024  # the rotation of each pass, in float4s (16 KiB: stays 128-byte aligned)
MIN_L2 = 1 << 20  # sizing floor where the driver reports no L2
SMEM_ITERS = 256  # 4 float4 reads per iteration per thread
FMA_ITERS = 128  # x FMA_UNROLL chain steps
# x -> x m + c converges to L = c / (1 - m) = 100; m = 1 - 2^-11 (1 - 1 / steps) keeps m^steps
# near 1/e, so the result still depends on the step count (16 steps fewer move it ~9 x the
# tolerance) while rounding errors stay small. Both are exact in float32.
FMA_M, FMA_C = np.float32(1 - 2.0 ** -11), np.float32(100 * 2.0 ** -11)
POISON = 0xFFFFFFFF  # never an iota value (buffers hold < 2^32 words)
CHECK_CHUNK = 1 << 24  # words compared per numpy step on the host


@dataclass
class Ceilings:
    """What measure() found: `values` (the float dict of KEYS, NaN where not measured),
    `notes` (key -> why it is NaN, or a caveat) and `detail` (per kernel: bytes or flops,
    working set, best and median sample, samples, timer) for the job manifest."""

    values: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)
    detail: dict[str, dict[str, Any]] = field(default_factory=dict)
    # what measurements raised (the runner checks the CUDA context after a CUDA error)
    errors: list[Exception] = field(default_factory=list)

    @property
    def note(self) -> str:
        """The notes in one line ('' when there are none)."""
        return "; ".join(f"{k}: {v}" for k, v in self.notes.items())

    def summary(self) -> str:
        """One log line of the values."""
        v = self.values

        def num(key: str, unit: str) -> str:
            return f"{v[key]:.0f} {unit}" if math.isfinite(v[key]) else "n/a"

        return (f"DRAM {num('ceil_dram_gbps', 'GB/s')} (memcpy "
                f"{num('ceil_dram_memcpy_gbps', 'GB/s')}), L2 {num('ceil_l2_gbps', 'GB/s')}, "
                f"shared {num('ceil_smem_gbps', 'GB/s')} of "
                f"{num('peak_smem_gbps', 'GB/s')}, FP32 {num('ceil_fp32_gflops', 'GFLOP/s')}"
                + (f" [{self.note}]" if self.note else ""))


class CheckFailed(Exception):
    """A ceiling kernel's output is wrong: its ceiling is not a number."""


# -- sizes and references (pure: tested on the CPU) -------------------------------------------
def dram_buffer_bytes(l2_bytes: int, free_bytes: int) -> int:
    """Bytes of each of the two DRAM buffers: DRAM_L2_FACTOR x L2, but the pair within
    FREE_FRACTION of the free memory and each within MAX_BUFFER; a multiple of 1 MiB."""
    want = DRAM_L2_FACTOR * max(int(l2_bytes), MIN_L2)
    room = int(FREE_FRACTION * max(int(free_bytes), 0)) // 2
    size = min(want, room, MAX_BUFFER)
    return (size >> 20) << 20


def l2_buffer_bytes(l2_bytes: int) -> int:
    """Bytes of each of the two L2 buffers (in + out = half the L2), a multiple of 64 KiB,
    at least four passes' rotation (so the rotation wraps within the buffer)."""
    size = (max(int(l2_bytes), MIN_L2) // L2_FRACTION >> 16) << 16
    return max(size, 4 * 16 * L2_SHIFT_F4)


def rotation_words(n_words: int, reps: int, shift_f4: int) -> int:
    """How far copy_f4's output is rotated after `reps` passes, in 32-bit words: out[i] =
    in[(i + rotation) % n]."""
    n4 = n_words // 4
    return 4 * (((reps - 1) * shift_f4) % n4) if reps > 0 and n4 else 0


def count_iota_mismatches(out: np.ndarray, rotation: int = 0) -> int:
    """Words of `out` that differ from iota rotated by `rotation` ((i + rotation) % n),
    compared chunk by chunk (no full-size reference is made): out[:n - rotation] must
    count up from `rotation`, the rest from 0."""
    out = np.asarray(out).view(np.uint32).reshape(-1)
    n = out.size
    rotation %= max(n, 1)
    split = n - rotation
    bad = 0
    for start, stop, first in ((0, split, rotation), (split, n, 0)):
        for a in range(start, stop, CHECK_CHUNK):
            b = min(a + CHECK_CHUNK, stop)
            want = np.arange(first + a - start, first + b - start, dtype=np.uint32)
            bad += int(np.count_nonzero(out[a:b] != want))
    return bad


def smem_expected(threads: int = SMEM_THREADS, iters: int = SMEM_ITERS) -> np.ndarray:
    """Each thread's sum in smem_read (float64, exact: small integers), for one block."""
    n_f4 = 4 * threads
    k = np.arange(n_f4, dtype=np.int64)
    value = (k & 7) + ((k >> 3) & 7) + ((k >> 6) & 15) + 1  # the four components' sum
    t = np.arange(threads, dtype=np.int64)[:, None]
    bases = (t + 32 * np.arange(iters, dtype=np.int64)[None, :]) % n_f4  # thread x iter
    total = np.zeros(threads, np.float64)
    for u in range(4):
        total += value[(bases + u * threads) % n_f4].sum(axis=1)
    return total


def fma_start(gid: np.ndarray, chain: int) -> np.ndarray:
    """fma_chains' start value of chain `chain` in thread `gid` (exact in float32)."""
    return (np.asarray(gid, np.int64) & 1023) * 0.015625 + chain


def fma_expected(n_threads: int, steps: int, m: float = float(FMA_M), c: float = float(FMA_C),
                 chains: int = FMA_CHAINS) -> np.ndarray:
    """Each thread's sum of its chains after `steps` x -> x m + c steps, from the closed
    form x_n = L + m^n (x_0 - L), L = c / (1 - m), in float64 (m and c: the float32 values
    the kernel gets)."""
    gid = np.arange(n_threads)
    limit = c / (1.0 - m)
    return sum(limit + m ** steps * (fma_start(gid, k) - limit) for k in range(chains))


def fma_tolerance(steps: int, m: float = float(FMA_M), c: float = float(FMA_C),
                  chains: int = FMA_CHAINS) -> float:
    """Relative error bound of the float32 chains against the closed form: each step's FMA
    rounds once (at most 2^-24 of |x|) and earlier errors shrink by m, so a chain is off by
    at most steps x 2^-24 x max|x|; twice that, relative to the smallest sum, plus the
    float32 sum of the chains."""
    limit = c / (1.0 - m)
    x_max = max(abs(limit), 1023 * 0.015625 + chains)
    smallest = float(fma_expected(1024, steps, m, c, chains).min())
    return 2 * steps * 2.0 ** -24 * x_max * chains / abs(smallest) + chains * 2.0 ** -24


def best_rate(amount: float, timing: Timing) -> float:
    """amount / fastest clean sample / 1e9 (GB/s or GFLOP/s); NaN without samples."""
    best = timing.stats()["min"]
    return amount / best / 1e9 if best > 0 else math.nan


def grid_blocks(sm_count: int, blocks_per_sm: int) -> int:
    """One full wave: every SM holds as many blocks as fit."""
    return max(1, int(sm_count)) * max(1, int(blocks_per_sm))


# -- the table of ceilings (aggregate) ---------------------------------------------------------
TABLE_COLUMNS = ["experiment", "job_id", "gpu_name", "gpu_uuid", *KEYS, "ceilings_note"]


def ceilings_table(manifests: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per GPU job manifest that carries ceilings (results/ceilings.csv)."""
    rows = []
    for m in manifests:
        c = m.get("ceilings")
        if not isinstance(c, dict):
            continue
        prov = m.get("provenance") or {}
        rows.append({"experiment": m.get("experiment"), "job_id": m.get("job_id"),
                     "gpu_name": prov.get("gpu_name"), "gpu_uuid": prov.get("gpu_uuid"),
                     **{k: number(c.get(k)) for k in KEYS},
                     "ceilings_note": m.get("ceilings_note", "")})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


# -- measuring -------------------------------------------------------------------------------
def theoretical(gpu: Any) -> dict[str, float]:
    """The theoretical keys (devicespec), the measured ones NaN."""
    return {**{k: math.nan for k in MEASURED_KEYS}, **devicespec.memory_peaks(gpu)}


def not_measured(gpu: Any, why: str) -> Ceilings:
    """Ceilings of a job that measures none (switched off, or the step failed)."""
    return Ceilings(theoretical(gpu), {"ceilings": why})


def measure_ceilings(gpu: Any, harness: Harness) -> dict[str, float]:
    """The contract's float dict (KEYS); measure() also returns the notes."""
    return measure(gpu, harness).values


def measure(gpu: Any, harness: Harness, settings: Settings = SETTINGS) -> Ceilings:
    """Measure every ceiling on `gpu` (cudalab.gpu.GpuSession); a failing one is NaN with a
    note, the others are still measured."""
    out = Ceilings(theoretical(gpu))
    l2 = int(out.values["l2_bytes"]) if math.isfinite(out.values["l2_bytes"]) else 0
    try:
        kernel = gpu.compile(SOURCE, DEFINES)
    except Exception as exc:  # noqa: BLE001 - nothing can be measured
        for k in MEASURED_KEYS:
            out.notes[k] = f"{SOURCE} did not compile: {type(exc).__name__}: {exc}"
        return out
    m = _Measurer(gpu, kernel, harness, settings, out)
    m.run("ceil_dram_gbps", lambda: m.dram(l2, memcpy=False))
    m.run("ceil_dram_memcpy_gbps", lambda: m.dram(l2, memcpy=True))
    m.run("ceil_l2_gbps", lambda: m.l2(l2))
    m.run("ceil_smem_gbps", m.smem)
    m.run("ceil_fp32_gflops", m.fma)
    _best_dram(out)
    return out


def _best_dram(out: Ceilings) -> None:
    """ceil_dram_gbps: the better of the float4 copy (measured into it) and cudaMemcpy."""
    v = out.values
    copy, memcpy = v["ceil_dram_gbps"], v["ceil_dram_memcpy_gbps"]
    if math.isfinite(memcpy) and not memcpy <= copy:  # copy NaN or slower
        if not math.isfinite(copy):
            out.notes["ceil_dram_gbps"] = (
                f"cudaMemcpy alone (float4 copy: {out.notes.get('ceil_dram_gbps', 'n/a')})")
        v["ceil_dram_gbps"] = memcpy


class _Measurer:
    """The ceiling kernels on one GPU session; every device buffer is freed after its
    ceiling, whatever happens."""

    def __init__(self, gpu: Any, kernel: Any, harness: Harness, settings: Settings,
                 out: Ceilings) -> None:
        self.gpu, self.cuda, self.kernel = gpu, gpu.cuda, kernel
        self.harness, self.settings, self.out = harness, settings, out
        self.sms = _attr(gpu, "MULTIPROCESSOR_COUNT") or 1
        self._allocs: list[Any] = []

    def run(self, key: str, fn: Callable[[], None]) -> None:
        """fn() measures ceiling `key`; if it fails, `key` is NaN and its note says why."""
        try:
            fn()
        except CheckFailed as exc:
            self.out.values[key] = math.nan
            self.out.notes[key] = f"check failed: {exc}"
        except Exception as exc:  # noqa: BLE001 - OOM, launch failure: this ceiling is NaN
            self.out.errors.append(exc)
            self.out.values[key] = math.nan
            self.out.notes[key] = f"{type(exc).__name__}: {exc}"
        finally:
            self._free()

    # -- helpers ---------------------------------------------------------------------------
    def _alloc(self, nbytes: int) -> Any:
        a = self.cuda.mem_alloc(nbytes)
        self._allocs.append(a)
        return a

    def _free(self) -> None:
        while self._allocs:
            a = self._allocs.pop()
            try:
                a.free()
            except Exception:  # noqa: BLE001 - context gone: nothing left to free
                pass

    def _function(self, name: str, fmt: str) -> Any:
        f = self.kernel.function(name)
        f.prepare(fmt)
        return f

    def _blocks_per_sm(self, func: Any, threads: int) -> int:
        """Resident blocks per SM of `func` (cudalab's occupancy calculator; the warp limit
        where the compute capability is not tabled)."""
        from cudalab import occupancy

        try:
            occ = occupancy.occupancy(self.gpu.info["compute_capability"], threads,
                                      int(func.num_regs), int(func.shared_size_bytes))
            if occ.active_blocks > 0:
                return occ.active_blocks
        except (KeyError, ValueError, AttributeError):
            pass
        return max(1, (_attr(self.gpu, "MAX_THREADS_PER_MULTIPROCESSOR") or 2048) // threads)

    def _time(self, launch: Callable[[], None]) -> Timing:
        return self.harness.measure(launch, self.gpu.event_timer(), asynchronous=True,
                                    settings=self.settings)

    def _record(self, name: str, key: str, amount: float, unit: str, timing: Timing,
                **extra: Any) -> float:
        rate = best_rate(amount, timing)
        st = timing.stats()
        self.out.detail[name] = {unit: amount, "best_s": st["min"], "median_s": st["median"],
                                 "cv": st["cv"], "n": timing.n, "n_clean": len(timing.clean),
                                 "timer": timing.timer, "method_note": timing.method_note,
                                 **extra}
        if key:
            self.out.values[key] = rate
        return rate

    def _checked_copy(self, out_d: Any, n_words: int, launch: Callable[[], None],
                      rotation: int, what: str) -> None:
        """Poison the output, run once, compare with iota rotated by `rotation`."""
        self.cuda.memset_d32(out_d, POISON, n_words)
        launch()
        self.gpu.synchronize()
        host = np.empty(n_words, np.uint32)
        self.cuda.memcpy_dtoh(host, out_d)
        bad = count_iota_mismatches(host, rotation)
        if bad:
            raise CheckFailed(f"{what}: {bad} of {n_words} words differ from its input")

    def _iota(self, a: Any, n_words: int) -> None:
        fill = self._function("fill_iota", "PQ")
        fill.prepared_call((grid_blocks(self.sms, 8), 1), (COPY_THREADS, 1, 1), a, n_words)

    # -- the ceilings ----------------------------------------------------------------------
    def dram(self, l2: int, memcpy: bool) -> None:
        """The float4 copy (memcpy False) or cudaMemcpy device to device over two buffers of
        DRAM_L2_FACTOR x L2 (less where free memory is short, with a note)."""
        key = "ceil_dram_memcpy_gbps" if memcpy else "ceil_dram_gbps"
        free, _ = self.cuda.mem_get_info()
        nbytes = dram_buffer_bytes(l2, free)
        if nbytes < (1 << 20):
            raise RuntimeError(f"too little free device memory ({free} B) for the DRAM copy")
        if nbytes < DRAM_L2_FACTOR * max(l2, MIN_L2):
            self.out.notes[key] = (f"working set only {2 * nbytes / max(l2, MIN_L2):.1f} x L2 "
                                   "(free memory)")
        n_words = nbytes // 4
        in_d, out_d = self._alloc(nbytes), self._alloc(nbytes)
        self._iota(in_d, n_words)
        if memcpy:
            def launch() -> None:
                self.cuda.memcpy_dtod_async(out_d, in_d, nbytes)
        else:
            copy = self._function("copy_f4", "PPQIQ")
            grid = (grid_blocks(self.sms, self._blocks_per_sm(copy, COPY_THREADS)), 1)

            def launch() -> None:
                copy.prepared_call(grid, (COPY_THREADS, 1, 1), out_d, in_d, n_words // 4, 1, 0)

        what = "cudaMemcpy" if memcpy else "float4 copy"
        self._checked_copy(out_d, n_words, launch, 0, what)
        self._record("dram_memcpy" if memcpy else "dram_copy_f4", key, 2.0 * nbytes, "bytes",
                     self._time(launch), working_set_bytes=2 * nbytes)

    def l2(self, l2: int) -> None:
        nbytes = l2_buffer_bytes(l2)
        n_words = nbytes // 4
        in_d, out_d = self._alloc(nbytes), self._alloc(nbytes)
        self._iota(in_d, n_words)
        copy = self._function("copy_f4", "PPQIQ")
        grid = (grid_blocks(self.sms, self._blocks_per_sm(copy, COPY_THREADS)), 1)

        def launch() -> None:
            copy.prepared_call(grid, (COPY_THREADS, 1, 1), out_d, in_d, n_words // 4, L2_REPS,
                               L2_SHIFT_F4)

        self._checked_copy(out_d, n_words, launch,
                           rotation_words(n_words, L2_REPS, L2_SHIFT_F4), "L2 copy")
        self._record("l2_copy_f4", "ceil_l2_gbps", 2.0 * nbytes * L2_REPS, "bytes",
                     self._time(launch), working_set_bytes=2 * nbytes, reps=L2_REPS)

    def smem(self) -> None:
        func = self._function("smem_read", "PI")
        blocks = grid_blocks(self.sms, self._blocks_per_sm(func, SMEM_THREADS))
        n = blocks * SMEM_THREADS
        out_d = self._alloc(4 * n)

        def launch() -> None:
            func.prepared_call((blocks, 1), (SMEM_THREADS, 1, 1), out_d, SMEM_ITERS)

        self.cuda.memset_d32(out_d, POISON, n)
        launch()
        self.gpu.synchronize()
        host = np.empty(n, np.float32)
        self.cuda.memcpy_dtoh(host, out_d)
        want = np.tile(smem_expected(SMEM_THREADS, SMEM_ITERS), blocks)
        bad = int(np.count_nonzero(host.astype(np.float64) != want))
        if bad:
            raise CheckFailed(f"{bad} of {n} thread sums differ from the CPU's")
        self._record("smem_read", "ceil_smem_gbps", 16.0 * 4 * SMEM_ITERS * n, "bytes",
                     self._time(launch), threads=n)

    def fma(self) -> None:
        func = self._function("fma_chains", "PffI")
        blocks = grid_blocks(self.sms, self._blocks_per_sm(func, FMA_THREADS))
        n = blocks * FMA_THREADS
        steps = FMA_ITERS * FMA_UNROLL
        out_d = self._alloc(4 * n)

        def launch() -> None:
            func.prepared_call((blocks, 1), (FMA_THREADS, 1, 1), out_d, FMA_M, FMA_C, FMA_ITERS)

        self.cuda.memset_d32(out_d, POISON, n)
        launch()
        self.gpu.synchronize()
        host = np.empty(n, np.float32)
        self.cuda.memcpy_dtoh(host, out_d)
        want = fma_expected(n, steps)
        with np.errstate(invalid="ignore"):
            err = float(np.max(np.abs(host.astype(np.float64) - want) / np.abs(want)))
        tol = fma_tolerance(steps)
        if not err <= tol:  # NaN (poison left) fails too
            raise CheckFailed(f"largest relative error {err:.3g} exceeds {tol:.3g}")
        self._record("fma_chains", "ceil_fp32_gflops", 2.0 * FMA_CHAINS * steps * n, "flops",
                     self._time(launch), threads=n, max_rel_error=err)


def _attr(gpu: Any, name: str) -> int:
    try:
        return int(gpu.attr(name))
    except Exception:  # noqa: BLE001 - missing attribute: the caller's fallback
        return 0
