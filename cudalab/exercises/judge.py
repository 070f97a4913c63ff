"""The GPU side of judging one kernel: run in a child process (cudalab.exercises.sandbox),
so a kernel that hangs or crashes takes only that process with it.

    python -m cudalab.exercises.judge --exercise NAME --cubin FILE --out VERDICT.json
                                      [--mode check|class] [--seed N] [--cublas]

Every size of the small grid, then the timed size `trials` times, goes through the slot's
experiment's verify_then_time: fresh random inputs, the output poisoned, one launch checked
against the CPU reference, then the harness's timing. The check callback poisons the output
again before the timed launches start, and the output of the timed launches is checked too
(a reduction's, which accumulates, against launches x the sum): a kernel that caches its
output, notices repeated inputs or skips work after the first launch fails there.
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

from cudalab.exercises import slots
from cudalab.exercises.catalog import Exercise, get
from cudalab.exercises.guard import GuardedTimer, beat, guard_summary
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import POISON_64_WORD, Check, RunContext
from cudalab.harness import Harness, Settings

# The small grid: each size is checked, then launched a few times and checked again.
CHECK_SETTINGS = Settings(warmup=1, min_samples=2, max_samples=3, budget_s=0.01,
                          min_sample_s=0.0, min_sample_sync_s=0.0)
MODES = {
    "check": (2, Settings(warmup=1, min_samples=5, max_samples=50, budget_s=0.1)),
    "class": (3, Settings(warmup=1, min_samples=10, max_samples=200, budget_s=0.5)),
    "sanitize": (0, CHECK_SETTINGS),  # under compute-sanitizer: the small grid, no timing
}


@dataclass
class Slot:
    """The kernel bound to one case's device buffers, with a count of its launches."""

    case: slots.Case
    out_d: Any
    buffers: list[Any]
    launch: Any
    launches: list[int]


def bind(gpu: Any, ex: Exercise, func: Any, case: slots.Case) -> Slot:
    cuda = gpu.cuda
    ins = []
    for a in case.inputs:
        ins.append(cuda.mem_alloc(max(a.nbytes, 1)))
        cuda.memcpy_htod(ins[-1], a)
    out_d = cuda.mem_alloc(case.out.nbytes)
    ptrs = [out_d, *ins] if case.out_first else [*ins, out_d]
    args = (*ptrs, *(np.int32(s) for s in case.scalars))
    grid, block = slots.geometry(ex, case.size)
    launches = [0]

    def launch() -> None:
        launches[0] += 1
        func.prepared_call(grid, block, *args)

    return Slot(case, out_d, [*ins, out_d], launch, launches)


def poison(cuda: Any, device: Any, host: np.ndarray, fill: int) -> None:
    """Poison a device output as verify_then_time does (NaN words, or 0 for a sum)."""
    if host.itemsize == 8:
        cuda.memset_d32(device, POISON_64_WORD, 2 * host.size)
    else:
        cuda.memset_d32(device, fill, host.size)


def measure(ctx: RunContext, ex: Exercise, slot: Slot, settings: Settings,
            timer: Any = None, sync: Any = None) -> dict[str, Any]:
    """One case through verify_then_time, then the timed launches' output checked."""
    gpu, case = ctx.gpu, slot.case
    sync = sync or gpu.synchronize
    first: dict[str, Any] = {}

    def synced() -> None:
        sync()
        beat()

    def check(host: np.ndarray) -> Check:
        first["check"] = c = case.check(host, slot.launches[0])
        first["wrong"] = None if c.passed else _wrong(ex, host, case, slot.launches[0])
        poison(gpu.cuda, slot.out_d, case.out, case.fill)  # the timed launches write anew
        slot.launches[0] = 0
        return c

    samples: list[tuple[float, float, float, int]] = []
    guarded = GuardedTimer(timer or gpu.event_timer(), synced, samples)
    result, timing = REGISTRY[ex.experiment].verify_then_time(
        ctx, slot.launch, check, output=(slot.out_d, case.out), fill=case.fill, timer=guarded,
        sync=synced, asynchronous=True, settings=settings)
    synced()
    gpu.cuda.memcpy_dtoh(case.out, slot.out_d)
    after = case.check(case.out, max(slot.launches[0], 1))
    return {"size": list(case.size), "check": _check_dict(result, first["wrong"]),
            "timed_check": _check_dict(after, None if after.passed else _wrong(
                ex, case.out, case, max(slot.launches[0], 1))),
            "launches": slot.launches[0], "median_s": timing.stats()["median"],
            "timer": timing.timer, "guard": guard_summary(samples)}


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


def run_cases(ctx: RunContext, ex: Exercise, func: Any, mode: str,
              cublas: bool = False) -> dict[str, Any]:
    """The small grid, stopping at the first wrong size, then the timed trials."""
    checks = []
    if not cublas:
        for size in ex.check_sizes:
            slot = bind(ctx.gpu, ex, func, slots.make_case(ex, ctx.rng, size))
            try:
                checks.append(measure(ctx, ex, slot, CHECK_SETTINGS))
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
        slot = bind(ctx.gpu, ex, func, case)
        try:
            if cublas:
                done.append(_cublas_trial(ctx, ex, slot, settings))
            else:
                done.append(measure(ctx, ex, slot, settings))
        finally:
            free(slot)
        if not (done[-1]["check"]["passed"] and done[-1]["timed_check"]["passed"]):
            return {"status": "wrong", "checks": checks + done}
    return {"status": "ok", "checks": checks, "timing": summarize(done, case)}


def _cublas_trial(ctx: RunContext, ex: Exercise, slot: Slot, settings: Settings
                  ) -> dict[str, Any]:
    from cudalab.experiments.matmul.cublas import _cublas_launcher

    m, k, n = slot.case.size
    a_d, b_d = slot.buffers[0], slot.buffers[1]
    launch, timer, sync, _extra = _cublas_launcher(ctx.gpu, a_d, b_d, slot.out_d, m, k, n,
                                                   ex.dtype)
    counted = slot.launches

    def cublas_launch() -> None:
        counted[0] += 1
        launch()

    slot.launch = cublas_launch
    return measure(ctx, ex, slot, settings, timer=timer, sync=sync)


def summarize(trials: list[dict[str, Any]], case: slots.Case) -> dict[str, Any]:
    """The timed size: the median trial's time (or, where the guard saw work outside the
    events, the wall-clock time), with GFLOP/s and GB/s."""
    suspect = any(t["guard"]["suspect"] for t in trials)
    per = [t["guard"]["wall_s"] if suspect else t["median_s"] for t in trials]
    med = statistics.median(per)
    out = {"size": trials[0]["size"], "median_s": med, "trials_s": per,
           "timer": trials[0]["timer"], "suspect": suspect,
           "guard": [t["guard"] for t in trials]}
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
        beat()
        verdict = run_cases(ctx, ex, func, mode, cublas)
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
