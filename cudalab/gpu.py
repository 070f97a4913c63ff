"""The CUDA side of a job: find the device, hold its primary context, compile kernels,
time with CUDA events (plain, or with the launches queued behind a held stream). pycuda is
imported lazily so CPU-only machines never need it.

The primary context (not pycuda.autoinit's own) is used so CuPy / cuBLAS can share it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cudalab.harness import QUEUED_MAX_BATCH, HoldTimeout
from cudalab.kernel_sources import HOLD_SOURCE
from cudalab.resources import CUDA_DIR

# How long the hold kernel waits for the host before it lets the queued launches run: far
# above the host time of a queued batch (256 launches of ~5-12 us), far below a hang.
HOLD_TIMEOUT_S = 0.5


class NoGpuError(RuntimeError):
    """No usable CUDA device: the job stops before measuring anything."""

    why: str = ""  # the short cause (no pycuda, 0 devices, ...) for one-line messages


def _no_gpu(why: str) -> NoGpuError:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    cvd_txt = "unset" if cvd is None else repr(cvd)
    looked = (f"no usable CUDA GPU: {why}. Looked for a CUDA device through pycuda "
              f"(cuInit + cuDeviceGetCount); CUDA_VISIBLE_DEVICES is {cvd_txt}. ")
    job = os.environ.get("SLURM_JOB_ID")
    if job:  # inside a Slurm job that asked for a GPU: the allocation is what is wrong
        node = os.environ.get("SLURMD_NODENAME") or os.environ.get("HOSTNAME") or "?"
        gres = os.environ.get("SLURM_JOB_GPUS") or os.environ.get("SLURM_GPUS_ON_NODE")
        err = NoGpuError(
            looked + f"This is Slurm job {job} on node {node} (GPUs Slurm gave it: "
            f"{gres or 'none'}): the job asked for a GPU but sees none. Check "
            "slurm.gpu_model (and slurm.partition / constraint) in the config against "
            "`sinfo -o '%P %N %G'`, or ask the cluster's admins whether the node's GPUs are "
            "configured (gres.conf). No numbers were recorded.")
        err.why = why
        return err
    err = NoGpuError(
        looked + "GPU variants need a GPU machine (or a Slurm GPU job: snakemake --profile "
        "profiles/slurm); CPU-only variants run anywhere. No numbers were recorded."
    )
    err.why = why
    return err


def nvcc_banner(path: str | None) -> str | None:
    """What `<path> --version` prints, or None where it cannot run (no path, no nvcc)."""
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout


def nvcc_version() -> str:
    text = nvcc_banner(shutil.which("nvcc"))
    if text is None:
        return "unavailable"
    m = re.search(r"release ([\d.]+), V([\d.]+)", text)
    return m.group(2) if m else text.strip().splitlines()[-1]


@dataclass
class Kernel:
    """A compiled module with what provenance needs to know about it."""

    module: Any
    source_file: str
    options: list[str]
    source_hash: str

    def function(self, name: str) -> Any:
        return self.module.get_function(name)


@dataclass
class GpuSession:
    index: int
    cuda: Any  # the pycuda.driver module
    device: Any
    context: Any
    _kernels: dict[tuple, Kernel] = field(default_factory=dict)
    _queued: tuple[Any, str] | None = None
    # a shard's job (cudalab.shards): the lesson's other shards build the same kernels at
    # the same time, so each build holds this lock (shards.build_lock) of its key, and the
    # others then find it in pycuda's cache
    build_lock: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None

    # -- device facts -------------------------------------------------------------------
    @cached_property
    def attributes(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.device.get_attributes().items()}

    def attr(self, name: str) -> int:
        return int(self.device.get_attribute(getattr(self.cuda.device_attribute, name)))

    @cached_property
    def info(self) -> dict[str, Any]:
        import pycuda

        cc = self.device.compute_capability()
        drv = self.cuda.get_driver_version()
        return {
            "gpu_name": self.device.name(),
            "gpu_uuid": _uuid(self.device) or _nvml_uuid(self.device.pci_bus_id()),
            "gpu_pci_bus_id": self.device.pci_bus_id(),
            "compute_capability": f"{cc[0]}.{cc[1]}",
            "cuda_driver_api": f"{drv // 1000}.{(drv % 1000) // 10}",
            "cuda_version": ".".join(map(str, self.cuda.get_version())),
            "pycuda_version": pycuda.VERSION_TEXT,
            "nvcc_version": nvcc_version(),
            "total_memory_bytes": int(self.device.total_memory()),
            # a launch of fewer blocks than this runs one partial wave (compare: small-grid)
            "sm_count": self.attr("MULTIPROCESSOR_COUNT"),
        }

    @property
    def l2_bytes(self) -> int:
        return self.attr("L2_CACHE_SIZE")

    # -- compiling ----------------------------------------------------------------------
    def compile(
        self, source_file: str, defines: dict[str, Any] | None = None, options: Sequence[str] = (),
        arch: str | None = None,
    ) -> Kernel:
        """Compile cuda/<source_file> once per job per (defines, options, arch); arch: an nvcc
        target such as sm_90a (default: the device's own, sm_XY)."""
        defines = defines or {}
        opts = ["-O3", "-lineinfo", *options] + [f"-D{k}={v}" for k, v in sorted(defines.items())]
        opts += planted_options()
        recorded = opts + ([f"-arch={arch}"] if arch else [])
        key = (source_file, tuple(recorded))
        if key not in self._kernels:
            path = CUDA_DIR / source_file
            src = path.read_text()
            mod = self._source_module(src, opts, arch)
            h = hashlib.sha256((src + "\0" + " ".join(recorded)).encode()).hexdigest()[:16]
            self._kernels[key] = Kernel(mod, source_file, recorded, h)
        return self._kernels[key]

    def _source_module(self, src: str, opts: list[str], arch: str | None) -> Any:
        """pycuda's SourceModule, built again without pycuda's disk cache where loading the
        image fails: pycuda writes a cache entry in place, so a job that reads it while
        another job (a shard of the same lesson, on another GPU) is still writing it loads a
        truncated image. A failed build (CompileError) is not retried."""
        from pycuda.compiler import SourceModule

        kw = {"options": opts, "no_extern_c": True, "include_dirs": [str(CUDA_DIR)],
              "arch": arch}
        key = "\0".join([src, *opts, str(arch)])
        with self.build_lock(key) if self.build_lock else contextlib.nullcontext():
            try:
                return SourceModule(src, **kw)
            except (self.cuda.LogicError, self.cuda.RuntimeError):
                return SourceModule(src, cache_dir=False, **kw)

    # -- timing -------------------------------------------------------------------------
    def event_timer(self, stream: Any = None) -> EventTimer:
        # queued timing holds the default stream, the one asynchronous fns enqueue on
        return EventTimer(self.cuda, stream, self.queued_timer if stream is None else None)

    def queued_timer(self) -> tuple[QueuedEventTimer | None, str]:
        """The job's queued-launch timer, or None and why it cannot be had here."""
        if self._queued is None:
            self._queued = self._make_queued_timer()
        return self._queued

    def _make_queued_timer(self) -> tuple[QueuedEventTimer | None, str]:
        import numpy as np

        cuda = self.cuda
        if not self.attr("CAN_MAP_HOST_MEMORY"):
            return None, "the device cannot map host memory"
        if not self.attr("UNIFIED_ADDRESSING"):
            # Without unified addressing mapped memory needs a context made with
            # ctx_flags.MAP_HOST; the primary context open_session retains has no such flag.
            return None, "no unified addressing (the primary context lacks MAP_HOST)"
        try:
            flag = cuda.pagelocked_zeros(2, np.int32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
            dptr = np.intp(flag.base.get_device_pointer())
            func = self.compile(HOLD_SOURCE).function("hold")
        except Exception as exc:  # noqa: BLE001 - pycuda's own error types
            return None, f"host-mapped flag or hold kernel unavailable: {exc}"
        func.prepare("Pq")
        # CLOCK_RATE is the peak SM clock in kHz: at a lower clock the hold lasts longer,
        # never shorter; 2 GHz where the driver does not say
        cycles = int(HOLD_TIMEOUT_S * (self.attr("CLOCK_RATE") or 2_000_000) * 1e3)

        def hold() -> None:
            func.prepared_call((1, 1), (1, 1, 1), dptr, cycles)

        return QueuedEventTimer(cuda, hold, flag), ""

    def launch_costs(self, func: Any, grid: tuple[int, ...], block: tuple[int, ...],
                     args: Sequence[Any], prepared: Callable[[], None], reps: int = 50
                     ) -> dict[str, float]:
        """What a launch costs beside the kernel itself, in seconds (the course's lesson
        "small problems are launch-bound", measured): the host time of one launch from
        Python through Function.__call__ (argument handling on every call) and through
        prepared_call (the `prepared` fn), each the mean of `reps` back-to-back calls; and
        one launch end to end, the median of events around a single launch on an idle
        stream (what one kernel of a program costs the GPU timeline)."""
        import time

        import numpy as np

        def host_s(launch: Callable[[], Any]) -> float:
            self.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                launch()
            dt = time.perf_counter() - t0
            self.synchronize()
            return dt / reps

        call_s = host_s(lambda: func(*args, block=block, grid=grid))
        prepared_s = host_s(prepared)
        start, end = self.cuda.Event(), self.cuda.Event()
        one = []
        for _ in range(max(5, reps // 5)):
            start.record()
            prepared()
            end.record()
            end.synchronize()
            one.append(end.time_since(start) * 1e-3)
        return {"host_call_s": call_s, "host_prepared_call_s": prepared_s,
                "one_launch_s": float(np.median(one))}

    def l2_flusher(self) -> Callable[[], None]:
        """Writes a buffer twice the L2 size, evicting whatever the last sample left there."""
        nbytes = 2 * max(self.l2_bytes, 1 << 20)
        buf = self.cuda.mem_alloc(nbytes)
        cuda = self.cuda

        def flush() -> None:
            cuda.memset_d32(buf, 0, nbytes // 4)
            cuda.Context.synchronize()

        flush._buf = buf  # keep the allocation alive with the closure
        return flush

    def synchronize(self) -> None:
        self.cuda.Context.synchronize()


class EventTimer:
    """CUDA events around `reps` launches on one stream: device time, but the launches run
    as fast as the host issues them, so a kernel shorter than the host's launch cost is
    timed at the host's launch rate. See QueuedEventTimer."""

    name = "cuda_event"

    def __init__(self, cuda: Any, stream: Any = None,
                 queued: Callable[[], tuple[Any, str]] | None = None) -> None:
        self.cuda = cuda
        self.stream = stream
        self.start = cuda.Event()
        self.end = cuda.Event()
        self._queued = queued

    def queued(self) -> tuple[Any, str]:
        """The queued variant of this timer (harness.choose_timer), or None and why not."""
        if self._queued is None:
            return None, "events on a non-default stream"
        return self._queued()

    def time(self, fn: Callable[[], Any], reps: int) -> float:
        self.start.record(self.stream)
        for _ in range(reps):
            fn()
        self.end.record(self.stream)
        self.end.synchronize()
        return self.end.time_since(self.start) * 1e-3


class QueuedEventTimer:
    """Events around `reps` launches that are all queued before the first one runs: a hold
    kernel (cuda/common/hold.cu) blocks the default stream, the start event, the launches and the
    stop event are enqueued behind it, then the host releases it through a host-mapped flag.
    The GPU then runs the batch back to back, so the host's launch cost stays out (nvbench's
    blocking kernel). A hold that timed out (the host blocked) raises HoldTimeout."""

    name = "cuda_event_queued"
    max_batch = QUEUED_MAX_BATCH

    def __init__(self, cuda: Any, hold: Callable[[], None], flag: Any) -> None:
        self.cuda = cuda
        self.hold = hold  # launches the hold kernel on the default stream
        self.flag = flag  # [release, timed_out], host-mapped
        self.start = cuda.Event()
        self.end = cuda.Event()

    def time(self, fn: Callable[[], Any], reps: int) -> float:
        if reps > self.max_batch:
            raise ValueError(f"a queued batch of {reps} exceeds {self.max_batch} launches")
        self.flag[0] = 0
        self.flag[1] = 0
        self.hold()
        self.start.record()
        for _ in range(reps):
            fn()
        self.end.record()
        self.flag[0] = 1  # release: the GPU runs start, the batch, end
        self.end.synchronize()
        if self.flag[1]:
            raise HoldTimeout(f"the hold kernel timed out after {HOLD_TIMEOUT_S} s before "
                              f"{reps} launches were queued (the host blocked)")
        return self.end.time_since(self.start) * 1e-3


def _uuid(device: Any) -> str:
    try:
        raw = device.get_uuid() if hasattr(device, "get_uuid") else None
    except Exception:  # noqa: BLE001 - older pycuda / drivers
        raw = None
    if not raw:
        return ""
    h = raw.hex() if isinstance(raw, (bytes, bytearray)) else str(raw)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _nvml_uuid(pci_bus_id: str) -> str:
    """The UUID from NVML, by PCI bus id: pycuda has no Device.get_uuid, and the UUID keys
    the point cache, so it must not depend on telemetry.nvml being on."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        try:
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode()))
        finally:
            nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML library, or no such device: unknown
        return ""
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


_SESSION: GpuSession | None = None

# A test hook of node acceptance (tools/accept_planted.sh): nvcc options added to every kernel
# this process compiles, e.g. "-Xptxas -O0", to make one GPU's kernels slower on purpose.
# The workflow never sets it; the options show in every record's nvcc_options and hash.
PLANT_ENV = "CUDALAB_PLANT_NVCC_OPTIONS"
_PLANT_ALLOWED = {"-Xptxas", "-O0", "-O1", "-O2", "-G"}


def planted_options() -> list[str]:
    """The planted nvcc options of PLANT_ENV (only a few harmless ones are taken)."""
    words = os.environ.get(PLANT_ENV, "").split()
    bad = [w for w in words if w not in _PLANT_ALLOWED]
    if bad:
        raise ValueError(f"{PLANT_ENV}: {' '.join(bad)} not allowed; allowed: "
                         f"{', '.join(sorted(_PLANT_ALLOWED))}")
    return words


def open_session(index: int = 0) -> GpuSession:
    """The job's GPU session (one per process), or NoGpuError saying what was looked for."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise _no_gpu(f"pycuda is not importable ({exc}); install the GPU extra: "
                      "pip install -e '.[gpu]' (README: Troubleshooting the pycuda build)") from exc
    try:
        cuda.init()
        count = cuda.Device.count()
    except Exception as exc:  # noqa: BLE001 - pycuda raises its own error types
        raise _no_gpu(f"the CUDA driver did not initialise ({exc})") from exc
    if count == 0:
        raise _no_gpu("the driver reports 0 devices")
    if index >= count:
        raise _no_gpu(f"gpu_index {index} asked for, but only {count} device(s) visible")
    device = cuda.Device(index)
    ctx = device.retain_primary_context()
    ctx.push()

    def _release() -> None:
        try:
            ctx.pop()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    atexit.register(_release)
    _SESSION = GpuSession(index=index, cuda=cuda, device=device, context=ctx)
    return _SESSION


def context_alive(session: GpuSession) -> bool:
    """After a launch failure the context is unusable ('sticky' errors): detect it."""
    try:
        session.cuda.Context.synchronize()
        session.cuda.mem_alloc(4).free()
        return True
    except Exception:  # noqa: BLE001
        return False
