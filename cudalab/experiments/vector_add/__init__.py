"""Vector addition c = a + b (float32): the course's first kernel.

One thread per element, grid = ceil(n / threads) blocks, a bounds check for the last block.
A point is a vector length n and a block size (threads per block). Every element moves
12 bytes (load a, load b, store c), so the declared work is 12 n bytes and n flops: the
kernel is memory-bound and its GB/s is compared with the theoretical DRAM bandwidth.
The block-rate probe (block_rate.py, variant `block_rate`) measures, in the same run, the
cost per block that the lesson's claim on small blocks reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments import base, shared
from cudalab.experiments.base import Experiment, Point, Result, block_schema
from cudalab.experiments.shared import peak_line, size_label
from cudalab.experiments.vector_add import block_rate
from cudalab.experiments.vector_add.check import check_sum, reference, sum_error  # noqa: F401
from cudalab.experiments.vector_add.lesson import LESSON
from cudalab.experiments.vector_add.slot import SLOT

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

THREADS = [32, 64, 128, 256, 512, 1024]
MAX_N = 1 << 28  # three float32 vectors of 1 GiB each


class VectorAdd(Experiment):
    name = "vector_add"
    kernel_files = ("vector_add/vector_add.cu", "vector_add/block_rate.cu")
    slot = SLOT
    order = 20
    lesson = LESSON
    roofline = True
    schema = block_schema({
            "sizes": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"type": "integer", "minimum": 1, "maximum": MAX_N},
                "default": [50_000, 1 << 20, 1 << 24, 1 << 26],
                "description": "vector lengths n (floats); 50 000 is the course's example, "
                "2^24 and 2^26 fill the chip (4 GPU memory passes of 192 MiB / 768 MiB)",
            },
            "threads": {
                "type": "array", "items": {"enum": THREADS}, "minItems": 1,
                "uniqueItems": True, "default": THREADS,
                "description": "threads per block",
            },
            "tolerance": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1e-6,
                "description": "largest ||c - c_ref||_2 / ||c_ref||_2 against the float64 sum",
            },
            **block_rate.SCHEMA,
        })
    smoke = {"sizes": [1000, 50_000, 1 << 20], "threads": [32, 256, 1024],
             "probe_blocks": [1024, 65536], "probe_kinds": ["one_load"]}

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        return [Point(self.name, "gpu", {"n": n, "threads": t})
                for n in sorted(block["sizes"]) for t in sorted(block["threads"])
                ] + block_rate.points(self.name, block)

    def gpu_bytes(self, point: Point) -> int:
        if point.variant == block_rate.VARIANT:
            return block_rate.gpu_bytes(point)
        return 3 * 4 * point.params["n"]  # a, b, c in float32

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant == block_rate.VARIANT:
            return ctx.gpu.compile(block_rate.KERNEL_FILE)
        return ctx.gpu.compile("vector_add/vector_add.cu")

    def measure(self, ctx: RunContext, point: Point) -> Result:
        if point.variant == block_rate.VARIANT:
            return block_rate.measure(self, ctx, point)
        n, t = point.params["n"], point.params["threads"]
        bufs = shared.buffer_set(ctx, ("vector_add", n), lambda: self._buffers(ctx, n))
        a_d, b_d, c_d = bufs["a_d"], bufs["b_d"], bufs["c_d"]
        kernel = self.kernel_for(ctx, point)
        func = kernel.function("vector_add")
        func.prepare("PPPi")
        grid = (shared.grid_size(n, t), 1)

        def launch() -> None:
            func.prepared_call(grid, (t, 1, 1), a_d, b_d, c_d, n)

        # the host copy `c` is overwritten whole by the D2H copy: reused across the points of n
        check, timing = self.verify_then_time(
            ctx, launch, lambda c: check_sum(c, bufs["a"], bufs["b"], ctx.block["tolerance"]),
            output=(c_d, bufs["c"]), asynchronous=True)
        metrics = {"blocks": grid[0],
                   **ctx.gpu.launch_costs(func, grid, (t, 1, 1), (a_d, b_d, c_d, np.int32(n)),
                                          launch)}
        return Result(timing, float(n), 12.0 * n, check, metrics, kernel=kernel,
                      launch=base.Launch(grid, (t, 1, 1)))

    def _buffers(self, ctx: RunContext, n: int) -> dict[str, Any]:
        cuda = ctx.gpu.cuda
        a = base.uniform_f32(ctx.rng, n)
        b = base.uniform_f32(ctx.rng, n)
        # the host inputs are kept and the float64 reference a + b is formed block by block
        # in each check (check_sum): no full-size float64 array (512 MiB at 2^26) is made
        bufs: dict[str, Any] = {"a": a, "b": b, "c": np.empty(n, np.float32)}
        for name, host in (("a_d", a), ("b_d", b), ("c_d", None)):
            bufs[name] = cuda.mem_alloc(4 * n)
            if host is not None:
                cuda.memcpy_htod(bufs[name], host)
        return bufs

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        d = self.ok(df)
        d = d[d["variant"] == "gpu"].copy()  # the vector-add points, not the probe
        if d.empty:
            return d
        d["n"] = d["p_n"].astype("int64")
        d["threads"] = d["p_threads"].astype("int64")
        d["size"] = [size_label(n) for n in d["n"]]
        return d.sort_values(["n", "threads"])

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        if name == "block_rate":
            return block_rate.plot(df)
        d = self._frame(df)
        if d.empty:
            return None
        if name == "bandwidth":
            fig, ax = plt.subplots(figsize=(9, 5))
            sns.lineplot(data=d, x="threads", y="gbps", hue="size",
                         hue_order=list(dict.fromkeys(d["size"])), marker="o", ax=ax)
            ax.set_xscale("log", base=2)
            ticks = sorted(d["threads"].unique())
            ax.set_xticks(ticks, [str(t) for t in ticks])
            peak_line(ax, d)
            ax.set(xlabel="threads per block (log scale)",
                   ylabel="effective bandwidth (GB/s, 12 bytes per element)",
                   title="Vector add c = a + b (float32): bandwidth by block size")
            ax.set_ylim(bottom=0)
            ax.legend(title="n (elements)", fontsize=8)
            return fig
        if name == "time":
            d = d.assign(time_us=d["time_median_s"] * 1e6, block=d["threads"].astype(str))
            order = [str(t) for t in sorted(d["threads"].unique())]
            fig, ax = plt.subplots(figsize=(9, 5))
            sns.lineplot(data=d, x="n", y="time_us", hue="block", hue_order=order, marker="o",
                         ax=ax, palette=sns.color_palette("viridis", len(order)))
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set(xlabel="vector length n (elements, log scale)",
                   ylabel="kernel time (µs, log scale)",
                   title="Vector add: time against problem size")
            ax.legend(title="threads per block", fontsize=8)
            return fig
        raise KeyError(name)


