"""The GPU side of judging one kernel: run in a child process (cudalab.exercises.sandbox),
so a kernel that hangs or crashes takes only that process with it.

    python -m cudalab.exercises.judge --exercise NAME --cubin FILE --out VERDICT.json
                                      [--mode check|class] [--seed N] [--cublas]

Every size of the small grid, then the timed size `trials` times, goes through the slot's
experiment's verify_then_time: fresh random inputs, the output poisoned, one launch checked
against the CPU reference, then the harness's timing, one launch per sample. Before every
sample (outside its events) the output is poisoned again and one of a few input sets, each
fresh and random, is picked at random; a few samples picked at random and the last one are
copied back and checked. So a kernel that caches its output, skips work once it has passed
the first check, or keys on repeated inputs it has seen fails, not only one that is wrong.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cudalab.exercises import fresh, slots
from cudalab.exercises.catalog import Exercise, get
from cudalab.exercises.guard import GuardedTimer, beat, guard_summary
from cudalab.harness import Harness, Settings
from cudalab.kernel_slot import POISON_64_WORD, Check, RunContext, verify_then_time

INPUT_SETS = 3  # input sets of a timed trial (fresh random inputs each)
SPOT_CHECKS = 3  # timed samples per trial checked at random, besides the last

# One launch per sample (no batching): each sample's output is poisoned before it and may be
# checked after it, and each reads an input set picked at random.
CHECK_SETTINGS = Settings(warmup=1, min_samples=2, max_samples=3, budget_s=0.01,
                          min_sample_s=0.0, min_sample_sync_s=0.0)
MODES = {
    "check": (2, Settings(warmup=1, min_samples=5, max_samples=50, budget_s=0.1,
                          min_sample_s=0.0, min_sample_sync_s=0.0)),
    "class": (3, Settings(warmup=1, min_samples=10, max_samples=200, budget_s=0.5,
                          min_sample_s=0.0, min_sample_sync_s=0.0)),
    "sanitize": (0, CHECK_SETTINGS),  # under compute-sanitizer: the small grid, no timing
}


@dataclass
class Slot:
    """The kernel bound to the device buffers of a few input sets of one size. Set 0 first
    holds the host-made `case` (the first check's inputs, with the full CPU reference);
    before every timed sample a set is picked and its content made afresh on the device
    (`seeds[set]`: the seed it was made from). `launches` counts the launches since the
    output was last poisoned."""

    case: slots.Case
    out_d: Any
    buffers: list[Any]
    inputs: list[list[Any]]
    current: list[int]
    launches: list[int]
    seeds: list[int | None]
    launch: Any


def bind(gpu: Any, ex: Exercise, func: Any, case: slots.Case, sets: int) -> Slot:
    cuda = gpu.cuda
    out_d = cuda.mem_alloc(case.out.nbytes)
    buffers, inputs, arg_sets = [out_d], [], []
    for s in range(sets):
        ins = [cuda.mem_alloc(max(a.nbytes, 1)) for a in case.inputs]
        if s == 0:
            for d, a in zip(ins, case.inputs, strict=True):
                cuda.memcpy_htod(d, a)
        buffers += ins
        inputs.append(ins)
        ptrs = [out_d, *ins] if case.out_first else [*ins, out_d]
        arg_sets.append((*ptrs, *(np.int32(v) for v in case.scalars)))
    grid, block = slots.geometry(ex, case.size)
    current, launches = [0], [0]

    def launch() -> None:
        launches[0] += 1
        func.prepared_call(grid, block, *arg_sets[current[0]])

    seeds: list[int | None] = [None] + [0] * (sets - 1)  # sets past 0: filled before use
    return Slot(case, out_d, buffers, inputs, current, launches, seeds, launch)


def poison(cuda: Any, device: Any, host: np.ndarray, fill: int) -> None:
    """Poison a device output as verify_then_time does (NaN words, or 0 for a sum)."""
    if host.itemsize == 8:
        cuda.memset_d32(device, POISON_64_WORD, 2 * host.size)
    else:
        cuda.memset_d32(device, fill, host.size)


def refresh(gpu: Any, ex: Exercise, slot: Slot, rng: np.random.Generator,
            filler: fresh.Filler) -> None:
    """Before a timed sample: a set picked at random, its inputs made afresh on the device
    from a new seed (content no launch has read before), the output poisoned."""
    s = int(rng.integers(len(slot.inputs)))
    seed = int(rng.integers(1, 1 << 32))
    for buf, a, sub in zip(slot.inputs[s], slot.case.inputs,
                           fresh.input_seeds(seed, len(slot.case.inputs)), strict=True):
        filler(buf, a.size, a.dtype, sub, fresh.centred(ex))
    slot.current[0], slot.seeds[s] = s, seed
    poison(gpu.cuda, slot.out_d, slot.case.out, slot.case.fill)
    slot.launches[0] = 0


def measure(ctx: RunContext, ex: Exercise, slot: Slot, settings: Settings,
            filler: fresh.Filler, timer: Any = None, sync: Any = None) -> dict[str, Any]:
    """One size through verify_then_time (the host-made set), then the timed samples:
    before each, outside its events, fresh inputs and a poisoned output (refresh); a few
    samples picked at random are copied back and checked, and so is the last."""
    gpu = ctx.gpu
    sync = sync or gpu.synchronize
    first: dict[str, Any] = {}
    spot: dict[str, Any] = {"failed": None, "checked": 0}
    p_spot = min(1.0, SPOT_CHECKS / max(settings.min_samples, 1))

    def synced() -> None:
        sync()
        beat()

    def check(host: np.ndarray) -> Check:
        c, first["wrong"] = output_check(ctx, ex, slot, host)
        return c

    def after() -> None:
        if spot["failed"] is None and spot["checked"] < SPOT_CHECKS \
                and ctx.rng.random() < p_spot:
            spot["checked"] += 1
            spot["failed"] = _after_check(ctx, ex, slot)

    samples: list[tuple[float, float, float, int]] = []
    guarded = GuardedTimer(timer or gpu.event_timer(), synced, samples,
                           lambda: refresh(gpu, ex, slot, ctx.rng, filler), after)
    result, timing = verify_then_time(
        ctx, slot.launch, check, output=(slot.out_d, slot.case.out), fill=slot.case.fill,
        timer=guarded, sync=synced, asynchronous=True, settings=settings)
    synced()
    last = spot["failed"] or _after_check(ctx, ex, slot)
    return {"size": list(slot.case.size), "check": _check_dict(result, first["wrong"]),
            "timed_check": last or {"passed": True, "first_wrong": None},
            "launches": len(samples), "spot_checks": spot["checked"],
            "median_s": timing.stats()["median"], "timer": timing.timer,
            "guard": guard_summary(samples)}


def output_check(ctx: RunContext, ex: Exercise, slot: Slot, host: np.ndarray
                 ) -> tuple[Check, dict[str, Any] | None]:
    """The output in `host` against the inputs the current set holds: the host-made case
    (its full reference), or the content made from its seed (fresh.check)."""
    case, k = slot.case, max(slot.launches[0], 1)
    seed = slot.seeds[slot.current[0]]
    if seed is None:
        c = case.check(host, k)
        return c, None if c.passed else _wrong(ex, host, case, k)
    return fresh.check(ex, case, seed, host, k, ctx.rng)


def _after_check(ctx: RunContext, ex: Exercise, slot: Slot) -> dict[str, Any] | None:
    """The output of the last timed sample, checked (None where right)."""
    ctx.gpu.synchronize()
    ctx.gpu.cuda.memcpy_dtoh(slot.case.out, slot.out_d)
    c, wrong = output_check(ctx, ex, slot, slot.case.out)
    return None if c.passed else _check_dict(c, wrong)


def _check_dict(c: Check, wrong: dict[str, Any] | None) -> dict[str, Any]:
    return c.as_dict() | {"first_wrong": wrong}


def _wrong(ex: Exercise, host: np.ndarray, case: slots.Case, launches: int
           ) -> dict[str, Any] | None:
    expected = case.expected * launches if ex.kind == "reduction" else case.expected
    return slots.first_wrong(host, expected, 10 * slots.tolerance(ex)
                             if ex.kind in ("vector_add", "matmul") else 0.0)


def free(slot: Slot) -> None:
    for b in slot.buffers:
        b.free()


def run_cases(ctx: RunContext, ex: Exercise, func: Any, mode: str, cublas: bool = False,
              filler: fresh.Filler | None = None) -> dict[str, Any]:
    """The small grid, stopping at the first wrong size, then the timed trials; a time
    below what the hardware allows is 'gamed'."""
    filler = filler or fresh.device_filler(ctx.gpu)
    checks = []
    if not cublas:
        for size in ex.check_sizes:
            slot = bind(ctx.gpu, ex, func, slots.make_case(ex, ctx.rng, size), INPUT_SETS)
            try:
                checks.append(measure(ctx, ex, slot, CHECK_SETTINGS, filler))
            finally:
                free(slot)
            if not (checks[-1]["check"]["passed"] and checks[-1]["timed_check"]["passed"]):
                return {"status": "wrong", "checks": checks}
    trials, settings = MODES[mode]
    if trials == 0:
        return {"status": "ok", "checks": checks}
    size = ex.time_size if mode == "check" else ex.class_size
    done = []
    for _ in range(trials):
        case = slots.make_case(ex, ctx.rng, size)
        slot = bind(ctx.gpu, ex, func, case, 1 if cublas else INPUT_SETS)
        try:
            if cublas:
                done.append(_cublas_trial(ctx, ex, slot, settings, filler))
            else:
                done.append(measure(ctx, ex, slot, settings, filler))
        finally:
            free(slot)
        if not (done[-1]["check"]["passed"] and done[-1]["timed_check"]["passed"]):
            return {"status": "wrong", "checks": checks + done}
    bounds = hardware_floors(ex, case, ctx.gpu)
    timing = summarize(done, case, max(bounds.values(), default=0.0))
    if timing["implausible"]:
        which = max(bounds, key=bounds.__getitem__)
        return {"status": "gamed", "checks": checks, "timing": timing, "message":
                f"{timing['median_s']:.3g} s is faster than this GPU can do the work "
                f"(at least {timing['floor_s']:.3g} s: {BOUND_TEXT[which]}): the time is "
                "not the kernel's work. The bound assumes the slot's precision on its own "
                "cores and DRAM beyond the L2's size: a kernel that legitimately does the "
                "work another way (FP32 on tensor cores, say) may be judged by hand"}
    return {"status": "ok", "checks": checks, "timing": timing}


BOUND_TEXT = {"compute": "its flops at the peak of the slot's precision",
              "dram": "its bytes beyond the L2's size at peak DRAM bandwidth"}


def hardware_floors(ex: Exercise, case: slots.Case, gpu: Any) -> dict[str, float]:
    """The least time the slot's work can take on this GPU, per bound: compute, its flops at
    the peak of the slot's precision (FP32 cores; FP64 also counts the FP64 tensor cores),
    and dram, the bytes that cannot come from the L2 cache at peak DRAM bandwidth. A bound
    the driver's numbers cannot give is left out."""
    from cudalab import devicespec, tensor_peaks

    peaks = devicespec.device_peaks(gpu)
    compute = peaks["peak_fp32_gflops"]
    if ex.dtype == "float64":
        fp64 = devicespec._per_sm_peak(
            lambda name: devicespec._device_attr(gpu, name),
            lambda cc, sms, clock: tensor_peaks.tensor_peak_gflops(cc, "fp64", sms, clock))
        compute = max(compute, fp64) if math.isfinite(fp64) else compute
    l2 = devicespec.memory_peaks(gpu)["l2_bytes"]
    floors = {}
    if math.isfinite(case.flops) and compute > 0:
        floors["compute"] = case.flops / (compute * 1e9)
    if math.isfinite(case.bytes) and peaks["peak_mem_gbps"] > 0 and math.isfinite(l2):
        floors["dram"] = max(0.0, case.bytes - l2) / (peaks["peak_mem_gbps"] * 1e9)
    return {k: f for k, f in floors.items() if math.isfinite(f)}


def _cublas_trial(ctx: RunContext, ex: Exercise, slot: Slot, settings: Settings,
                  filler: fresh.Filler) -> dict[str, Any]:
    ceiling = slots.slot_of(ex).ceiling
    if ceiling is None:
        raise LookupError(f"exercise {ex.name}: its slot has no library ceiling")
    m, k, n = slot.case.size
    a_d, b_d = slot.buffers[1], slot.buffers[2]  # the output is buffers[0]
    launch, timer, sync, _extra = ceiling(ctx.gpu, a_d, b_d, slot.out_d, m, k, n, ex.dtype)
    counted = slot.launches

    def cublas_launch() -> None:
        counted[0] += 1
        launch()

    slot.launch = cublas_launch
    return measure(ctx, ex, slot, settings, filler, timer=timer, sync=sync)


def summarize(trials: list[dict[str, Any]], case: slots.Case, floor_s: float = 0.0
              ) -> dict[str, Any]:
    """The timed size: the median trial's time (or, where the guard saw work outside the
    events, the wall-clock time), with GFLOP/s and GB/s; implausible where it is below
    `floor_s`, the least time the hardware needs for the work."""
    suspect = any(t["guard"]["suspect"] for t in trials)
    per = [t["guard"]["wall_s"] if suspect else t["median_s"] for t in trials]
    med = statistics.median(per)
    out = {"size": trials[0]["size"], "median_s": med, "trials_s": per,
           "timer": trials[0]["timer"], "suspect": suspect,
           "guard": [t["guard"] for t in trials], "floor_s": floor_s,
           "implausible": bool(floor_s > 0 and med < floor_s)}
    if med > 0 and math.isfinite(case.flops):
        out["gflops"] = case.flops / med / 1e9
    if med > 0 and math.isfinite(case.bytes):
        out["gbps"] = case.bytes / med / 1e9
    return out


def judge(ex: Exercise, cubin: Path | None, mode: str, seed: int,
          cublas: bool = False) -> dict[str, Any]:
    """Open the GPU, load the cubin (or cuBLAS), run the cases; a CUDA error becomes the
    verdict 'crashed' (the context is lost after one: nothing else runs)."""
    from cudalab import gpu as gpumod

    try:
        session = gpumod.open_session()
    except gpumod.NoGpuError as exc:
        return {"status": "no_gpu", "message": exc.why or str(exc)}
    info = {k: session.info[k] for k in ("gpu_name", "compute_capability")}
    ctx = RunContext(session, Harness(MODES[mode][1]), np.random.default_rng(seed), {}, {})
    try:
        func = None
        if not cublas:
            func = session.cuda.module_from_file(str(cubin)).get_function(ex.kernel)
            func.prepare(_arg_types(ex))
        filler = fresh.device_filler(session)  # compiled before the watchdog's first beat
        beat()
        verdict = run_cases(ctx, ex, func, mode, cublas, filler)
    except Exception as exc:  # noqa: BLE001 - pycuda's errors: illegal address, launch failure
        from cudalab.gpu_errors import gpu_error_kind

        verdict = {"status": "crashed", "message": f"{gpu_error_kind(exc)}: {exc}"}
    return verdict | {"device": info, "seed": seed}


def _arg_types(ex: Exercise) -> str:
    return "".join("P" if t == "u64" else "i" for t in ex.params)


def main(argv: list[str] | None = None) -> int:
    from cudalab import results

    p = argparse.ArgumentParser(prog="python -m cudalab.exercises.judge")
    p.add_argument("--exercise", required=True)
    p.add_argument("--cubin", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--mode", choices=sorted(MODES), default="check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cublas", action="store_true")
    a = p.parse_args(argv)
    seed = a.seed or int(np.random.SeedSequence().entropy % (1 << 63))
    verdict = judge(get(a.exercise), a.cubin, a.mode, seed, a.cublas)
    results.write_json_atomic(a.out, verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
