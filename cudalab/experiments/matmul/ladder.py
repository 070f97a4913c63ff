"""The ladder past register tiling (cuda/matmul/matmul_ladder.cu): the vec4 and warp tiles,
their checks, the ladder's steps at a size against cuBLAS, its expected effect, table and
figure.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd

from cudalab import fmt
from cudalab.experiments.matmul.figures import size_label
from cudalab.experiments.matmul.kernels import (
    APAD,
    COURSE_SIZE,
    LADDER,
    MAX_STATIC_SMEM,
)

if TYPE_CHECKING:
    pass


VEC4_RT = [4, 8]
VEC4_BK = [8, 16, 32]
DEFAULT_VEC4_TILES = [{"rt": 8, "bt": 128, "bk": 8}, {"rt": 8, "bt": 128, "bk": 16}]
# warptile: a small tile search (Kernel Tuner style) over these; the figure keeps the best
WARP_KEYS = ("bm", "bn", "bk", "wm", "wn", "wniter", "tm", "tn", "threads")
WARP_ENUMS: dict[str, list[int]] = {
    "bm": [32, 64, 128, 256], "bn": [32, 64, 128, 256], "bk": [8, 16, 32],
    "wm": [16, 32, 64, 128], "wn": [16, 32, 64, 128], "wniter": [1, 2, 4, 8],
    "tm": [4, 8], "tn": [4, 8], "threads": [64, 128, 256, 512],
}
MAX_WARP_ACC = 128  # outputs per thread (wm*wn/32): more do not fit 255 registers unspilled


def _wt(bm, bn, bk, wm, wn, wniter, tm, tn, threads) -> dict[str, int]:
    return dict(zip(WARP_KEYS, (bm, bn, bk, wm, wn, wniter, tm, tn, threads)))


DEFAULT_WARP_TILES = [
    _wt(128, 128, 16, 64, 64, 4, 8, 4, 128),  # the known-good FP32 start on Ampere/Hopper
    _wt(128, 128, 8, 64, 64, 4, 8, 4, 128),
    _wt(128, 128, 16, 32, 64, 2, 8, 4, 256),
    _wt(128, 64, 16, 64, 32, 2, 8, 4, 128),
    _wt(64, 128, 16, 32, 64, 2, 8, 4, 128),
]

# pipelined and swizzled (cuda/matmul/matmul_pipeline.cu): a warp tile of wtm x (32/wtm) threads,
# `stages` shared-memory stages filled by cp.async. The defaults lead the tile searches on an
# H100 (reports/reference/NVIDIA-H100-80GB-HBM3/sgemm-ladder-2026-11-25 and
# sgemm-tune-2026-11-26): 128 threads, 8 x 8 outputs each, 168 registers, three blocks per SM,
# the FFMAs in korder 2. The faster 128x256 tile (16 x 8 outputs, 255 registers) is named in
# config.yaml rather than here: swizzled, which shares these tiles, spills there.
PIPE_KEYS = ("bm", "bn", "bk", "wm", "wn", "wtm", "stages", "threads")
PIPE_ENUMS: dict[str, list[int]] = {
    "bm": [32, 64, 128, 256], "bn": [32, 64, 128, 256], "bk": [8, 16, 32],
    "wm": [16, 32, 64, 128], "wn": [16, 32, 64, 128], "wtm": [4, 8],
    "stages": [2, 3, 4, 5, 6, 7, 8], "threads": [64, 128, 256, 512],
}


# optional (the kernel's KORDER, FRAGDB, SLAB, MINB, GROUP): korder, the FFMA order (0 row by
# row, 1 column by column, 2 row by row with the columns back and forth), changes nothing but
# the compiler's register allocation and schedule, and 2 gained 1.1 to 2.4 points of cuBLAS
# on an H100; fragdb double-buffers a thread's fragments in registers; slab stores A in
# 16-deep k slabs (conflict-free reads at bk 32); minb is __launch_bounds__' blocks per SM (a
# register cap); group runs the blocks `group` block rows at a time (L2 reuse of B).
PIPE_OPTIONAL: dict[str, list[int]] = {"korder": [0, 1, 2], "fragdb": [0, 1], "slab": [0, 1],
                                       "minb": [1, 2, 3, 4], "group": [0, 4, 8, 16]}


def _pt(bm, bn, bk, wm, wn, wtm, stages, threads, **opt) -> dict[str, int]:
    return dict(zip(PIPE_KEYS, (bm, bn, bk, wm, wn, wtm, stages, threads))) | opt


DEFAULT_PIPE_TILES = [
    _pt(64, 128, 16, 32, 64, 4, 2, 128, korder=2),
    _pt(64, 128, 16, 32, 64, 4, 4, 128, korder=2),
    _pt(128, 64, 16, 32, 64, 4, 2, 128),
]


def pipe_geometry(t: dict[str, int]) -> dict[str, float]:
    """Derived numbers of a pipelined / swizzled tile: warps, a thread's rows (tm) and
    columns (tn), outputs per thread, static shared bytes (every stage's A and B tile)."""
    wtn = 32 / t["wtm"]
    return {"warps": (t["bm"] / t["wm"]) * (t["bn"] / t["wn"]), "tm": t["wm"] / t["wtm"],
            "tn": t["wn"] / wtn, "acc": t["wm"] * t["wn"] / 32,
            "smem": 4 * t["stages"] * t["bk"] * (t["bm"] + t["bn"])}


def check_pipe_tile(t: dict[str, int]) -> list[str]:
    """Why a pipelined / swizzled tile cannot be compiled or launched (the kernel's
    static_asserts, the 48 KiB of static shared memory), one message per broken rule."""
    g = pipe_geometry(t)
    out = []
    if t["bm"] % t["wm"] or t["bn"] % t["wn"]:
        out.append(f"bm={t['bm']} must be a multiple of wm={t['wm']} and bn={t['bn']} of "
                   f"wn={t['wn']}")
    elif t["threads"] != g["warps"] * 32:
        out.append(f"threads={t['threads']} must be (bm/wm)*(bn/wn)*32 = "
                   f"{int(g['warps'] * 32)}")
    if t["wm"] % t["wtm"] or t["wn"] % (4 * (32 // t["wtm"])):
        out.append(f"wm={t['wm']} must be a multiple of wtm={t['wtm']} and wn={t['wn']} of "
                   f"4*32/wtm = {4 * (32 // t['wtm'])} (float4 columns per thread)")
    if g["smem"] > MAX_STATIC_SMEM:
        out.append(f"needs {int(g['smem'])} bytes of static shared memory ({t['stages']} "
                   f"stages of A {t['bm']}x{t['bk']} + B {t['bk']}x{t['bn']} floats); at most "
                   f"{MAX_STATIC_SMEM} (48 KiB): use fewer stages or a smaller bk, bm or bn")
    if g["acc"] > MAX_WARP_ACC:
        out.append(f"wm*wn/32 = {g['acc']:g} outputs per thread; at most {MAX_WARP_ACC} fit "
                   "the 255 registers of a thread without spilling: use a smaller wm or wn")
    return out


def warp_geometry(t: dict[str, int]) -> dict[str, float]:
    """Derived numbers of a warp tile (cuda/matmul/matmul_ladder.cu): warps, WMITER, sub-tile
    WSUBM x WSUBN, threads of a warp along n (tcols), outputs per thread, shared bytes.
    Fractions where the tile is inconsistent (check_warp_tile says why)."""
    warps = (t["bm"] / t["wm"]) * (t["bn"] / t["wn"])
    wmiter = t["wm"] * t["wn"] / (32 * t["tm"] * t["tn"] * t["wniter"])
    wsubn = t["wn"] / t["wniter"]
    return {"warps": warps, "wmiter": wmiter, "wsubm": t["wm"] / wmiter if wmiter else 0.0,
            "wsubn": wsubn, "tcols": wsubn / t["tn"], "acc": t["wm"] * t["wn"] / 32,
            "smem": 4 * t["bk"] * (t["bm"] + APAD + t["bn"])}


def check_warp_tile(t: dict[str, int]) -> list[str]:
    """Why a warp tile cannot be compiled or launched (the kernel's static_asserts, the
    1024-thread and 48 KiB limits), one message per broken rule ([] : it is fine)."""
    g = warp_geometry(t)
    out = []
    if t["bm"] % t["wm"] or t["bn"] % t["wn"]:
        out.append(f"bm={t['bm']} must be a multiple of wm={t['wm']} and bn={t['bn']} of "
                   f"wn={t['wn']}")
    elif t["threads"] != g["warps"] * 32:
        out.append(f"threads={t['threads']} must be (bm/wm)*(bn/wn)*32 = "
                   f"({t['bm']}/{t['wm']})*({t['bn']}/{t['wn']})*32 = {int(g['warps'] * 32)}")
    if (t["wm"] * t["wn"]) % (32 * t["tm"] * t["tn"] * t["wniter"]):
        out.append(f"wm*wn = {t['wm'] * t['wn']} must be a multiple of 32*tm*tn*wniter = "
                   f"{32 * t['tm'] * t['tn'] * t['wniter']} (a warp's 32 threads cover its "
                   "tile in whole sub-tiles)")
    elif t["wn"] % t["wniter"] or g["wsubn"] % t["tn"] or 32 % g["tcols"]:
        out.append(f"wn/wniter = {g['wsubn']:g} must be a multiple of tn={t['tn']} and "
                   f"wn/wniter/tn = {g['tcols']:g} must divide 32")
    if g["smem"] > MAX_STATIC_SMEM:
        out.append(f"needs {int(g['smem'])} bytes of static shared memory (A {t['bk']}x"
                   f"{t['bm'] + APAD} + B {t['bk']}x{t['bn']} floats); at most "
                   f"{MAX_STATIC_SMEM} (48 KiB): use a smaller bk, bm or bn")
    if g["acc"] > MAX_WARP_ACC:
        out.append(f"wm*wn/32 = {g['acc']:g} outputs per thread; at most {MAX_WARP_ACC} fit "
                   "the 255 registers of a thread without spilling: use a smaller wm or wn")
    return out


LADDER_MIN_STEPS = 2  # steps measured at a size before the ladder figure shows it

LADDER_NOTES = {
    "naive": "One thread per element of C, operands read from global memory: 2K loads for "
             "2K flops. The caches catch most of them (neighbours share rows and columns), "
             "but every flop still waits on a load through L1.",
    "tiled": "A block stages TILE x TILE tiles of A and B in shared memory and every thread "
             "reuses each staged value TILE times: global loads drop by the tile factor; now "
             "two shared-memory loads (one of A, one of B) feed one FMA.",
    "register": "Each thread computes an rt x rt block of C in registers (unroll-and-jam): "
                "per k it loads rt values of A and rt of B from shared memory and does "
                "rt*rt FMAs, so the FMA units, not the shared-memory port, set the pace.",
    "vec4": "The register tile with 128-bit (float4) global loads and stores, and A stored "
            "transposed (As[k][m]) so a thread reads its A and B values from shared memory "
            "as float4 too: a quarter of the load instructions, conflict-free (neighbouring "
            "threads read neighbouring float4s). Edge tiles and rows whose length is no "
            "multiple of 4 fall back to guarded scalar loads.",
    "dbuf": "vec4 with two shared buffers: while the block multiplies one tile pair, the "
            "next is loaded into the other (B by cp.async straight into shared memory on "
            "sm_80+, A through registers because it is stored transposed), so load latency "
            "hides behind the math and one barrier per tile remains instead of two.",
    "warptile": "Warp tiling: each warp owns a WM x WN sub-tile of the block tile and each "
                "thread TM x TN outputs in each of its WMITER x WNITER sub-sub-tiles. A "
                "warp's shared-memory reads stay inside its own rows and columns (broadcasts, "
                "register reuse across sub-tiles): the structure of cuBLAS/CUTLASS kernels, "
                "on the CUDA cores.",
    "pipelined": "Both tiles go from global to shared memory by cp.async, `stages` tiles "
                 "deep, with one barrier per tile and no staging registers; blocks wholly "
                 "inside the matrices run a k loop without bounds checks. cp.async cannot "
                 "transpose, so A stays row-major and a thread reads its A values as float4 "
                 "along k (four k steps per load). Fewer instructions per FFMA than dbuf: the "
                 "issue slots, not memory, set the pace, and the FFMA order the compiler "
                 "allocates registers from (korder) decides the last few per cent.",
    "swizzled": "pipelined with the A tile's 16-byte chunks XOR-swizzled by row: the rows a "
                "warp reads with one float4 load fall into different bank groups. It removes "
                "the conflicts of the tiles that have them (k depth 32, or 8 threads along m), "
                "but the swizzled offsets cost registers (about 240 against 168: two blocks "
                "per SM instead of three).",
    "cublas": "cuBLAS SGEMM through CuPy, plain FP32 (no TF32): NVIDIA's tuned kernel for "
              "this GPU, the ceiling of the ladder.",
}


# -- the ladder ----------------------------------------------------------------------------
def _largest_square(d: pd.DataFrame) -> str | None:
    sq = d[(d["p_m"] == d["p_k"]) & (d["p_k"] == d["p_n"])]
    return None if sq.empty else str(sq.loc[sq["flops"].idxmax(), "size"])


def _num(r: Any, col: str) -> float:
    v = r.get(col) if hasattr(r, "get") else None
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def ladder_at(d: pd.DataFrame, size: str) -> list[dict[str, Any]]:
    """The ladder's steps at one size (float32 rows of _frame): the best configuration of
    each step in LADDER order, with its % of cuBLAS (same run, same size; NaN without
    cuBLAS), % of the FP32 peak and the kernel's registers, shared memory, occupancy."""
    at = d[(d["size"] == size) & d["variant"].isin(LADDER)]
    cub = at[at["variant"] == "cublas"]["gflops"].max() if (at["variant"] == "cublas").any() \
        else math.nan
    rows = []
    for v in LADDER:
        g = at[at["variant"] == v]
        if g.empty:
            continue
        top = g.loc[g["gflops"].idxmax()]
        rows.append({"step": v, "size": size, "label": str(top["label"]),
                     "gflops": float(top["gflops"]), "pct_cublas": 100 * top["gflops"] / cub,
                     "pct_peak": _num(top, "pct_peak_gflops"), "regs": _num(top, "m_regs"),
                     "smem": _num(top, "m_smem_bytes"), "occupancy": _num(top, "m_occupancy")})
    return rows


def ladder_rows(d: pd.DataFrame) -> list[dict[str, Any]]:
    """The ladder at the largest square size ([] without square products)."""
    size = _largest_square(d)
    return [] if size is None else ladder_at(d, size)


def _cell(x: float, f: Callable[[float], str]) -> str:
    return "–" if not math.isfinite(x) else f(x)


def _ladder_table_html(steps: list[dict[str, Any]]) -> str:
    head = ("<tr><th>step</th><th>what it changes, what it buys</th><th>best configuration"
            "</th><th>TFLOP/s</th><th>% of cuBLAS</th><th>% of FP32 peak</th>"
            "<th>registers</th><th>shared memory</th><th>occupancy</th></tr>")
    body = "".join(
        f"<tr><td>{html.escape(r['step'])}</td><td>{html.escape(LADDER_NOTES[r['step']])}</td>"
        f"<td>{html.escape(r['label'])}</td><td>{r['gflops'] / 1e3:.1f}</td>"
        f"<td>{_cell(r['pct_cublas'], lambda x: f'{x:.0f} %')}</td>"
        f"<td>{_cell(r['pct_peak'], lambda x: f'{x:.0f} %')}</td>"
        f"<td>{_cell(r['regs'], lambda x: f'{x:.0f}')}</td>"
        f"<td>{_cell(r['smem'], lambda x: f'{x / 1024:.1f} KiB')}</td>"
        f"<td>{_cell(r['occupancy'], lambda x: f'{100 * x:.0f} %')}</td></tr>"
        for r in steps)
    return f'<table class="kv">{head}{body}</table>'


def _plot_ladder(d: pd.DataFrame):
    """Horizontal bars, one per step, at the largest square size and at the course's
    product; each labelled with TFLOP/s, % of cuBLAS and % of the FP32 peak."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    course = size_label(*COURSE_SIZE)
    big = _largest_square(d)
    panels = [(f"largest square product: n = {big}", ladder_at(d, big)) if big else ("", []),
              (f"the course's product {course}", ladder_at(d, course))]
    # one step is no ladder
    panels = [(t, rows) for t, rows in panels if len(rows) >= LADDER_MIN_STEPS]
    if not panels:
        return None
    heights = [len(rows) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.6 + 0.42 * sum(heights)
                                                      + 0.9 * len(panels)),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    colors = dict(zip(LADDER, sns.color_palette("deep", len(LADDER))))
    colors["cublas"] = (0.25, 0.25, 0.25)
    for ax, (title, rows) in zip(axes[:, 0], panels):
        tf = [r["gflops"] / 1e3 for r in rows]
        ax.barh(range(len(rows)), tf, color=[colors[r["step"]] for r in rows])
        ax.set_yticks(range(len(rows)), [r["label"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        top = max(tf)
        ax.set_xlim(0, top * 1.75)
        for i, r in enumerate(rows):
            parts = [fmt.flop_rate(r["gflops"])]
            if math.isfinite(r["pct_cublas"]) and r["step"] != "cublas":
                parts.append(f"{r['pct_cublas']:.0f}% of cuBLAS")
            if math.isfinite(r["pct_peak"]):
                parts.append(f"{r['pct_peak']:.0f}% of FP32 peak")
            ax.text(tf[i] + top * 0.02, i, ", ".join(parts), va="center", fontsize=7.5)
        ax.set(xlabel="TFLOP/s (float32, best configuration of each step)", title=title)
    fig.suptitle("The matmul ladder: from the naive kernel to cuBLAS SGEMM")
    fig.tight_layout()
    return fig
