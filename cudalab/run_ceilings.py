"""The run's ceilings as its results table records them, and the roof each point is judged
against: what the lessons' verdicts take (a Ceilings) and what the report's ceilings table
shows. Measured ceilings (ceil_* columns, the ceilings step of each GPU job) come first,
theoretical peaks (peak_*) where none was measured; older tables (the committed references)
have only some peaks, derived here from what they have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cudalab import fmt

# Input precisions of tensor-core points (p_precision) with a dense peak of their own; an
# fp32 point of such an experiment runs on the CUDA cores and has the FP32 roof.
TENSOR_PRECISIONS = ("tf32", "fp16", "bf16")


PRECISIONS = ("fp32", *TENSOR_PRECISIONS)


# -- ceilings --------------------------------------------------------------------------------
def num(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df.columns:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce").astype(float)


def _first(df: pd.DataFrame, *cols: str) -> float:
    """The first finite value of the first column that has one (NaN if none)."""
    for c in cols:
        v = num(df, c)
        v = v[np.isfinite(v)]
        if len(v):
            return float(v.iloc[0])
    return math.nan


@dataclass(frozen=True)
class Ceilings:
    """The run's ceilings: measured on the GPU (NaN where not) and theoretical."""

    dram: float = math.nan  # ceil_dram_gbps
    dram_memcpy: float = math.nan  # ceil_dram_memcpy_gbps
    l2: float = math.nan  # ceil_l2_gbps
    smem: float = math.nan  # ceil_smem_gbps
    fp32: float = math.nan  # ceil_fp32_gflops
    dram_peak: float = math.nan  # peak_mem_gbps
    l2_peak: float = math.nan
    smem_peak: float = math.nan
    fp32_peak: float = math.nan
    l2_bytes: float = math.nan
    # FP64 peaks: the CUDA cores' and the FP64 tensor cores' (sm_80, sm_90; DGEMM in cuBLAS)
    fp64_peak: float = math.nan
    fp64_tensor_peak: float = math.nan
    # where dram_memcpy came from when the ceilings step did not record it
    dram_memcpy_source: str = ""
    # dense tensor-core peaks of the input precisions (FP32 accumulation)
    tf32_tensor_peak: float = math.nan
    fp16_tensor_peak: float = math.nan
    bf16_tensor_peak: float = math.nan

    @property
    def measured(self) -> bool:
        return any(math.isfinite(v) for v in (self.dram, self.l2, self.fp32))

    def bandwidth(self, level: str) -> tuple[float, str]:
        """(GB/s, 'measured' | 'theoretical') of a memory level, the measured one first;
        (NaN, '') where neither is known."""
        measured, peak = {"dram": (self.dram, self.dram_peak),
                          "l2": (self.l2, self.l2_peak)}.get(level, (math.nan, math.nan))
        return _pick(measured, peak)

    def flops(self, dtype: str = "float32", tensor: bool = False) -> tuple[float, str]:
        """(GFLOP/s, 'measured' | 'theoretical') of the roof a point of this dtype is judged
        against: FP32 measured first; FP64 theoretical only (no FP64 ceiling is measured),
        the tensor cores' where the point ran on them."""
        if dtype == "float64":
            return _pick(math.nan, self.fp64_tensor_peak if tensor else self.fp64_peak)
        return _pick(self.fp32, self.fp32_peak)

    def tensor(self, precision: str) -> tuple[float, str]:
        """(GFLOP/s, 'theoretical' | '') of a precision's dense tensor-core peak (none is
        measured)."""
        return _pick(math.nan, getattr(self, f"{precision}_tensor_peak", math.nan))


def _pick(measured: float, peak: float) -> tuple[float, str]:
    if math.isfinite(measured):
        return measured, "measured"
    if math.isfinite(peak):
        return peak, "theoretical"
    return math.nan, ""


def ceilings_of(df: pd.DataFrame) -> Ceilings:
    """The ceilings of a results table; older tables have only the theoretical DRAM peak
    (and the FP32 peak behind pct_peak_gflops, and device_query's peaks and L2 size)."""
    derived_fp32 = num(df, "gflops") * 100 / num(df, "pct_peak_gflops")
    fp32_peak = _first(df, "peak_fp32_gflops")
    if not math.isfinite(fp32_peak):
        fin = derived_fp32[np.isfinite(derived_fp32)]
        fp32_peak = float(fin.median()) if len(fin) else _first(df, "m_peak_fp32_gflops")
    memcpy, source = _first(df, "ceil_dram_memcpy_gbps"), ""
    if not math.isfinite(memcpy):
        memcpy, source = _memcpy_point(df)
    fp64, fp64_tc = _fp64_peaks(df)
    tensor = {f"{p}_tensor_peak": _tensor_peak(df, p) for p in TENSOR_PRECISIONS}
    return Ceilings(
        dram=_first(df, "ceil_dram_gbps"), dram_memcpy=memcpy, dram_memcpy_source=source,
        l2=_first(df, "ceil_l2_gbps"), smem=_first(df, "ceil_smem_gbps"),
        fp32=_first(df, "ceil_fp32_gflops"),
        dram_peak=_first(df, "peak_mem_gbps", "m_peak_mem_gbps"),
        l2_peak=_first(df, "peak_l2_gbps"), smem_peak=_smem_peak(df),
        fp32_peak=fp32_peak, l2_bytes=_first(df, "l2_bytes", "m_l2_bytes"),
        fp64_peak=fp64, fp64_tensor_peak=fp64_tc, **tensor)


# Shared memory delivers one 4-byte word per bank per clock, 32 banks per SM (every compute
# capability since Kepler's 32-bit mode): 128 bytes per clock per SM.
SMEM_BYTES_PER_CLOCK = 32 * 4


def _smem_peak(df: pd.DataFrame) -> float:
    """The recorded shared-memory peak, else 32 banks x 4 bytes x SMs x SM clock."""
    peak = _first(df, "peak_smem_gbps")
    if math.isfinite(peak):
        return peak
    sms, mhz = _first(df, "m_sm_count"), _first(df, "m_sm_clock_mhz")
    return SMEM_BYTES_PER_CLOCK * sms * mhz * 1e6 / 1e9


def _memcpy_point(df: pd.DataFrame) -> tuple[float, str]:
    """cudaMemcpy device-to-device measured as a point (coalescing's memcpy at its largest
    DRAM-sized copy) where the ceilings step did not record it; (NaN, '') if none."""
    if "variant" not in df or "experiment" not in df:
        return math.nan, ""
    m = df[(df["experiment"] == "coalescing") & (df["variant"] == "memcpy")
           & (df["status"].astype(str) == "ok")]
    m = m[num(m, "gbps") > 0]
    if m.empty:
        return math.nan, ""
    ws = num(m, "working_set_bytes").fillna(num(m, "bytes"))
    row = m.loc[ws.idxmax()]
    return float(row["gbps"]), f"coalescing's {row['point_id']} point"


def _fp64_peaks(df: pd.DataFrame) -> tuple[float, float]:
    """(CUDA-core FP64 peak, FP64 tensor-core peak) from the float64 points' own peaks
    (m_peak_fp64_gflops: cuBLAS DGEMM is judged against the tensor cores where the chip
    has them, kernels against the CUDA cores)."""
    peak = num(df, "m_peak_fp64_gflops")
    if not np.isfinite(peak).any():
        return math.nan, math.nan
    cublas = (df["variant"].astype(str) == "cublas" if "variant" in df
              else pd.Series(False, index=df.index))
    cores, tc = peak[~cublas & np.isfinite(peak)], peak[cublas & np.isfinite(peak)]
    fp64 = float(cores.iloc[0]) if len(cores) else math.nan
    fp64_tc = float(tc.iloc[0]) if len(tc) else math.nan
    if math.isfinite(fp64_tc) and fp64_tc == fp64:
        fp64_tc = math.nan  # no tensor path: cuBLAS is judged against the cores too
    return fp64, fp64_tc


def _tensor_peak(df: pd.DataFrame, precision: str) -> float:
    """A precision's dense tensor-core peak: recorded as a device peak (devicespec.
    theoretical_peaks, device_query's row), else the peak its own points carry
    (m_peak_precision_gflops of the rows of that p_precision)."""
    peak = _first(df, f"peak_{precision}_tensor_gflops", f"m_peak_{precision}_tensor_gflops")
    if math.isfinite(peak) or "p_precision" not in df:
        return peak
    return _first(df[df["p_precision"].astype(str) == precision], "m_peak_precision_gflops")


def _precision(r: pd.Series) -> str:
    """The point's input precision where it has a roof of its own ('' otherwise)."""
    p = r.get("p_precision")
    return str(p) if not fmt.missing(p) and str(p) in PRECISIONS else ""


def row_roof(r: pd.Series, c: Ceilings) -> tuple[float, str, str]:
    """(GFLOP/s, kind, name) of the roof a point is judged against: its own dtype's, or its
    input precision's (p_precision: fp32 on the CUDA cores under the FP32 ceiling, tf32,
    fp16 and bf16 under that precision's dense tensor-core peak)."""
    prec = _precision(r)
    if prec:
        own = as_float(r.get("m_peak_precision_gflops"))
        if prec == "fp32":
            value, kind = c.flops()
            return (value, kind, "FP32") if math.isfinite(value) else (
                own, "theoretical" if math.isfinite(own) else "", "FP32")
        name = f"{prec.upper()} tensor-core"
        return (own, "theoretical", name) if math.isfinite(own) else (*c.tensor(prec), name)
    dtype = str(r.get("p_dtype") or "float32")
    if dtype == "float64":
        own = as_float(r.get("m_peak_fp64_gflops"))
        tensor = (str(r.get("variant")) == "cublas" and math.isfinite(c.fp64_tensor_peak))
        name = "FP64 tensor-core" if tensor else "FP64"
        if math.isfinite(own):
            return own, "theoretical", name
        return (*c.flops("float64", tensor), name)
    return (*c.flops(), "FP32")


def ceilings_rows(c: Ceilings) -> list[dict[str, str]]:
    """The ceilings table of the report: one row per level, measured beside theoretical."""
    def row(level: str, measured: float, peak: float, unit: Any,
            no_peak: str = "no formula") -> dict[str, str]:
        return {"level": level, "measured": unit(measured) or "not measured",
                "theoretical": unit(peak) or no_peak}
    memcpy = ("DRAM, cudaMemcpy D2D alone" + (f" (from {c.dram_memcpy_source})"
                                              if c.dram_memcpy_source else ""))
    rows = [row("DRAM (best of D2D memcpy and a streaming copy)", c.dram, c.dram_peak,
                fmt.bandwidth),
            row(memcpy, c.dram_memcpy, math.nan, fmt.bandwidth, "see DRAM above"),
            row(f"L2 (hot, working set <= half of {fmt.nbytes(c.l2_bytes) or 'L2'})", c.l2,
                c.l2_peak, fmt.bandwidth, "no public formula (slice count and width vary)"),
            row("shared memory (32 banks x 4 bytes x SMs x SM clock)", c.smem, c.smem_peak,
                fmt.bandwidth, "SM count or clock not recorded"),
            row("FP32 (FMA on the CUDA cores)", c.fp32, c.fp32_peak, fmt.flop_rate)]
    if math.isfinite(c.fp64_peak):
        rows.append(row("FP64 (FMA on the CUDA cores)", math.nan, c.fp64_peak, fmt.flop_rate))
    if math.isfinite(c.fp64_tensor_peak):
        rows.append(row("FP64 tensor cores (DGEMM)", math.nan, c.fp64_tensor_peak,
                        fmt.flop_rate))
    for p in TENSOR_PRECISIONS:
        value = c.tensor(p)[0]
        if math.isfinite(value):
            rows.append(row(f"{p.upper()} tensor cores (dense, FP32 accumulation)", math.nan,
                            value, fmt.flop_rate))
    return rows


def as_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan
