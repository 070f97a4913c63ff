"""One job per experiment: walk its grid in one process (one CUDA context, one compile per
kernel variant), keep every finished point on disk, and redo only what is missing.

A point is reused when a record with the same cache key exists and is ok. The key hashes
everything that affects the measurement: parameters, the experiment's scalar settings
(tolerance, end_to_end, ...), harness settings, the measuring code (experiment module, base,
harness, gpu), kernel source hash and nvcc options; GPU UUID, driver, CUDA, pycuda and nvcc
versions for GPU points, host, CPU and numpy for CPU points.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cudalab import devicespec, gpu_slots, results, trials
from cudalab.config import block_hash
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Experiment, Point, RunContext, Skipped
from cudalab.gpu_errors import CUDA_KINDS, gpu_error_kind
from cudalab.gpu_slots import Claim
from cudalab.harness import Harness, Settings
from cudalab.point_record import cache_key, code_hash, record_body, summary_line, throttle_check_of
from cudalab.provenance import job_provenance, now_iso, nvidia_driver_version
from cudalab.shards import MANIFEST, Shard, build_lock, points_of, walk_order

if TYPE_CHECKING:
    from cudalab.ceilings import Ceilings
    from cudalab.gpu import GpuSession
    from cudalab.nvml_clocks import NvmlClockObserver


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class TelemetrySource(Protocol):
    """Something that watches the GPU for a whole job (nvidia-smi sampler, NVML observer).
    `unavailable` says why it saw nothing ('' while it works)."""

    unavailable: str

    def before_job(self) -> None: ...

    def after_job(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


@dataclass
class Job:
    """What every point of one job shares: the experiment, its settings and provenance, the
    GPU session (None for CPU-only jobs or where no GPU is here) and telemetry."""

    name: str
    exp: Experiment
    config: dict[str, Any]
    points: list[Point]
    settings: Settings
    env: dict[str, Any]
    job_id: str
    seed: int
    raw_dir: Path
    telemetry_dir: Path
    gpu: GpuSession | None = None
    nvml: NvmlClockObserver | None = None
    sources: list[TelemetrySource] = field(default_factory=list)
    telemetry_off: dict[str, Any] = field(default_factory=dict)
    flush: Callable[[], None] | None = None
    no_gpu: str = ""  # set: GPU points are recorded "not_measured" with this reason
    blocked: str = ""  # set: GPU points fail with this reason (prepare failed, context lost)
    statuses: dict[str, str] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)
    ceilings: Ceilings | None = None  # measured once per GPU job (cudalab.ceilings)
    floor: dict[str, Any] | None = None  # the resolution floor, once per GPU job with trials
    profile: dict[str, Any] = field(default_factory=dict)  # the ncu step's summary, if it ran
    slot: Claim | None = None  # the GPU a local job locked (cudalab.gpu_slots), held to the end
    shard: Shard | None = None  # one shard of the grid (cudalab.shards); None: all of it

    @property
    def block(self) -> dict[str, Any]:
        return self.config["experiments"][self.name]

    @property
    def manifest(self) -> str:
        """The file name of this job's manifest in raw_dir."""
        return self.shard.manifest if self.shard else MANIFEST

    @property
    def needs_gpu(self) -> bool:
        return any(p.gpu for p in self.points)


def job_fingerprint(config: dict[str, Any], name: str, machine: bool = True) -> str:
    """What makes a measure job stale when it changes: its block, the blocks its grid reads,
    the measurement and telemetry settings, the modules it loads (the workflow's rerun
    trigger; in the manifest). machine=False leaves out what this machine makes of the
    block: a login node cannot judge a compute node's job by it."""
    blocks = [config["experiments"].get(b) for b in REGISTRY[name].reads_blocks]
    parts = [config["experiments"][name], *blocks, config["measurement"], config["telemetry"]]
    facts = REGISTRY[name].machine_facts(config["experiments"][name]) if machine else None
    if facts is not None:  # what this machine makes of the block (static analysis: auto)
        parts.append(facts)
    modules = (config.get("slurm") or {}).get("modules")
    if modules:  # another toolkit module can change every GPU point
        parts.append({"modules": modules})
    if profiling(config):  # turning counters on reruns the job (its timings are reused)
        parts.append(config["profile"])
    return block_hash(parts)


def profiling(config: dict[str, Any]) -> bool:
    """Whether the config asks for Nsight Compute counters (profile.ncu)."""
    return bool((config.get("profile") or {}).get("ncu"))


def rerun_reasons(results_dir: Path, name: str, shard: Shard | None = None) -> list[str]:
    """Why a finished job of `name` (or of one shard of it) must run again although its
    manifest exists: damaged raw records (unreadable JSON; named; a shard's own points only)
    and points a GPU-less run left not measured."""
    raw_dir = Path(results_dir) / "raw" / name
    manifest = results.read_json(raw_dir / (shard.manifest if shard else MANIFEST))
    if manifest is None:
        return []
    mine = set(manifest.get("points") or ()) if shard else None
    why = [f"damaged record {p} ({err}): its point is measured again"
           for p, err in results.damaged_records(raw_dir) if mine is None or p.stem in mine]
    missing = [k for k, v in (manifest.get("points") or {}).items() if v == "not_measured"]
    if missing:
        why.append(f"{len(missing)} GPU point(s) not measured yet (no GPU in an earlier run)")
    return why


RERUN_MARKER = "_rerun.txt"


def mark_stale(results_dir: Path, name: str) -> list[str]:
    """Keep raw/<name>/_rerun.txt, an input of the measure rule: when the finished job must
    run again (rerun_reasons), it is rewritten with the reasons, so it is newer than the
    manifest and Snakemake reruns the job; otherwise it is created with an mtime of 0 (the
    epoch), older than any manifest, and left alone. Returns the reasons."""
    marker = Path(results_dir) / "raw" / name / RERUN_MARKER
    why = rerun_reasons(results_dir, name)
    marker.parent.mkdir(parents=True, exist_ok=True)
    if why:
        marker.write_text("".join(f"{line}\n" for line in why))
    elif not marker.exists():
        marker.write_text("")
        os.utime(marker, (0, 0))
    return why


def not_measured_summary(results_dir: Path, names: list[str]) -> str:
    """The workflow's closing line when GPU points were left unmeasured ('' if none)."""
    counts = {}
    for name in names:
        m = results.read_json(Path(results_dir) / "raw" / name / "_manifest.json") or {}
        counts[name] = (m.get("counts") or {}).get("not_measured", 0)
    total = sum(counts.values())
    if not total:
        return ""
    which = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    return (f"cudalab: {total} GPU point(s) were not measured: no GPU here ({which}). "
            "To measure them, run the same command on a GPU machine (or snakemake --profile "
            "slurm from a login node): only those points are measured, the ok ones are "
            "reused from results/raw/.")


def run_experiment(config: dict[str, Any], name: str, results_dir: Path,
                   shard: Shard | None = None) -> dict[str, Any]:
    """Measure every point of one experiment (or of one shard of its grid: cudalab.shards);
    returns (and writes) the job manifest."""
    job = _new_job(config, name, results_dir, shard)
    try:
        return _run_job(job)
    finally:
        if job.slot is not None:  # the GPU's lock, whatever happened
            job.slot.release()


def _run_job(job: Job) -> dict[str, Any]:
    name = job.name
    if job.needs_gpu:
        _open_gpu(job)
    ctx = _context(job)
    log(f"{name}: {len(job.points)} grid points ({sum(p.gpu for p in job.points)} on the GPU)"
        + (f" in shard {job.shard.index} of {job.shard.count}" if job.shard else "")
        + (f" on {job.env.get('gpu_name')} (cc {job.env.get('compute_capability')})"
           if job.gpu else ""))
    for src in job.sources:
        _telemetry_hook(src, "before_job")
    t_job = time.time()
    try:
        with cpu_threads(job):
            _prepare(job, ctx)
            _measure_ceilings(job, ctx)
            _measure_floor(job, ctx)
            _walk(job, ctx, t_job)
    finally:
        for src in job.sources:
            _telemetry_hook(src, "after_job")
    _profile(job, ctx)
    return _write_manifest(job, t_job)


def _usable_cores() -> int:
    """The cores this process may run on (its Slurm allocation or CPU set; macOS has no
    affinity call: all cores)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else (os.cpu_count() or 1)


def shared_cores(config: dict[str, Any], slot: Claim | None) -> int:
    """The cores one job's CPU work may use: all of them, shared out between the GPU jobs a
    local multi-GPU run starts at once. On 4 H200s, three jobs each running their float64
    references on all 64 cores stretched matmul's job from 214 s to 481 s."""
    cores = _usable_cores()
    if slot is None:
        return cores
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if slot.cvd_before is not None:  # what the run saw before this job pinned its GPU
        env["CUDA_VISIBLE_DEVICES"] = slot.cvd_before
    return max(1, cores // max(1, len(gpu_slots.usable_gpus(config, env=env))))


@contextlib.contextmanager
def cpu_threads(job: Job) -> Iterator[None]:
    """The job's CPU work runs with measurement.cpu_threads BLAS/OpenMP threads (0: the
    cores this process may use: under Snakemake and Slurm its allocation), recorded in the
    job's provenance with the BLAS library; without threadpoolctl the BLAS keeps its own
    count, which is recorded as unknown."""
    want = job.config["measurement"].get("cpu_threads") or shared_cores(job.config, job.slot)
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        job.env |= {"cpu_threads": None, "blas": "unknown (threadpoolctl not installed)"}
        yield
        return
    with threadpool_limits(limits=want):
        libs = [f"{i['internal_api']} {i.get('version') or ''} ({i['num_threads']} threads)"
                for i in threadpool_info()]
        job.env |= {"cpu_threads": want, "blas": "; ".join(libs) or "none loaded"}
        yield


def _new_job(config: dict[str, Any], name: str, results_dir: Path,
             shard: Shard | None = None) -> Job:
    exp = REGISTRY[name]
    settings = Settings.from_config(config["measurement"])
    # the config hash covers the block and the measurement settings: both shape the numbers
    env = job_provenance(block_hash({"block": config["experiments"][name],
                                     "harness": settings.as_dict()}))
    env["timestamp"] = now_iso()
    env["code_hash"] = code_hash(exp)
    env |= exp.tool_provenance(config["experiments"][name])
    job_id = f"{name}{'-' + shard.tag if shard else ''}-{time.strftime('%Y%m%dT%H%M%S')}"
    raw_dir = results_dir / "raw" / name
    raw_dir.mkdir(parents=True, exist_ok=True)
    points = exp.grid(config)
    return Job(name=name, exp=exp, config=config,
               points=points_of(points, shard) if shard else points, settings=settings,
               env=env, job_id=job_id,
               seed=config.get("seed") or int.from_bytes(np.random.bytes(4), "little"),
               raw_dir=raw_dir, telemetry_dir=results_dir / "telemetry" / job_id, shard=shard)


def _open_gpu(job: Job) -> None:
    """Open the GPU and its telemetry. Without a GPU: under Slurm (a job that asked for one)
    NoGpuError stops the job; elsewhere the GPU points are recorded as not measured."""
    from cudalab import gpu as gpumod

    try:
        # several GPUs here: lock a free one and pin this process to it before CUDA starts
        job.slot = gpu_slots.claim_for_job(job.config, job.raw_dir, say=log,
                                           every=job.exp.all_gpus, manifest=job.manifest)
        job.gpu = gpumod.open_session(0 if job.slot else job.config["gpu_index"])
    except gpumod.NoGpuError as exc:
        if job.env.get("slurm_job_id"):
            raise  # a Slurm job that asked for a GPU: its message names job, node and GPUs
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        job.no_gpu = (f"not measured: no GPU here ({exc.why or exc}; CUDA_VISIBLE_DEVICES="
                      f"{'unset' if cvd is None else repr(cvd)})")
        log(f"{job.name}: {job.no_gpu}: its GPU points are recorded as not measured; "
            "run the workflow again on a GPU machine to measure them")
        return
    job.env |= job.gpu.info
    job.gpu.build_lock = build_lock if job.shard else None  # its other shards build alike
    if job.slot is not None:
        job.env |= job.slot.provenance()
        log(f"{job.name}: measures on {'; '.join(g.label() for g in job.slot.gpus)}")
    else:
        job.env["gpu_smi_index"] = gpu_slots.smi_index(job.env.get("gpu_pci_bus_id", ""))
    _open_telemetry(job)
    if job.settings.cold_l2:
        job.flush = job.gpu.l2_flusher()
    job.env.setdefault("driver_version", nvidia_driver_version() or "unknown")


def _open_telemetry(job: Job) -> None:
    from cudalab.nvml_clocks import NvmlClockObserver
    from cudalab.telemetry import NvidiaSmiSampler

    gpu, tcfg = job.gpu, job.config["telemetry"]
    assert gpu is not None
    if tcfg["nvml"]:
        job.nvml = NvmlClockObserver(gpu.index, tcfg["throttle_clock_ratio"],
                                     pci_bus_id=gpu.info["gpu_pci_bus_id"])
        job.env |= {k: v for k, v in job.nvml.device_facts().items()
                    if k in ("driver_version", "gpu_uuid") and v}
        if not job.nvml.active:
            log(f"{job.name}: {job.nvml.unavailable}; samples are not checked for throttling")
        job.sources.append(job.nvml)
    else:
        job.telemetry_off |= {"nvml": "disabled", "nvml_reason": "telemetry.nvml is false"}
    if tcfg["nvidia_smi"]:
        job.sources.append(NvidiaSmiSampler(job.telemetry_dir, _nvidia_smi_index(gpu),
                                            tcfg["interval_ms"]))
    else:
        job.telemetry_off |= {"nvidia_smi": "disabled",
                              "nvidia_smi_reason": "telemetry.nvidia_smi is false"}


def _context(job: Job) -> RunContext:
    observers = [job.nvml] if job.nvml is not None and job.nvml.active else []
    harness = Harness(job.settings, observers, flush_l2=job.flush)
    return RunContext(gpu=job.gpu, harness=harness, rng=np.random.default_rng(job.seed),
                      config=job.config, block=job.block)


def _prepare(job: Job, ctx: RunContext) -> None:
    if job.no_gpu:
        return  # prepare() sets up GPU things (kernels, buffers)
    try:
        job.exp.prepare(ctx)
    except Exception as exc:  # noqa: BLE001 - a compile error fails the GPU points
        job.blocked = f"{gpu_error_kind(exc)}: {exc}"
        log(f"{job.name}: preparing failed: {job.blocked}")


def _measure_ceilings(job: Job, ctx: RunContext) -> None:
    """The GPU's measured ceilings, once per GPU job whose experiment is compared with the
    device (vs_device_peak) and could prepare; they go into every GPU record's work and the
    manifest. A failure never stops the job: the ceilings are NaN and the log says why."""
    if job.gpu is None or job.blocked or not job.exp.vs_device_peak:
        return
    from cudalab import ceilings

    t0 = time.time()
    if not job.config.get("measurement", {}).get("ceilings", True):
        job.ceilings = ceilings.not_measured(job.gpu, "measurement.ceilings is false")
    else:
        try:
            job.ceilings = ceilings.measure(job.gpu, ctx.harness)
        except Exception as exc:  # noqa: BLE001 - the job goes on without ceilings
            job.ceilings = ceilings.not_measured(job.gpu, f"{gpu_error_kind(exc)}: {exc}")
            job.ceilings.errors.append(exc)
    log(f"{job.name}: ceilings ({time.time() - t0:.1f} s): {job.ceilings.summary()}")
    if any(gpu_error_kind(e) in CUDA_KINDS for e in job.ceilings.errors):
        from cudalab.gpu import context_alive

        if not context_alive(job.gpu):
            job.blocked = ("skipped: the CUDA context was lost while measuring the ceilings "
                           f"({job.ceilings.note})")


def _measure_floor(job: Job, ctx: RunContext) -> None:
    """The job's resolution floor (cudalab.trials.measure_floor), once per GPU job that
    measures in trials and could prepare; it goes into every GPU record. A failure never
    stops the job: the floor is NaN with the reason (compare then uses the class floors)."""
    if job.gpu is None or job.blocked or job.settings.trials < 2:
        return
    t0 = time.time()
    try:
        job.floor = trials.measure_floor(job.gpu, ctx.harness)
    except Exception as exc:  # noqa: BLE001 - the job goes on without a floor
        job.floor = trials.not_measured_floor(f"{gpu_error_kind(exc)}: {exc}")
    f = job.floor
    log(f"{job.name}: resolution floor ({time.time() - t0:.1f} s): "
        + (f"{f['floor_s'] * 1e9:.0f} ns (empty kernel {f['empty_s'] * 1e6:.2f} us, spread "
           f"{f['empty_spread_s'] * 1e9:.0f} ns; tiny {f['tiny_s'] * 1e6:.2f} us, spread "
           f"{f['tiny_spread_s'] * 1e9:.0f} ns; {f['trials']} trials)"
           if math.isfinite(f["floor_s"]) else f"not measured ({f.get('note', '')})"))


def _profile(job: Job, ctx: RunContext) -> None:
    """The ncu step (profile.ncu): after the timing walk and the telemetry, so no timing
    and no telemetry sample is taken while the profiler runs. It never stops the job: what
    went wrong is each point's m_ncu_status and one log line."""
    if not profiling(job.config) or job.gpu is None:
        return
    from cudalab import profiler
    from cudalab.experiments.job_cache import free_all

    for value in ctx.cache.values():  # the profiled child needs the GPU's memory
        free_all(value)
    ctx.cache.clear()
    try:
        job.profile = profiler.profile_job(job.config, job.name, job.points, job.raw_dir,
                                           job.telemetry_dir / "ncu", job.seed)
    except Exception as exc:  # noqa: BLE001 - counters are optional, the timings stand
        job.profile = {"tool": "ncu", "status": f"not profiled: {type(exc).__name__}: {exc}",
                       "line": f"ncu step failed: {type(exc).__name__}: {exc}\n"
                               + traceback.format_exc(limit=5)}
    log(f"{job.name}: {job.profile['line']}")


def _walk(job: Job, ctx: RunContext, t_job: float) -> None:
    """Every point in grid order (a shard: in its walk order, shards.walk_order), each written
    to disk as soon as it is done."""
    peaks = (devicespec.device_peaks(job.gpu)
             if job.gpu is not None and job.exp.vs_device_peak else {})
    if peaks and job.ceilings is not None:
        peaks |= job.ceilings.values
    done = 0
    for i, point in enumerate(walk_order(job.points, job.shard) if job.shard else job.points, 1):
        rec, note = _one_point(job, ctx, point, peaks)
        job.statuses[point.point_id] = rec["status"]
        if note is None:
            continue
        done += 1
        log(f"[{i}/{len(job.points)}] {point.label()}: {note}"
            + (_eta(t_job, done, len(job.points) - i) if rec.get("timing") else ""))


def _one_point(job: Job, ctx: RunContext, point: Point,
               peaks: dict[str, float]) -> tuple[dict[str, Any], str | None]:
    """Measure (or reuse, or record why not) one point; returns its record and a log note
    (None: nothing worth a line)."""
    path = job.raw_dir / f"{point.point_id}.json"
    t0 = time.time()
    rec: dict[str, Any] = {
        "schema_version": results.SCHEMA_VERSION, "experiment": job.name,
        "variant": point.variant, "point_id": point.point_id, "params": point.params,
        "job_id": job.job_id, "seed": job.seed, "provenance": job.env,
        "t_start": t0, "t_end": t0,
    }
    old = results.read_record(path)
    if point.gpu and job.no_gpu:
        if old and old.get("status") == "ok":
            return old, None  # measured on a GPU before: keep it, never overwrite
        return _write(path, rec | {"status": "not_measured", "reason": job.no_gpu}), None
    if point.gpu and job.blocked:
        return _write(path, rec | {"status": "failed", "reason": job.blocked}), None
    try:
        kernel = job.exp.kernel_for(ctx, point) if point.gpu else None
        key = cache_key(point, job.settings, job.env, kernel, job.block, job.env["code_hash"])
        if old and old.get("cache_key") == key and old.get("status") == "ok":
            if not old.get("cached"):
                results.write_json_atomic(path, old | {"cached": True})
            return old, f"cached from {old['job_id']}"
        # the driver module moves buffers between trials; a session without one (a CPU-side
        # double of the GPU) has none to move
        cuda = getattr(job.gpu, "cuda", None) if point.gpu else None
        result, trial_list = trials.measure_trials(lambda: job.exp.measure(ctx, point),
                                                   ctx.harness, ctx.cache, cuda)
    except Skipped as exc:  # an optional dependency is missing: no fault, no speed
        rec |= {"status": "skipped", "reason": str(exc), "t_end": time.time()}
        return _write(path, rec), f"skipped ({exc})"
    except Exception as exc:  # noqa: BLE001 - OOM, launch failure, ...
        return _failed(job, point, path, rec, exc)
    rec |= record_body(result, job.env, key, throttle_check_of(point, job.nvml),
                       peaks if point.gpu else {}, gpu_point=point.gpu,
                       no_check_reason=job.exp.no_check_reason)
    if rec.get("timing") and len(trial_list) > 1:
        rec["timing"] |= {"trials": trial_list, "trial_spread": trials.spread(trial_list)}
    if point.gpu and job.floor is not None:
        rec["floor"] = job.floor
    rec["t_end"] = time.time()
    _write(path, rec)
    job.phases.append({"point_id": point.point_id, "t_start": t0, "t_end": rec["t_end"],
                       "n_throttled": (rec.get("timing") or {}).get("n_throttled")})
    return rec, summary_line(rec)


def _failed(job: Job, point: Point, path: Path, rec: dict[str, Any],
            exc: Exception) -> tuple[dict[str, Any], str]:
    """Record a failed point; if the failure killed the CUDA context, block the rest."""
    reason = f"{gpu_error_kind(exc)}: {exc}"
    rec |= {"status": "failed", "reason": reason, "t_end": time.time(),
            "traceback": traceback.format_exc(limit=5)}
    _write(path, rec)
    if job.gpu is not None and point.gpu:
        from cudalab.gpu import context_alive

        if not context_alive(job.gpu):
            job.blocked = (f"skipped: the CUDA context was lost after {point.point_id} "
                           f"failed ({reason})")
    return rec, f"FAILED ({reason})"


def _write(path: Path, rec: dict[str, Any]) -> dict[str, Any]:
    results.write_json_atomic(path, rec)
    return rec


def _write_manifest(job: Job, t_job: float) -> dict[str, Any]:
    """The job's manifest (the measure rule's output) and, for GPU jobs, its copy beside the
    telemetry; one summary line on the log."""
    telemetry: dict[str, Any] = dict(job.telemetry_off)
    for src in job.sources:
        telemetry |= src.status()
    if not job.needs_gpu:
        telemetry = {"nvidia_smi": "not applicable", "nvml": "not applicable",
                     "reason": "CPU-only job"}
    elif job.no_gpu:
        telemetry = {"nvidia_smi": "not applicable", "nvml": "not applicable",
                     "reason": job.no_gpu}
    statuses = list(job.statuses.values())
    manifest = {
        "experiment": job.name, "job_id": job.job_id, "t_start": t_job, "t_end": time.time(),
        "points": job.statuses, "phases": job.phases, "telemetry": telemetry,
        "telemetry_dir": str(job.telemetry_dir) if job.gpu is not None else "",
        "provenance": job.env, "seed": job.seed, "harness": job.settings.as_dict(),
        "fingerprint": job_fingerprint(job.config, job.name),
        "config_fingerprint": job_fingerprint(job.config, job.name, machine=False),
        "counts": {s: statuses.count(s) for s in results.STATUSES},
    }
    if job.ceilings is not None:
        manifest |= {"ceilings": job.ceilings.values, "ceilings_note": job.ceilings.note,
                     "ceilings_detail": job.ceilings.detail}
    if job.floor is not None:
        manifest["floor"] = job.floor
    if job.profile:
        manifest["profile"] = {k: v for k, v in job.profile.items() if k != "line"}
    if job.shard:
        manifest["shard"] = job.shard.tag
    if job.gpu is not None:
        results.write_json_atomic(job.telemetry_dir / "phases.json", manifest)
    results.write_json_atomic(job.raw_dir / job.manifest, manifest)
    c = manifest["counts"]
    log(f"{job.name}{' shard ' + job.shard.tag if job.shard else ''}: done: {c['ok']} ok, "
        f"{c['wrong']} wrong, {c['failed']} failed, "
        f"{c['skipped']} skipped, {c['not_measured']} not measured "
        f"in {manifest['t_end'] - t_job:.1f} s")
    return manifest


def _telemetry_hook(src: TelemetrySource, hook: str) -> None:
    """Telemetry never stops a measurement: a failing hook marks its source unavailable."""
    try:
        getattr(src, hook)()
    except Exception as exc:  # noqa: BLE001
        log(f"telemetry {type(src).__name__}.{hook} failed: {exc}")
        if not src.unavailable:
            src.unavailable = f"{hook} failed: {type(exc).__name__}: {exc}"


def _eta(t0: float, done: int, left: int) -> str:
    if done == 0 or left == 0:
        return ""
    return f"  [~{(time.time() - t0) / done * left:.0f} s left]"


def _nvidia_smi_index(gpu: Any) -> str:
    """nvidia-smi ignores CUDA_VISIBLE_DEVICES: address the GPU by PCI bus id instead
    (in nvidia-smi's spelling, 00000000:18:00.0; pycuda gives 0000:18:00.0)."""
    from cudalab.telemetry import smi_device_id

    return smi_device_id(gpu.info.get("gpu_pci_bus_id", ""), gpu.index)
