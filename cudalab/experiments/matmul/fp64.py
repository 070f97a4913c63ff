"""Double precision: the FP64:FP32 ratio by compute capability, each float64 point's share
of the FP64 peak, and the float64 summary table.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from cudalab import fmt
from cudalab.experiments.matmul.kernels import LADDER
from cudalab.experiments.matmul.ladder import _cell, _num

if TYPE_CHECKING:
    pass


# -- double precision ------------------------------------------------------------------------
# FP64 : FP32 throughput of the CUDA cores by compute capability (CUDA C++ Programming
# Guide, "Arithmetic Instructions": 64-bit fma results per clock per SM against 32-bit).
# GA100 / GH100 (and V100) are the HPC parts with full-rate FP64 units; the consumer and
# workstation chips (sm_86, sm_89, sm_120) have 1:64. cuBLAS DGEMM may also use the FP64
# tensor cores of sm_80 / sm_90 (DMMA), which double the FP64 rate of GH100 and GA100.
FP64_RATIO = {"7.0": 1 / 2, "8.0": 1 / 2, "9.0": 1 / 2, "8.6": 1 / 64, "8.9": 1 / 64,
              "12.0": 1 / 64}
# FP64 tensor cores (DMMA, which cuBLAS DGEMM uses) against the FP32 CUDA cores: GA100 and
# GH100 run FP64 matrix products at the FP32 rate (A100 19.5 / 19.5, H100 SXM 67 / 67
# TFLOP/s), twice their CUDA cores' FP64 (the lesson's claim dgemm_tensor_cores judges it).
FP64_TENSOR_RATIO = {"8.0": 1.0, "9.0": 1.0}


def fp64_ratio(cc: Any) -> float | None:
    """FP64:FP32 rate of the CUDA cores of a compute capability ("9.0", (9, 0), "sm_90"),
    None where cudalab does not know it."""
    from cudalab import devicespec

    try:
        return FP64_RATIO.get(devicespec.cc_key(cc))
    except ValueError:
        return None


def fp64_peak_ratio(cc: Any, variant: str) -> tuple[float | None, str]:
    """(FP64 peak / FP32 peak, which units) a float64 point is judged against: cuBLAS DGEMM
    against the FP64 tensor cores where the GPU has them, kernels against the CUDA cores."""
    from cudalab import devicespec

    try:
        key = devicespec.cc_key(cc)
    except ValueError:
        return None, ""
    if variant == "cublas" and key in FP64_TENSOR_RATIO:
        return FP64_TENSOR_RATIO[key], "FP64 tensor cores"
    r = FP64_RATIO.get(key)
    return r, ("FP64 CUDA cores" if r is not None else "")


def fp32_peak(row: Any) -> float:
    """The theoretical FP32 peak recorded with a row (GFLOP/s): its peak_fp32_gflops, else
    the one behind its pct_peak_gflops; NaN where neither is there."""
    peak = _num(row, "peak_fp32_gflops")
    if math.isfinite(peak) and peak > 0:
        return peak
    pct = _num(row, "pct_peak_gflops")
    return 100 * _num(row, "gflops") / pct if pct > 0 else math.nan


def fp64_peak(row: Any) -> tuple[float, str]:
    """(GFLOP/s, which units) of the FP64 peak a float64 row is judged against: the FP32
    peak recorded with it x fp64_peak_ratio of its variant (cuBLAS DGEMM: the FP64 tensor
    cores where the GPU has them), else the FP64 peak the record holds. Computed from the
    FP32 peak, so a record made before the tensor-core peak was known is judged right too
    (its m_peak_fp64_gflops is the CUDA cores')."""
    cc = row.get("compute_capability") if hasattr(row, "get") else None
    ratio, units = (None, "") if fmt.missing(cc) else fp64_peak_ratio(cc, str(row["variant"]))
    peak32 = fp32_peak(row)
    if ratio is not None and math.isfinite(peak32):
        return peak32 * ratio, units
    return _num(row, "m_peak_fp64_gflops"), units or "FP64 units"


def ratio_text(r: float | None) -> str:
    return "unknown" if r is None else f"1:{1 / r:.0f}"


def fp64_metrics(gpu: Any, flops: float, seconds: float,
                 variant: str = "naive") -> dict[str, float]:
    """The FP64 peak this point is judged against (FP32 peak x fp64_peak_ratio: the FP64
    tensor cores for cuBLAS DGEMM where the GPU has them, else the CUDA cores) and this
    point's % of it; {} where the ratio or the FP32 peak is unknown."""
    from cudalab import devicespec

    try:
        ratio, _ = fp64_peak_ratio(gpu.info["compute_capability"], variant)
        peak32 = devicespec.device_peaks(gpu)["peak_fp32_gflops"]
    except Exception:  # noqa: BLE001 - no device facts (a stand-in)
        return {}
    if ratio is None or not math.isfinite(peak32) or not seconds > 0:
        return {}
    peak = peak32 * ratio
    return {"peak_fp64_gflops": peak, "pct_peak_fp64": 100 * flops / seconds / 1e9 / peak}


def fp64_summary(d: pd.DataFrame) -> dict[str, Any] | None:
    """FP64 against FP32 per size and variant (best configuration of each), the theoretical
    FP64:FP32 ratio of the run's GPU and cuBLAS DGEMM / SGEMM at the largest size both
    ran; None without float64 rows. d: _frame(df, None)."""
    f64 = d[d["p_dtype"] == "float64"]
    if f64.empty:
        return None
    ccs = d["compute_capability"].dropna() if "compute_capability" in d else pd.Series([])
    cc = str(ccs.iloc[0]) if len(ccs) else ""
    rows = []
    for (size, v), g in f64.groupby(["size", "variant"], sort=False):
        top = g.loc[g["gflops"].idxmax()]
        f32 = d[(d["p_dtype"] == "float32") & (d["size"] == size) & (d["variant"] == v)]
        g32 = float(f32["gflops"].max()) if not f32.empty else math.nan
        # % of the FP64 peak of the units the point runs on (fp64_peak); the record's own %
        # where that peak is unknown
        peak, _ = fp64_peak(top)
        pct = (100 * float(top["gflops"]) / peak if peak > 0
               else _num(top, "m_pct_peak_fp64"))
        rows.append({"size": size, "variant": v, "flops": float(top["flops"]),
                     "gflops64": float(top["gflops"]), "gflops32": g32, "pct_peak_fp64": pct})
    rows.sort(key=lambda r: (r["flops"], LADDER.index(r["variant"])))
    both = [r for r in rows if r["variant"] == "cublas" and math.isfinite(r["gflops32"])]
    measured = None
    if both:
        b = max(both, key=lambda r: r["flops"])
        measured = (b["size"], b["gflops64"] / b["gflops32"])
    theory = fp64_ratio(cc) if cc else None
    return {"cc": cc, "theory": theory, "measured": measured, "rows": rows}


def _fp64_table_html(s: dict[str, Any]) -> str:
    meas = "not measured (cuBLAS DGEMM and SGEMM at one size)"
    if s["measured"] is not None:
        size, r = s["measured"]
        meas = f"cuBLAS DGEMM / SGEMM = {fmt.ratio(r)} at {size}"
    tensor, _ = fp64_peak_ratio(s["cc"], "cublas") if s["cc"] else (None, "")
    dmma = ("" if tensor is None or tensor == s["theory"] else
            f" cuBLAS DGEMM runs on the FP64 tensor cores (DMMA), which on this GPU do FP64 "
            f"matrix products at {ratio_text(tensor) if tensor < 1 else 'the FP32 rate'}, "
            f"so DGEMM can match SGEMM; its % is of that peak, while the hand-written "
            f"kernels' are of the CUDA cores' FP64 peak.")
    lead = (f"<p>FP64:FP32 of the CUDA cores of this GPU (compute capability "
            f"{html.escape(s['cc'] or '?')}): {ratio_text(s['theory'])}; measured: "
            f"{html.escape(meas)}.{html.escape(dmma)}</p>")
    head = ("<tr><th>size</th><th>variant</th><th>float64</th><th>float32</th>"
            "<th>FP64 / FP32</th><th>% of FP64 peak</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['size'])}</td><td>{html.escape(r['variant'])}</td>"
        f"<td>{fmt.flop_rate(r['gflops64'])}</td>"
        f"<td>{_cell(r['gflops32'], fmt.flop_rate)}</td>"
        f"<td>{_cell(r['gflops64'] / r['gflops32'], fmt.ratio)}</td>"
        f"<td>{_cell(r['pct_peak_fp64'], fmt.percent)}</td></tr>"
        for r in s["rows"])
    return f'{lead}<table class="kv">{head}{body}</table>'
