"""Which GPU a local job measures on: every GPU of the machine busy, never two jobs on one.

Snakemake is told how many GPUs the run may use (common.smk sets its `gpu` resource to
`local_gpu_count`), so at most that many GPU jobs run at once. Each job then takes the first
free GPU by an exclusive lock (fcntl.flock on a file per GPU UUID: the kernel releases it
when the process ends, killed or not) and pins itself to that GPU with
CUDA_VISIBLE_DEVICES=<UUID> before CUDA starts. A job first tries the GPU its experiment ran
on last (its manifest), so a resumed run reuses its finished points: their cache key names
the GPU. The locks live in one folder per user and machine, so two runs of one user on one
machine never share a GPU either.

Under Slurm the allocation pins each job already, and `gpu_index` (a single GPU chosen by
hand) keeps its old meaning: in both cases nothing is claimed. With one usable GPU and no
`gpus:` list in the config, nothing changes either.

NVML lists the GPUs (nvidia-smi's order). Tests give a list of their own through
CUDALAB_TEST_GPUS (JSON), since this machine's CI has no GPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

TEST_GPUS_ENV = "CUDALAB_TEST_GPUS"
WAIT_NOTE_S = 30.0  # how often a job that waits for a GPU says so


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's (and nvidia-smi's) index: CUDA_VISIBLE_DEVICES does not change it
    uuid: str
    pci_bus_id: str
    name: str

    def label(self) -> str:
        return f"GPU {self.index} ({self.name}, {self.pci_bus_id})"


def nvml_gpus(nvml: Any = None) -> list[Gpu]:
    """Every GPU NVML sees, in its order; [] without NVML, a driver or a GPU."""
    fake = os.environ.get(TEST_GPUS_ENV)
    if fake is not None:
        return [Gpu(int(g["index"]), g["uuid"], g.get("pci_bus_id", ""), g.get("name", "GPU"))
                for g in json.loads(fake)]
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: no GPU to share out
        return []
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            out.append(Gpu(i, _text(nvml.nvmlDeviceGetUUID(h)),
                           _text(nvml.nvmlDeviceGetPciInfo(h).busId), _text(
                               nvml.nvmlDeviceGetName(h))))
        return out
    except Exception:  # noqa: BLE001 - a GPU that NVML cannot read is not handed out
        return []
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _visible(gpus: list[Gpu], cvd: str | None) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves (indices or UUIDs or their unique prefixes, as
    CUDA reads it: up to the first entry that matches nothing)."""
    if cvd is None:
        return gpus
    out: list[Gpu] = []
    for entry in (e.strip() for e in cvd.split(",")):
        match = [g for g in gpus if (entry.isdigit() and g.index == int(entry))
                 or (entry.startswith("GPU-") and g.uuid.startswith(entry))]
        if len(match) != 1 or match[0] in out:
            break
        out.append(match[0])
    return out


def usable_gpus(config: dict[str, Any], gpus: list[Gpu] | None = None,
                env: dict[str, str] | None = None) -> list[Gpu]:
    """The GPUs a local run may use: those NVML sees, less what CUDA_VISIBLE_DEVICES hides,
    restricted to the config's `gpus:` list (indices as nvidia-smi numbers them, or UUIDs)."""
    env = os.environ if env is None else env
    found = _visible(nvml_gpus() if gpus is None else gpus, env.get("CUDA_VISIBLE_DEVICES"))
    wanted = config.get("gpus", "all")
    if wanted == "all":
        return found
    keep = {str(w) for w in wanted}
    return [g for g in found if str(g.index) in keep or g.uuid in keep]


def pins(config: dict[str, Any], gpus: list[Gpu], env: dict[str, str] | None = None) -> bool:
    """Whether jobs claim a GPU: not under Slurm (its allocation pins them), not with a
    hand-picked gpu_index, and not where one GPU is all there is and no list was given."""
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID") or config.get("gpu_index", 0) != 0 or not gpus:
        return False
    return len(gpus) > 1 or config.get("gpus", "all") != "all"


def local_gpu_count(config: dict[str, Any]) -> int:
    """How many GPU jobs a local run starts at once: one per usable GPU, at least one (a
    GPU-less run still runs its GPU jobs, which record their points as not measured)."""
    gpus = usable_gpus(config)
    return max(1, len(gpus)) if pins(config, gpus) else 1


def shardable_gpu_count(config: dict[str, Any]) -> tuple[int, str]:
    """(how many GPUs one lesson's shards may spread over, why not more). A lesson split
    over GPUs of different models would mix their speeds in one lesson's comparisons, so
    a machine whose usable GPUs differ keeps one job per lesson."""
    gpus = usable_gpus(config)
    n = local_gpu_count(config)
    models = sorted({g.name for g in gpus})
    if n > 1 and len(models) > 1:
        return 1, "its GPUs are of different models (" + ", ".join(models) + ")"
    return n, ""


def lock_dir() -> Path:
    """One folder per user and machine (never world-writable: another user's files there
    would decide which GPU we take)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = Path(base) / f"cudalab-gpu-locks-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or path.stat().st_uid != os.getuid():
        raise RuntimeError(f"{path} is not this user's own folder: GPU locks cannot be kept")
    return path


@dataclass
class Claim:
    gpu: Gpu
    fd: int  # the open lock file: the GPU is ours while it stays open
    cvd_before: str | None = None  # CUDA_VISIBLE_DEVICES before the claim pinned it
    # a job that needs every GPU (the links between them): the others it locked, with fds
    others: tuple[tuple[Gpu, int], ...] = ()

    @property
    def gpus(self) -> list[Gpu]:
        return [self.gpu, *(g for g, _ in self.others)]

    def release(self) -> None:
        if self.fd < 0:
            return
        for fd in (self.fd, *(fd for _, fd in self.others)):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fd, self.others = -1, ()
        if self.cvd_before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = self.cvd_before

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu_smi_index": self.gpu.index, "gpu_slot_locked": True}
        if self.others:
            out["gpu_slot_gpus"] = [g.index for g in self.gpus]
        return out


def smi_index(pci_bus_id: str) -> int | None:
    """nvidia-smi's index of the GPU at this PCI bus id (None where NVML cannot tell)."""
    norm = pci_bus_id.lower().split(":", 1)[-1] if pci_bus_id else ""
    for g in nvml_gpus():
        if norm and g.pci_bus_id.lower().split(":", 1)[-1] == norm:
            return g.index
    return None


def _try_lock(folder: Path, gpu: Gpu) -> int | None:
    fd = os.open(folder / f"{gpu.uuid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _wait_for(attempt: Callable[[], T | None], t0: float, timeout_s: float | None,
              say: Callable[[str], None] | None, timed_out: Callable[[], str],
              waiting: Callable[[], str]) -> T:
    """attempt() until it gives something; meanwhile say waiting() every WAIT_NOTE_S
    seconds, and TimeoutError(timed_out()) once timeout_s has passed since t0."""
    noted = t0
    while (got := attempt()) is None:
        now = time.monotonic()
        if timeout_s is not None and now - t0 > timeout_s:
            raise TimeoutError(timed_out())
        if now - noted > WAIT_NOTE_S:
            noted = now
            (say or _stderr)(waiting())
        time.sleep(0.2)
    return got


def claim(gpus: list[Gpu], prefer_uuid: str = "", folder: Path | None = None,
          say: Callable[[str], None] | None = None, timeout_s: float | None = None
          ) -> Claim:
    """Lock a free GPU of `gpus` (prefer_uuid first) and pin this process to it. Waits while
    every one is taken (another run of this user), saying so every WAIT_NOTE_S seconds;
    TimeoutError after timeout_s (None: no limit)."""
    folder = lock_dir() if folder is None else folder
    order = sorted(gpus, key=lambda g: (g.uuid != prefer_uuid, g.index))

    def first_free() -> tuple[Gpu, int] | None:
        for gpu in order:
            fd = _try_lock(folder, gpu)
            if fd is not None:
                return gpu, fd
        return None

    gpu, fd = _wait_for(
        first_free, time.monotonic(), timeout_s, say,
        lambda: f"no free GPU among {len(gpus)} after {timeout_s:g} s",
        lambda: f"waiting for a free GPU: all {len(gpus)} are in use by other cudalab jobs "
                f"of this user ({holders(folder, gpus)})")
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    return Claim(gpu, fd, before)


def claim_all(gpus: list[Gpu], folder: Path | None = None,
              say: Callable[[str], None] | None = None, timeout_s: float | None = None
              ) -> Claim:
    """Lock every GPU of `gpus` and make them all visible to this process (in NVML order),
    for a job that measures between GPUs: no other job then measures on any of them. Locks
    are taken in index order, so two such jobs never hold part of what the other waits for;
    a one-GPU job never waits while holding a lock. Waits, saying so, while one is taken."""
    folder = lock_dir() if folder is None else folder
    held: list[tuple[Gpu, int]] = []
    t0 = time.monotonic()
    try:
        for gpu in sorted(gpus, key=lambda g: g.index):
            fd = _wait_for(
                lambda g=gpu: _try_lock(folder, g), t0, timeout_s, say,
                lambda g=gpu: f"GPU {g.index} still in use after {timeout_s:g} s",
                lambda g=gpu: f"waiting for every GPU ({len(held)} of {len(gpus)} locked): "
                              f"{holders(folder, [g])}")
            held.append((gpu, fd))
    except BaseException:
        for _, fd in held:
            os.close(fd)
        raise
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid for g, _ in held)
    (first, fd0), rest = held[0], tuple(held[1:])
    return Claim(first, fd0, before, rest)


def holders(folder: Path, gpus: list[Gpu]) -> str:
    """Which process holds each GPU's lock, as its lock file says."""
    out = []
    for g in gpus:
        try:
            pid = (folder / f"{g.uuid}.lock").read_text().strip()
        except OSError:
            pid = "?"
        out.append(f"GPU {g.index}: pid {pid or '?'}")
    return ", ".join(out)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def last_gpu(raw_dir: Path, manifest_name: str = "_manifest.json") -> str:
    """The UUID the experiment's (or its shard's) last job ran on (its manifest), '' where
    none."""
    from cudalab import results

    manifest = results.read_json(raw_dir / manifest_name) or {}
    prov = manifest.get("provenance") or {}
    return str(prov.get("gpu_uuid") or "")


def claim_for_job(config: dict[str, Any], raw_dir: Path,
                  say: Callable[[str], None] | None = None, every: bool = False,
                  manifest: str = "_manifest.json") -> Claim | None:
    """The GPU a local measure job takes (every usable GPU where `every`: a job measuring
    between GPUs), or None where jobs are not pinned; `manifest`: the job's own in raw_dir
    (a shard's), whose GPU it tries first."""
    found = nvml_gpus()
    gpus = usable_gpus(config, found)
    if found and not gpus:
        from cudalab.gpu import NoGpuError

        err = NoGpuError(f"gpus: {config.get('gpus')} names no GPU of this machine "
                         f"({'; '.join(g.label() for g in found)})")
        err.why = str(err)
        raise err
    if not pins(config, gpus) or "pycuda.driver" in sys.modules:
        # CUDA reads CUDA_VISIBLE_DEVICES once, when it starts: a process that may have
        # started it already (a test session, a notebook) keeps the device it has
        return None
    if every:
        return claim_all(gpus, say=say)
    return claim(gpus, last_gpu(raw_dir, manifest), say=say)


def problem(config: dict[str, Any]) -> str:
    """Why the config's `gpus:` list cannot be used here ('' where it can)."""
    found = nvml_gpus()
    if config.get("gpus", "all") == "all" or not found or usable_gpus(config, found):
        return ""
    return (f"gpus: {config['gpus']} names no usable GPU of this machine; it has "
            f"{'; '.join(g.label() for g in found)}")


def summary_line(config: dict[str, Any]) -> str:
    """What a local run will use, for the console at start-up."""
    gpus = usable_gpus(config)
    if not gpus:
        return "cudalab: no GPU found by NVML: GPU points are recorded as not measured"
    names = "; ".join(g.label() for g in gpus)
    if not pins(config, gpus):
        return f"cudalab: GPU jobs run one at a time (GPUs seen: {names})"
    return f"cudalab: {len(gpus)} GPU(s), one GPU job on each at a time: {names}"
