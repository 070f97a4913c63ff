"""Reading Nsight Compute's CSV (--csv --page raw): rows in launch order, a marker row
starts a point, the kernel rows up to the next marker are that point's (several: the
longest is 'the kernel', and the times are summed); each point's counters by column name
(m_ncu_<short>), the time pass's median, the top stall reasons. Running ncu is
cudalab.profiler.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

MARKER_KERNEL = "cudalab_marker"


TIME_METRIC = "gpu__time_duration.sum"


CLOCK_METRIC = "gpc__cycles_elapsed.avg.per_second"  # the GPC (SM) clock during the kernel


STALL_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


# `selected` is the issuing warp, not a stall; the rest are reasons a warp waited.
NOT_STALLS = frozenset({"selected"})


TOP_STALLS = 3


# ncu metric -> column short name (m_ncu_<short>); other metrics get their name, sanitised.
SHORT_NAMES: dict[str, str] = {
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "dram__bytes.sum": "dram_bytes",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "l2_throughput_pct",
    "l1tex__t_sector_hit_rate.pct": "l1_hit_rate_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "smem_bank_conflicts_ld",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "smem_bank_conflicts_st",
    # who moves the operands of a matrix product into shared memory and out of it (the
    # tensor-core lesson: mma.sync's cp.async and ldmatrix against wgmma's TMA)
    "smsp__inst_executed_op_ldgsts.sum": "cp_async_inst",
    "smsp__inst_executed_op_ldsm.sum": "ldmatrix_inst",
    "smsp__sass_inst_executed_op_tma_ld.sum": "tma_load_inst",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": "smem_lsu_wavefronts",
    "smsp__inst_executed.sum": "warp_inst",
    "launch__registers_per_thread": "registers",
    "launch__occupancy_limit_registers": "occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem": "occupancy_limit_smem",
    "launch__occupancy_limit_warps": "occupancy_limit_warps",
    "launch__occupancy_limit_blocks": "occupancy_limit_blocks",
    TIME_METRIC: "replay_time_us",  # the counters pass's (replayed) duration
}


# Scale of a unit to the column's unit: time in microseconds, bytes in bytes. ncu runs
# with --print-units base (ns, byte); the scaled spellings are read too.
UNIT_SCALE: dict[str, float] = {
    "ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
    "s": 1e6, "second": 1e6,
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
}


# -- reading ncu's CSV (--csv --page raw) ---------------------------------------------------
@dataclass
class KernelRow:
    """One profiled kernel launch: its name, grid (x) and metric values (floats; NaN for
    n/a) with units as ncu printed them."""

    name: str
    grid_x: int
    values: dict[str, float] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)

    @property
    def is_marker(self) -> bool:
        return MARKER_KERNEL in self.name

    def time_us(self) -> float:
        v = self.values.get(TIME_METRIC, math.nan)
        return v * UNIT_SCALE.get(self.units.get(TIME_METRIC, ""), 1e-3)

    def clock_mhz(self) -> float:
        """The GPC clock during the kernel (ncu prints cycle/second or cycle/nsecond)."""
        v = self.values.get(CLOCK_METRIC, math.nan)
        unit = self.units.get(CLOCK_METRIC, "")
        return v * (1e3 if unit.endswith("nsecond") else 1e-6)


def parse_number(text: str) -> float:
    """A metric value: thousands separators ("1,024") allowed; n/a and text are NaN."""
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return math.nan


def _grid_x(text: str) -> int:
    """x of "(20, 10, 1)"; dimensions are split at ", " so "(1,024, 1, 1)" reads 1024."""
    first = (text or "").strip().strip("()").split(", ")[0].replace(",", "").strip()
    return int(first) if first.isdigit() else 0


def parse_raw_csv(text: str) -> list[KernelRow]:
    """Kernel rows, in launch order, from ncu's `--csv --page raw` output: a header row
    ("ID", "Process ID", ..., "CC", then one column per metric), a units row (empty ID),
    then one row per kernel. Other lines (==PROF==, ==ERROR==) are skipped, and so are
    columns that are no metric (a metric is named unit__counter)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    header: list[str] = []
    units: dict[str, str] = {}
    rows: list[KernelRow] = []
    for cells in csv.reader(lines):
        if not cells:
            continue
        if cells[0] == "ID":
            header, units = cells, {}
        elif header and cells[0] == "":
            units = dict(zip(header, cells))
        elif header and cells[0].strip().isdigit():
            row = dict(zip(header, cells))
            metrics = [h for h in header if "__" in h]  # unit__counter: the metric columns
            rows.append(KernelRow(
                name=row.get("Kernel Name", ""), grid_x=_grid_x(row.get("Grid Size", "")),
                values={m: parse_number(row.get(m, "")) for m in metrics},
                units={m: units.get(m, "") for m in metrics}))
    return rows


def group_runs(rows: list[KernelRow], n_points: int) -> dict[int, list[list[KernelRow]]]:
    """Point index -> its runs, each the kernel rows of one run. A marker with grid x = i + 1
    starts a run of point i; the kernels up to the next marker are that run's. Rows before
    any marker, or after a marker out of range, belong to no point."""
    out: dict[int, list[list[KernelRow]]] = {}
    current: list[KernelRow] | None = None
    for row in rows:
        if row.is_marker:
            i = row.grid_x - 1
            current = None
            if 0 <= i < n_points:
                current = []
                out.setdefault(i, []).append(current)
        elif current is not None:
            current.append(row)
    return out


def group_by_marker(rows: list[KernelRow], n_points: int) -> dict[int, list[KernelRow]]:
    """Point index -> all its kernel rows (its runs one after the other)."""
    return {i: [k for run in runs for k in run]
            for i, runs in group_runs(rows, n_points).items()}


def time_pass_values(runs: list[list[KernelRow]]) -> dict[str, Any]:
    """A point's time-pass metrics: the median over its runs of the run's summed kernel
    duration (a point may launch several kernels) and the run count."""
    times = [sum(k.time_us() for k in run) for run in runs if run]
    return {"ncu_time_us": statistics.median(times) if times else math.nan,
            "ncu_time_runs": len(times)}


def short_name(metric: str) -> str:
    return SHORT_NAMES.get(metric) or re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")


def top_stalls(values: dict[str, float], n: int = TOP_STALLS) -> str:
    """The n largest stall reasons (warps stalled per issued instruction), as text:
    'long_scoreboard 4.1, barrier 2.0, wait 1.1' ('' when none was counted)."""
    stalls = [(m.group(1), v) for k, v in values.items()
              if (m := STALL_RE.match(k)) and m.group(1) not in NOT_STALLS
              and math.isfinite(v) and v > 0]
    stalls.sort(key=lambda kv: -kv[1])
    return ", ".join(f"{name} {v:.1f}" for name, v in stalls[:n])


def requested(values: dict[str, float], metrics: list[str]) -> dict[str, float]:
    """The values of the metrics asked for: the raw page also prints every launch__ and
    device__ attribute and .min/.max/.sum siblings of some metrics. A regex: entry keeps
    every column it matches (partially, as ncu does)."""
    patterns = [re.compile(m[len("regex:"):]) for m in metrics if m.startswith("regex:")]
    return {k: v for k, v in values.items()
            if k in metrics or any(p.search(k) for p in patterns)}


def point_counters(kernels: list[KernelRow], metrics: list[str]) -> dict[str, Any]:
    """The ncu_* metrics of one point: the requested counters of its longest kernel ("the
    kernel"), the summed kernel time, how many kernels ran and the top stall reasons."""
    main = main_kernel(kernels)
    values = requested(main.values, metrics)
    out: dict[str, Any] = {}
    for metric, v in values.items():
        if STALL_RE.match(metric):
            continue
        if metric == CLOCK_METRIC:
            out["ncu_clock_mhz"] = main.clock_mhz()
            continue
        unit = main.units.get(metric, "")
        out[f"ncu_{short_name(metric)}"] = v * (UNIT_SCALE[unit] if unit.endswith("byte")
                                                and unit in UNIT_SCALE else 1.0)
    times = [k.time_us() for k in kernels]  # all kernels' time, in us (not the main one's)
    out["ncu_replay_time_us"] = sum(times) if all(math.isfinite(t) for t in times) else math.nan
    ld, st = out.get("ncu_smem_bank_conflicts_ld"), out.get("ncu_smem_bank_conflicts_st")
    if ld is not None and st is not None:
        out["ncu_smem_bank_conflicts"] = ld + st
    out["ncu_top_stall"] = top_stalls(values)
    out["ncu_kernel"] = re.sub(r"\(.*$", "", main.name).strip()
    out["ncu_kernels"] = len(kernels)
    return out


def main_kernel(kernels: list[KernelRow]) -> KernelRow:
    """The longest kernel of a point (the first one where no duration was read)."""
    return max(kernels, key=lambda k: k.time_us() if math.isfinite(k.time_us()) else -1.0)
