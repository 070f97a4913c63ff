"""The tensor-core figures and the summary table: speed against error per precision (the
lesson), and each variant's TFLOP/s per precision against cuBLAS and the precision's peak.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pandas as pd

from cudalab import fmt

ORDER = ["fp32", "tf32", "bf16", "fp16"]
VARIANT_LABEL = {"wmma": "WMMA", "mma": "mma.sync + ldmatrix + cp.async",
                 "wgmma_tma": "wgmma + TMA, 1 stage", "wgmma_pipe": "wgmma + TMA pipeline",
                 "wgmma_ws": "wgmma, producer/consumer warpgroups",
                 "wgmma_persist": "wgmma, warp-specialised, persistent", "cublas": "cuBLAS"}


def largest(d: pd.DataFrame) -> pd.DataFrame:
    if d.empty:
        return d
    f = pd.to_numeric(d["flops"], errors="coerce")
    return d[f == f.max()]


def best(d: pd.DataFrame) -> pd.DataFrame:
    """The fastest row per (size, precision, variant): the mma tile search keeps its best."""
    if d.empty:
        return d
    d = d.assign(gflops=pd.to_numeric(d["gflops"], errors="coerce")).dropna(subset=["gflops"])
    keys = ["flops", "p_precision", "variant"]
    return d.loc[d.groupby(keys, sort=False)["gflops"].idxmax()]


def summary_rows(d: pd.DataFrame) -> list[dict[str, Any]]:
    """At the largest size: per precision and variant, TFLOP/s, % of cuBLAS of the same
    precision, % of the precision's peak, the errors."""
    b = best(largest(d))
    rows = []
    for prec in ORDER:
        sub = b[b["p_precision"] == prec]
        cub = sub[sub["variant"] == "cublas"]["gflops"]
        ceiling = float(cub.iloc[0]) if len(cub) else float("nan")
        for _, r in sub.sort_values("gflops").iterrows():
            rows.append({
                "precision": prec, "variant": r["variant"],
                "tile": tile_label(r), "tflops": r["gflops"] / 1e3,
                "pct_cublas": 100 * r["gflops"] / ceiling if ceiling > 0 else float("nan"),
                "pct_peak": _num(r, "m_pct_peak_precision"),
                "err_input": _num(r, "m_err_input"), "err_check": _num(r, "error"),
                "tolerance": _num(r, "tolerance"),
            })
    return rows


def _num(r: Any, c: str) -> float:
    try:
        return float(r[c])
    except (KeyError, TypeError, ValueError):
        return float("nan")


def tile_label(r: Any) -> str:
    if str(r.get("variant")).startswith("wgmma_"):
        st, bn = r.get("p_stages"), r.get("p_bn")
        return ", ".join(([f"128x{int(bn)}"] if pd.notna(bn) else [])
                         + ([f"{int(st)} stages"] if pd.notna(st) else []))
    if r.get("variant") != "mma" or pd.isna(r.get("p_bm")):
        return ""
    return (f"{int(r['p_bm'])}x{int(r['p_bn'])}x{int(r['p_bk'])} warp "
            f"{int(r['p_wm'])}x{int(r['p_wn'])}, {int(r['p_stages'])} stages")


def summary_html(d: pd.DataFrame) -> str:
    rows = summary_rows(d)
    if not rows:
        return ""
    def f(x: float, spec: str) -> str:
        return "" if not math.isfinite(x) else format(x, spec)
    head = ("<tr><th>precision</th><th>variant</th><th>TFLOP/s</th><th>% of cuBLAS</th>"
            "<th>% of peak</th><th>error vs unrounded</th><th>check error</th></tr>")
    body = "".join(
        f"<tr><td>{r['precision']}</td><td>{html.escape(VARIANT_LABEL[r['variant']])}"
        f"{(' (' + html.escape(r['tile']) + ')') if r['tile'] else ''}</td>"
        f"<td>{f(r['tflops'], '.1f')}</td><td>{f(r['pct_cublas'], '.0f')}</td>"
        f"<td>{f(r['pct_peak'], '.0f')}</td><td>{f(r['err_input'], '.1e')}</td>"
        f"<td>{f(r['err_check'], '.1e')}</td></tr>" for r in rows)
    return f"<table>{head}{body}</table>"


def plot(name: str, d: pd.DataFrame):
    if d.empty:
        return None
    if name == "precision_knob":
        return _plot_knob(best(largest(d)))
    if name == "tflops":
        return _plot_tflops(best(d))
    if name == "wgmma_ladder":
        return _plot_ladder(best(largest(d)))
    if name == "pipeline_depth":
        return _plot_depth(largest(d))
    raise KeyError(name)


LADDER = ["wmma", "mma", "wgmma_tma", "wgmma_pipe", "wgmma_ws", "wgmma_persist", "cublas"]


def _plot_ladder(b: pd.DataFrame):
    """TFLOP/s of each rung at the largest size, one group of bars per precision, each bar
    labelled with its share of cuBLAS of the same precision."""
    import matplotlib.pyplot as plt

    b = b[b["variant"].isin(LADDER) & b["p_precision"].isin(["tf32", "bf16", "fp16"])]
    if not b["variant"].str.startswith("wgmma_").any():
        return None
    precs = [p for p in ["fp16", "bf16", "tf32"] if (b["p_precision"] == p).any()]
    rungs = [v for v in LADDER if (b["variant"] == v).any()]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(rungs)
    for i, v in enumerate(rungs):
        for j, prec in enumerate(precs):
            r = b[(b["variant"] == v) & (b["p_precision"] == prec)]
            cub = b[(b["variant"] == "cublas") & (b["p_precision"] == prec)]["gflops"]
            if r.empty:
                continue
            y = float(r["gflops"].iloc[0]) / 1e3
            ax.bar(j + (i - (len(rungs) - 1) / 2) * width, y, width, color=f"C{i}",
                   label=VARIANT_LABEL[v] if j == 0 else None)
            if len(cub) and v != "cublas":
                ax.annotate(f"{100 * y * 1e3 / float(cub.iloc[0]):.0f}%",
                            (j + (i - (len(rungs) - 1) / 2) * width, y), ha="center",
                            va="bottom", fontsize=6)
    ax.set_xticks(range(len(precs)), [p.upper() for p in precs])
    ax.set(ylabel="TFLOP/s", title=f"The ladder at {_size(b)} (label: % of cuBLAS)")
    ax.set_ylim(0, float(b["gflops"].max()) / 1e3 * 1.45)  # head room for the legend
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.tight_layout()
    return fig


def _plot_depth(d: pd.DataFrame):
    """TFLOP/s of the wgmma rungs against their shared-memory stages (the one-stage rung at
    1): one panel per precision, a rung's colour as in the ladder, the measured stage counts
    as the ticks."""
    import matplotlib.pyplot as plt

    w = d[d["variant"].str.startswith("wgmma_")]
    if "p_stages" not in w or pd.to_numeric(w["p_stages"], errors="coerce").nunique() < 2:
        return None
    w = w.assign(stages=pd.to_numeric(w["p_stages"], errors="coerce").fillna(1).astype(int),
                 gflops=pd.to_numeric(w["gflops"], errors="coerce"))
    precs = [p for p in ["fp16", "bf16", "tf32"] if (w["p_precision"] == p).any()]
    fig, axes = plt.subplots(1, len(precs), figsize=(3.4 * len(precs) + 0.6, 3.9),
                             squeeze=False)
    for ax, prec in zip(axes[0], precs):
        sub = w[w["p_precision"] == prec]
        for v in LADDER:
            g = sub[sub["variant"] == v].groupby("stages")["gflops"].max()
            if not g.empty:
                ax.plot(g.index, g.values / 1e3, marker="o", color=f"C{LADDER.index(v)}",
                        label=VARIANT_LABEL[v])
        ticks = sorted(set(sub["stages"]))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlim(min(ticks) - 0.5, max(ticks) + 0.5)
        ax.set(title=prec.upper(), xlabel="shared-memory stages")
    axes[0][0].set_ylabel("TFLOP/s")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(f"Pipeline depth against speed at {_size(w)}")
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(handles)), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def _plot_knob(b: pd.DataFrame):
    import matplotlib.pyplot as plt
    import seaborn as sns

    from cudalab.experiments.tensor_cores.numerics import expected_input_error

    b = b.dropna(subset=["m_err_input"]) if "m_err_input" in b else b.iloc[:0]
    if b.empty:
        return None
    colors = dict(zip(ORDER, sns.color_palette("deep", len(ORDER))))
    markers = {"cublas": "o", "wmma": "s", "mma": "^", "wgmma_tma": "v", "wgmma_pipe": "<",
               "wgmma_ws": ">", "wgmma_persist": "D"}
    fig, ax = plt.subplots(figsize=(8, 5))
    for _, r in b.iterrows():
        ax.scatter(r["m_err_input"], r["gflops"] / 1e3, color=colors.get(r["p_precision"]),
                   marker=markers.get(r["variant"], "x"), s=60,
                   label=f"{r['p_precision']} {VARIANT_LABEL[r['variant']]}")
    for prec in sorted(set(b["p_precision"]), key=ORDER.index):
        if expected_input_error(prec) > 0:  # fp32 inputs are not rounded
            ax.axvline(expected_input_error(prec), color=colors[prec], ls=":", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="relative error against the float64 product of "
           "the unrounded inputs (log)", ylabel="TFLOP/s (log)",
           title=f"Precision is a knob: speed against error at {_size(b)}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def _plot_tflops(b: pd.DataFrame):
    import matplotlib.pyplot as plt

    precs = [p for p in ORDER if (b["p_precision"] == p).any()]
    if not precs:
        return None
    # up to three panels in a row; four (every precision) as two by two, to fit a page
    ncols = len(precs) if len(precs) <= 3 else 2
    nrows = -(-len(precs) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.6 * nrows), squeeze=False,
                             sharey=True)
    for ax in axes.flat[len(precs):]:
        ax.set_visible(False)
    for ax, prec in zip(axes.flat, precs):
        sub = b[b["p_precision"] == prec].sort_values("flops")
        for v, g in sub.groupby("variant"):
            ax.plot(np.cbrt(g["flops"] / 2), g["gflops"] / 1e3, marker="o",
                    label=VARIANT_LABEL[str(v)], ls="--" if v == "cublas" else "-")
        if "m_peak_precision_gflops" in sub and sub["m_peak_precision_gflops"].notna().any():
            ax.axhline(float(sub["m_peak_precision_gflops"].max()) / 1e3, color="grey", ls="--",
                       lw=1, label="dense peak")
        ax.set(xscale="log", yscale="log", title=prec, xlabel="n (cube root of m k n, log)")
        # the measured sizes as the ticks: log minor labels (3x10^3, 4x10^3) collide
        sizes = sorted({round(float(x)) for x in np.cbrt(sub["flops"] / 2)})
        ax.set_xticks(sizes, [fmt.integer(x) for x in sizes])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.legend(fontsize=7)
    for row in axes:
        row[0].set_ylabel("TFLOP/s (log)")
    fig.tight_layout()
    return fig


def _size(b: pd.DataFrame) -> str:
    r = b.iloc[0]
    m, k, n = int(r["p_m"]), int(r["p_k"]), int(r["p_n"])
    return f"n = {m}" if m == k == n else f"{m}x{k}.{k}x{n}"
