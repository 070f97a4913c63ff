"""Atomics: a counter incremented by every thread (racy vs atomicAdd), and a float sum
(atomicAdd of every element vs a shared-memory tree with one atomicAdd per block).

Counter points (racy_counter, atomic_counter): params grid, block; expected count =
grid * block. The racy count is the lesson, not a failure: its check only asks that the
count is a possible outcome of the race, 1 <= counted <= expected. The atomic count must
be exact.

Sum points (atomic_sum, reduce_sum): params n, block; n float32 values uniform in [0, 1),
checked against the float64 sum. Tolerance on |S - S_ref| / sum|x_i|: factor * sqrt(n) * u
(u = 2^-24, default factor 3). Why sqrt(n): adding n positive numbers one after another in
float32 (what per-element atomics do, in whatever order the hardware serialises them)
rounds n times; rounding k errs by at most half an ulp of the partial sum S_k, i.e. by at
most u * S_k, and these errors behave as independent zero-mean variables (the
probabilistic rounding-error model of Higham & Mary, 2019). With sum_k S_k^2 ~ n S^2 / 3:
- Hoeffding's inequality (bounded errors, nothing else assumed) puts the chance of
  exceeding 3 sqrt(n) u S at 2 exp(-13.5) ~ 3e-6;
- errors uniform within half an ulp (what uniform inputs give) have a standard deviation
  below sqrt(n) u S / 3, so the tolerance is 9 of them.
The deterministic worst case, n u, is 1 at n = 2^24: useless. The tolerance is 1.8e-4 at
n = 2^20 and 7.3e-4 at n = 2^24; a flat 1e-4 would fail the atomic sum at 2^24 now and then
(a sequential float32 sum of 2^24 uniform values errs by up to ~1e-4 in simulation).
The tree reduction's error is far smaller (log2(block) levels, then n / (2 block) block sums).
"""

from __future__ import annotations

import html
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments import base
from cudalab.experiments.atomics.lesson import LESSON, racy_runs
from cudalab.experiments.atomics.slot import (  # noqa: F401 - the sums, re-exported
    SLOT,
    U,
    sum_error,
    sum_inputs,
    sum_tolerance,
)
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

COUNTERS = ["racy_counter", "atomic_counter"]
SUMS = ["atomic_sum", "reduce_sum"]
VARIANTS = COUNTERS + SUMS
# variant -> kernel in cuda/atomics/atomics.cu
KERNELS = {"racy_counter": "counter_racy", "atomic_counter": "counter_atomic",
           "atomic_sum": "sum_atomic", "reduce_sum": "sum_reduce"}
RACY_REPEATS = 5  # extra runs of the racy counter: its count changes from run to run
# ... and so does its time: how the race unfolds sets how many read-modify-writes collide
# (per-launch CV about 9 % on an H100, where every other kernel is below 1 %). A sample
# averages at least this much of queued launches (64 at 1024 x 1024 threads), so the CV
# of its samples can reach target_cv (2.7 % with 5 ms samples, seen on the H100).
RACY_MIN_SAMPLE_S = 0.02

# the blocks' limit, 2^31 - 1, bounds both; check_config holds threads to 1024
_launch = base.int_tuple_schema(2, 1, 2**31 - 1, description="[blocks, threads per block]")


class Atomics(Experiment):
    name = "atomics"
    kernel_files = ("atomics/atomics.cu",)
    slot = SLOT
    order = 90
    lesson = LESSON
    noise = {"racy_counter": ("how the race unfolds sets how many read-modify-writes collide, "
                              "so each launch takes a different time; a sample averages at least "
                              f"{fmt.seconds(RACY_MIN_SAMPLE_S)} of launches")}
    schema = block_schema({
            "variants": base.choices_schema(VARIANTS),
            "counter_launches": {
                "type": "array", "items": _launch, "minItems": 1,
                "default": [[1024, 1024]],
                "description": "[blocks, threads per block] of the counter kernels "
                "(expected count = blocks x threads, at most 2^31)",
            },
            "sum_sizes": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": 1 << 28},
                "minItems": 1, "uniqueItems": True,
                "default": [1 << 16, 1 << 20, 1 << 24],
                "description": "numbers of float32 values summed",
            },
            "sum_block": {
                "enum": [64, 128, 256, 512, 1024], "default": 256,
                "description": "threads per block of both sum kernels (a power of two: "
                "the tree halves it at every level)",
            },
            "sum_tolerance_factor": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1000, "default": 3.0,
                "description": "a sum passes if |S - S_ref| / sum|x| <= factor * sqrt(n) * "
                "2^-24 (3: exceeded by a sequential float32 sum with probability below "
                "3e-6, see the module docstring)",
            },
        })
    smoke = {"counter_launches": [[64, 256], [1024, 1024]], "sum_sizes": [1000, 1 << 16]}

    def check_config(self, block: dict[str, Any]) -> list[str]:
        msgs = []
        for i, (g, b) in enumerate(block["counter_launches"]):
            if b > 1024:
                msgs.append(f"counter_launches[{i}]: {b} threads per block; at most 1024")
            if g > 2**31 - 1:
                msgs.append(f"counter_launches[{i}]: {g} blocks; at most 2^31 - 1")
            if g * b > 2**31:
                msgs.append(f"counter_launches[{i}]: {g} x {b} = {g * b} increments; at most "
                            "2^31 (the counter is a 32-bit unsigned int)")
        return msgs

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        pts = []
        for g, b in block["counter_launches"]:
            for v in COUNTERS:
                if v in block["variants"]:
                    pts.append(Point(self.name, v, {"grid": g, "block": b}))
        for n in sorted(block["sum_sizes"]):
            for v in SUMS:
                if v in block["variants"]:
                    pts.append(Point(self.name, v, {"n": n, "block": block["sum_block"]}))
        return pts

    def gpu_bytes(self, point: Point) -> int:
        return 4 * point.params.get("n", 0) + 4  # the float32 inputs of a sum, one counter

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant == "reduce_sum":
            return ctx.gpu.compile("atomics/atomics.cu", {"BLOCK": point.params["block"]})
        return ctx.gpu.compile("atomics/atomics.cu")

    def measure(self, ctx: RunContext, point: Point) -> Result:
        if point.variant in COUNTERS:
            return self._counter(ctx, point)
        return self._sum(ctx, point)

    def _counter(self, ctx: RunContext, point: Point) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        g, b = point.params["grid"], point.params["block"]
        expected = g * b
        kernel = self.kernel_for(ctx, point)
        func = kernel.function(KERNELS[point.variant])
        func.prepare("P")
        counter = np.zeros(1, np.uint32)
        c_d = cuda.mem_alloc(4)
        try:
            def launch() -> None:
                func.prepared_call((g, 1), (b, 1, 1), c_d)

            def count_once() -> int:
                cuda.memset_d32(c_d, 0, 1)
                launch()
                gpu.synchronize()
                cuda.memcpy_dtoh(counter, c_d)
                return int(counter[0])

            seen: dict[str, int] = {}

            def check_count(out: np.ndarray) -> Check:
                seen["counted"] = int(out[0])
                return counter_check(point.variant, seen["counted"], expected)

            # the verification launch runs on a zeroed counter; the timed launches keep
            # adding to it (it wraps harmlessly)
            s = ctx.harness.settings
            # (min_sample_s 0, no batching at all, is kept)
            racy = point.variant == "racy_counter" and s.min_sample_s > 0
            check, timing = self.verify_then_time(
                ctx, launch, check_count, output=(c_d, counter), fill=0, asynchronous=True,
                check_each_trial=True,
                settings=replace(s, min_sample_s=max(s.min_sample_s, RACY_MIN_SAMPLE_S))
                if racy else None)
            repeats = [count_once() for _ in range(RACY_REPEATS)] \
                if point.variant == "racy_counter" else []
        finally:
            ctx.cache.retire(c_d)  # freed after the point's trials: each lands anew
        counted = seen["counted"]
        metrics = {
            "counted": counted, "expected": expected,
            "lost_fraction": (expected - counted) / expected,
            "updates_per_s": expected / timing.stats()["median"],
        }
        extra = {"racy_repeats": repeats} if repeats else {}
        return Result(timing, float("nan"), float("nan"), check, metrics, kernel=kernel,
                      extra=extra)

    def _sum(self, ctx: RunContext, point: Point) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        n, b = point.params["n"], point.params["block"]
        def make():
            x = sum_inputs(ctx.rng, n)
            return (x, float(np.sum(x, dtype=np.float64)),
                    float(np.sum(np.abs(x), dtype=np.float64)))

        # one size in memory: sum points are ordered by size
        x, ref, abs_sum = ctx.cache.one_per_slot("atomics_sum", ("atomics_sum", n), make)
        kernel = self.kernel_for(ctx, point)
        func = kernel.function(KERNELS[point.variant])
        func.prepare("PPi")
        per_block = b if point.variant == "atomic_sum" else 2 * b
        grid = ((n + per_block - 1) // per_block, 1)
        out = np.zeros(1, np.float32)
        tol = sum_tolerance(n, ctx.block["sum_tolerance_factor"])

        def check_sum(o: np.ndarray) -> Check:
            got = float(o[0])
            return Check(sum_error(got, ref, abs_sum), tol, "rel_sum_err",
                         f"sum {got!r} vs float64 {ref!r}; {grid[0]} blocks")

        x_d, o_d = cuda.mem_alloc(x.nbytes), cuda.mem_alloc(4)
        try:
            cuda.memcpy_htod(x_d, x)

            def launch() -> None:
                func.prepared_call(grid, (b, 1, 1), x_d, o_d, n)

            # the verification launch adds into a zeroed output; the timed launches keep
            # accumulating into it, which does not change the work
            check, timing = self.verify_then_time(
                ctx, launch, check_sum, output=(o_d, out), fill=0,
                asynchronous=True)
        finally:
            ctx.cache.retire(x_d, o_d)  # freed after the point's trials: each lands anew
        got, err = float(out[0]), check.error
        metrics = {"sum": got, "ref_sum": ref, "rel_err": err, "abs_err": abs(got - ref),
                   "atomics_per_launch": n if point.variant == "atomic_sum" else grid[0]}
        return Result(timing, float(n), 4.0 * n, check, metrics, kernel=kernel)

    # -- figures -----------------------------------------------------------------------
    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        d = self.ok(df)
        if name == "counter":
            c = d[d["variant"].isin(COUNTERS)].copy()
            if c.empty:
                return None
            c["launch"] = [f"{int(g)} x {int(b)}" for g, b in zip(c["p_grid"], c["p_block"])]
            c = c.sort_values(["m_expected", "variant"], ascending=[True, False])
            rows = []
            for _, r in c.iterrows():
                label = f"{r['variant'].replace('_counter', '')}\n{r['launch']}"
                rows.append({"run": label, "what": "counted", "count": r["m_counted"],
                             "lost": r["m_lost_fraction"], "variant": r["variant"]})
                rows.append({"run": label, "what": "expected", "count": r["m_expected"],
                             "lost": np.nan, "variant": r["variant"]})
            bars = pd.DataFrame(rows)
            fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(c)), 4.8))
            sns.barplot(data=bars, x="run", y="count", hue="what",
                        hue_order=["counted", "expected"], ax=ax)
            ax.set_yscale("log")
            ax.set_ylim(0.8, bars["count"].max() * 4)  # from 1: a racy count can be tiny
            labels = list(dict.fromkeys(bars["run"]))
            for i, lab in enumerate(labels):
                r = bars[(bars["run"] == lab) & (bars["what"] == "counted")].iloc[0]
                if r["variant"] == "racy_counter":  # the count itself: a share near 100 %
                    bar = ax.containers[0][i]  # the "counted" bar of this launch
                    ax.text(bar.get_x() + bar.get_width() / 2, r["count"] * 1.3,
                            f"{fmt.integer(r['count'])} counted", ha="center", va="bottom",
                            fontsize=8)
            ax.set(xlabel="counter (blocks x threads per block)",
                   ylabel="final count (increments, log scale)",
                   title="One counter, every thread adds 1: racy vs atomicAdd")
            ax.legend(title="", fontsize=8)
            fig.tight_layout()
            return fig
        if name == "sum":
            s = d[d["variant"].isin(SUMS)].copy()
            if s.empty:
                return None
            s["time_ms"] = s["time_median_s"] * 1e3
            s = s.sort_values("p_n")
            fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.8))
            sns.lineplot(data=s, x="p_n", y="time_ms", hue="variant", hue_order=SUMS,
                         marker="o", ax=ax_t)
            ax_t.set(xscale="log", yscale="log", xlabel="n (float32 values, log scale)",
                     ylabel="kernel time (ms, log scale)",
                     title="Time to sum n floats")
            s["err_plot"] = s["error"].clip(lower=1e-12)  # an exact sum has error 0
            sns.lineplot(data=s, x="p_n", y="err_plot", hue="variant", hue_order=SUMS,
                         marker="o", ax=ax_e)
            tol = s.drop_duplicates("p_n")
            ax_e.plot(tol["p_n"], tol["tolerance"], ls="--", color="grey", label="tolerance")
            ax_e.set(xscale="log", yscale="log", xlabel="n (float32 values, log scale)",
                     ylabel="|S - S_float64| / sum|x| (log scale; 1e-12 = exact)",
                     title="Error of the float32 sum")
            for ax in (ax_t, ax_e):
                ax.legend(fontsize=8)
            fig.tight_layout()
            return fig
        raise KeyError(name)

    def tables(self, df: pd.DataFrame) -> list[dict[str, str]]:
        runs = racy_runs(df[df["variant"] == "racy_counter"])
        if not runs:
            return []
        n = max(len(c) for c in runs.values())
        head = "<th>launch (blocks x threads)</th>" + "".join(
            f"<th>run {i + 1}</th>" for i in range(n))
        body = "".join(
            f"<tr><td>{html.escape(lab)}</td>"
            + "".join(f"<td>{fmt.integer(c)}</td>" for c in counts) + "</tr>"
            for lab, counts in runs.items())
        return [{"title": "The racy counter, run by run (same launch, same expected count)",
                 "html": f'<table class="kv"><tr>{head}</tr>{body}</table>'}]


# -- the pieces the tests check ----------------------------------------------------------
def counter_check(variant: str, counted: int, expected: int) -> Check:
    """Atomic: exact. Racy: any count the race can produce, 1 <= counted <= expected (each
    store writes a value some thread read, plus one); outside that range the kernel did not
    run or memory is corrupt."""
    if variant == "atomic_counter":
        return Check(abs(counted - expected), 0, "abs_count_err",
                     f"counted {counted} of {expected}")
    dist = max(0, 1 - counted, counted - expected)
    return Check(dist, 0, "racy_count_outside_1_to_expected",
                 f"counted {counted} of {expected} ({expected - counted} updates lost: "
                 "expected for the racy counter)")


