"""A new lesson, added as docs/experiments.md's walk-through "Add a lesson" says: the
bandwidth of the driver's memset (cuMemsetD32) against the buffer size. It names no kernel
file of its own (the driver writes the memory), so the lesson is this folder plus its line
in config.yaml. tests/test_add_a_lesson.py copies it into a temporary copy of the project
and runs the catalogue tests there, before any GPU run of it exists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments.base import (
    Check,
    Experiment,
    Point,
    Result,
    RunContext,
    block_schema,
)

from .lesson import LESSON

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class MemsetBandwidth(Experiment):
    name = "memset_bw"
    order = 150
    lesson = LESSON
    schema = block_schema({
        "sizes_mib": {"type": "array", "default": [1, 64, 512], "minItems": 1,
                      "items": {"type": "integer", "minimum": 1, "maximum": 4096},
                      "description": "buffer sizes to set, MiB"},
    })
    smoke = {"sizes_mib": [1]}

    def points(self, block: dict[str, Any]) -> list[Point]:
        return [Point(self.name, "memset_d32", {"mib": m}) for m in block["sizes_mib"]]

    def gpu_bytes(self, point: Point) -> int:
        return point.params["mib"] << 20

    def measure(self, ctx: RunContext, point: Point) -> Result:
        nbytes = point.params["mib"] << 20
        words = nbytes // 4
        cuda = ctx.gpu.cuda
        buf = ctx.cache.one_per_slot("buf", nbytes, lambda: cuda.mem_alloc(nbytes))
        host = np.empty(words, np.uint32)

        def check(out: np.ndarray) -> Check:
            wrong = int(np.count_nonzero(out != 0x3F800000))
            return Check(float(wrong), 0.0, "wrong_words")

        chk, timing = self.verify_then_time(
            ctx, lambda: cuda.memset_d32_async(buf, 0x3F800000, words), check,
            output=(buf, host), fill=0, asynchronous=True)
        return Result(timing, flops=0.0, bytes=float(nbytes), working_set=float(nbytes),
                      check=chk)

    def plot(self, name: str, df: pd.DataFrame) -> Figure | None:
        import matplotlib.pyplot as plt

        d = self.ok(df)
        if d.empty:
            return None
        fig, ax = plt.subplots()
        ax.plot(d["p_mib"], d["gbps"], "o-")
        ax.set(xscale="log", xlabel="buffer (MiB)", ylabel="GB/s", title=self.lesson.title)
        return fig
