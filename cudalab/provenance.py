"""Where a number came from: host, code version, Slurm context, software versions."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(
            # safe.directory: a checkout copied or owned by another user (shared GPU
            # machines, containers) is still read, not refused as "dubious ownership"
            ["git", "-c", f"safe.directory={ROOT}", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=20,
        )
        if out.returncode != 0:
            raise OSError(out.stderr)
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # results/ and the like are git-ignored; only tracked or new source counts as dirty
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.TimeoutExpired):
        return {"git_commit": "unknown", "git_dirty": None}
    return {"git_commit": commit, "git_dirty": dirty}


def slurm_context() -> dict[str, Any]:
    """The Slurm job a measurement ran in ('' outside Slurm).

    Under the Slurm executor plugin the rule runs in an inner `srun` step whose
    environment has SLURM_JOB_ID, SLURMD_NODENAME, SLURM_JOB_PARTITION, SLURM_STEP_GPUS
    and CUDA_VISIBLE_DEVICES, but not SLURM_GPUS / SLURM_JOB_GPUS (the plugin strips
    them before its srun): hence the fallbacks.
    """
    env = os.environ

    def first(*names: str) -> str:
        return next((env[n] for n in names if env.get(n)), "")

    return {
        "slurm_job_id": first("SLURM_JOB_ID", "SLURM_JOBID"),
        "slurm_node": first("SLURMD_NODENAME", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
                            "SLURM_NODELIST"),
        "slurm_partition": first("SLURM_JOB_PARTITION"),
        # the GPU indices Slurm gave the job (the step's, else the allocation's)
        "slurm_gpus": first("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS"),
        "cuda_visible_devices": first("CUDA_VISIBLE_DEVICES"),
    }


@lru_cache(maxsize=1)
def host_info() -> dict[str, Any]:
    import numpy

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count() or 0,
        "python_version": platform.python_version(),
        "numpy_version": numpy.__version__,
        **interpreter(),
    }


def interpreter() -> dict[str, Any]:
    """The Python that measured (every job runs the one that runs Snakemake, by path, not a
    `python` first on PATH) and where it imports cudalab from."""
    import cudalab

    return {"python_executable": sys.executable,
            "cudalab_path": str(Path(cudalab.__file__).resolve().parent)}


def software_environment(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The environment modules loaded in the job (LOADEDMODULES, as Lmod and Environment
    Modules keep it; '' without modules) and the nvcc on PATH that builds the kernels ('' if
    none): a site's module decides which toolkit measured."""
    env = os.environ if env is None else env
    return {"loaded_modules": env.get("LOADEDMODULES", ""),
            "nvcc_path": shutil.which("nvcc", path=env.get("PATH", "")) or ""}


def toolkit_provenance(nvcc: str | None) -> dict[str, Any]:
    """The toolkit a config names (experiments.static_analysis.nvcc, as found) and why the
    job may run it or refuses to (cudalab.toolkit.untrusted_reasons: owner and mode of it
    and every folder above it)."""
    from cudalab import toolkit

    if not nvcc:
        return {"toolkit_nvcc": "", "toolkit_check": "not found"}
    return {"toolkit_nvcc": nvcc, "toolkit_check": toolkit.check_result(nvcc)}


def nvidia_driver_version(path: Path = Path("/proc/driver/nvidia/version")) -> str:
    """The kernel driver's version (580.159.04) from /proc/driver/nvidia/version, for when
    NVML is not there; '' if neither is (no NVIDIA driver on this host)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return ""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text) or re.search(
        r"\s(\d{3,}\.\d+(?:\.\d+)?)\s", text)
    return m.group(1) if m else ""


def source_hash(paths: list[Path] | tuple[Path, ...]) -> str:
    """sha256 (16 hex) of the files' contents: the code that takes a measurement."""
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).name.encode() + b"\0")
        try:
            h.update(Path(p).read_bytes())
        except OSError:
            h.update(b"<missing>")
        h.update(b"\0")
    return h.hexdigest()[:16]


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def job_provenance(config_hash: str) -> dict[str, Any]:
    """What is the same for every point of one job (the runner adds the GPU's facts)."""
    return {**host_info(), **git_state(), **slurm_context(), **software_environment(),
            "config_hash": config_hash}
