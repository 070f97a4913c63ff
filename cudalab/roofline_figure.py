"""The roofline figure and its caption: what the report shows of a run's points.

Roofline (Williams, Waterman, Patterson 2009): x = arithmetic intensity (declared flops /
declared bytes, FLOP/byte), y = achieved GFLOP/s, both log; a memory level of bandwidth B
caps a kernel at B * x, the FP32 peak at a flat roof. Measured ceilings are drawn solid,
theoretical ones dashed. Points with no flops (copies) cannot sit on a FLOP roofline: they
go to a second panel, GB/s per experiment against the ceiling of their memory level.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.roofline import annotate, bandwidth_points, roofline_points
from cudalab.run_ceilings import TENSOR_PRECISIONS, Ceilings, ceilings_of, num

RUN_FIGURE = "run"  # the run's roofline (cudalab.run_figures draws it beside each lesson's)


# Points by memory level (bandwidth panel) and the ceilings' lines, darker than seaborn's
# deep palette that colours the roofline's points, so no experiment shares a line's colour.
LEVEL_COLORS = {"dram": "#4c72b0", "l2": "#dd8452", "": "0.55"}


CEIL_COLORS = {"dram": "#1b2a49", "l2": "#a0522d", "smem": "#2e7d32", "fp32": "0.1",
               "fp64": "#6a1b9a", "tf32": "#00838f", "fp16": "#c62828", "bf16": "#ef6c00"}


LEVEL_MARKERS = {"dram": "o", "l2": "^", "": "s"}


SUSPECT_COLOR = "#c0262d"


# Label placement: offsets (points) tried around a point, nearest first.
LABEL_RADII = (10, 22, 36, 52, 70)


LABEL_ANGLES = (45, -45, 135, -135, 90, -90, 0, 180, 20, -20, 160, -160)


def highlights(points: pd.DataFrame) -> list[tuple[pd.Series, str]]:
    """The points a lesson is about: per experiment, the best and the worst at its largest
    problem (most flops), e.g. naive vs cuBLAS at 4096^3. Returns (row, label)."""
    out = []
    for exp, g in points.groupby("experiment", sort=True):
        big = g[num(g, "flops") == num(g, "flops").max()]
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
