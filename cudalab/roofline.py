"""The roofline of a run, and how honest each bandwidth number is about where it came from.

Roofline (Williams, Waterman, Patterson 2009): x = arithmetic intensity (declared flops /
declared bytes, FLOP/byte), y = achieved GFLOP/s, both log; a memory level of bandwidth B
caps a kernel at B * x, the FP32 peak at a flat roof. Measured ceilings (ceil_* columns, the
ceilings step of each GPU job) are drawn solid, theoretical ones (peak_*) dashed. Points
with no flops (copies) cannot sit on a FLOP roofline: they go to a second panel, GB/s per
experiment against the ceiling of their memory level.

Memory-level honesty: a working set that fits L2 on a hot run (the harness did not flush
L2) measures L2, not DRAM; a number above the ceiling it is compared with is suspect and
said so, with why. Tables written before the ceilings columns existed (the committed H100
reference) get the same columns derived here from what they have: the theoretical DRAM
peak and device_query's L2 size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cudalab import fmt, harness_columns, results

RUN_FIGURE = "run"  # the run's roofline (cudalab.run_figures draws it beside each lesson's)
# Points by memory level (bandwidth panel) and the ceilings' lines, darker than seaborn's
# deep palette that colours the roofline's points, so no experiment shares a line's colour.
LEVEL_COLORS = {"dram": "#4c72b0", "l2": "#dd8452", "": "0.55"}
CEIL_COLORS = {"dram": "#1b2a49", "l2": "#a0522d", "smem": "#2e7d32", "fp32": "0.1",
               "fp64": "#6a1b9a", "tf32": "#00838f", "fp16": "#c62828", "bf16": "#ef6c00"}
# Input precisions of tensor-core points (p_precision) with a dense peak of their own; an
# fp32 point of such an experiment runs on the CUDA cores and has the FP32 roof.
TENSOR_PRECISIONS = ("tf32", "fp16", "bf16")
PRECISIONS = ("fp32", *TENSOR_PRECISIONS)
LEVEL_MARKERS = {"dram": "o", "l2": "^", "": "s"}
SUSPECT_COLOR = "#c0262d"
# Label placement: offsets (points) tried around a point, nearest first.
LABEL_RADII = (10, 22, 36, 52, 70)
LABEL_ANGLES = (45, -45, 135, -135, 90, -90, 0, 180, 20, -20, 160, -160)


# -- ceilings --------------------------------------------------------------------------------
def _num(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df.columns:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce").astype(float)


def _first(df: pd.DataFrame, *cols: str) -> float:
    """The first finite value of the first column that has one (NaN if none)."""
    for c in cols:
        v = _num(df, c)
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
    derived_fp32 = _num(df, "gflops") * 100 / _num(df, "pct_peak_gflops")
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
    m = m[_num(m, "gbps") > 0]
    if m.empty:
        return math.nan, ""
    ws = _num(m, "working_set_bytes").fillna(_num(m, "bytes"))
    row = m.loc[ws.idxmax()]
    return float(row["gbps"]), f"coalescing's {row['point_id']} point"


def _fp64_peaks(df: pd.DataFrame) -> tuple[float, float]:
    """(CUDA-core FP64 peak, FP64 tensor-core peak) from the float64 points' own peaks
    (m_peak_fp64_gflops: cuBLAS DGEMM is judged against the tensor cores where the chip
    has them, kernels against the CUDA cores)."""
    peak = _num(df, "m_peak_fp64_gflops")
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
        own = _f(r.get("m_peak_precision_gflops"))
        if prec == "fp32":
            value, kind = c.flops()
            return (value, kind, "FP32") if math.isfinite(value) else (
                own, "theoretical" if math.isfinite(own) else "", "FP32")
        name = f"{prec.upper()} tensor-core"
        return (own, "theoretical", name) if math.isfinite(own) else (*c.tensor(prec), name)
    dtype = str(r.get("p_dtype") or "float32")
    if dtype == "float64":
        own = _f(r.get("m_peak_fp64_gflops"))
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


# -- memory levels and suspect numbers -------------------------------------------------------
def _truthy(v: Any) -> bool:
    if fmt.missing(v):
        return False
    return v is True or str(v).strip().lower() in ("true", "1", "yes")


def annotate(df: pd.DataFrame, c: Ceilings | None = None) -> pd.DataFrame:
    """df with the memory-level columns of the contract filled: working_set_bytes,
    memory_level ('dram' | 'l2' | ''), pct_ceil_gbps, pct_ceil_gflops, suspect (bool),
    plus cold_l2 (the harness setting), intensity (FLOP/byte) and suspect_why (text).
    Columns the table has are kept; missing ones are derived by the contract's rules.
    Annotate the whole table, then select (the L2 size of old tables is on device_query's
    row), or give the whole table's ceilings as c. A frame whose every row has them
    (aggregate wrote them, or annotate ran) is returned as is."""
    if len(df) and _filled(df, "roof_name", every=True):
        return df
    out = df.copy()
    c = c or ceilings_of(df)
    out = harness_columns.expand(out, drop=False)  # a frame with the older JSON column
    if "cold_l2" not in out:
        out["cold_l2"] = pd.Series(None, index=out.index, dtype=object)
    # results.read_table gives an older table the new columns, empty: derive those as if
    # they were absent
    if not _filled(out, "working_set_bytes"):
        out["working_set_bytes"] = _num(out, "bytes")
    out["working_set_bytes"] = _num(out, "working_set_bytes")
    if _filled(out, "memory_level"):
        out["memory_level"] = out["memory_level"].map(lambda v: "" if fmt.missing(v)
                                                      else str(v))
    else:
        out["memory_level"] = [_level(r, c) for _, r in out.iterrows()]
    for col in ("pct_ceil_gbps", "pct_ceil_gflops"):
        out[col] = _num(out, col)
    flops = _num(out, "flops")
    nbytes = _num(out, "bytes")
    out["intensity"] = np.where((flops > 0) & (nbytes > 0), flops / nbytes, np.nan)
    # every point against the roof of its own dtype (FP64 points against an FP64 peak) or
    # input precision (tensor-core points against their precision's peak)
    roofs = [row_roof(r, c) for _, r in out.iterrows()]
    out["roof_gflops"] = [r[0] for r in roofs]
    out["roof_name"] = [r[2] for r in roofs]
    own = (out["p_dtype"].astype(str) == "float64" if "p_dtype" in out
           else pd.Series(False, index=out.index))
    if "p_precision" in out:
        own |= out["p_precision"].astype(str).isin(PRECISIONS)
    out.loc[own, "pct_ceil_gflops"] = 100 * _num(out, "gflops")[own] / out["roof_gflops"][own]
    why = [_suspect_why(r, c) for _, r in out.iterrows()]
    given = (out["suspect"].map(_truthy) if _filled(out, "suspect")
             else pd.Series(False, out.index))
    out["suspect"] = [bool(g) or bool(w) for g, w in zip(given, why, strict=True)]
    out["suspect_why"] = [w or ("above 100 % of the peak or ceiling the results table "
                                "compares it with" if s else "")
                          for w, s in zip(why, out["suspect"], strict=True)]
    return out


def _filled(df: pd.DataFrame, col: str, every: bool = False) -> bool:
    """The table has the column with a value in at least one row (every: in every row);
    '' counts as none."""
    if col not in df:
        return False
    has = df[col].map(lambda v: not fmt.missing(v) and str(v) != "").astype(bool)
    return bool(has.all() if every else has.any())


def load_table(path: Path) -> pd.DataFrame:
    """results.csv as the figures and the report read it: every derived column as aggregate
    wrote it, or, for a table aggregated before those columns (the committed references),
    derived here; the one place an older table gets them."""
    return annotate(results.read_table(path))


def on_device(experiment: Any, timer: Any) -> bool:
    """A GPU point whose bytes go through device memory (not a CPU point, not PCIe): of an
    experiment compared with the device's peaks, or one whose points carry the peak of
    their own precision (precision_roofs: tensor cores, whose roof is not the FP32 peak)."""
    from cudalab.experiments import REGISTRY

    exp = REGISTRY.get(str(experiment))
    return (exp is not None and (exp.vs_device_peak or exp.precision_roofs)
            and str(timer) != "perf_counter")


def _level(r: pd.Series, c: Ceilings) -> str:
    """results.memory_level for a row of an older table: '' for CPU points and PCIe
    experiments; the L2 size from the row or, for old tables, the run's (device_query)."""
    if not on_device(r.get("experiment"), r.get("timer")):
        return ""
    l2 = _f(r.get("l2_bytes"))
    return results.memory_level(_f(r.get("working_set_bytes")),
                                l2 if math.isfinite(l2) else _f(c.l2_bytes),
                                r.get("cold_l2") is True)


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _suspect_why(r: pd.Series, c: Ceilings) -> str:
    """Why an ok point's speed cannot be taken at face value ('' if it can): above the
    ceiling of its memory level (or, without one, the DRAM peak), or above the FP32 roof."""
    if r.get("status") != "ok":
        return ""
    out = []
    gbps, level = _f(r.get("gbps")), r.get("memory_level") or ""
    if math.isfinite(gbps) and level:
        ref, kind, name = *c.bandwidth(level), level.upper()
        if not math.isfinite(ref) and level == "l2":  # no L2 ceiling: only DRAM to compare
            ref, kind, name = *c.bandwidth("dram"), "DRAM"
        if math.isfinite(ref) and gbps > ref:
            out.append(f"{fmt.bandwidth(gbps)} is {fmt.percent(100 * gbps / ref)} of the "
                       f"{kind} {name} ceiling {fmt.bandwidth(ref)}"
                       + _l2_hint(r, c, level, name))
    gflops = _f(r.get("gflops"))
    ref, kind, name = row_roof(r, c)
    if math.isfinite(gflops) and math.isfinite(ref) and gflops > ref:
        out.append(f"{fmt.flop_rate(gflops)} is above the {kind} {name} ceiling "
                   f"{fmt.flop_rate(ref)}: the declared flop count is too high or the "
                   "timing is wrong")
    return "; ".join(out)


def _l2_hint(r: pd.Series, c: Ceilings, level: str, compared: str) -> str:
    ws = _f(r.get("working_set_bytes"))
    l2 = c.l2_bytes
    hot = r.get("cold_l2") is not True
    if level == "l2" and compared == "DRAM":
        return (f": its working set {fmt.nbytes(ws)} fits the {fmt.nbytes(l2)} L2 and the run "
                f"was {'hot (L2 not flushed)' if hot else 'cold'}, so it measured L2; compare "
                "it with the L2 ceiling (not measured in this run)")
    if level == "l2":
        return (f": L2-resident ({fmt.nbytes(ws)} of {fmt.nbytes(l2)}), yet faster than L2 "
                "was measured: check the declared bytes")
    return (": from DRAM nothing is faster than the DRAM ceiling; check the declared bytes "
            "or whether the data stayed in a cache")


def distrust(df: pd.DataFrame) -> list[dict[str, str]]:
    """The 'measurements to distrust' list: every suspect point with why."""
    d = annotate(df)
    d = d[d["suspect"]]
    return [{"experiment": str(r["experiment"]), "point_id": str(r["point_id"]),
             "level": r["memory_level"], "why": r["suspect_why"]} for _, r in d.iterrows()]


def hot_cold_note(df: pd.DataFrame, c: Ceilings | None = None) -> str:
    """Whether a section's bandwidth numbers were taken hot or cold, and how many of them
    measured L2 ('' where the section has no device-memory bandwidth). c: the run's
    ceilings (its L2 size), where df is one section of the table."""
    d = annotate(df, c)
    d = d[(d["status"] == "ok") & (d["memory_level"] != "") & np.isfinite(_num(d, "gbps"))]
    if d.empty:
        return ""
    cold = d["cold_l2"].dropna()
    if cold.empty:
        how = "L2 flushing not recorded (older harness)"
    elif cold.all():
        how = "cold: L2 flushed before every sample (measurement.cold_l2: true)"
    elif not cold.any():
        how = "hot: L2 not flushed between samples (measurement.cold_l2: false)"
    else:
        how = f"mixed: {int(cold.sum())} of {len(cold)} points cold"
    n_l2 = int((d["memory_level"] == "l2").sum())
    l2 = (c or ceilings_of(df)).l2_bytes
    size = f" fits the {fmt.nbytes(l2)} L2" if math.isfinite(l2) else " fits L2"
    return (f"Bandwidth measured {how}. {n_l2} of {len(d)} points have a working set that"
            f"{size} and, run hot, measure L2 rather than DRAM (column memory level); "
            "% of ceiling compares each with the ceiling of its level.")


# -- points ----------------------------------------------------------------------------------
def device_points(df: pd.DataFrame) -> pd.DataFrame:
    """ok GPU points of experiments whose bytes go through device memory."""
    d = annotate(df)
    timer = d["timer"] if "timer" in d else pd.Series("", index=d.index)
    dev = [on_device(e, t) for e, t in zip(d["experiment"], timer, strict=True)]
    return d[np.array(dev, dtype=bool) & (d["status"].astype(str) == "ok")
             & (_num(d, "bytes") > 0)]


def roofline_points(df: pd.DataFrame) -> pd.DataFrame:
    d = device_points(df)
    return d[(_num(d, "flops") > 0) & (_num(d, "gflops") > 0)]


def bandwidth_points(df: pd.DataFrame) -> pd.DataFrame:
    """Points without flops (copies): they have GB/s only."""
    d = device_points(df)
    return d[~(_num(d, "flops") > 0) & (_num(d, "gbps") > 0)]


def highlights(points: pd.DataFrame) -> list[tuple[pd.Series, str]]:
    """The points a lesson is about: per experiment, the best and the worst at its largest
    problem (most flops), e.g. naive vs cuBLAS at 4096^3. Returns (row, label)."""
    out = []
    for exp, g in points.groupby("experiment", sort=True):
        big = g[_num(g, "flops") == _num(g, "flops").max()]
        best, worst = big.loc[big["gflops"].idxmax()], big.loc[big["gflops"].idxmin()]
        out.append((best, f"best {exp}: {_name(best, big)}"))
        if worst.name != best.name:
            out.append((worst, f"worst {exp}: {_name(worst, big)}"))
    return out


def _name(row: pd.Series, among: pd.DataFrame) -> str:
    """The variant plus the parameters that tell it apart from the others shown with it."""
    same = among[among["variant"] == row["variant"]]
    keys = [c for c in among.columns if c.startswith("p_") and c != "p_dtype"
            and not fmt.missing(row.get(c)) and same[c].nunique() > 1]
    dtype = " (FP64)" if str(row.get("p_dtype")) == "float64" else ""
    return " ".join([str(row["variant"])]
                    + [f"{k[2:]}={fmt.param(row[k])}" for k in keys]) + dtype


# -- drawing ---------------------------------------------------------------------------------
def draw(df: pd.DataFrame, experiment: str | None = None) -> Any:
    """The roofline figure of a run (experiment None) or of one experiment; None when it
    has no point to place. Top: the roofline; bottom: the copies' GB/s per memory level."""
    import matplotlib.pyplot as plt

    df = annotate(df)
    sub = df if experiment is None else df[df["experiment"] == experiment]
    roof, bw = roofline_points(sub), bandwidth_points(sub)
    if roof.empty and bw.empty:
        return None
    c = ceilings_of(df)
    panels = [p for p, pts in (("roof", roof), ("bw", bw)) if not pts.empty]
    # one above the other, each legend at its right: the legends never cover a point
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 0.6 + 4.4 * len(panels)),
                             layout="constrained", squeeze=False,
                             height_ratios=[1.3 if p == "roof" else 1 for p in panels])
    by = "experiment" if experiment is None else "variant"
    for ax, p in zip(axes[:, 0], panels, strict=True):
        if p == "roof":
            _draw_roof(ax, roof, c, by)
        else:
            _draw_bandwidth(ax, bw, c, by)
    what = "this run" if experiment is None else experiment
    fig.suptitle(f"Roofline of {what} on {fig_gpu(df) or 'the GPU'}", fontsize=11)
    fig.canvas.draw()
    # the layout is final from here: labels are placed in its pixels, saving must not move it
    fig.set_layout_engine("none")
    for ax, p in zip(axes[:, 0], panels, strict=True):
        if p == "roof":
            place_labels(ax, [(r["intensity"], r["gflops"], lab) for r, lab in highlights(roof)])
    return fig


def fig_gpu(df: pd.DataFrame) -> str:
    g = df["gpu_name"].dropna() if "gpu_name" in df else pd.Series(dtype=object)
    return str(g.iloc[0]) if len(g) else ""


def _palette(keys: list[str]) -> dict[str, Any]:
    """One colour per key: seaborn's deep palette, husl beyond its 10 colours."""
    import seaborn as sns

    colors = sns.color_palette("deep" if len(keys) <= 10 else "husl", len(keys))
    return dict(zip(keys, colors, strict=True))


def _tensor_roofs(pts: pd.DataFrame, c: Ceilings) -> list[tuple[float, list[str]]]:
    """(peak, precisions) of the tensor-core precisions among the points, precisions of
    one peak together (FP16 and BF16 share theirs), highest first."""
    if "p_precision" not in pts:
        return []
    have = set(pts["p_precision"].astype(str))
    peaks: dict[float, list[str]] = {}
    for p in TENSOR_PRECISIONS:
        value = c.tensor(p)[0]
        if p in have and math.isfinite(value):
            peaks.setdefault(value, []).append(p)
    return sorted(peaks.items(), reverse=True)


def _higher(a: float, b: float) -> float:
    """The larger of two roofs, either NaN (unknown) left out."""
    known = [v for v in (a, b) if math.isfinite(v)]
    return max(known) if known else math.nan


def _draw_roof(ax: Any, pts: pd.DataFrame, c: Ceilings, by: str) -> None:
    ai, gf = pts["intensity"].astype(float), pts["gflops"].astype(float)
    # the slopes rise to the highest flat roof drawn: a tensor-core precision's where its
    # points are plotted, else FP32
    tensor_top = max([v for v, _ in _tensor_roofs(pts, c)], default=math.nan)
    top_measured, top_peak = _higher(c.fp32, tensor_top), _higher(c.fp32_peak, tensor_top)
    # a ridge point sits at roof / bandwidth FLOP/byte
    ridges = [roof / bw for bw, roof in ((c.dram, top_measured), (c.dram_peak, top_peak),
                                         (c.l2, top_measured), (c.l2_peak, top_peak))
              if math.isfinite(bw) and math.isfinite(roof)]
    x_lo = min([ai.min()] + ridges) / 4
    x_hi = max([ai.max()] + ridges) * 4
    xs = np.geomspace(x_lo, x_hi, 200)
    tops = [v for v in (c.fp32, c.fp32_peak, tensor_top) if math.isfinite(v)]
    handles = []
    for level, measured, peak in (("DRAM", c.dram, c.dram_peak), ("L2", c.l2, c.l2_peak)):
        color = CEIL_COLORS[level.lower()]
        for value, ls, kind, roofv in ((measured, "-", "measured", top_measured),
                                       (peak, "--", "theoretical", top_peak)):
            if math.isfinite(value):
                cap = roofv if math.isfinite(roofv) else np.inf
                handles += ax.plot(xs, np.minimum(value * xs, cap), ls=ls, color=color,
                                   lw=1.6, label=f"{level} {kind}: {fmt.bandwidth(value)}")
    handles += _flat_roofs(ax, pts, c)
    if math.isfinite(c.smem):  # the measured shared-memory slope: what tiles can feed
        cap = top_measured if math.isfinite(top_measured) else np.inf
        handles += ax.plot(xs, np.minimum(c.smem * xs, cap), ls="-", lw=1.2,
                           color=CEIL_COLORS["smem"],
                           label=f"shared memory measured: {fmt.bandwidth(c.smem)}")
    keys = sorted(pts[by].astype(str).unique())
    colors = _palette(keys)
    from matplotlib.lines import Line2D

    for k in keys:
        g = pts[pts[by].astype(str) == k]
        for level, marker in LEVEL_MARKERS.items():
            m = g[g["memory_level"] == level]
            if len(m):
                ax.scatter(m["intensity"], m["gflops"], s=24, color=colors[k], marker=marker,
                           edgecolor="white", linewidth=0.4, zorder=3)
        handles.append(Line2D([], [], ls="", marker="o", color=colors[k], label=k))
    if (pts["memory_level"] == "l2").any():
        handles.append(Line2D([], [], ls="", marker="^", color="0.4",
                              label="triangle: L2-resident (hot, fits L2)"))
    dram = c.dram if math.isfinite(c.dram) else c.dram_peak
    fed = pts[pts["gflops"].astype(float) > dram * pts["intensity"].astype(float)]
    if len(fed):  # above the DRAM slope: the declared bytes came (mostly) from a cache
        handles.append(ax.scatter(fed["intensity"], fed["gflops"], s=46, facecolor="none",
                                  edgecolor="0.15", linewidth=0.8, zorder=4,
                                  label="ringed: above the DRAM slope, fed by a cache"))
    bad = pts[pts["suspect"]]
    if len(bad):
        handles.append(ax.scatter(bad["intensity"], bad["gflops"], s=70, facecolor="none",
                                  edgecolor=SUSPECT_COLOR, linewidth=1.3, zorder=4,
                                  label="suspect (see the list)"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(gf.min() / 4, max([gf.max()] + tops) * 3)
    _log_ticks(ax)
    ax.set_xlabel("arithmetic intensity, FLOP/byte (declared flops / declared bytes)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("points with a FLOP count", fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7.5,
              frameon=False)


def _flat_roofs(ax: Any, pts: pd.DataFrame, c: Ceilings) -> list[Any]:
    """The flat roofs of the dtypes the points have: FP32 (measured and theoretical), FP64
    (CUDA cores, tensor cores) only where float64 points are drawn, and each tensor-core
    precision's dense peak only where points of that precision are drawn."""
    out = []
    for value, ls, kind in ((c.fp32, "-", "measured"), (c.fp32_peak, "--", "theoretical")):
        if math.isfinite(value):
            out.append(ax.axhline(value, ls=ls, color=CEIL_COLORS["fp32"], lw=1.6,
                                  label=f"FP32 {kind}: {fmt.flop_rate(value)}"))
    has64 = "p_dtype" in pts and (pts["p_dtype"].astype(str) == "float64").any()
    for value, ls, name in ((c.fp64_peak, ":", "FP64 CUDA cores"),
                            (c.fp64_tensor_peak, "-.", "FP64 tensor cores")):
        if has64 and math.isfinite(value):
            out.append(ax.axhline(value, ls=ls, color=CEIL_COLORS["fp64"], lw=1.4,
                                  label=f"{name} theoretical: {fmt.flop_rate(value)}"))
    for value, precs in _tensor_roofs(pts, c):
        out.append(ax.axhline(value, ls="-.", color=CEIL_COLORS[precs[0]], lw=1.4,
                              label=f"{'/'.join(p.upper() for p in precs)} tensor cores "
                                    f"theoretical (dense): {fmt.flop_rate(value)}"))
    return out


def _log_ticks(ax: Any) -> None:
    """Decades only: minor labels collide (2x10^-2 beside 3x10^-2) and minor ticks make
    every layout pass slow."""
    from matplotlib.ticker import LogLocator, NullLocator

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, numticks=12))
        axis.set_minor_locator(NullLocator())


def _draw_bandwidth(ax: Any, pts: pd.DataFrame, c: Ceilings, by: str) -> None:
    keys = sorted(pts[by].astype(str).unique())
    handles = []
    for i, k in enumerate(keys):
        g = pts[pts[by].astype(str) == k].sort_values("gbps")
        x = i + (np.linspace(-0.3, 0.3, len(g)) if len(g) > 1 else np.zeros(1))
        for level in ("dram", "l2", ""):
            m = (g["memory_level"] == level).to_numpy()
            if m.any():
                ax.scatter(x[m], g["gbps"].to_numpy()[m], s=18, color=LEVEL_COLORS[level],
                           marker=LEVEL_MARKERS[level],
                           edgecolor="white", linewidth=0.4, zorder=3)
        bad = g["suspect"].to_numpy(dtype=bool)
        if bad.any():
            ax.scatter(x[bad], g["gbps"].to_numpy()[bad], s=70, facecolor="none",
                       edgecolor=SUSPECT_COLOR, linewidth=1.3, zorder=4)
    from matplotlib.lines import Line2D

    for level in ("dram", "l2", ""):
        if (pts["memory_level"] == level).any():
            name = {"dram": "point from DRAM", "l2": "point L2-resident (hot, fits L2)",
                    "": "memory level unknown"}[level]
            handles.append(Line2D([], [], ls="", marker=LEVEL_MARKERS[level],
                                  color=LEVEL_COLORS[level], label=name))
    if pts["suspect"].any():
        handles.append(Line2D([], [], ls="", marker="o", markerfacecolor="none",
                              markeredgecolor=SUSPECT_COLOR, markersize=8,
                              label="suspect (see the list)"))
    for level, measured, peak in (("DRAM", c.dram, c.dram_peak), ("L2", c.l2, c.l2_peak)):
        for value, ls, kind in ((measured, "-", "measured"), (peak, "--", "theoretical")):
            if math.isfinite(value):
                handles.append(ax.axhline(value, ls=ls, lw=1.4,
                                          color=CEIL_COLORS[level.lower()],
                                          label=f"{level} {kind}: {fmt.bandwidth(value)}"))
    ax.set_xticks(range(len(keys)), keys, rotation=35, ha="right", rotation_mode="anchor",
                  fontsize=8)
    ax.set_xlim(-0.6, len(keys) - 0.4)
    tops = [pts["gbps"].max()] + [v for v in (c.dram, c.dram_peak, c.l2, c.l2_peak)
                                  if math.isfinite(v)]
    ax.set_ylim(0, max(tops) * 1.08)
    ax.set_ylabel("achieved GB/s (declared bytes / time)")
    ax.set_title("points without flops: bandwidth against the ceiling of their memory "
                 "level", fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7.5,
              frameon=False)


def place_labels(ax: Any, items: list[tuple[float, float, str]]) -> list[str]:
    """Annotate each (x, y, text) at the first offset where its text overlaps no label
    placed before, the legend or the title, and stays inside the axes; returns the texts
    that found no such place (left unlabelled rather than drawn over others)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = [t.get_window_extent(renderer) for t in (ax.title,) if t.get_text()]
    unplaced = []
    for x, y, text in items:
        for r in LABEL_RADII:
            for a in LABEL_ANGLES:
                dx, dy = r * math.cos(math.radians(a)), r * math.sin(math.radians(a))
                ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                                  fontsize=7.5, ha="left" if dx >= 0 else "right",
                                  va="bottom" if dy >= 0 else "top", zorder=5,
                                  bbox={"boxstyle": "round,pad=0.15", "fc": "white",
                                        "ec": "0.7", "alpha": 0.85},
                                  arrowprops={"arrowstyle": "-", "color": "0.4", "lw": 0.6})
                box = ann.get_window_extent(renderer)
                inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0
                          and box.y1 <= frame.y1)
                if inside and not any(box.overlaps(b) for b in taken):
                    taken.append(box)
                    break
                ann.remove()
            else:
                continue
            break
        else:
            unplaced.append(text)
    return unplaced


def caption(df: pd.DataFrame, experiment: str | None = None) -> str:
    """What the figure shows, from the data it was drawn from."""
    df = annotate(df)
    sub = df if experiment is None else df[df["experiment"] == experiment]
    roof, bw, c = roofline_points(sub), bandwidth_points(sub), ceilings_of(df)
    parts = []
    if len(roof):
        parts.append(
            f"{'Top' if len(bw) else 'The figure'}: {len(roof)} GPU points with a FLOP count "
            "at their arithmetic intensity "
            "(the flops and bytes each experiment declares: the compulsory traffic, so a "
            "point above the DRAM slope was fed by a cache) against achieved GFLOP/s, both "
            "axes log. The labelled points are the best and the worst of each experiment "
            "at its largest problem; ringed points sit above the DRAM slope, fed by a cache. "
            "Each point's dtype has its roof: FP32, FP64 where float64 points are drawn, "
            "and a tensor-core precision's dense peak where points of that precision are "
            "drawn.")
    if len(bw):
        parts.append(
            f"{'Bottom' if len(roof) else 'The figure'}: {len(bw)} points without flops "
            "(copies, transposes, stencils counted in bytes) as achieved GB/s per "
            f"{'experiment' if experiment is None else 'variant'}, coloured by memory level "
            "(L2 where the working set fits L2 and L2 was not flushed).")
    if c.measured:
        parts.append("Solid lines: ceilings measured on this GPU at the start of each GPU "
                     "job; dashed: theoretical peaks from the device's clocks and bus.")
    elif not any(math.isfinite(v) for v in (c.dram_peak, c.fp32_peak)):
        parts.append("No ceiling is known for these results (neither measured nor a "
                     "theoretical peak recorded): the points are drawn without roofs.")
    else:
        parts.append("No ceilings were measured for this run (results from before the "
                     "ceilings step): only the theoretical peaks are drawn (dashed); "
                     "measured ceilings are lower, so real headroom is smaller than shown.")
    n_bad = int(roof["suspect"].sum() + bw["suspect"].sum())
    if n_bad:
        parts.append(f"Red rings: {n_bad} suspect points, above the ceiling they are "
                     "compared with (listed under 'Measurements to distrust').")
    return " ".join(parts)
