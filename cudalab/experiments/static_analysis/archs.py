"""Which target architectures static analysis compiles for.

`archs: auto` (the default): the architecture of every GPU NVML sees on this machine, plus
the documented pair FALLBACK_ARCHS (sm_80 and sm_90, the A100 and H100 generations), so a
run without a GPU still analyses the targets the course talks about and the "registers
depend on the target" claim has two targets to compare. `archs: all`: every target the
configured nvcc can build. A list: exactly those.

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
FALLBACK_ARCHS = ["sm_80", "sm_90"]
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
    return sorted({*FALLBACK_ARCHS, *(a for a in gpus if a in KNOWN)}, key=_sm)


def _sm(arch: str) -> int:
    digits = "".join(ch for ch in arch.split("_")[-1] if ch.isdigit())
    return int(digits) if digits else 0
