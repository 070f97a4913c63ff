"""The matmul figures: GFLOP/s per size and variant, the lesson panels, the course's size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from cudalab import fmt
from cudalab.experiments.matmul.cublas import _gemm_name
from cudalab.experiments.matmul.kernels import LADDER_KERNELS, VARIANTS

if TYPE_CHECKING:
    pass


# -- figures -------------------------------------------------------------------------------
PANELS = [
    ("global memory vs shared-memory tiles", ["cpu", "naive", "tiled"]),
    ("bank conflicts: padded vs conflicting tile", ["tiled_conflict", "tiled_padded"]),
    ("register tiling", ["register"]),
    ("toward cuBLAS: float4, double buffer, warp tiles", LADDER_KERNELS),
]

# One paragraph per step of the ladder (the report's ladder table): what it changes, what
# it buys.
def size_label(m: Any, k: Any, n: Any) -> str:
    m, k, n = int(m), int(k), int(n)
    return f"{n}" if m == k == n else f"{m}x{k}.{k}x{n}"


def params(d: pd.DataFrame) -> list[dict[str, Any]]:
    """Each row's variant and parameters (p_*), all that a label or a legend order reads:
    not whole rows (a run's table has hundreds of columns; converting them all made the
    claims' judging of a lesson ten times slower)."""
    return d[["variant", *(c for c in d.columns if c.startswith("p_"))]].to_dict("records")


def variant_label(r: dict[str, Any]) -> str:
    v = r["variant"]

    def i(key: str) -> int:
        return int(r[f"p_{key}"])

    if v == "cpu":
        return "cpu"
    if v == "cublas":
        return f"cuBLAS {_gemm_name(str(r.get('p_dtype') or 'float32'))}"
    if v in ("register", "vec4", "dbuf"):
        return f"{v} {i('rt')}x{i('rt')} ({i('bt')}x{i('bt')}x{i('bk')})"
    if v == "warptile":
        return (f"warptile {i('bm')}x{i('bn')}x{i('bk')} w{i('wm')}x{i('wn')}/{i('wniter')} "
                f"t{i('tm')}x{i('tn')}")
    if v == "tiled_padded":
        return f"tiled_padded ({i('tile')}x{i('tile') + 1})"
    t = r.get("p_tile")
    if t is None or pd.isna(t):
        return v
    return f"{v} ({int(t)}x{int(t)})"


def _config_order(r: dict[str, Any]) -> tuple:
    """Legend order: variant (course order), then tile or register tile, block tile, depth."""
    def num(key: str) -> float:
        v = r.get(f"p_{key}")
        return -1.0 if v is None or pd.isna(v) else float(v)

    return (VARIANTS.index(r["variant"]) if r["variant"] in VARIANTS else len(VARIANTS),
            num("tile"), num("rt"), num("bt"), num("bm"), num("bn"), num("bk"), num("wm"),
            num("wn"), num("wniter"), num("tm"), num("tn"))


def _best_per_variant(rows: pd.DataFrame) -> dict[str, tuple[str, float]]:
    """variant -> (label, gflops) of its fastest configuration among rows."""
    out = {}
    for v, g in rows.groupby("variant", sort=False):
        top = g.loc[g["gflops"].idxmax()]
        out[str(v)] = (str(top["label"]), float(top["gflops"]))
    return out


def _plot_gflops(d: pd.DataFrame):
    """One panel per lesson on a numeric (log2) size axis for the square products, and
    the course's rectangular product as bars of its own: its flop count sits between two
    square sizes, and a category axis would space 160x240.240x320 and 4096 alike."""
    import matplotlib.pyplot as plt

    square = d[(d["p_m"] == d["p_k"]) & (d["p_k"] == d["p_n"])]
    rect = d[~d.index.isin(square.index)]
    cub = square[square["variant"] == "cublas"]
    pct = _pct_of_cublas(square)
    square = square.assign(legend=[pct.get(lab, lab) for lab in square["label"]],
                           config_order=[_config_order(r) for r in params(square)])
    lessons = [(t, vs) for t, vs in PANELS if square["variant"].isin(vs).any()]
    if not lessons and rect.empty:
        lessons = [("cuBLAS", [])]
    n = len(lessons) + (not rect.empty)
    ncols = 2 if n > 1 else 1
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.7 * ncols, 5.3 * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax, (title, vs) in zip(flat, lessons):
        _lesson_panel(ax, square[square["variant"].isin(vs)], cub, title)
    if not rect.empty:
        _course_panel(flat[len(lessons)], rect)
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle("Matrix multiplication throughput (float32)")
    fig.tight_layout()
    return fig


def _pct_of_cublas(d: pd.DataFrame) -> dict[str, str]:
    """label -> legend text with its % of cuBLAS at the largest size both ran at."""
    cub = d[d["variant"] == "cublas"]
    pct: dict[str, str] = {}
    for lab, g in d[d["variant"] != "cublas"].groupby("label"):
        both = g[g["size"].isin(set(cub["size"]))]
        if not both.empty:
            row = both.loc[both["flops"].idxmax()]
            ref = cub[cub["size"] == row["size"]]["gflops"].max()
            pct[str(lab)] = f"{lab}: {100 * row['gflops'] / ref:.0f}% at {row['size']}"
    return pct


def _size_ticks(ax, sizes: list[int]) -> None:
    """Ticks at the measured sizes; of two sizes closer than a third of an octave (1000
    and 1024) only the power of two is labelled, so labels never collide."""
    from matplotlib.ticker import NullFormatter

    labelled: list[int] = []
    for s in sorted(sizes, key=lambda v: (v & (v - 1)) != 0):
        if all(abs(math.log2(s / t)) > 0.33 for t in labelled):
            labelled.append(s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(labelled), [str(s) for s in sorted(labelled)])
    ax.set_xticks([s for s in sizes if s not in labelled], minor=True)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _lesson_panel(ax, sub: pd.DataFrame, cub: pd.DataFrame, title: str) -> None:
    import seaborn as sns
    from matplotlib.lines import Line2D

    handles = []
    if not sub.empty:
        conflicts = set(sub["variant"]) <= {"tiled_conflict", "tiled_padded"}
        if conflicts:  # pair them: one colour per tile, dotted = conflicting layout
            sub = sub.assign(config_order=[(c[1], -c[0]) for c in sub["config_order"]])
        hue_order = list(dict.fromkeys(sub.sort_values("config_order")["legend"]))
        first = sub.drop_duplicates("legend").set_index("legend")
        if conflicts:
            tiles = sorted(first["p_tile"].unique())
            pal = dict(zip(tiles, sns.color_palette("deep", len(tiles))))
            colors = {e: pal[first.loc[e, "p_tile"]] for e in hue_order}
        else:
            colors = dict(zip(hue_order, sns.color_palette("deep", len(hue_order))))
        dotted = {e: first.loc[e, "variant"] == "tiled_conflict" for e in hue_order}
        for e in hue_order:
            g = sub[sub["legend"] == e].sort_values("p_n")
            ax.plot(g["p_n"], g["gflops"], marker="o", ms=4, color=colors[e],
                    ls=":" if dotted[e] else "-")
        handles = [Line2D([], [], color=colors[e], marker="o", ms=4, label=e,
                          ls=":" if dotted[e] else "-") for e in hue_order]
    if not cub.empty:
        c = cub.sort_values("p_n")
        handles.append(ax.plot(c["p_n"], c["gflops"], ls="--", color="black", marker="s",
                               ms=4, label="cuBLAS SGEMM (ceiling)")[0])
        below = (sub.groupby("p_n")["gflops"].max().reindex(c["p_n"]).to_numpy()
                 > c["gflops"].to_numpy()) if not sub.empty else []
        small = [n for n, b in zip(c["p_n"], below) if b and n < 1000]
        if small:  # cuBLAS is no ceiling there: say so where it happens (caption: why)
            ax.axvspan(min(small) / 1.3, max(small) * 2, color="0.9", zorder=0, lw=0)
            ax.text(max(small) * 1.9, 0.97, "small n:\nlaunch-\nbound", fontsize=7.5,
                    transform=ax.get_xaxis_transform(), va="top", ha="right", color="0.3")
    sizes = sorted({int(v) for v in pd.concat([sub["p_n"], cub["p_n"]]).dropna()})
    if sizes:
        _size_ticks(ax, sizes)
    ax.set_yscale("log")
    ax.set(xlabel="matrix size n (n x n times n x n; log scale)", ylabel="GFLOP/s (log)",
           title=title)
    ax.legend(handles=handles, title="variant: % of cuBLAS" if not cub.empty else "variant",
              fontsize=7.5, title_fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              # two columns of the long warp-tile labels would run off the panel
              ncol=2 if len(handles) > 4 and max(len(str(h.get_label())) for h in handles)
              <= 40 else 1, frameon=False)


def _course_panel(ax, rect: pd.DataFrame) -> None:
    """Best configuration of each variant at the rectangular product, as bars."""
    import seaborn as sns

    best = rect.loc[rect.groupby("variant")["gflops"].idxmax()]
    best = best.assign(order=[_config_order(r) for r in params(best)])
    best = best.sort_values("order")
    colors = sns.color_palette("deep", len(best))
    ax.barh(range(len(best)), best["gflops"], color=colors)
    ax.set_yticks(range(len(best)), list(best["label"]), fontsize=8)
    ax.invert_yaxis()
    top = float(best["gflops"].max())
    ax.set_xlim(0, top * 1.45)
    for i, g in enumerate(best["gflops"]):
        ax.text(g + top * 0.02, i, fmt.flop_rate(g), va="center", fontsize=7.5)
    ax.set(xlabel="GFLOP/s (best configuration of each variant)",
           title=f"the course's product {rect['size'].iloc[0]}")


def _mkn(size: Any) -> tuple[int, int, int]:
    if isinstance(size, int):
        return size, size, size
    m, k, n = size
    return int(m), int(k), int(n)
