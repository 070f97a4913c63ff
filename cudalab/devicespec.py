"""Per-compute-capability hardware limits, and the theoretical peaks of a device.

Sources of the table (each value is a property of the compute capability, not of one card):

- CUDA C++ Programming Guide, "Compute Capabilities" -> "Features and Technical
  Specifications" ("Technical Specifications per Compute Capability"): resident warps,
  threads and blocks per SM, 32-bit registers per SM / per block / per thread, shared memory
  per SM and per block (opt-in), the shared-memory carve-outs of each architecture section
  (e.g. 8.0: 0, 8, 16, 32, 64, 100, 132 or 164 KB; 9.0: ... 196 or 228 KB) and the 1 KB per
  block "reserved for system use" from cc 8.0 on; FP32 results per clock per SM from
  "Arithmetic Instructions" (= FP32 cores per SM).
- The CUDA Occupancy Calculator (the spreadsheet, and its header twin cuda_occupancy.h
  shipped in every CUDA toolkit's include/): register allocation unit 256 registers per
  warp (cudaOccRegAllocationGranularity), shared memory allocation unit 256 B before cc 8.0
  and 128 B from 8.0 (cudaOccSMemAllocationGranularity), warp allocation granularity =
  register sub-partitions per SM, 4 except 2 on GP100 (cudaOccSubPartitionsPerMultiprocessor),
  max blocks per SM (cudaOccMaxBlocksPerMultiprocessor), and the carve-out steps
  (cudaOccAlignUpShmemSizeVoltaPlus). The 10.0 and 12.0 rows follow the CUDA 13.0 header
  and the 12.8+ Programming Guide.

Every limit a device reports can be checked against this table on the GPU (the device_query
experiment does; see `compare_with_device`). The dense tensor-core rates per precision live
in cudalab/tensor_peaks.py; theoretical_peaks merges them with the FP32 and DRAM peaks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from cudalab import tensor_peaks

KB = 1024


@dataclass(frozen=True)
class ArchSpec:
    """The limits of one compute capability (per SM unless named per block/thread)."""

    cc: str  # "major.minor"
    arch: str  # architecture family
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int  # 32-bit registers
    max_regs_per_block: int
    max_regs_per_thread: int
    smem_per_sm: int  # bytes: the largest shared-memory carve-out
    smem_per_block_optin: int  # bytes: the most one block may use (opt-in above 48 KB)
    smem_carveouts_kb: tuple[int, ...]  # configurable shared-memory sizes per SM
    smem_alloc_unit: int  # bytes: shared memory is allocated per block in these units
    smem_reserved_per_block: int  # bytes the driver reserves per block (cc >= 8.0)
    warp_alloc_granularity: int  # = register sub-partitions per SM
    fp32_cores_per_sm: int
    warp_size: int = 32
    max_threads_per_block: int = 1024
    smem_per_block: int = 48 * KB  # without opt-in (static shared memory is capped here)
    reg_alloc_unit: int = 256  # registers, allocated per warp
    reg_alloc_granularity: str = "warp"
    # block barriers an SM holds per resident-block slot (cudaOccMaxBlocksPerSMBlockBarrierLimit;
    # applied from cc 9.0 on): 2 on full-size SMs, 1 on GA10x / AD10x / GB20x
    barrier_factor: int = 2

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    @property
    def major(self) -> int:
        return int(self.cc.split(".")[0])

    @property
    def minor(self) -> int:
        return int(self.cc.split(".")[1])

    @property
    def sm(self) -> str:
        """The nvcc target name (sm_90)."""
        return f"sm_{self.major}{self.minor}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_warps_per_sm"] = self.max_warps_per_sm
        d["smem_carveouts_kb"] = list(self.smem_carveouts_kb)
        return d


def _spec(cc, arch, threads, blocks, regs_sm, regs_block, regs_thread, smem_sm_kb,
          smem_block_kb, carveouts, smem_unit, reserved, warp_gran, cores) -> ArchSpec:
    return ArchSpec(
        cc=cc, arch=arch, max_threads_per_sm=threads, max_blocks_per_sm=blocks,
        regs_per_sm=regs_sm, max_regs_per_block=regs_block, max_regs_per_thread=regs_thread,
        smem_per_sm=smem_sm_kb * KB, smem_per_block_optin=smem_block_kb * KB,
        smem_carveouts_kb=tuple(carveouts), smem_alloc_unit=smem_unit,
        smem_reserved_per_block=reserved, warp_alloc_granularity=warp_gran,
        fp32_cores_per_sm=cores,
    )


K64 = 64 * KB
_VOLTA_CARVE = (0, 8, 16, 32, 64, 96)
_GA100_CARVE = (0, 8, 16, 32, 64, 100, 132, 164)
_GA10X_CARVE = (0, 8, 16, 32, 64, 100)
_HOPPER_CARVE = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)

# cc: arch, threads/SM, blocks/SM, regs/SM, regs/block, regs/thread, smem/SM KB,
#     smem/block KB (opt-in), carve-outs KB, smem unit B, reserved B/block, warp gran, FP32/SM
SPECS: dict[str, ArchSpec] = {s.cc: s for s in [
    # Kepler: L1 + shared = 64 KB split 16/48, 32/32 or 48/16 (3.7: 128 KB, up to 112 KB shared)
    _spec("3.0", "Kepler", 2048, 16, K64, K64, 63, 48, 48, (16, 32, 48), 256, 0, 4, 192),
    _spec("3.5", "Kepler", 2048, 16, K64, K64, 255, 48, 48, (16, 32, 48), 256, 0, 4, 192),
    _spec("3.7", "Kepler", 2048, 16, 2 * K64, K64, 255, 112, 48, (80, 96, 112), 256, 0, 4,
          192),
    # Maxwell, Pascal: dedicated shared memory, not configurable
    _spec("5.0", "Maxwell", 2048, 32, K64, K64, 255, 64, 48, (64,), 256, 0, 4, 128),
    _spec("5.2", "Maxwell", 2048, 32, K64, K64, 255, 96, 48, (96,), 256, 0, 4, 128),
    _spec("5.3", "Maxwell", 2048, 32, K64, 32 * KB, 255, 64, 48, (64,), 256, 0, 4, 128),
    _spec("6.0", "Pascal", 2048, 32, K64, K64, 255, 64, 48, (64,), 256, 0, 2, 64),
    _spec("6.1", "Pascal", 2048, 32, K64, K64, 255, 96, 48, (96,), 256, 0, 4, 128),
    _spec("6.2", "Pascal", 2048, 32, K64, 32 * KB, 255, 64, 48, (64,), 256, 0, 4, 128),
    # Volta, Turing: unified L1 / shared memory with a carve-out
    _spec("7.0", "Volta", 2048, 32, K64, K64, 255, 96, 96, _VOLTA_CARVE, 256, 0, 4, 64),
    _spec("7.2", "Volta", 2048, 32, K64, K64, 255, 96, 96, _VOLTA_CARVE, 256, 0, 4, 64),
    _spec("7.5", "Turing", 1024, 16, K64, K64, 255, 64, 64, (32, 64), 256, 0, 4, 64),
    # Ampere, Ada, Hopper, Blackwell: 1 KB of shared memory reserved per block
    _spec("8.0", "Ampere", 2048, 32, K64, K64, 255, 164, 163, _GA100_CARVE, 128, KB, 4, 64),
    replace(_spec("8.6", "Ampere", 1536, 16, K64, K64, 255, 100, 99, _GA10X_CARVE, 128, KB, 4,
                  128), barrier_factor=1),
    replace(_spec("8.7", "Ampere", 2048, 16, K64, K64, 255, 164, 163, _GA100_CARVE, 128, KB, 4,
                  128), barrier_factor=1),
    replace(_spec("8.9", "Ada", 1536, 24, K64, K64, 255, 100, 99, _GA10X_CARVE, 128, KB, 4,
                  128), barrier_factor=1),
    _spec("9.0", "Hopper", 2048, 32, K64, K64, 255, 228, 227, _HOPPER_CARVE, 128, KB, 4, 128),
    _spec("10.0", "Blackwell", 2048, 32, K64, K64, 255, 228, 227, _HOPPER_CARVE, 128, KB, 4,
          128),
    replace(_spec("12.0", "Blackwell", 1536, 24, K64, K64, 255, 100, 99, _GA10X_CARVE, 128, KB,
                  4, 128), barrier_factor=1),
]}


def cc_key(cc: Any) -> str:
    """Normalise a compute capability: "9.0", (9, 0), 9.0, "sm_90", "90", 90 -> "9.0"."""
    if isinstance(cc, ArchSpec):
        return cc.cc
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        return f"{int(cc[0])}.{int(cc[1])}"
    s = str(cc).strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)(?:[af])?", s)
    if m:  # "sm_90", "90", "120": the last digit is the minor version
        d = m.group(1)
        return f"{int(d[:-1])}.{d[-1]}"
    m = re.fullmatch(r"(\d+)\.(\d+)", s)
    if m:
        return f"{int(m.group(1))}.{int(m.group(2))}"
    raise ValueError(f"not a compute capability: {cc!r} (use 9.0, (9, 0) or sm_90)")


def spec(cc: Any) -> ArchSpec:
    """The ArchSpec of a compute capability; KeyError naming the known ones otherwise."""
    if isinstance(cc, ArchSpec):
        return cc
    key = cc_key(cc)
    if key not in SPECS:
        raise KeyError(f"compute capability {key} is not in cudalab.devicespec "
                       f"(known: {', '.join(SPECS)})")
    return SPECS[key]


def sm_targets() -> list[str]:
    """nvcc target names of every tabled compute capability (sm_30 ... sm_120)."""
    return [s.sm for s in SPECS.values()]


# -- the live device against the table ----------------------------------------------------
# ArchSpec field -> CUDA driver device attribute (CUdevice_attribute name without the
# CU_DEVICE_ATTRIBUTE_ prefix, as pycuda.driver.device_attribute spells it).
DEVICE_ATTRIBUTES = {
    "max_threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
    "max_blocks_per_sm": "MAX_BLOCKS_PER_MULTIPROCESSOR",
    "regs_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "max_regs_per_block": "MAX_REGISTERS_PER_BLOCK",
    "smem_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "smem_per_block": "MAX_SHARED_MEMORY_PER_BLOCK",
    "smem_per_block_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "smem_reserved_per_block": "RESERVED_SHARED_MEMORY_PER_BLOCK",
    "warp_size": "WARP_SIZE",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
}


# CUdevice_attribute values (cuda.h, stable since they were introduced) of every attribute
# cudalab reads through the driver API: pycuda's device_attribute enum lags new drivers.
CU_DEVICE_ATTRIBUTE_IDS = {
    "MAX_THREADS_PER_BLOCK": 1, "MAX_BLOCK_DIM_X": 2, "MAX_BLOCK_DIM_Y": 3,
    "MAX_BLOCK_DIM_Z": 4, "MAX_GRID_DIM_X": 5, "MAX_GRID_DIM_Y": 6, "MAX_GRID_DIM_Z": 7,
    "MAX_SHARED_MEMORY_PER_BLOCK": 8, "TOTAL_CONSTANT_MEMORY": 9, "WARP_SIZE": 10,
    "MAX_REGISTERS_PER_BLOCK": 12, "CLOCK_RATE": 13, "MULTIPROCESSOR_COUNT": 16,
    "KERNEL_EXEC_TIMEOUT": 17, "INTEGRATED": 18, "CONCURRENT_KERNELS": 31, "ECC_ENABLED": 32,
    "PCI_BUS_ID": 33, "PCI_DEVICE_ID": 34, "MEMORY_CLOCK_RATE": 36,
    "GLOBAL_MEMORY_BUS_WIDTH": 37, "L2_CACHE_SIZE": 38, "MAX_THREADS_PER_MULTIPROCESSOR": 39,
    "ASYNC_ENGINE_COUNT": 40, "UNIFIED_ADDRESSING": 41, "PCI_DOMAIN_ID": 50,
    "COMPUTE_CAPABILITY_MAJOR": 75, "COMPUTE_CAPABILITY_MINOR": 76,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 81, "MAX_REGISTERS_PER_MULTIPROCESSOR": 82,
    "MANAGED_MEMORY": 83, "CONCURRENT_MANAGED_ACCESS": 89,
    "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 97, "MAX_BLOCKS_PER_MULTIPROCESSOR": 106,
    "MAX_PERSISTING_L2_CACHE_SIZE": 108, "RESERVED_SHARED_MEMORY_PER_BLOCK": 111,
}


def compare_with_device(cc: Any, attrs: dict[str, int]) -> dict[str, tuple[int, int]]:
    """{field: (table, device)} for every limit the device reports differently from the
    table. `attrs` maps device attribute names (DEVICE_ATTRIBUTES values) to values; names
    the driver did not report are skipped."""
    s = spec(cc)
    out = {}
    for field, attr in DEVICE_ATTRIBUTES.items():
        if attr in attrs and attrs[attr] is not None:
            table, dev = int(getattr(s, field)), int(attrs[attr])
            if table != dev:
                out[field] = (table, dev)
    return out


def from_device(cc: Any, attrs: dict[str, int]) -> ArchSpec:
    """The table row with every limit the device reports replaced by the device's value
    (for a calculator that must agree with this very device)."""
    s = spec(cc)
    changes = {f: int(attrs[a]) for f, a in DEVICE_ATTRIBUTES.items()
               if attrs.get(a) is not None}
    return replace(s, **changes)


# -- theoretical peaks ------------------------------------------------------------------------
def peak_mem_gbps(mem_clock_khz: float, bus_width_bits: int) -> float:
    """2 (double data rate) * memory clock * bus width / 8 bits per byte, in GB/s. The
    driver reports the memory clock such that the factor 2 holds for HBM and GDDR alike
    (H100 SXM: 2 * 2619 MHz * 5120 bit / 8 = 3352 GB/s)."""
    return 2.0 * float(mem_clock_khz) * 1e3 * float(bus_width_bits) / 8.0 / 1e9


def peak_fp32_gflops(cc: Any, sm_count: int, sm_clock_khz: float) -> float:
    """2 (an FMA is two flops) * FP32 cores per SM * SMs * SM clock, in GFLOP/s."""
    return 2.0 * spec(cc).fp32_cores_per_sm * int(sm_count) * float(sm_clock_khz) * 1e3 / 1e9


def theoretical_peaks(cc: Any, sm_count: int, sm_clock_khz: float, mem_clock_khz: float,
                      bus_width_bits: int, name: str = "") -> dict[str, float]:
    """Peak DRAM bandwidth and FP32 throughput from the device's clocks (deviceQuery's
    formulas: peak_mem_gbps, peak_fp32_gflops), and the dense tensor-core peak of each
    precision (tensor_peaks: peak_fp16/bf16/tf32/fp64_tensor_gflops, NaN where the chip has
    no such path; name: the device's name, whose GeForce boards halve FP32 accumulation)."""
    s = spec(cc)
    return {"peak_mem_gbps": peak_mem_gbps(mem_clock_khz, bus_width_bits),
            "peak_fp32_gflops": peak_fp32_gflops(cc, sm_count, sm_clock_khz),
            "fp32_cores_per_sm": s.fp32_cores_per_sm,
            "fp32_cores": s.fp32_cores_per_sm * int(sm_count),
            **tensor_peaks.tensor_peaks(cc, sm_count, sm_clock_khz,
                                        geforce=tensor_peaks.is_geforce(name))}


def _device_attr(gpu: Any, name: str) -> int | None:
    """gpu.attr(name) as an int, or None where this pycuda / driver lacks the attribute."""
    try:
        return int(gpu.attr(name))
    except Exception:  # noqa: BLE001 - attribute missing in this pycuda / driver
        return None


def device_peaks(gpu: Any) -> dict[str, float]:
    """Peak DRAM GB/s and FP32 GFLOP/s of an open device (anything with attr(NAME) -> int,
    such as cudalab.gpu.GpuSession), from the driver's clocks: the one place GB/s and
    GFLOP/s are turned into % of peak. NaN where the driver does not report what a formula
    needs, or (FP32) for a compute capability the limits table lacks."""
    def attr(name: str) -> int | None:
        return _device_attr(gpu, name)

    out = {"peak_mem_gbps": math.nan, "peak_fp32_gflops": math.nan}
    mem, bus = attr("MEMORY_CLOCK_RATE"), attr("GLOBAL_MEMORY_BUS_WIDTH")
    if mem and bus and mem > 0 and bus > 0:
        out["peak_mem_gbps"] = peak_mem_gbps(mem, bus)
    out["peak_fp32_gflops"] = _per_sm_peak(attr, peak_fp32_gflops)
    return out


def _per_sm_peak(attr: Callable[[str], int | None],
                 peak: Callable[[str, int, int], float]) -> float:
    """peak(cc, SM count, SM clock in kHz) from the device's attributes; NaN where the
    driver does not say or the compute capability is not in the table."""
    major, minor = attr("COMPUTE_CAPABILITY_MAJOR"), attr("COMPUTE_CAPABILITY_MINOR")
    sms, clock = attr("MULTIPROCESSOR_COUNT"), attr("CLOCK_RATE")
    if major and minor is not None and sms and clock and sms > 0 and clock > 0:
        try:
            return peak(f"{major}.{minor}", sms, clock)
        except KeyError:
            pass
    return math.nan


def smem_bytes_per_clock(cc: Any) -> int:
    """Bytes the shared memory of one SM delivers per clock: 32 banks of 4 bytes (128 B);
    Kepler (cc 3.x) has 8-byte banks in its 64-bit mode (256 B). CUDA C++ Programming Guide,
    "Shared Memory" of each compute capability."""
    return 32 * (8 if spec(cc).major == 3 else 4)


def peak_smem_gbps(cc: Any, sm_count: int, sm_clock_khz: float) -> float:
    """SMs x shared-memory bytes per clock (32 banks x 4 B) x SM clock, in GB/s (H100 SXM:
    132 x 128 B x 1980 MHz = 33 454 GB/s)."""
    return smem_bytes_per_clock(cc) * int(sm_count) * float(sm_clock_khz) * 1e3 / 1e9


def memory_peaks(gpu: Any) -> dict[str, float]:
    """Theoretical shared-memory and L2 bandwidth and the L2 size of an open device (as
    device_peaks: anything with attr(NAME) -> int); NaN where the driver does not say.

    peak_l2_gbps is always NaN: NVIDIA documents neither the L2's clock (the driver does not
    report it) nor its bytes per clock per slice for recent architectures, and figures
    derived from the SM clock disagree with measurements by large factors, so no formula
    here would be reliable. The measured ceil_l2_gbps stands alone."""
    def attr(name: str) -> int | None:
        return _device_attr(gpu, name)

    out = {"peak_smem_gbps": math.nan, "peak_l2_gbps": math.nan, "l2_bytes": math.nan}
    out["peak_smem_gbps"] = _per_sm_peak(attr, peak_smem_gbps)
    l2 = attr("L2_CACHE_SIZE")
    if l2 and l2 > 0:
        out["l2_bytes"] = float(l2)
    return out
