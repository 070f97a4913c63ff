"""The links between the GPUs of one machine: NVLink, PCIe and the host.

For every ordered pair of the machine's usable GPUs (the config's `gpus:` list, at most
`max_gpus`), each mode of cudalab.links is a point: a copy with peer access on and off, one
staged through pinned host memory, both directions at once, and a kernel on the destination
GPU reading the source GPU's memory. The copies are cudalab.links' own (one definition for
this lesson and node acceptance); here each is checked byte for byte, then timed by the
shared harness (CUDA events on the GPU that does the work; the host clock where both GPUs
work). A `topology` point, measured on every machine, records how many GPUs there are and
`nvidia-smi topo -m`: with fewer than two GPUs it is the lesson's only row, and every claim
says why it does not apply.

The job locks every GPU it measures (gpu_slots.claim_all) and a local Snakemake run starts
it alone: copies between GPUs would disturb the other jobs' timings, and theirs these.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import pandas as pd

from cudalab import gpu_slots, links
from cudalab.experiments.base import (
    Check,
    Experiment,
    Point,
    Result,
    Skipped,
    block_schema,
    choices_schema,
)
from cudalab.experiments.interconnect import spec
from cudalab.experiments.interconnect.lesson import LESSON

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

TOPOLOGY = "topology"


class Interconnect(Experiment):
    name = "interconnect"
    order = 45  # after the host link (transfer), before streams
    lesson = LESSON
    kernel_files = (links.READ_REMOTE_FILE,)
    vs_device_peak = False  # the bytes cross a link, not one GPU's DRAM
    all_gpus = True
    noise = {"host_staged": "two copies in turn through the host's memory and root complex, "
                            "timed by the host clock: the host's load shows in it"}
    schema = block_schema({
        "size_mib": {"type": "integer", "minimum": 1, "maximum": 16384, "default": 256,
                     "description": "bytes of one copy, in MiB (each GPU holds two buffers "
                     "of it; the host one pinned)"},
        "modes": choices_schema(list(links.MODES), "what is measured for each ordered pair"),
        "max_gpus": {"type": "integer", "minimum": 2, "maximum": 64, "default": 8,
                     "description": "measure between at most this many GPUs (the first, in "
                     "nvidia-smi's order): n GPUs make n(n-1) ordered pairs"},
    })
    smoke = {"size_mib": 16, "modes": list(links.MODES)}

    # -- grid --------------------------------------------------------------------------
    def grid(self, config: dict[str, Any]) -> list[Point]:
        block = self.settings_in(config)
        gpus = gpu_slots.usable_gpus(config)[: block["max_gpus"]]
        return self._points(block, [g.index for g in gpus])

    def points(self, block: dict[str, Any]) -> list[Point]:
        return self._points(block, [g.index for g in gpu_slots.usable_gpus({})])

    def _points(self, block: dict[str, Any], gpus: list[int]) -> list[Point]:
        pts = [Point(self.name, TOPOLOGY, {"gpus": len(gpus)}, gpu=False)]
        if len(gpus) < 2:
            return pts
        size = block["size_mib"] << 20
        return pts + [Point(self.name, mode, {"src": s, "dst": d, "size": size})
                      for s in gpus for d in gpus if s != d
                      for mode in links.MODES if mode in block["modes"]]

    def machine_facts(self, block: dict[str, Any]) -> Any:
        return [g.uuid for g in gpu_slots.nvml_gpus()]  # another set of GPUs: measure again

    def gpu_bytes(self, point: Point) -> int:
        return 2 * point.params.get("size", 0)  # two buffers on each GPU of the pair

    def tool_provenance(self, block: dict[str, Any]) -> dict[str, Any]:
        text = links.topology_text()
        return {"nvidia_smi_topo": text or "not available (no nvidia-smi or no GPU)"}

    # -- measuring ---------------------------------------------------------------------
    def prepare(self, ctx: RunContext) -> None:
        if ctx.gpu is None:  # fewer than two GPUs: the topology point alone, no GPU
            return
        cuda = ctx.gpu.cuda
        by_bus = {spec.bus(g.pci_bus_id): g for g in gpu_slots.nvml_gpus()}
        ordinal, pcie = {}, {}
        for k in range(cuda.Device.count()):
            bus = cuda.Device(k).pci_bus_id()
            g = by_bus.get(spec.bus(bus))
            if g is not None:
                ordinal[g.index] = k
                pcie[g.index] = spec.pcie_of(g.index, bus)
        ctx.cache["ordinal"], ctx.cache["pcie"] = ordinal, pcie
        ctx.cache["topology"] = links.topology()
        ctx.cache["cc"] = ctx.gpu.info["compute_capability"]

    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant != "remote_read":
            return None
        from cudalab.gpu import Kernel
        from cudalab.resources import CUDA_DIR

        src = (CUDA_DIR / links.READ_REMOTE_FILE).read_text()
        return Kernel(None, links.READ_REMOTE_FILE, [],
                      hashlib.sha256(src.encode()).hexdigest()[:16])

    def measure(self, ctx: RunContext, point: Point) -> Result:
        if point.variant == TOPOLOGY:
            return self._topology(point)
        p = point.params
        ordinal = ctx.cache["ordinal"]
        missing = [i for i in (p["src"], p["dst"]) if i not in ordinal]
        if missing:
            raise Skipped(f"GPU {missing[0]} is not visible to this job "
                          "(CUDA_VISIBLE_DEVICES or its Slurm allocation hides it)")
        cuda = ctx.gpu.cuda
        src, dst = ordinal[p["src"]], ordinal[p["dst"]]
        pair = ctx.cache.one_per_slot("pair", (src, dst, p["size"]),
                                      lambda: links.Pair(cuda, src, dst, p["size"]))
        o = links.op(pair, point.variant)
        if isinstance(o, str):
            raise Skipped(o)
        pair.set_peer(o.peer)
        check, timing = self._verify_then_time(ctx, pair, o)
        link = ctx.cache["topology"].get((p["src"], p["dst"]), "")
        metrics = spec.metrics(link, ctx.cache["cc"], point.variant, pair.peer_ok,
                               [ctx.cache["pcie"].get(i) for i in (p["src"], p["dst"])])
        kernel = self.kernel_for(ctx, point)
        return Result(timing, bytes=float(o.moved), check=check, metrics=metrics,
                      kernel=kernel)

    def _verify_then_time(self, ctx: RunContext, pair: links.Pair, o: links.Op
                          ) -> tuple[Check, Any]:
        """One copy checked byte for byte first, then the copy timed by the harness: CUDA
        events on the stream of the GPU that does the work, or the host clock around both
        GPUs' streams where both work."""
        from cudalab.gpu import EventTimer
        from cudalab.harness import WallTimer

        if o.side is None:
            o.run()
            links.sync_both(pair)
        else:
            pair.ctx[o.side].push()
            try:
                o.run()
                pair.stream[o.side].synchronize()
            finally:
                pair.ctx[o.side].pop()
        bad = not o.check()
        check = Check(float(bad), 0.0, "copies_not_intact",
                      detail="the destination's bytes differ from the source's" if bad else "")
        if o.side is None:
            def both() -> None:
                o.run()
                links.sync_both(pair)
            return check, ctx.harness.measure(both, WallTimer())
        pair.ctx[o.side].push()
        try:
            timer = EventTimer(pair.cuda, pair.stream[o.side])
            return check, ctx.harness.measure(o.run, timer)
        finally:
            pair.ctx[o.side].pop()

    def _topology(self, point: Point) -> Result:
        """How many GPUs this machine has and how they are joined (no GPU needed)."""
        n = point.params["gpus"]
        topo = links.topology()
        pairs = "; ".join(f"GPU {s} -> GPU {d}: {v}" for (s, d), v in sorted(topo.items()))
        return Result(None, check=Check(0.0, 0.0, "topology_read"),
                      metrics={"gpus": n, "links": pairs or "none",
                               "nvidia_smi_topo": links.topology_text()})

    # -- presentation --------------------------------------------------------------------
    def plot(self, name: str, df: pd.DataFrame):
        if name != "matrix":
            raise KeyError(name)
        d = spec.links_frame(df)
        if d.empty:
            return None
        size = int(d["bytes"].min()) >> 20
        gpu = str(df["gpu_name"].dropna().iloc[0]) if "gpu_name" in df and \
            df["gpu_name"].notna().any() else "GPUs"
        return links.matrix_figure(
            d, tuple(m for m in links.MODES if m in set(d["mode"])),
            f"Bandwidth between GPUs of this machine ({gpu}; GB/s, {size} MiB per copy; "
            "both directions at once: the sum)")

    def tables(self, df: pd.DataFrame) -> list[dict[str, str]]:
        return spec.tables(df)
