"""Sobel edge detection: global memory, shared-memory tiles with a halo, weights in
constant memory, for several block shapes and image sizes.

For an interior pixel (i, j) of an 8-bit grey image u (i: row, j: column):
  gx = (u[i-1][j+1] - u[i-1][j-1]) + 2 (u[i][j+1] - u[i][j-1]) + (u[i+1][j+1] - u[i+1][j-1])
  gy = (u[i-1][j-1] + 2 u[i-1][j] + u[i-1][j+1]) - (u[i+1][j-1] + 2 u[i+1][j] + u[i+1][j+1])
  e[i][j] = 255 if gx^2 + gy^2 > threshold else 0;   e = 0 on the border.
Integer arithmetic: every kernel must reproduce the numpy reference pixel for pixel
(error = number of differing pixels, tolerance 0). Parameters of a point: height, width,
bx, by (block shape: bx threads along a row, by along a column).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments import base
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.sobel.lesson import LESSON

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

VARIANTS = ["global", "shared", "constant"]
SENTINEL = 0x7F  # neither 0 nor 255: an unwritten output pixel shows as a difference
# Weight masks of the constant-memory kernel, row-major over (di, dj) in {-1, 0, 1}^2.
WX = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.int32)
WY = np.array([[1, 2, 1], [0, 0, 0], [-1, -2, -1]], np.int32)

_size = base.size_schema(2, 3, 16384, "a square image edge n (n x n pixels) or [height, width]")
_shape = base.int_tuple_schema(2, 1, 1024, "[bx, by]: threads along a row x along a column "
                               "(bx * by <= 1024)")


class Sobel(Experiment):
    name = "sobel"
    kernel_files = ("sobel/sobel.cu",)
    order = 100
    lesson = LESSON
    roofline = True
    schema = block_schema({
            "sizes": {
                "type": "array", "items": _size, "minItems": 1,
                "default": [512, 2048, 8192],
                "description": "image sizes (8192 x 8192 = 64 MiB in, 64 MiB out)",
            },
            "variants": base.choices_schema(VARIANTS),
            "block_shapes": {
                "type": "array", "items": _shape, "minItems": 1,
                "default": [[16, 16], [32, 8], [32, 32]],
                "description": "block shapes [bx, by] to try for every variant",
            },
            "threshold": {
                "type": "integer", "minimum": 0, "maximum": 2 * 1020 * 1020,
                "default": 10000,
                "description": "edge if gx^2 + gy^2 > threshold (10000: gradient above 100)",
            },
        })
    smoke = {"sizes": [64, [37, 50], 300], "block_shapes": [[16, 16], [32, 8]]}

    def check_config(self, block: dict[str, Any]) -> list[str]:
        msgs = []
        for i, (bx, by) in enumerate(block["block_shapes"]):
            if bx * by > 1024:
                msgs.append(f"block_shapes[{i}]: [{bx}, {by}] is {bx * by} threads; a block "
                            "has at most 1024 (bx * by <= 1024)")
        return msgs

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        pts = []
        for h, w in sorted((_hw(s) for s in block["sizes"]), key=lambda s: s[0] * s[1]):
            for v in [v for v in VARIANTS if v in block["variants"]]:
                for bx, by in block["block_shapes"]:
                    pts.append(Point(self.name, v, {"height": h, "width": w,
                                                    "bx": bx, "by": by}))
        return pts

    def gpu_bytes(self, point: Point) -> int:
        p = point.params
        return 2 * p["height"] * p["width"]  # image and edges, one byte per pixel each

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant == "shared":
            return ctx.gpu.compile("sobel/sobel.cu", {"BX": point.params["bx"],
                                                "BY": point.params["by"]})
        return ctx.gpu.compile("sobel/sobel.cu")

    def _inputs(self, ctx: RunContext, h: int, w: int):
        def make():
            img = make_image(h, w, ctx.rng)
            return img, reference(img, ctx.block["threshold"])

        # one size in memory: points are ordered by size
        return ctx.cache.one_per_slot("sobel", ("sobel", h, w, ctx.block["threshold"]), make)

    def measure(self, ctx: RunContext, point: Point) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        p = point.params
        h, w, bx, by = p["height"], p["width"], p["bx"], p["by"]
        thr = ctx.block["threshold"]
        img, ref = self._inputs(ctx, h, w)
        kernel = self.kernel_for(ctx, point)
        func = kernel.function(f"sobel_{point.variant}")
        func.prepare("PPiii")
        if point.variant == "constant":
            for sym, mask in (("sobel_wx", WX), ("sobel_wy", WY)):
                ptr, size = kernel.module.get_global(sym)
                flat = np.ascontiguousarray(mask.ravel(), dtype=np.int32)
                if size != flat.nbytes:
                    raise RuntimeError(f"__constant__ {sym} is {size} bytes, expected "
                                       f"{flat.nbytes}")
                cuda.memcpy_htod(ptr, flat)
        grid = ((w + bx - 1) // bx, (h + by - 1) // by)
        out = np.empty((h, w), np.uint8)
        u_d, e_d = cuda.mem_alloc(img.nbytes), cuda.mem_alloc(out.nbytes)
        try:
            cuda.memcpy_htod(u_d, img)

            def launch() -> None:
                func.prepared_call(grid, (bx, by, 1), u_d, e_d, h, w, thr)

            check, timing = self.verify_then_time(
                ctx, launch, lambda o: compare(o, ref),
                output=(e_d, out), fill=SENTINEL, asynchronous=True)
        finally:
            ctx.cache.retire(u_d, e_d)  # freed after the point's trials: each lands anew
        metrics = {"edge_fraction": float(np.count_nonzero(ref)) / ref.size,
                   "threads_per_block": bx * by}
        return Result(timing, float("nan"), 2.0 * h * w, check, metrics, kernel=kernel,
                      launch=base.Launch(grid, (bx, by, 1)))

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        d = self.ok(df).copy()
        if d.empty:
            return d
        d["size"] = [f"{int(w)}x{int(h)}" for h, w in zip(d["p_height"], d["p_width"])]
        d["shape"] = [f"{int(x)}x{int(y)}" for x, y in zip(d["p_bx"], d["p_by"])]
        d["pixels"] = d["p_height"] * d["p_width"]
        return d.sort_values(["pixels", "variant"])

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        if name != "gbps":
            raise KeyError(name)
        d = self._frame(df)
        if d.empty:
            return None
        sizes = list(dict.fromkeys(d["size"]))
        shapes = list(dict.fromkeys(
            f"{x}x{y}" for x, y in sorted({(int(a), int(b))
                                           for a, b in zip(d["p_bx"], d["p_by"])},
                                          key=lambda s: (s[0] * s[1], -s[0]))))
        hue_order = [v for v in VARIANTS if v in set(d["variant"])]
        # each size on its own y axis: a 512 x 512 image runs at a tenth of the GB/s of a
        # large one, and a shared axis would flatten its bars
        fig, axes = plt.subplots(1, len(sizes), figsize=(3.6 * len(sizes) + 0.6, 4.8),
                                 squeeze=False)
        peak = peak_gbps(d)
        for ax, size in zip(axes[0], sizes):
            sub = d[d["size"] == size]
            sns.barplot(data=sub, x="shape", y="gbps", hue="variant",
                        order=shapes, hue_order=hue_order, ax=ax)
            ax.set(title=f"{size} pixels", xlabel="block shape (bx x by)",
                   ylabel="GB/s (image in + edges out)" if ax is axes[0][0] else "")
            top = float(sub["gbps"].max())
            if math.isfinite(peak) and top >= 0.25 * peak:  # the ceiling is in reach
                ax.axhline(peak, ls="--", color="0.3", lw=1)
                ax.text(0.02, peak, f"DRAM peak {fmt.bandwidth(peak)}", va="bottom",
                        fontsize=7.5, color="0.3", transform=ax.get_yaxis_transform())
                ax.set_ylim(0, peak * 1.15)
            elif math.isfinite(peak):
                ax.set_ylim(0, top * 1.3)
                ax.text(0.02, 0.98, f"DRAM peak {fmt.bandwidth(peak)}:\noff this scale",
                        va="top", fontsize=7.5, color="0.3", transform=ax.transAxes)
            ax.get_legend().remove()
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, title="kernel", fontsize=8, title_fontsize=8,
                   loc="lower center", ncol=len(labels), frameon=False)
        fig.suptitle("Sobel edge detection: effective bandwidth per kernel and block shape")
        fig.tight_layout(rect=(0, 0.09, 1, 1))
        return fig


def peak_gbps(d: pd.DataFrame) -> float:
    """The device's DRAM peak, from the rows' GB/s and their % of it."""
    r = (d["gbps"] / d["pct_peak_gbps"] * 100).dropna() if "pct_peak_gbps" in d else []
    return float(r.median()) if len(r) else math.nan


def _hw(size: Any) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


# -- the pieces the tests check ----------------------------------------------------------
def make_image(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A deterministic (given the rng) 8-bit image with edges of every orientation and
    strength: two smooth gradients, rectangles, disks, and noise."""
    ii = np.arange(h, dtype=np.float32)[:, None]
    jj = np.arange(w, dtype=np.float32)[None, :]
    img = (40.0 + 90.0 * (jj / max(w - 1, 1))) + 50.0 * (ii / max(h - 1, 1))  # (h, w) f32
    n_shapes = 6 + int(np.sqrt(h * w) // 256)
    for _ in range(n_shapes):  # rectangles
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        y1 = min(h, y0 + int(rng.integers(1, max(2, h // 3))))
        x1 = min(w, x0 + int(rng.integers(1, max(2, w // 3))))
        img[y0:y1, x0:x1] = float(rng.uniform(0, 255))
    for _ in range(n_shapes):  # disks (only their bounding box is touched)
        cy, cx = float(rng.uniform(0, h)), float(rng.uniform(0, w))
        r = float(rng.uniform(2, max(3.0, min(h, w) / 6)))
        y0, y1 = max(0, int(cy - r)), min(h, int(cy + r) + 1)
        x0, x1 = max(0, int(cx - r)), min(w, int(cx + r) + 1)
        if y0 >= y1 or x0 >= x1:
            continue
        yy = np.arange(y0, y1, dtype=np.float32)[:, None] - cy
        xx = np.arange(x0, x1, dtype=np.float32)[None, :] - cx
        inside = yy * yy + xx * xx <= r * r
        img[y0:y1, x0:x1][inside] = float(rng.uniform(0, 255))
    noise = rng.standard_normal((h, w), dtype=np.float32)
    noise *= 6.0
    img += noise
    np.rint(img, out=img)
    np.clip(img, 0, 255, out=img)
    return img.astype(np.uint8)


def reference(img: np.ndarray, threshold: int, rows_per_chunk: int = 1024) -> np.ndarray:
    """Vectorised integer Sobel on the CPU, in row chunks (bounded memory at 8192^2)."""
    u = np.asarray(img)
    h, w = u.shape
    e = np.zeros((h, w), np.uint8)
    if h < 3 or w < 3:
        return e
    for r0 in range(1, h - 1, rows_per_chunk):
        r1 = min(h - 1, r0 + rows_per_chunk)  # output rows r0 .. r1-1
        a = u[r0 - 1:r1 + 1].astype(np.int32)  # input rows r0-1 .. r1
        up, mid, dn = a[:-2], a[1:-1], a[2:]
        gx = (up[:, 2:] - up[:, :-2]) + 2 * (mid[:, 2:] - mid[:, :-2]) + (dn[:, 2:] - dn[:, :-2])
        gy = (up[:, :-2] + 2 * up[:, 1:-1] + up[:, 2:]) - (dn[:, :-2] + 2 * dn[:, 1:-1]
                                                          + dn[:, 2:])
        e[r0:r1, 1:-1] = np.where(gx * gx + gy * gy > threshold, 255, 0).astype(np.uint8)
    return e


def compare(out: np.ndarray, ref: np.ndarray) -> Check:
    """Pixel-exact comparison: error = number of differing pixels, tolerance 0."""
    diff = out != ref
    n = int(np.count_nonzero(diff))
    detail = ""
    if n:
        i, j = (int(k) for k in np.argwhere(diff)[0])
        unwritten = int(np.count_nonzero(out == SENTINEL))
        detail = (f"first difference at row {i}, column {j}: {int(out[i, j])} vs "
                  f"{int(ref[i, j])}" + (f"; {unwritten} pixels unwritten" if unwritten
                                          else ""))
    return Check(n, 0, "differing_pixels", detail)
