"""One job per experiment: walk its grid in one process (one CUDA context, one compile per
kernel variant), keep every finished point on disk, and redo only what is missing.

A point is reused when a record with the same cache key exists and is ok. The key hashes
everything that affects the measurement: parameters, the experiment's scalar settings
(tolerance, end_to_end, ...), harness settings, the measuring code (experiment module, base,
harness, gpu), kernel source hash and nvcc options; GPU UUID, driver, CUDA, pycuda and nvcc
versions for GPU points, host, CPU and numpy for CPU points.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from cudalab import devicespec, results
from cudalab.config import block_hash
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Point, Result, RunContext, Skipped
from cudalab.harness import Harness, Settings
from cudalab.provenance import job_provenance, now_iso, nvidia_driver_version, source_hash


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _gpu_error_kind(exc: BaseException) -> str:
    name = type(exc).__name__
    text = str(exc)
    if name == "MemoryError" or "out of memory" in text.lower():
        return "out of GPU memory"
    if name == "LaunchError" or "launch" in text.lower():
        return "kernel launch failed"
    if name == "CompileError":
        return "nvcc failed"
    return name


GPU_KEY = ("gpu_uuid", "driver_version", "cuda_version", "pycuda_version", "nvcc_version")
CPU_KEY = ("host", "cpu_model", "numpy_version")


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
             gpu_module.__file__]
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


def run_experiment(config: dict[str, Any], name: str, results_dir: Path) -> dict[str, Any]:
    """Measure every point of one experiment; returns (and writes) the job manifest."""
    exp = REGISTRY[name]
    block = config["experiments"][name]
    raw_dir = results_dir / "raw" / name
    raw_dir.mkdir(parents=True, exist_ok=True)
    points = exp.grid(config)
    job_id = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    settings = Settings.from_config(config["measurement"])
    env = job_provenance(block_hash(block))
    env["timestamp"] = now_iso()
    env["code_hash"] = code_hash(exp)

    need_gpu = any(p.gpu for p in points)
    gpu = None
    observers: list[Any] = []
    job_sources: list[Any] = []
    telemetry_dir = results_dir / "telemetry" / job_id
    flush = None
    nvml = None
    disabled: dict[str, Any] = {}
    if need_gpu:
        from cudalab import gpu as gpumod

        gpu = gpumod.open_session(config["gpu_index"])  # NoGpuError stops the job here
        env |= gpu.info
        tcfg = config["telemetry"]
        from cudalab.telemetry import NvidiaSmiSampler, NvmlClockObserver

        nvml = NvmlClockObserver(
            gpu.index, tcfg["throttle_clock_ratio"], pci_bus_id=gpu.info["gpu_pci_bus_id"]
        ) if tcfg["nvml"] else None
        if nvml is not None:
            env |= {k: v for k, v in nvml.device_facts().items()
                    if k in ("driver_version", "gpu_uuid") and v}
            if nvml.handle is not None:
                observers.append(nvml)
            else:
                log(f"{name}: {nvml.unavailable}; samples are not checked for throttling")
            job_sources.append(nvml)
        else:
            disabled |= {"nvml": "disabled", "nvml_reason": "telemetry.nvml is false"}
        if tcfg["nvidia_smi"]:
            smi_index = _nvidia_smi_index(gpu)
            job_sources.append(NvidiaSmiSampler(telemetry_dir, smi_index, tcfg["interval_ms"]))
        else:
            disabled |= {"nvidia_smi": "disabled",
                         "nvidia_smi_reason": "telemetry.nvidia_smi is false"}
        if settings.cold_l2:
            flush = gpu.l2_flusher()
        env.setdefault("driver_version", nvidia_driver_version() or "unknown")
    peaks = devicespec.device_peaks(gpu) if gpu is not None and exp.vs_device_peak else {}

    harness = Harness(settings, observers, flush_l2=flush)
    seed = config.get("seed") or int.from_bytes(np.random.bytes(4), "little")
    ctx = RunContext(gpu=gpu, harness=harness, rng=np.random.default_rng(seed),
                     config=config, block=block)
    log(f"{name}: {len(points)} grid points ({sum(p.gpu for p in points)} on the GPU)"
        + (f" on {env.get('gpu_name')} (cc {env.get('compute_capability')})" if gpu else ""))

    phases: list[dict[str, Any]] = []
    statuses: dict[str, str] = {}
    for src in job_sources:
        if hasattr(src, "before_job"):
            _telemetry_hook(src, "before_job")
    t_job = time.time()
    try:
        prepare_error = ""
        try:
            exp.prepare(ctx)
        except Exception as exc:  # noqa: BLE001 - a compile error fails the GPU points
            prepare_error = f"{_gpu_error_kind(exc)}: {exc}"
            log(f"{name}: preparing failed: {prepare_error}")
        dead_reason = ""
        done = 0
        for i, point in enumerate(points, 1):
            path = raw_dir / f"{point.point_id}.json"
            t0 = time.time()
            rec: dict[str, Any] = {
                "schema_version": results.SCHEMA_VERSION,
                "experiment": name, "variant": point.variant, "point_id": point.point_id,
                "params": point.params, "job_id": job_id, "seed": seed,
            }
            if (prepare_error or dead_reason) and point.gpu:
                rec |= {"status": "failed", "reason": prepare_error or dead_reason,
                        "provenance": env, "t_start": t0, "t_end": t0}
                results.write_json_atomic(path, rec)
                statuses[point.point_id] = "failed"
                continue
            try:
                kernel = exp.kernel_for(ctx, point) if point.gpu else None
                key = cache_key(point, settings, env, kernel, block, env["code_hash"])
                old = results.read_record(path)
                if old and old.get("cache_key") == key and old.get("status") == "ok":
                    if not old.get("cached"):
                        results.write_json_atomic(path, old | {"cached": True})
                    statuses[point.point_id] = "ok"
                    done += 1
                    log(f"[{i}/{len(points)}] {point.label()}: cached from {old['job_id']}")
                    continue
                result = exp.measure(ctx, point)
            except Skipped as exc:  # an optional dependency is missing: no fault, no speed
                rec |= {"status": "skipped", "reason": str(exc), "provenance": env,
                        "t_start": t0, "t_end": time.time()}
                results.write_json_atomic(path, rec)
                statuses[point.point_id] = "skipped"
                log(f"[{i}/{len(points)}] {point.label()}: skipped ({exc})")
                continue
            except Exception as exc:  # noqa: BLE001 - OOM, launch failure, ...
                reason = f"{_gpu_error_kind(exc)}: {exc}"
                rec |= {"status": "failed", "reason": reason, "provenance": env,
                        "traceback": traceback.format_exc(limit=5),
                        "t_start": t0, "t_end": time.time()}
                results.write_json_atomic(path, rec)
                statuses[point.point_id] = "failed"
                log(f"[{i}/{len(points)}] {point.label()}: FAILED ({reason})")
                if gpu is not None and point.gpu:
                    from cudalab.gpu import context_alive

                    if not context_alive(gpu):
                        dead_reason = (f"skipped: the CUDA context was lost after "
                                       f"{point.point_id} failed ({reason})")
                continue
            rec |= _record_body(result, env, key, _throttle_check(point, nvml),
                                peaks if point.gpu else {})
            rec |= {"t_start": t0, "t_end": time.time()}
            results.write_json_atomic(path, rec)
            statuses[point.point_id] = rec["status"]
            phases.append({"point_id": point.point_id, "t_start": t0, "t_end": rec["t_end"],
                           "n_throttled": (rec.get("timing") or {}).get("n_throttled")})
            done += 1
            log(f"[{i}/{len(points)}] {point.label()}: {_summary(rec)}"
                + _eta(t_job, done, len(points) - i))
    finally:
        for src in job_sources:
            if hasattr(src, "after_job"):
                _telemetry_hook(src, "after_job")
    telemetry_status: dict[str, Any] = dict(disabled)
    for src in job_sources:
        telemetry_status |= src.status()
    if not need_gpu:
        telemetry_status = {"nvidia_smi": "not applicable", "nvml": "not applicable",
                            "reason": "CPU-only job"}
    manifest = {
        "experiment": name, "job_id": job_id, "t_start": t_job, "t_end": time.time(),
        "points": statuses, "phases": phases, "telemetry": telemetry_status,
        "telemetry_dir": str(telemetry_dir) if need_gpu else "",
        "provenance": env, "seed": seed,
        "counts": {s: list(statuses.values()).count(s) for s in results.STATUSES},
    }
    if need_gpu:
        results.write_json_atomic(telemetry_dir / "phases.json", manifest)
    results.write_json_atomic(raw_dir / "_manifest.json", manifest)
    c = manifest["counts"]
    log(f"{name}: done: {c['ok']} ok, {c['wrong']} wrong, {c['failed']} failed, "
        f"{c['skipped']} skipped in {manifest['t_end'] - t_job:.1f} s")
    return manifest


def _telemetry_hook(src: Any, hook: str) -> None:
    """Telemetry never stops a measurement: a failing hook marks its source unavailable."""
    try:
        getattr(src, hook)()
    except Exception as exc:  # noqa: BLE001
        log(f"telemetry {type(src).__name__}.{hook} failed: {exc}")
        if hasattr(src, "unavailable") and not src.unavailable:
            src.unavailable = f"{hook} failed: {type(exc).__name__}: {exc}"


def _throttle_check(point: Point, nvml: Any) -> str:
    """'ok' if NVML watched this point's samples for throttling, else why not."""
    if not point.gpu:
        return "not applicable (CPU point)"
    if nvml is None:
        return "not checked: telemetry.nvml is false"
    return "ok" if nvml.active else f"not checked: {nvml.unavailable}"


def _unchecked(timing: dict[str, Any], why: str) -> dict[str, Any]:
    """No throttle observer ran: n_throttled is unknown (None), not 0."""
    return timing | {"n_throttled": None, "throttle_check": why}


def _record_body(result: Result, env: dict[str, Any], key: str,
                 throttle_check: str = "ok",
                 peaks: dict[str, float] | None = None) -> dict[str, Any]:
    """The measured part of a record. `peaks` (the device's theoretical DRAM bandwidth and
    FP32 rate) goes with the declared work, so the table can give % of peak."""
    prov = dict(env)
    prov["timestamp"] = now_iso()  # when this point was measured (env's: when the job began)
    if result.kernel is not None:
        prov["nvcc_options"] = " ".join(result.kernel.options)
        prov["kernel_hash"] = result.kernel.source_hash
    status, reason = "ok", ""
    if result.timing is None and result.check is None:
        status, reason = "failed", "no measurement"
    if result.check is not None and not result.check.passed:
        status = "wrong"
        reason = (f"{result.check.metric} = {result.check.error:.3g} exceeds tolerance "
                  f"{result.check.tolerance:.3g}" + (f"; {result.check.detail}"
                                                     if result.check.detail else ""))
    timing = result.timing.as_dict() if result.timing else None
    phases = {k: v.as_dict() for k, v in result.phases.items()}
    if throttle_check != "ok":
        timing = _unchecked(timing, throttle_check) if timing else None
        phases = {k: _unchecked(v, throttle_check) for k, v in phases.items()}
    return {
        "status": status, "reason": reason, "cache_key": key,
        "timing": timing,
        "phases": phases,
        "work": {"flops": result.flops, "bytes": result.bytes, **(peaks or {})},
        "check": result.check.as_dict() if result.check else None,
        "metrics": result.metrics, "extra": result.extra, "provenance": prov,
    }


def _summary(rec: dict[str, Any]) -> str:
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


def _eta(t0: float, done: int, left: int) -> str:
    if done == 0 or left == 0:
        return ""
    return f"  [~{(time.time() - t0) / done * left:.0f} s left]"


def _si(x: float) -> str:
    for unit, scale in (("", 1), ("m", 1e-3), ("u", 1e-6), ("n", 1e-9)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def _nvidia_smi_index(gpu: Any) -> str:
    """nvidia-smi ignores CUDA_VISIBLE_DEVICES: address the GPU by PCI bus id instead
    (in nvidia-smi's spelling, 00000000:18:00.0; pycuda gives 0000:18:00.0)."""
    from cudalab.telemetry import smi_device_id

    return smi_device_id(gpu.info.get("gpu_pci_bus_id", ""), gpu.index)
