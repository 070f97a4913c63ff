"""Host <-> device copies over PCIe: pageable against pinned (page-locked) host memory.

A point is a memory kind (the variant: pageable = an ordinary numpy array, pinned =
cuda.pagelocked_empty), a direction (h2d, d2h) and a size in bytes. One copy is timed with
CUDA events on the default stream (cuMemcpyHtoD / cuMemcpyDtoH; the same call for both memory
kinds, so only the host memory differs). Correctness: random bytes make a round trip
host -> device -> host into a destination that differs from the source in every byte, and
must come back unchanged.

The PCIe link (generation and width, current and maximum) is read from NVML, matched to the
CUDA device by PCI bus id, and kept in every point's metrics; the theoretical bandwidth of the
link is the reference line of the figure.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments import shared
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.shared import bytes_label
from cudalab.experiments.transfer import lesson
from cudalab.experiments.transfer.lesson import LESSON

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

DIRECTIONS = ["h2d", "d2h"]
MEMORY = ["pageable", "pinned"]
DIRECTION_LABEL = {"h2d": "host to device (H2D)", "d2h": "device to host (D2H)"}
MAX_BYTES = 1 << 34  # 16 GiB

# Usable GB/s per lane and direction after line encoding: 8b/10b up to Gen2, 128b/130b for
# Gen3-5, FLIT mode (242 of 256 bytes carry data) from Gen6. Packet headers cost a further
# ~10-15 %, so a copy reaches at most ~85-90 % of these numbers.
PCIE_LANE_GBPS = {
    1: 2.5 * 0.8 / 8,
    2: 5.0 * 0.8 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
    7: 128.0 * 242 / 256 / 8,
}


def pcie_gbps(gen: Any, width: Any) -> float:
    """Theoretical bandwidth of one direction of a PCIe link in GB/s (NaN if unknown)."""
    try:
        g, w = int(gen), int(width)
    except (TypeError, ValueError):
        return math.nan
    return PCIE_LANE_GBPS[g] * w if g in PCIE_LANE_GBPS and w > 0 else math.nan


def sizes(block: dict[str, Any]) -> list[int]:
    """min_bytes, min_bytes * step, ... up to max_bytes."""
    out, s = [], block["min_bytes"]
    while s <= block["max_bytes"]:
        out.append(s)
        s *= block["step"]
    return out


def link_metrics(facts: dict[str, Any], unavailable: str = "") -> dict[str, Any]:
    """The PCIe link as point metrics, from NvmlClockObserver.device_facts()."""
    keys = ("pcie_gen_current", "pcie_width_current", "pcie_gen_max", "pcie_width_max")
    m: dict[str, Any] = {k: facts.get(k) for k in keys}
    if m["pcie_gen_current"] is None or m["pcie_width_current"] is None:
        why = unavailable or "NVML did not report the PCIe link of this GPU"
        m["pcie_link"] = f"unavailable ({why})"
        m["pcie_theoretical_gbps"] = math.nan
        return m
    theo = pcie_gbps(m["pcie_gen_current"], m["pcie_width_current"])
    m["pcie_theoretical_gbps"] = theo
    link = f"PCIe Gen{m['pcie_gen_current']} x{m['pcie_width_current']}"
    if m["pcie_gen_max"] is not None and m["pcie_width_max"] is not None:
        link += f" (max Gen{m['pcie_gen_max']} x{m['pcie_width_max']})"
    if math.isfinite(theo):
        link += f", {theo:.1f} GB/s per direction in theory"
    m["pcie_link"] = link
    return m


class Transfer(Experiment):
    name = "transfer"
    order = 40
    lesson = LESSON
    vs_device_peak = False  # bytes cross PCIe: compared with the link instead
    noise = {
        "pageable": ("a pageable copy is staged by the CPU through a pinned buffer, so its "
                     "time follows the host's memory system and scheduler (on a shared VM, "
                     "its neighbours): seen on an H100 VM, a 16 MiB copy's CV stays near "
                     "5-10 % however many copies a sample averages"),
        "pinned": ("PCIe traffic crosses the host's root complex, which other devices and "
                   "guests share: bursts of slower copies (tens of ms) are seen on a shared "
                   "VM"),
    }
    schema = block_schema({
            "min_bytes": {
                "type": "integer", "minimum": 1, "maximum": MAX_BYTES, "default": 4096,
                "description": "smallest copy in bytes",
            },
            "max_bytes": {
                "type": "integer", "minimum": 1, "maximum": MAX_BYTES, "default": 1 << 30,
                "description": "largest copy in bytes (host memory: 4 x this, half pinned)",
            },
            "step": {
                "enum": [2, 4], "default": 4,
                "description": "size factor from one copy size to the next",
            },
            "directions": {
                "type": "array", "items": {"enum": DIRECTIONS}, "minItems": 1,
                "uniqueItems": True, "default": DIRECTIONS,
            },
            "memory": {
                "type": "array", "items": {"enum": MEMORY}, "minItems": 1,
                "uniqueItems": True, "default": MEMORY,
                "description": "host memory kinds: pageable (numpy) and pinned "
                "(cuda.pagelocked_empty)",
            },
        })
    smoke = {"min_bytes": 4096, "max_bytes": 1 << 22, "step": 4}

    def check_config(self, block: dict[str, Any]) -> list[str]:
        if block["min_bytes"] > block["max_bytes"]:
            return [f"min_bytes: {block['min_bytes']} is larger than max_bytes "
                    f"{block['max_bytes']}; allowed: min_bytes <= max_bytes"]
        return []

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        return [Point(self.name, mem, {"direction": d, "size": s})
                for s in sizes(block) for mem in MEMORY if mem in block["memory"]
                for d in DIRECTIONS if d in block["directions"]]

    def gpu_bytes(self, point: Point) -> int:
        return point.params["size"]  # one device buffer of the copy's size

    # -- measuring ---------------------------------------------------------------------
    def prepare(self, ctx: RunContext) -> None:
        from cudalab.nvml_clocks import NvmlClockObserver  # never raises: records why not

        ctx.cache["nvml"] = NvmlClockObserver(
            ctx.gpu.index, pci_bus_id=ctx.gpu.info.get("gpu_pci_bus_id", ""))

    def _link(self, ctx: RunContext) -> dict[str, Any]:
        nvml = ctx.cache.get("nvml")
        if nvml is None or nvml.handle is None:
            why = nvml.unavailable if nvml is not None else "NVML not opened"
            return link_metrics({}, why or "NVML unavailable")
        return link_metrics(nvml.device_facts())

    def measure(self, ctx: RunContext, point: Point) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        size, direction, kind = point.params["size"], point.params["direction"], point.variant
        bufs = shared.buffer_set(ctx, ("transfer", size), lambda: self._buffers(ctx, size))
        dev = bufs["dev"]
        src, dst = self._host(ctx, bufs, kind)

        def round_trip() -> Check:
            """A round trip through this memory kind into a destination whose every byte
            differs from the source, on a device buffer that was cleared first."""
            np.bitwise_not(src, out=dst)
            cuda.memset_d8(dev, 0, size)
            cuda.memcpy_htod(dev, src)
            cuda.memcpy_dtoh(dst, dev)
            gpu.synchronize()
            bad = int(np.count_nonzero(dst != src))
            return Check(float(bad), 0.0, "mismatched_bytes",
                         detail=f"{bad} of {size} bytes changed in the round trip" if bad else "")

        # Pinned memory is copied with the async calls on the default stream: they only
        # enqueue the DMA, so the harness queues a batch behind a held stream and the ~10 us
        # of host cost per call stays out of the copy time. A pageable copy cannot be queued
        # (the driver stages it through a bounce buffer on the host, synchronously): it is
        # timed one call after the other, staging included, which is what it costs.
        pinned = kind == "pinned"
        if direction == "h2d":
            def copy() -> None:
                if pinned:
                    cuda.memcpy_htod_async(dev, src)
                else:
                    cuda.memcpy_htod(dev, src)
        else:
            def copy() -> None:
                if pinned:
                    cuda.memcpy_dtoh_async(dst, dev)
                else:
                    cuda.memcpy_dtoh(dst, dev)

        # the round trip (up to 2 x 1 GiB copied and compared) is no part of what is timed:
        # a later trial takes the first one's
        check, timing = self.verify_then_time(ctx, copy, round_trip, asynchronous=pinned,
                                              check_each_trial=False)
        metrics = self._link(ctx)  # read right after copying: the link is not idling down
        return Result(timing, math.nan, float(size), check, metrics)

    def _buffers(self, ctx: RunContext, size: int) -> dict[str, Any]:
        data = ctx.rng.integers(0, 256, size, dtype=np.uint8)
        return {"data": data, "dev": ctx.gpu.cuda.mem_alloc(size)}

    def _host(self, ctx: RunContext, bufs: dict[str, Any], kind: str):
        """(source, destination) host arrays of this memory kind, made once per size."""
        if kind not in bufs:
            cuda = ctx.gpu.cuda
            data = bufs["data"]
            if kind == "pinned":
                src = cuda.pagelocked_empty(data.shape, np.uint8)
                dst = cuda.pagelocked_empty(data.shape, np.uint8)
                src[:] = data
            else:
                src, dst = data, np.empty_like(data)
            bufs[kind] = (src, dst)
        return bufs[kind]

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        d = self.ok(df).copy()
        if d.empty:
            return d
        d["size"] = d["p_size"].astype("int64")
        d["direction"] = d["p_direction"].astype(str)
        d["memory"] = d["variant"].astype(str)
        return d.sort_values(["direction", "memory", "size"])

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        if name != "bandwidth":
            raise KeyError(name)
        d = self._frame(df)
        if d.empty:
            return None
        dirs = [x for x in DIRECTIONS if x in set(d["direction"])]
        fig, axes = plt.subplots(1, len(dirs), figsize=(5.5 * len(dirs), 4.8), sharey=True,
                                 squeeze=False)
        link, theo = lesson.link(d)
        palette = dict(zip(MEMORY, sns.color_palette("deep", len(MEMORY))))
        ticks = sorted(d["size"].unique())
        if len(ticks) > 7:  # labels of 7 sizes fit a panel's width unrotated
            ticks = ticks[:: math.ceil(len(ticks) / 7)]
        for ax, direction in zip(axes[0], dirs):
            sub = d[d["direction"] == direction]
            sns.lineplot(data=sub, x="size", y="gbps", hue="memory", palette=palette,
                         hue_order=[m for m in MEMORY if m in set(sub["memory"])],
                         marker="o", ax=ax)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [bytes_label(t) for t in ticks])
            if math.isfinite(theo):
                ax.axhline(theo, ls="--", color="0.3", lw=1,
                           label=f"PCIe theoretical ({theo:.0f} GB/s)")
            ax.set(xlabel="copy size (log scale)", ylabel="bandwidth (GB/s)",
                   title=DIRECTION_LABEL[direction])
            ax.set_ylim(bottom=0)
            ax.legend(title="host memory", fontsize=8)
        fig.suptitle(f"Host-device copy bandwidth: {link}", fontsize=11)
        fig.tight_layout()
        return fig
