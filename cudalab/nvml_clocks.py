"""The GPU's clock-event ('throttle') reasons and the NVML observer of every timed chunk:
SM clock and reasons (nvidia-ml-py) at the start and end of each chunk of the harness, so
samples of a throttled chunk are flagged. It only reads: nothing here changes a clock, a
power limit or any other GPU setting. Without NVML a job still measures; status() says why
the check is missing.
"""

from __future__ import annotations

from typing import Any

# Clock-event ("throttle") reason bits, nvmlClocksEventReason* in nvml.h.
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


# Active reasons that do not mean the GPU was slowed down while working.
NOT_THROTTLING = {"gpu_idle", "applications_clocks_setting", "display_clock_setting"}


THROTTLING_MASK = sum(b for b, n in THROTTLE_BITS.items() if n not in NOT_THROTTLING)


def decode_reasons(mask: int) -> list[str]:
    """Names of the reason bits set in `mask` (unknown bits as 'bit_0x...')."""
    mask = int(mask)
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    names += [f"bit_{1 << i:#x}" for i in range(64) if rest >> i & 1]
    return names


def is_throttled(sm_mhz: float, max_sm_mhz: float, mask: int, ratio: float) -> bool:
    """Throttled: an active reason other than idle / application clocks / display clock, or
    an SM clock below `ratio` x its maximum."""
    if any(r not in NOT_THROTTLING for r in decode_reasons(mask)):
        return True
    return bool(max_sm_mhz > 0 and sm_mhz < ratio * max_sm_mhz)


# -- NVML per-chunk observer ---------------------------------------------------------------
class NvmlClockObserver:
    """SM clock and clock-event reasons at the start and end of each timed chunk (a harness
    Observer). A chunk is flagged throttled if the lower of the two clocks is below
    `ratio` x the maximum SM clock, or if either reading has a throttling reason active."""

    def __init__(self, gpu_index: int, ratio: float = 0.85, pci_bus_id: str = "",
                 nvml: Any = None) -> None:
        self.ratio = ratio
        self.unavailable = ""
        self.handle = None
        self.max_sm = 0.0
        self.nvml = None
        self._before: tuple[float, int] | None = None
        self.n_reads = 0
        self.n_flagged = 0
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            self.nvml = nvml
            # Match by PCI bus id: NVML indexes ignore CUDA_VISIBLE_DEVICES.
            if pci_bus_id:
                self.handle = nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
            else:
                self.handle = nvml.nvmlDeviceGetHandleByIndex(gpu_index)
            self.max_sm = float(nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_SM))
            self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
                or nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # nvidia-ml-py < 12.535
            self._read()
        except Exception as exc:  # noqa: BLE001 - no library, no driver, no permission
            self.unavailable = f"NVML unavailable: {type(exc).__name__}: {exc}"
            self.handle = None

    def _read(self) -> tuple[float, int]:
        sm = float(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
        mask = int(self._reasons(self.handle))
        self.n_reads += 1
        return sm, mask

    @property
    def active(self) -> bool:
        return self.handle is not None

    def before_batch(self) -> None:
        self._before = None
        if self.handle is not None:
            try:
                self._before = self._read()
            except Exception as exc:  # noqa: BLE001 - e.g. GPU lost: measuring goes on
                self._fail(exc)

    def after_batch(self) -> dict[str, Any]:
        if self.handle is None or self._before is None:
            return {}
        try:
            after = self._read()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return {}
        sm_min = min(self._before[0], after[0])
        mask = self._before[1] | after[1]
        throttled = is_throttled(sm_min, self.max_sm, mask, self.ratio)
        self.n_flagged += throttled
        return {
            "sm_clock_mhz_before": self._before[0],
            "sm_clock_mhz_after": after[0],
            "max_sm_clock_mhz": self.max_sm,
            "clock_reasons_mask": mask,
            "clock_reasons": decode_reasons(mask),
            "throttled": throttled,
        }

    def _fail(self, exc: Exception) -> None:
        self.unavailable = f"NVML read failed during the job: {type(exc).__name__}: {exc}"
        self.handle = None

    def before_job(self) -> None:
        """Nothing to start: NVML is read around every chunk (runner.TelemetrySource)."""

    def after_job(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def status(self) -> dict[str, Any]:
        return {"nvml": "ok" if not self.unavailable else "unavailable",
                "nvml_reason": self.unavailable,
                "nvml_throttle_ratio": self.ratio,
                "nvml_max_sm_clock_mhz": self.max_sm or None,
                "nvml_chunks_flagged": self.n_flagged}

    def device_facts(self) -> dict[str, Any]:
        if self.handle is None:
            return {}
        n = self.nvml
        facts: dict[str, Any] = {}
        for key, fn in [
            ("driver_version", lambda: n.nvmlSystemGetDriverVersion()),
            ("gpu_uuid", lambda: n.nvmlDeviceGetUUID(self.handle)),
            ("pcie_gen_max", lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(self.handle)),
            ("pcie_width_max", lambda: n.nvmlDeviceGetMaxPcieLinkWidth(self.handle)),
            ("pcie_gen_current", lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(self.handle)),
            ("pcie_width_current", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(self.handle)),
            ("power_limit_w", lambda: n.nvmlDeviceGetPowerManagementLimit(self.handle) / 1000),
            ("max_sm_clock_mhz", lambda: self.max_sm),
            ("max_mem_clock_mhz",
             lambda: n.nvmlDeviceGetMaxClockInfo(self.handle, n.NVML_CLOCK_MEM)),
        ]:
            try:
                v = fn()
                facts[key] = v.decode() if isinstance(v, bytes) else v
            except Exception:  # noqa: BLE001 - field not supported on this GPU
                continue
        return facts
