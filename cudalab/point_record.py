"""A point's record: the cache key that decides whether it is measured again, its status
(ok, wrong, failed: a timed GPU result with no correctness check is refused) and the
measured body the runner writes. The key hashes everything that affects the measurement:
parameters, the experiment's scalar settings (tolerance, end_to_end, ...), harness
settings, the measuring code (experiment module, base, harness, gpu), kernel source hash
and nvcc options; GPU UUID, driver, CUDA, pycuda and nvcc versions for GPU points, host,
CPU and numpy for CPU points.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudalab import trials
from cudalab.experiments.base import Point, Result
from cudalab.harness import Settings
from cudalab.provenance import now_iso, source_hash

if TYPE_CHECKING:
    from cudalab.nvml_clocks import NvmlClockObserver


GPU_KEY = ("gpu_uuid", "driver_version", "cuda_version", "pycuda_version", "nvcc_version")


CPU_KEY = ("host", "cpu_model", "numpy_version", "cpu_threads")


def block_settings(block: dict[str, Any]) -> dict[str, Any]:
    """The scalar keys of an experiment block (tolerance, end_to_end, ...): they change how a
    point is measured or judged. Lists are the grid axes: adding a size keeps the other
    points cached."""
    return {k: v for k, v in sorted(block.items())
            if k != "enabled" and not isinstance(v, (list, tuple))}


def code_hash(exp: Any) -> str:
    """Hash of the code that measures a point of `exp`."""
    from cudalab import gpu as gpu_module  # imports no pycuda
    from cudalab import harness
    from cudalab.experiments import base

    files = [inspect.getsourcefile(type(exp)), base.__file__, harness.__file__,
             gpu_module.__file__, trials.__file__]
    return source_hash([Path(f) for f in files if f])


def cache_key(point: Point, settings: Settings, env: dict[str, Any], kernel: Any,
              block: dict[str, Any] | None = None, code: str = "") -> str:
    parts = {
        "experiment": point.experiment,
        "variant": point.variant,
        "params": point.params,
        "harness": settings.as_dict(),
        "kernel_hash": getattr(kernel, "source_hash", ""),
        "nvcc_options": getattr(kernel, "options", []),
        "settings": block_settings(block or {}),
        "code": code,
    }
    if point.gpu:
        parts |= {k: env.get(k) for k in GPU_KEY}
    else:
        parts |= {k: env.get(k) for k in CPU_KEY}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def throttle_check_of(point: Point, nvml: NvmlClockObserver | None) -> str:
    """'ok' if NVML watched this point's samples for throttling, else why not."""
    if not point.gpu:
        return "not applicable (CPU point)"
    if nvml is None:
        return "not checked: telemetry.nvml is false"
    return "ok" if nvml.active else f"not checked: {nvml.unavailable}"


def _unchecked(timing: dict[str, Any], why: str) -> dict[str, Any]:
    """No throttle observer ran: n_throttled is unknown (None), not 0."""
    return timing | {"n_throttled": None, "throttle_check": why}


def judge(result: Result, gpu_point: bool = False, no_check_reason: str = "") -> tuple[str, str]:
    """(status, reason) of a measured point. A timed GPU result needs a correctness check
    unless its experiment (or the result) says why none applies: an experiment that forgets
    its check must not pass silently."""
    check = result.check
    if result.timing is None and check is None:
        return "failed", "no measurement"
    why_none = result.no_check_reason or no_check_reason
    if gpu_point and result.timing is not None and check is None and not why_none:
        return "failed", ("refused: a timed GPU result without a correctness check (the "
                          "experiment declares no no_check_reason)")
    if check is not None and not check.passed:
        return "wrong", (f"{check.metric} = {check.error:.3g} exceeds tolerance "
                         f"{check.tolerance:.3g}" + (f"; {check.detail}" if check.detail else ""))
    return "ok", ""


def record_body(result: Result, env: dict[str, Any], key: str,
                throttle_check: str = "ok", peaks: dict[str, float] | None = None, *,
                gpu_point: bool = False, no_check_reason: str = "") -> dict[str, Any]:
    """The measured part of a record. `peaks` (the device's theoretical DRAM bandwidth and
    FP32 rate) goes with the declared work, so the table can give % of peak."""
    prov = dict(env)
    prov["timestamp"] = now_iso()  # when this point was measured (env's: when the job began)
    if result.kernel is not None:
        prov["nvcc_options"] = " ".join(result.kernel.options)
        prov["kernel_hash"] = result.kernel.source_hash
    status, reason = judge(result, gpu_point, no_check_reason)
    timing = result.timing.as_dict() if result.timing else None
    phases = {k: v.as_dict() for k, v in result.phases.items()}
    if throttle_check != "ok":
        timing = _unchecked(timing, throttle_check) if timing else None
        phases = {k: _unchecked(v, throttle_check) for k, v in phases.items()}
    return {
        "status": status, "reason": reason, "cache_key": key,
        "timing": timing,
        "phases": phases,
        "work": {"flops": result.flops, "bytes": result.bytes,
                 "working_set": result.working_set, **(peaks or {})},
        "check": result.check.as_dict() if result.check else None,
        "metrics": result.metrics, "extra": result.extra, "provenance": prov,
        "launch": result.launch.as_dict() if result.launch is not None else None,
    }


def summary_line(rec: dict[str, Any]) -> str:
    t = rec.get("timing") or {}
    parts = []
    if t:
        parts.append(f"{_si(t['median'])}s (n={t['n']}, cv {100 * t['cv']:.1f}%)")
    work = rec["work"]
    if t and work["flops"] and not math.isnan(work["flops"]):
        parts.append(f"{work['flops'] / t['median'] / 1e9:.1f} GFLOP/s")
    elif t and work["bytes"] and not math.isnan(work["bytes"]):
        parts.append(f"{work['bytes'] / t['median'] / 1e9:.1f} GB/s")
    if rec.get("check"):
        c = rec["check"]
        parts.append(("ok" if c["passed"] else "WRONG") + f" err {c['error']:.1e}")
    if t.get("n_throttled"):
        parts.append(f"{t['n_throttled']} throttled")
    return ", ".join(parts) or rec["status"]


def _si(x: float) -> str:
    for unit, scale in (("", 1), ("m", 1e-3), ("u", 1e-6), ("n", 1e-9)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "
