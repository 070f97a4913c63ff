"""Device query: what deviceQuery prints about the GPU, plus its theoretical peaks.

One point, nothing timed: the CUDA driver's device attributes (read through the driver API,
so attributes newer than pycuda's enum are there too), NVML's PCIe link and clocks, and the
peak DRAM bandwidth and FP32 throughput computed from them (cudalab.devicespec). The point's
check compares cudalab's per-compute-capability table (the occupancy calculator's input)
with the limits this device reports: a mismatch is a bug in cudalab.devicespec.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import pandas as pd

from cudalab import devicespec, fmt
from cudalab import occupancy as occ
from cudalab.experiments import base
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.device_query.lesson import LESSON

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

# metric -> (device attribute, unit, what deviceQuery calls it)
ATTRS: dict[str, tuple[str, str, str]] = {
    "sm_count": ("MULTIPROCESSOR_COUNT", "", "Multiprocessors (SMs)"),
    "sm_clock_khz": ("CLOCK_RATE", "kHz", "GPU max clock rate"),
    "mem_clock_khz": ("MEMORY_CLOCK_RATE", "kHz", "Memory clock rate"),
    "bus_width_bits": ("GLOBAL_MEMORY_BUS_WIDTH", "bit", "Memory bus width"),
    "l2_bytes": ("L2_CACHE_SIZE", "B", "L2 cache size"),
    "l2_persisting_max_bytes": ("MAX_PERSISTING_L2_CACHE_SIZE", "B",
                                "Max persisting L2 cache size"),
    "const_bytes": ("TOTAL_CONSTANT_MEMORY", "B", "Total constant memory"),
    "smem_per_block": ("MAX_SHARED_MEMORY_PER_BLOCK", "B", "Shared memory per block"),
    "smem_per_block_optin": ("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "B",
                             "Shared memory per block (opt-in)"),
    "smem_per_sm": ("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "B", "Shared memory per SM"),
    "smem_reserved_per_block": ("RESERVED_SHARED_MEMORY_PER_BLOCK", "B",
                                "Shared memory reserved by the driver per block"),
    "regs_per_block": ("MAX_REGISTERS_PER_BLOCK", "", "32-bit registers per block"),
    "regs_per_sm": ("MAX_REGISTERS_PER_MULTIPROCESSOR", "", "32-bit registers per SM"),
    "warp_size": ("WARP_SIZE", "", "Warp size"),
    "max_threads_per_block": ("MAX_THREADS_PER_BLOCK", "", "Max threads per block"),
    "max_threads_per_sm": ("MAX_THREADS_PER_MULTIPROCESSOR", "", "Max threads per SM"),
    "max_blocks_per_sm": ("MAX_BLOCKS_PER_MULTIPROCESSOR", "", "Max resident blocks per SM"),
    "max_block_x": ("MAX_BLOCK_DIM_X", "", "Max block dimension x"),
    "max_block_y": ("MAX_BLOCK_DIM_Y", "", "Max block dimension y"),
    "max_block_z": ("MAX_BLOCK_DIM_Z", "", "Max block dimension z"),
    "max_grid_x": ("MAX_GRID_DIM_X", "", "Max grid dimension x"),
    "max_grid_y": ("MAX_GRID_DIM_Y", "", "Max grid dimension y"),
    "max_grid_z": ("MAX_GRID_DIM_Z", "", "Max grid dimension z"),
    "copy_engines": ("ASYNC_ENGINE_COUNT", "",
                     "Concurrent copy and kernel execution: copy engines"),
    "concurrent_kernels": ("CONCURRENT_KERNELS", "bool", "Concurrent kernels"),
    "ecc_enabled": ("ECC_ENABLED", "bool", "ECC enabled"),
    "unified_addressing": ("UNIFIED_ADDRESSING", "bool", "Unified addressing (UVA)"),
    "managed_memory": ("MANAGED_MEMORY", "bool", "Managed memory"),
    "concurrent_managed_access": ("CONCURRENT_MANAGED_ACCESS", "bool",
                                  "Concurrent managed access"),
    "integrated": ("INTEGRATED", "bool", "Integrated GPU (shares host memory)"),
    "kernel_timeout": ("KERNEL_EXEC_TIMEOUT", "bool", "Run time limit on kernels"),
    "pci_domain": ("PCI_DOMAIN_ID", "", "PCI domain"),
    "pci_bus": ("PCI_BUS_ID", "", "PCI bus"),
    "pci_device": ("PCI_DEVICE_ID", "", "PCI device"),
}
# what else the table shows: metric -> (unit, label)
DERIVED: dict[str, tuple[str, str]] = {
    "cc": ("", "CUDA capability"),
    "total_memory_bytes": ("B", "Total global memory"),
    "fp32_cores_per_sm": ("", "FP32 cores per SM"),
    "fp32_cores": ("", "FP32 cores"),
    "max_warps_per_sm": ("", "Max resident warps per SM"),
    "sm_clock_mhz": ("MHz", "SM clock used for the peak"),
    "mem_clock_mhz": ("MHz", "Memory clock used for the peak"),
    "clock_source": ("", "Clocks read from"),
    "peak_mem_gbps": ("GB/s", "Theoretical peak DRAM bandwidth"),
    "peak_fp32_gflops": ("GFLOP/s", "Theoretical peak FP32 (FMA = 2 flops)"),
    "pcie_gen_max": ("", "PCIe generation (max)"),
    "pcie_width_max": ("lanes", "PCIe link width (max)"),
    "pcie_gen_current": ("", "PCIe generation (current)"),
    "pcie_width_current": ("lanes", "PCIe link width (current)"),
    "cuda_driver_api": ("", "CUDA driver API version"),
    "table_mismatches": ("", "cudalab table limits that differ from the device"),
}
REQUIRED = ("sm_count", "bus_width_bits", "max_threads_per_sm", "regs_per_sm", "smem_per_sm")


class DeviceQuery(Experiment):
    name = "device_query"
    order = 10
    lesson = LESSON
    schema = block_schema({
            "clock_source": {
                "enum": ["driver", "nvml"], "default": "driver",
                "description": "where the peak's clocks come from first: the CUDA driver's "
                "CLOCK_RATE / MEMORY_CLOCK_RATE attributes or NVML's max clocks (each falls "
                "back to the other)",
            },
        })
    smoke: dict[str, Any] = {}

    def points(self, block: dict[str, Any]) -> list[Point]:
        return [Point(self.name, "device", {"clock_source": block["clock_source"]})]

    def measure(self, ctx: RunContext, point: Point) -> Result:
        gpu = ctx.gpu
        drv = occ.CudaDriver()
        raw: dict[str, int] = {}
        missing = []
        for attr in {a for a, _, _ in ATTRS.values()} | set(devicespec.DEVICE_ATTRIBUTES.values()):
            try:
                raw[attr] = drv.device_attribute(gpu.index,
                                                 devicespec.CU_DEVICE_ATTRIBUTE_IDS[attr])
            except occ.CudaDriverError:
                missing.append(attr)
        m: dict[str, Any] = {k: raw[a] for k, (a, _, _) in ATTRS.items() if a in raw}
        info = gpu.info
        cc = info["compute_capability"]
        m["cc"] = cc
        m["total_memory_bytes"] = int(info["total_memory_bytes"])
        m["cuda_driver_api"] = info.get("cuda_driver_api", "")
        m["max_warps_per_sm"] = m.get("max_threads_per_sm", 0) // max(m.get("warp_size", 32), 1)
        nvml = _nvml_facts(gpu)
        for k in ("pcie_gen_max", "pcie_width_max", "pcie_gen_current", "pcie_width_current"):
            if nvml.get(k) is not None:
                m[k] = int(nvml[k])
        sm_khz, mem_khz, source = pick_clocks(m.get("sm_clock_khz"), m.get("mem_clock_khz"),
                                              nvml.get("max_sm_clock_mhz"),
                                              nvml.get("max_mem_clock_mhz"),
                                              point.params["clock_source"])
        m["clock_source"] = source
        if sm_khz:
            m["sm_clock_mhz"] = sm_khz / 1e3
        if mem_khz:
            m["mem_clock_mhz"] = mem_khz / 1e3
        if missing:
            m["attributes_missing"] = ", ".join(sorted(missing))
        try:
            s = devicespec.spec(cc)
        except KeyError as exc:
            m["table_mismatches"] = f"not checked: {exc}"
            return Result(None, check=Check(0.0, 0.0, "table_mismatches",
                                            detail=f"cc {cc} is not in cudalab.devicespec"),
                          metrics=m)
        if sm_khz and mem_khz and m.get("sm_count") and m.get("bus_width_bits"):
            m |= devicespec.theoretical_peaks(cc, m["sm_count"], sm_khz, mem_khz,
                                              m["bus_width_bits"])
        else:
            m["fp32_cores_per_sm"] = s.fp32_cores_per_sm
        mism = devicespec.compare_with_device(cc, raw)
        m["table_mismatches"] = "; ".join(f"{k}: table {a}, device {b}"
                                          for k, (a, b) in mism.items()) or "none"
        absent = [k for k in REQUIRED if k not in m]
        detail = ("; ".join(f"{k}: table {a}, device {b}" for k, (a, b) in mism.items())
                  + (f"; not reported: {', '.join(absent)}" if absent else ""))
        check = Check(float(len(mism)), 0.0, "table_mismatches", detail=detail.strip("; "))
        return Result(None, check=check, metrics=m)

    def plot(self, name: str, df: pd.DataFrame):
        raise KeyError(name)  # no figures: the report shows the table

    def summary_table(self, df: pd.DataFrame) -> str:
        """The device as a two-column HTML table (property, value), deviceQuery-style."""
        rows = df[df["experiment"] == self.name] if "experiment" in df else df
        rows = base.measured(rows)  # not measured: the plain table shows the reason
        if rows.empty:
            return ""
        r = rows.iloc[-1]
        cc = r.get("m_cc")  # "9.0" is a version, not the number 9
        cc = f"{float(cc):.1f}" if isinstance(cc, (int, float)) else cc
        items = [("Device", r.get("gpu_name"), "text"), (DERIVED["cc"][1], cc, "text")]
        for k, (_, unit, label) in ATTRS.items():
            items.append((label, r.get(f"m_{k}"), unit))
        for k, (unit, label) in DERIVED.items():
            if k != "cc":
                items.append((label, r.get(f"m_{k}"), unit))
        body = []
        for label, v, unit in items:
            if v is None or (isinstance(v, float) and pd.isna(v)) or v is pd.NA:
                continue
            body.append(f"<tr><th>{html.escape(label)}</th>"
                        f"<td>{html.escape(_fmt(v, unit))}</td></tr>")
        return ('<table class="kv device-query"><tbody>' + "".join(body)
                + "</tbody></table>")


def pick_clocks(drv_sm_khz: Any, drv_mem_khz: Any, nvml_sm_mhz: Any, nvml_mem_mhz: Any,
                prefer: str = "driver") -> tuple[float | None, float | None, str]:
    """(SM kHz, memory kHz, source): the preferred source's clocks, each falling back to the
    other source where missing or 0 (CUDA 13 dropped clockRate / memoryClockRate from
    cudaDeviceProp; the driver attributes may go the same way). source names where each
    clock came from: 'driver', 'nvml', 'driver+nvml' or 'none'."""
    def val(v: Any, scale: float) -> float | None:
        try:
            f = float(v) * scale
        except (TypeError, ValueError):
            return None
        return f if f > 0 and f == f else None

    sources = {"driver": (val(drv_sm_khz, 1), val(drv_mem_khz, 1)),
               "nvml": (val(nvml_sm_mhz, 1e3), val(nvml_mem_mhz, 1e3))}
    order = ["driver", "nvml"] if prefer == "driver" else ["nvml", "driver"]
    picked, used = [], set()
    for i in range(2):
        got = next(((sources[o][i], o) for o in order if sources[o][i] is not None),
                   (None, None))
        picked.append(got[0])
        if got[1]:
            used.add(got[1])
    return picked[0], picked[1], "+".join(sorted(used)) or "none"


def _nvml_facts(gpu: Any) -> dict[str, Any]:
    try:
        from cudalab.nvml_clocks import NvmlClockObserver

        obs = NvmlClockObserver(gpu.index, pci_bus_id=gpu.info.get("gpu_pci_bus_id", ""))
        return obs.device_facts()
    except Exception:  # noqa: BLE001 - no NVML: PCIe and the clock fallback are unknown
        return {}


def _fmt(v: Any, unit: str = "") -> str:
    """A device fact with its unit, formatted by cudalab.fmt (one place for numbers)."""
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "?"
    if unit == "text":
        return str(v)
    if unit == "bool":
        return "yes" if str(v) in ("1", "1.0", "True", "true") else "no"
    if unit == "B":
        return f"{fmt.nbytes(v)} ({fmt.integer(v)} B)" if float(v) >= 1024 else f"{int(v)} B"
    if unit == "GB/s":
        return fmt.bandwidth(v)
    if unit == "GFLOP/s":
        return fmt.flop_rate(v)
    return f"{fmt.number(v)} {unit}".strip()
