"""Which target architectures static analysis compiles for.

`archs: auto` (the default): the architecture of every GPU NVML sees on this machine, or,
without one, FALLBACK_ARCHS (sm_90, the H100 the course's reference runs use). One target by
default because each costs a whole nvcc front end: nvcc runs cicc once per target even when
one command names several, and cicc is 96 % of a build (matmul_pipeline.cu: 11 s of 11.7 s
on 2 cores). `archs: all`: every target the configured nvcc can build. A list: exactly those
(two or more, as [sm_80, sm_90], for the "registers depend on the target" claim).

NVML is read (no CUDA context, no nvcc run): the plan and a login node resolve `auto`
without starting a compiler; a Slurm job resolves it again on its compute node, where the
GPU is.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from cudalab import devicespec

AUTO, ALL = "auto", "all"
FALLBACK_ARCHS = ["sm_90"]
KNOWN = devicespec.sm_targets()


@lru_cache(maxsize=1)
def visible_gpu_archs() -> tuple[str, ...]:
    """sm_XY of each GPU NVML reports, in device order, once each (() without NVML, driver
    or GPU; CUDA_VISIBLE_DEVICES set empty or to -1 hides them as it hides them from CUDA)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return ()
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library or no driver: no GPU to read
        return ()
    try:
        found = []
        for i in range(nvml.nvmlDeviceGetCount()):
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(
                nvml.nvmlDeviceGetHandleByIndex(i))
            found.append(f"sm_{major}{minor}")
        return tuple(dict.fromkeys(found))
    except Exception:  # noqa: BLE001 - a device NVML cannot read: count what was read
        return tuple(dict.fromkeys(found))
    finally:
        nvml.nvmlShutdown()


def resolve(value: Any, nvcc_targets: list[str] | None = None,
            gpus: tuple[str, ...] | None = None) -> list[str]:
    """The architectures `archs` names, oldest first. nvcc_targets: what the nvcc can build
    (for `all`; None: every target the project knows from nvcc 13 on); gpus: the visible
    GPUs' architectures (None: read through NVML)."""
    if isinstance(value, list):
        return list(value)
    if value == ALL:
        targets = nvcc_targets or [a for a in KNOWN if _sm(a) >= 75]
        return sorted((a for a in targets if a in KNOWN), key=_sm)
    gpus = visible_gpu_archs() if gpus is None else gpus
    return sorted({a for a in gpus if a in KNOWN}, key=_sm) or list(FALLBACK_ARCHS)


def _sm(arch: str) -> int:
    digits = "".join(ch for ch in arch.split("_")[-1] if ch.isdigit())
    return int(digits) if digits else 0
