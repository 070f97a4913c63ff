"""Overlapping copies and compute with CUDA streams.

The course's map kernel (sin, cos, sqrt repeated `iterations` times per element) runs over a
large array in pinned host memory. The `serial` variant is the plain program on the default
stream: copy everything to the GPU, run the kernel on everything, copy everything back. The
`streams` variant splits the array into `nstreams` chunks, one per CUDA stream, and queues
H2D copy -> kernel -> D2H copy of each chunk on its own stream, so the copy of one chunk can
overlap the kernel of another (and H2D with D2H: the copy engines of each direction are
separate). The `duplex` variant times the whole array's H2D alone, D2H alone and both at
once on two streams (duplex.py): whether the two directions really run together.

Timing: one pipeline is bracketed by CUDA events recorded on the legacy default stream (the
harness's event timer). pycuda's Stream() is a blocking stream (flags 0), so work queued on
it after the start event waits for that event, and the end event waits for all work queued
on every stream before it: the events bracket the whole pipeline.

Reference points, measured separately on the whole array (pinned, default stream): H2D,
kernel, D2H. ideal = max of the three (perfect overlap), no_overlap = their sum, and the
pipeline model for k equal chunks = sum / k + (k - 1) / k * max.

One extra run per point records an event before and after every operation on its stream; the
per-operation start/end times (ms after a start event) are the timeline, kept in the raw
record (extra.timeline) and, for the serial point and the point with `timeline_streams`
streams, as a JSON string in the metric `timeline` (results.csv keeps it; the Gantt figure
reads it from there).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments import base, shared
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.shared import size_label
from cudalab.experiments.streams import duplex
from cudalab.experiments.streams.lesson import LESSON, OPS, busy_spans

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

STREAM_COUNTS = [1, 2, 4, 8, 16, 32]
CHUNK_ALIGN = 256  # chunk starts on 1 KiB boundaries: coalesced kernel accesses, DMA-friendly


def chunk_bounds(n: int, k: int, align: int = CHUNK_ALIGN) -> list[tuple[int, int]]:
    """Split [0, n) into at most k non-empty chunks [lo, hi) whose starts are multiples of
    `align` (so with small n there may be fewer than k)."""
    chunk = -(-n // k)
    chunk = -(-chunk // align) * align
    return [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]


def map_reference(x: np.ndarray, iterations: int) -> np.ndarray:
    """float64 value of the map kernel for float32 inputs x. t_k = x + k/64 is rounded to
    float32 exactly as the kernel rounds it; sin, cos, sqrt and the sum are float64."""
    x = np.asarray(x, dtype=np.float32)
    acc = np.zeros(x.shape, np.float64)
    for k in range(iterations):
        t = (x + np.float32(k * 0.015625)).astype(np.float64)
        acc += np.sin(t) * np.cos(t) + np.sqrt(t)
    return acc


def pipeline_model(h2d: float, kernel: float, d2h: float, k: int) -> float:
    """Time of a 3-stage pipeline over k equal chunks: the first chunk passes every stage,
    then one chunk leaves per slowest-stage time."""
    stages = (h2d, kernel, d2h)
    return sum(stages) / k + (k - 1) / k * max(stages)


def timeline_rows(marks: list[list[float]]) -> list[list[Any]]:
    """[[stream, op, start_ms, end_ms], ...] from per-chunk event times
    [before H2D, after H2D, after kernel, after D2H] (ms after the start event)."""
    rows = []
    for s, m in enumerate(marks):
        for i, op in enumerate(OPS):
            rows.append([s, op, round(float(m[i]), 4), round(float(m[i + 1]), 4)])
    return rows


class Streams(Experiment):
    name = "streams"
    kernel_files = ("streams/streams.cu",)
    order = 50
    lesson = LESSON
    noise = {v: ("every sample is a pipeline of pinned copies over PCIe, which crosses the "
                 "host's root complex that other devices and guests share: bursts of slower "
                 "copies (tens of ms) are seen on a shared VM")
             for v in ("serial", "streams", duplex.VARIANT)}
    # its bytes cross PCIe: the times are compared with the serial program and the ideal
    vs_device_peak = False
    schema = block_schema({
            "n": {
                "type": "integer", "minimum": 1024, "maximum": 1 << 28, "default": 1 << 26,
                "description": "array length in floats (2^26 = 256 MiB each way)",
            },
            "iterations": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"type": "integer", "minimum": 1, "maximum": 4096},
                "default": [5, 50],
                "description": "repetitions of the math per element: few = copies dominate, "
                "many = the kernel dominates",
            },
            "streams": {
                "type": "array", "items": {"enum": STREAM_COUNTS}, "minItems": 1,
                "uniqueItems": True, "default": [1, 2, 4, 8, 16],
                "description": "numbers of streams (= chunks) of the pipelined variant",
            },
            "timeline_streams": {
                "enum": STREAM_COUNTS, "default": 4,
                "description": "the stream count whose per-operation timeline is drawn "
                "(must be one of `streams`)",
            },
            "variants": {
                "type": "array", "items": {"enum": ["serial", "streams", duplex.VARIANT]},
                "minItems": 1, "uniqueItems": True,
                "default": ["serial", "streams", duplex.VARIANT],
                "description": "serial: the plain program; streams: the chunked pipeline; "
                "duplex: the whole array's H2D alone, D2H alone and both at once (two "
                "streams), which tells whether the two directions run together",
            },
            "threads": {
                "enum": [64, 128, 256, 512, 1024], "default": 256,
                "description": "threads per block of the map kernel",
            },
            "check_elements": {
                "type": "integer", "minimum": 1, "maximum": 1 << 30, "default": 1 << 18,
                "description": "random elements compared with the float64 reference (plus "
                "the first and last element of every chunk); every element is checked for "
                "NaN (unwritten)",
            },
            "tolerance": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1e-5,
                "description": "largest relative L2 error of the checked elements",
            },
        })
    # n not a multiple of the chunk alignment: the last chunk is shorter
    smoke = {"n": (1 << 20) + 3, "iterations": [4], "streams": [1, 2, 4], "timeline_streams": 2}

    def check_config(self, block: dict[str, Any]) -> list[str]:
        msgs = []
        if "streams" in block["variants"] and block["timeline_streams"] not in block["streams"]:
            msgs.append(f"timeline_streams: {block['timeline_streams']} is not one of streams; "
                        f"allowed values: {sorted(block['streams'])}")
        return msgs

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        pts = []
        n = block["n"]
        for it in sorted(block["iterations"]):
            if "serial" in block["variants"]:
                pts.append(Point(self.name, "serial", {"n": n, "iterations": it, "nstreams": 1}))
            if "streams" in block["variants"]:
                pts += [Point(self.name, "streams", {"n": n, "iterations": it, "nstreams": k})
                        for k in sorted(block["streams"])]
        if duplex.VARIANT in block["variants"]:
            pts += duplex.points(self.name, n)
        return pts

    def gpu_bytes(self, point: Point) -> int:
        return 2 * 4 * point.params["n"]  # d_in and d_out, float32

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant == duplex.VARIANT:
            return None  # copies only
        return ctx.gpu.compile("streams/streams.cu")

    def _buffers(self, ctx: RunContext, n: int) -> dict[str, Any]:
        cuda = ctx.gpu.cuda
        h_in = cuda.pagelocked_empty(n, np.float32)
        h_out = cuda.pagelocked_empty(n, np.float32)
        h_in[:] = ctx.rng.random(n, dtype=np.float32)
        return {"h_in": h_in, "h_out": h_out, "d_in": cuda.mem_alloc(4 * n),
                "d_out": cuda.mem_alloc(4 * n), "refs": {}, "phases": {}}

    def _reference(self, ctx: RunContext, bufs: dict[str, Any], n: int, it: int):
        """(checked indices, float64 reference there), once per iteration count."""
        if it not in bufs["refs"]:
            m = min(ctx.block["check_elements"], n)
            idx = [ctx.rng.integers(0, n, m)]
            for k in ctx.block["streams"]:
                for lo, hi in chunk_bounds(n, k):
                    idx.append(np.array([lo, hi - 1]))
            idx = np.unique(np.concatenate(idx))
            bufs["refs"][it] = (idx, map_reference(bufs["h_in"][idx], it))
        return bufs["refs"][it]

    def _streams(self, ctx: RunContext, k: int) -> list[Any]:
        have = ctx.cache.setdefault("stream_objects", [])
        while len(have) < k:
            have.append(ctx.gpu.cuda.Stream())  # flags 0: blocking w.r.t. the default stream
        return have[:k]

    def _plan(self, ctx: RunContext, point: Point) -> list[tuple[Any, int, int]]:
        """(stream, lo, hi) of every chunk: the serial program is one chunk on the default
        stream (None), k streams take n / k elements each."""
        n, k = point.params["n"], point.params["nstreams"]
        if point.variant == "serial":
            return [(None, 0, n)]
        return [(s, lo, hi) for s, (lo, hi) in zip(self._streams(ctx, k), chunk_bounds(n, k))]

    def measure(self, ctx: RunContext, point: Point) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        p = point.params
        if point.variant == duplex.VARIANT:
            bufs = shared.buffer_set(ctx, ("streams", p["n"]),
                                     lambda: self._buffers(ctx, p["n"]))
            return duplex.measure(ctx, point, bufs, self._streams(ctx, 2))
        n, it, k = p["n"], p["iterations"], p["nstreams"]
        threads = ctx.block["threads"]
        bufs = shared.buffer_set(ctx, ("streams", n), lambda: self._buffers(ctx, n))
        h_out = bufs["h_out"]
        kernel = self.kernel_for(ctx, point)
        func = kernel.function("map_kernel")
        func.prepare("PPii")

        plan = self._plan(ctx, point)
        enqueue = _enqueuer(cuda, func, plan, bufs, threads, it)

        traced: dict[str, Any] = {}

        def verify() -> Check:
            """One run with events around every operation, on a poisoned output: the
            timeline and the correctness check."""
            traced.update(self._traced_run(ctx, bufs, plan, enqueue))
            idx, ref = self._reference(ctx, bufs, n, it)
            unwritten = int(np.count_nonzero(~np.isfinite(h_out)))
            err = math.inf if unwritten else base.rel_fro_error(h_out[idx], ref)
            return Check(err, ctx.block["tolerance"], "rel_l2_sampled",
                         detail=(f"{unwritten} unwritten (NaN) elements" if unwritten else
                                 f"{len(idx)} elements compared with float64"))

        # enqueue() copies through several streams and the default stream waits on them all
        check, timing = self.verify_then_time(ctx, enqueue, verify, batchable=False)
        timeline, timeline_total_ms = traced["timeline"], traced["total_ms"]

        phases, ph = self._phases(ctx, bufs, func, n, it, threads)
        t = timing.stats()["median"]
        metrics: dict[str, Any] = {
            "h2d_s": ph["h2d"], "kernel_s": ph["kernel"], "d2h_s": ph["d2h"],
            "ideal_s": max(ph.values()), "no_overlap_s": sum(ph.values()),
            "model_s": pipeline_model(ph["h2d"], ph["kernel"], ph["d2h"], len(plan)),
            "overlap_efficiency": max(ph.values()) / t if t > 0 else math.nan,
            "chunks": len(plan), "timeline_total_ms": timeline_total_ms,
        }
        try:
            metrics["copy_engines"] = gpu.attr("ASYNC_ENGINE_COUNT")
        except Exception:  # noqa: BLE001 - attribute missing
            pass
        if point.variant == "serial" or k == ctx.block["timeline_streams"]:
            metrics["timeline"] = json.dumps(timeline, separators=(",", ":"))
        return Result(timing, math.nan, 8.0 * n, check, metrics, phases, kernel,
                      extra={"timeline": timeline, "timeline_columns":
                             ["stream", "op", "start_ms", "end_ms"]})

    @staticmethod
    def _traced_run(ctx: RunContext, bufs: dict[str, Any], plan: list[tuple[Any, int, int]],
                    enqueue: Callable[[list[list[Any]] | None], None]) -> dict[str, Any]:
        """enqueue() once with events around every operation, into a poisoned output."""
        gpu = ctx.gpu
        cuda = gpu.cuda
        bufs["h_out"].fill(np.nan)
        cuda.memset_d32(bufs["d_out"], base.NAN_BITS, bufs["h_out"].size)
        gpu.synchronize()
        marks = [[cuda.Event() for _ in range(4)] for _ in plan]
        start, end = cuda.Event(), cuda.Event()
        start.record()  # default stream
        for stream, _, _ in plan:
            if stream is not None:
                stream.wait_for_event(start)  # explicit: right for non-blocking streams too
        enqueue(marks)
        end.record()  # default stream: waits for every blocking stream
        end.synchronize()
        gpu.synchronize()
        return {"timeline": timeline_rows([[e.time_since(start) for e in m] for m in marks]),
                "total_ms": end.time_since(start)}

    def _phases(self, ctx, bufs, func, n, it, threads):
        """Whole-array H2D and D2H (once per job) and kernel (once per iteration count),
        each alone on the default stream. Returns (Timings measured now, medians)."""
        gpu, h = ctx.gpu, ctx.harness
        cuda = gpu.cuda
        ev = gpu.event_timer()
        store = bufs["phases"]
        new = {}
        if "h2d" not in store:
            new["h2d"] = h.measure(lambda: cuda.memcpy_htod_async(bufs["d_in"], bufs["h_in"]),
                                   ev, batchable=False)
            new["d2h"] = h.measure(lambda: cuda.memcpy_dtoh_async(bufs["h_out"], bufs["d_out"]),
                                   ev, batchable=False)
        if ("kernel", it) not in store:
            grid = ((n + threads - 1) // threads, 1)
            new["kernel"] = h.measure(
                lambda: func.prepared_call(grid, (threads, 1, 1), bufs["d_in"], bufs["d_out"],
                                           n, it), ev, batchable=False)
        for name, timing in new.items():
            store[name if name != "kernel" else ("kernel", it)] = timing.stats()["median"]
        med = {"h2d": store["h2d"], "kernel": store[("kernel", it)], "d2h": store["d2h"]}
        return new, med

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        d = self.ok(df)
        d = d[d["variant"].isin(["serial", "streams"])].copy()  # the pipelines
        if d.empty:
            return d
        for c in ("n", "iterations", "nstreams"):
            d[c] = d[f"p_{c}"].astype("int64")
        d["time_ms"] = d["time_median_s"] * 1e3
        return d.sort_values(["iterations", "variant", "nstreams"])

    def plot(self, name: str, df: pd.DataFrame):
        d = self._frame(df)
        if d.empty:
            return None
        if name == "pipeline":
            return self._plot_pipeline(d)
        if name == "timeline":
            return self._plot_timeline(d)
        raise KeyError(name)

    def _plot_pipeline(self, d: pd.DataFrame):
        import matplotlib.pyplot as plt

        its = sorted(d["iterations"].unique())
        fig, axes = plt.subplots(1, len(its), figsize=(5.5 * len(its), 4.6), squeeze=False)
        for ax, it in zip(axes[0], its):
            sub = d[d["iterations"] == it]
            st = sub[sub["variant"] == "streams"]
            ser = sub[sub["variant"] == "serial"]
            ks = sorted(st["nstreams"].unique()) or [1]
            if len(st):
                ax.plot(st["nstreams"], st["time_ms"], "o-", color="C0", label="streams")
                ax.plot(st["nstreams"], pd.to_numeric(st["m_model_s"]) * 1e3, "--",
                        color="C2", label="pipeline model")
            if len(ser):
                ax.axhline(ser["time_ms"].iloc[0], color="C3", lw=1.5,
                           label=f"serial ({ser['time_ms'].iloc[0]:.1f} ms)")
            ideal = pd.to_numeric(sub["m_ideal_s"], errors="coerce").median() * 1e3
            if math.isfinite(ideal):
                ax.axhline(ideal, color="0.3", ls=":", lw=1.5,
                           label=f"ideal = slowest stage ({ideal:.1f} ms)")
            ph = {op: pd.to_numeric(sub[f"m_{op}_s"], errors="coerce").median() * 1e3
                  for op in ("h2d", "kernel", "d2h")}
            ax.set_xscale("log", base=2)
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.set_ylim(bottom=0)
            ax.set(xlabel="streams (= chunks), log scale", ylabel="pipeline time (ms)",
                   title=f"{it} iterations: H2D {ph['h2d']:.1f}, kernel {ph['kernel']:.1f}, "
                   f"D2H {ph['d2h']:.1f} ms")
            ax.title.set_fontsize(9)
            ax.legend(fontsize=8)
        fig.suptitle(f"H2D -> map kernel -> D2H of {size_label(d['n'].iloc[0])} floats "
                     "(pinned): streams against serial", fontsize=11)
        fig.tight_layout()
        return fig

    def _plot_timeline(self, d: pd.DataFrame):
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch

        if "m_timeline" not in d:
            return None
        rows = d.dropna(subset=["m_timeline"])
        if rows.empty:
            return None
        its = sorted(rows["iterations"].unique())
        panels = [("serial", "default stream")]
        k_tl = rows[rows["variant"] == "streams"]["nstreams"]
        if len(k_tl):
            panels.append(("streams", f"{int(k_tl.iloc[0])} streams"))
        colors = dict(zip(OPS, ("C0", "C1", "C2")))
        fig, axes = plt.subplots(len(its), len(panels), figsize=(5.5 * len(panels),
                                 1.2 + 2.4 * len(its)), squeeze=False, sharex="row")
        for r, it in enumerate(its):
            for c, (variant, label) in enumerate(panels):
                ax = axes[r][c]
                sel = rows[(rows["iterations"] == it) & (rows["variant"] == variant)]
                if sel.empty:
                    ax.axis("off")
                    continue
                tl = json.loads(sel["m_timeline"].iloc[0])
                nrow = max(x[0] for x in tl) + 1
                for s, op, ready, run, t1 in busy_spans(tl):
                    if run > ready:  # queued: the stream was ready, the engine busy
                        ax.broken_barh([(ready, run - ready)], (s - 0.4, 0.8),
                                       facecolors=colors[op], alpha=0.2, linewidth=0)
                    ax.broken_barh([(run, max(t1 - run, 1e-3))], (s - 0.4, 0.8),
                                   facecolors=colors[op], edgecolor="white", linewidth=0.5)
                end = max(x[3] for x in tl)
                ax.set_yticks(range(nrow), [("stream " + str(s)) if variant == "streams"
                                            else "default" for s in range(nrow)])
                ax.set_ylim(nrow - 0.5, -0.5)
                ax.set(xlabel="time since start (ms)",
                       title=f"{label}, {it} iterations: {end:.1f} ms")
                ax.title.set_fontsize(9)
                ax.tick_params(axis="y", labelsize=7)
        handles = [Patch(color=colors[o], label=o) for o in OPS]
        handles.append(Patch(color="0.5", alpha=0.2, label="queued (engine busy)"))
        fig.legend(handles=handles, loc="upper right", ncol=4, fontsize=8)
        fig.suptitle("Timeline of one run (CUDA events around every operation)", fontsize=11,
                     x=0.4)
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        return fig


def _enqueuer(cuda: Any, func: Any, plan: list[tuple[Any, int, int]], bufs: dict[str, Any],
              threads: int, it: int) -> Callable[..., None]:
    """enqueue(marks=None): H2D -> kernel -> D2H of every chunk in its stream; `marks` (four
    events per chunk) bracket each operation for the timeline."""
    h_in, h_out = bufs["h_in"], bufs["h_out"]
    base_in, base_out = int(bufs["d_in"]), int(bufs["d_out"])

    def enqueue(marks: list[list[Any]] | None = None) -> None:
        for c, (stream, lo, hi) in enumerate(plan):
            din, dout = base_in + 4 * lo, base_out + 4 * lo
            grid = (shared.grid_size(hi - lo, threads), 1)
            if marks:
                marks[c][0].record(stream)
            cuda.memcpy_htod_async(din, h_in[lo:hi], stream)
            if marks:
                marks[c][1].record(stream)
            func.prepared_async_call(grid, (threads, 1, 1), stream, din, dout, hi - lo, it)
            if marks:
                marks[c][2].record(stream)
            cuda.memcpy_dtoh_async(h_out[lo:hi], dout, stream)
            if marks:
                marks[c][3].record(stream)

    return enqueue
