"""Latency of one load per memory level, measured by pointer chasing.

One thread follows a chain of dependent loads j = next[j] (cuda/latency/latency.cu): each address is
the value the previous load returned, so the loads cannot overlap and the time per step is
the latency of one load from wherever the chain lives. The chain is a random single cycle
through nodes `stride` bytes apart (every step a new cache line, no pattern a prefetcher
could follow), built on the CPU with the job's rng; its working set decides the level:

  global     ld.global.ca (default caching): L1, then L2, then DRAM as the chain grows
  global_cg  ld.global.cg: bypasses L1, so L2 then DRAM
  shared     the chain copied into shared memory (up to 32 KiB)
  constant   the chain in __constant__ memory (up to 64 KiB; the constant cache is smaller)

The kernel times its own loop with clock64 (SM cycles) and %globaltimer (ns), so cycles and
ns per load are both measured and the SM clock is their ratio (nothing assumed). Every launch
continues where the previous stopped, so a chain larger than a cache is never re-read while
still cached. The host follows the same chain on the CPU and every launch must stop on the
same node (the correctness check). The harness times the launches as every experiment's are
(the usual time columns: the whole launch); the latency itself is the median over those
launches of the kernel's own counters (m_cycles_per_load, m_ns_per_load).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import devicespec
from cudalab.experiments.base import (
    Check,
    Experiment,
    Point,
    Result,
    block_schema,
    choices_schema,
)
from cudalab.experiments.latency import lesson
from cudalab.experiments.latency.lesson import COURSE_CYCLES, GLOBAL, LESSON, VARIANTS, fact, levels
from cudalab.experiments.shared import bytes_label

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

SHARED_MAX = 32 * 1024  # SHARED_MAX_BYTES in cuda/latency/latency.cu
CONSTANT_MAX = 64 * 1024  # CONSTANT_MAX_BYTES in cuda/latency/latency.cu
MAX_BYTES = 1 << 31
SHARED_COPY_THREADS = 256  # threads that copy the chain into shared memory
# A chain of at most this many nodes is walked whole, untimed, at the start of every launch:
# L1 and the constant cache start each launch empty. 8192 nodes of 128 B = 1 MiB, 4x the
# largest L1.
WARM_NODES = 8192
# A global chain up to this many times the L2 size is walked whole once before it is timed,
# so the L2 holds what fits of it; a larger one would only be evicted again, so instead the
# L2 is flushed once: else the L2 still holds the end of the chain's upload, and the first
# ~30 launches of a 128 MiB chain read 12 % faster than the rest (seen on an H100: 4.93 ms
# rising to a 5.59 ms plateau, a sample CV of 2.1-2.6 % that never converged).
PRIME_L2_FACTOR = 2
SLOT_WORDS = 4  # [start offset, final offset, cycles, ns] per launch, 64-bit each

# The unified L1 / shared memory per SM (KiB) from NVIDIA's tuning guides: no device
# attribute gives the L1 size.
UNIFIED_L1_KIB = {"7.0": 128, "7.2": 128, "7.5": 96, "8.0": 192, "8.6": 128, "8.7": 192,
                  "8.9": 128, "9.0": 256, "10.0": 256, "12.0": 128}


def _pow2_schema(default: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 64, "maximum": MAX_BYTES, "default": default,
            "description": description}


class Latency(Experiment):
    name = "latency"
    kernel_files = ("latency/latency.cu",)
    order = 65
    own_timer = "ns_per_load"  # %globaltimer around the chase, in the kernel
    lesson = LESSON
    schema = block_schema({
        "variants": choices_schema(VARIANTS, "which memory to chase through: global (default "
                                   "caching), global_cg (bypass L1), shared, constant"),
        "min_bytes": _pow2_schema(1024, "smallest working set (a power of two, bytes)"),
        "max_bytes": _pow2_schema(1 << 29, "largest working set of the global chains (a "
                                  "power of two; shared stops at 32 KiB, constant at 64 KiB); "
                                  "512 MiB is 10x the H100's L2"),
        "stride": {"enum": [32, 64, 128, 256, 512], "default": 128,
                   "description": "bytes between chain nodes: 128 puts every node in its own "
                   "cache line"},
        "steps": {"type": "integer", "minimum": 1024, "maximum": 1 << 20, "default": 16384,
                  "description": "timed dependent loads per launch (16384 at a few hundred ns "
                  "from DRAM: a few ms)"},
    })
    smoke = {"min_bytes": 1024, "max_bytes": 1 << 20, "steps": 2048}
    vs_device_peak = False  # a latency is no bandwidth: no % of peak

    def check_config(self, block: dict[str, Any]) -> list[str]:
        msgs = []
        for key in ("min_bytes", "max_bytes"):
            v = block[key]
            if v & (v - 1):
                msgs.append(f"{key}: {v} is not a power of two")
        if block["min_bytes"] > block["max_bytes"]:
            msgs.append(f"min_bytes: {block['min_bytes']} is above max_bytes "
                        f"{block['max_bytes']}")
        if block["min_bytes"] < 2 * block["stride"]:
            msgs.append(f"min_bytes: {block['min_bytes']} holds fewer than 2 chain nodes of "
                        f"stride {block['stride']} (at least {2 * block['stride']})")
        for variant, cap in (("shared", SHARED_MAX), ("constant", CONSTANT_MAX)):
            if variant in block["variants"] and block["min_bytes"] > cap:
                msgs.append(f"min_bytes: {block['min_bytes']} leaves the {variant} variant no "
                            f"working set (it holds at most {cap} bytes)")
        return msgs

    # -- grid ------------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        """Every variant's working sets, smallest first (both global variants share a chain
        in a row: it is built once)."""
        pts = [Point(self.name, v, {"working_set": ws})
               for v in VARIANTS if v in block["variants"]
               for ws in working_sets(v, block["min_bytes"], block["max_bytes"])]
        return sorted(pts, key=lambda p: (p.params["working_set"], VARIANTS.index(p.variant)))

    def gpu_bytes(self, point: Point) -> int:
        ws = point.params["working_set"]
        return ws if point.variant in GLOBAL or point.variant == "shared" else 0

    # -- measuring -------------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        return ctx.gpu.compile("latency/latency.cu")

    def _chain(self, ctx: RunContext, ws: int, stride: int) -> ChainData:
        return ctx.cache.one_per_slot(
            "latency_chain", ("latency_chain", ws, stride),
            lambda: ChainData(make_chain(ws // stride, ctx.rng), stride))

    def measure(self, ctx: RunContext, point: Point) -> Result:
        gpu, blk = ctx.gpu, ctx.block
        ws, stride, steps = point.params["working_set"], blk["stride"], blk["steps"]
        chain = self._chain(ctx, ws, stride)
        warm = chain.n if chain.n <= WARM_NODES else 0
        prime = point.variant in GLOBAL and ws <= PRIME_L2_FACTOR * gpu.l2_bytes
        kernel = self.kernel_for(ctx, point)
        s = ctx.harness.settings
        # every launch keeps its record: the check's, and the harness's (twice as many where
        # a queued measurement falls back to plain events and starts again)
        chaser = Chaser(gpu, kernel, point.variant, chain, steps,
                        capacity=2 * (s.warmup + s.max_samples) + 2)
        try:
            first = chain.n if prime else warm
            if point.variant in GLOBAL and not prime:
                gpu.l2_flusher()()  # its buffer is freed when the flusher goes

            def verify() -> Check:
                chaser.launch(first)
                return chaser.check()

            _, timing = self.verify_then_time(ctx, lambda: chaser.launch(warm), verify,
                                              asynchronous=True, batchable=False)
            check = chaser.check()  # every launch, the timed ones too
            timed = chaser.timed(timing.throttled or [False] * timing.n)
        finally:
            # freed after the point's trials: each trial's chain lands somewhere new
            ctx.cache.retire(chaser)
        metrics = {**launch_stats(timed, steps), "nodes": chain.n, "stride": stride,
                   "warm_steps": warm, "primed": prime, "steps": steps,
                   "l2_bytes": gpu.l2_bytes, "l1_bytes": l1_bytes(gpu.info["compute_capability"])}
        # no FLOP rate and no bandwidth: NaN keeps both columns out of the report's table
        return Result(timing, float("nan"), float("nan"), check, metrics, kernel=kernel,
                      working_set=float(ws))

    # -- figure ----------------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        return lesson.frame(df)

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        if name != "latency":
            raise KeyError(name)
        d = self._frame(df)
        if d.empty:
            return None
        fig, ax = plt.subplots(figsize=(9.5, 5.5))
        order = [v for v in VARIANTS if v in set(d["variant"])]
        sns.lineplot(data=d, x="ws", y="cycles", hue="variant", hue_order=order, marker="o",
                     ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = [t for t in (2.0 ** np.arange(10, 32, 2)) if d["ws"].min() <= t <= d["ws"].max()]
        ax.set_xticks(ticks, [bytes_label(t) for t in ticks], fontsize=8)
        l1, l2 = fact(d, "m_l1_bytes"), fact(d, "m_l2_bytes")
        for size, label in ((l1, f"L1 (~{bytes_label(l1)} incl. shared)"),
                            (l2, f"L2 ({bytes_label(l2)})")):
            if math.isfinite(size):
                ax.axvline(size, ls=":", color="0.35", lw=1)
                ax.text(size, 0.98, f" {label}", transform=ax.get_xaxis_transform(),
                        va="top", fontsize=8, color="0.35")
        for cycles, label in ((COURSE_CYCLES["shared"], "course: shared / constant ~5 cycles"),
                              (COURSE_CYCLES["dram"], "course: global ~500 cycles")):
            ax.axhline(cycles, ls="--", color="0.55", lw=1)
            ax.annotate(label, (0.01, cycles), xycoords=("axes fraction", "data"),
                        va="bottom", fontsize=8, color="0.4")
        ax.set_ylim(min(2.0, d["cycles"].min() / 2), max(2000.0, d["cycles"].max() * 2))
        mhz = fact(d, "m_sm_clock_mhz")
        if math.isfinite(mhz) and mhz > 0:
            ghz = mhz / 1e3
            sec = ax.secondary_yaxis("right", functions=(lambda c: c / ghz,
                                                         lambda n: n * ghz))
            sec.set_ylabel(f"ns per load (at the measured {mhz:.0f} MHz)")
        ax.set(xlabel="working set of the chain (bytes, log scale)",
               ylabel="cycles per dependent load (log scale)",
               title="Pointer chasing: latency of one load by working set and memory")
        ax.legend(title="memory", fontsize=8)
        fig.tight_layout()
        return fig

    # -- report ----------------------------------------------------------------------------
    def tables(self, df: pd.DataFrame) -> list[dict[str, str]]:
        d = self._frame(df)
        rows = levels(d) if not d.empty else []
        if not rows:
            return []
        head = ("<tr><th>level</th><th>measured on</th><th>cycles per load</th>"
                "<th>ns per load</th><th>course</th><th>measured / course</th></tr>")
        body = "".join(
            f"<tr><td>{html.escape(x.name)}</td><td>{html.escape(x.where)}</td>"
            f"<td>{x.cycles:.0f}</td><td>{x.ns:.1f}</td>"
            + (f"<td>~{x.course:.0f} cycles</td><td>{x.cycles / x.course:.1f}x</td>"
               if x.course else "<td>—</td><td>—</td>") + "</tr>"
            for x in rows)
        return [{"title": "Latency per memory level (median over the working sets clearly "
                 "inside each level)", "html": f'<table class="kv">{head}{body}</table>'}]


# -- the pieces the tests check ------------------------------------------------------------
def working_sets(variant: str, lo: int, hi: int) -> list[int]:
    """Powers of two from lo to hi, capped at what the variant's memory holds."""
    cap = {"shared": SHARED_MAX, "constant": CONSTANT_MAX}.get(variant, MAX_BYTES)
    out, ws = [], lo
    while ws <= min(hi, cap):
        out.append(ws)
        ws *= 2
    return out


def l1_bytes(cc: Any) -> float:
    """The unified L1 / shared memory per SM of a compute capability (NaN if not tabled)."""
    try:
        kib = UNIFIED_L1_KIB.get(devicespec.cc_key(cc))
    except ValueError:
        return math.nan
    return float(kib * 1024) if kib else math.nan


def make_chain(n: int, rng: np.random.Generator) -> np.ndarray:
    """nxt[i] = the node after node i: one random cycle through all n nodes (a random order,
    each node pointing at the next in it, the last at the first)."""
    if n < 1:
        raise ValueError(f"a chain needs at least one node, not {n}")
    order = rng.permutation(n)
    nxt = np.empty(n, np.int64)
    nxt[order] = np.roll(order, -1)
    return nxt


def chain_words(nxt: np.ndarray, stride: int, dtype: Any, base: int = 0) -> np.ndarray:
    """The chain as the device holds it: n * stride bytes of `dtype` words, node i at byte
    i * stride holding base + the byte offset of the node after it; other words 0."""
    dtype = np.dtype(dtype)
    n = nxt.size
    words = np.zeros(n * stride // dtype.itemsize, dtype)
    words[np.arange(n) * (stride // dtype.itemsize)] = (base + nxt * stride).astype(dtype)
    return words


def chain_power(nxt: np.ndarray, k: int) -> np.ndarray:
    """p[i] = the node k steps after node i, following nxt (repeated squaring: log2(k)
    gathers of the whole chain, not k steps of Python)."""
    out = np.arange(nxt.size, dtype=nxt.dtype)
    sq = nxt
    while k:
        if k & 1:
            out = sq[out]
        k >>= 1
        if k:
            sq = sq[sq]
    return out


def follow(nxt: np.ndarray, start: int, k: int) -> int:
    """The node k steps after `start`, one step at a time (the plain definition)."""
    j = int(start)
    for _ in range(k):
        j = int(nxt[j])
    return j


@dataclass
class ChainData:
    """One chain of the job (shared by the points of one working set): the next-node array
    and the k-step maps the checks need, computed once per k."""

    nxt: np.ndarray
    stride: int

    def __post_init__(self) -> None:
        self._powers: dict[int, np.ndarray] = {}

    @property
    def n(self) -> int:
        return int(self.nxt.size)

    def after(self, k: int) -> np.ndarray:
        if k not in self._powers:
            self._powers[k] = chain_power(self.nxt, k)
        return self._powers[k]


def check_launches(launches: list[tuple[int, int, int]], chain: ChainData, steps: int,
                   first_start: int | None) -> Check:
    """launches: (start offset, final offset, warm steps) of consecutive launches, oldest
    first. Each must stop where the CPU lands following the chain warm + steps steps from its
    start, and start where the one before stopped (the first at first_start, if known).
    Error: the number of launches that did not."""
    bad, first_bad = 0, ""
    prev = first_start
    for i, (start, final, warm) in enumerate(launches):
        why = _launch_problem(start, final, warm, chain, steps, prev)
        if why:
            bad += 1
            first_bad = first_bad or f"launch {i}: {why}"
        prev = final
    return Check(bad, 0, "launches_off_the_chain",
                 f"{len(launches)} launches followed on the CPU" + (f"; {first_bad}" if bad
                                                                     else ""))


def _launch_problem(start: int, final: int, warm: int, chain: ChainData, steps: int,
                    prev: int | None) -> str:
    if prev is not None and start != prev:
        return f"started at offset {start}, not where the previous one stopped ({prev})"
    node, rem = divmod(start, chain.stride)
    if rem or not 0 <= node < chain.n:
        return f"started at offset {start}, not a node of the chain"
    want = int(chain.after(warm + steps)[node]) * chain.stride
    return "" if final == want else (f"stopped at offset {final}, the CPU at {want} after "
                                     f"{warm + steps} steps from {start}")


def launch_stats(slots: np.ndarray, steps: int) -> dict[str, float]:
    """Latency from the kernel's own counters, one row per launch [start, final, cycles,
    ns]: the median per load over launches, its spread (CV), and the SM clock they imply."""
    if len(slots) == 0:
        nan = float("nan")
        return {"cycles_per_load": nan, "ns_per_load": nan, "cycles_per_load_cv": nan,
                "ns_per_load_cv": nan, "sm_clock_mhz": nan, "launches": 0}
    cycles = slots[:, 2].astype(np.float64) / steps
    ns = slots[:, 3].astype(np.float64) / steps
    clock = np.divide(cycles, ns, out=np.full_like(cycles, np.nan), where=ns > 0)
    return {"cycles_per_load": float(np.median(cycles)), "ns_per_load": float(np.median(ns)),
            "cycles_per_load_cv": _cv(cycles), "ns_per_load_cv": _cv(ns),
            "sm_clock_mhz": float(np.nanmedian(clock)) * 1e3 if np.isfinite(clock).any()
            else float("nan"),
            "launches": len(slots)}


def _cv(x: np.ndarray) -> float:
    m = float(x.mean())
    return float(x.std(ddof=1)) / m if len(x) > 1 and m > 0 else 0.0


class Chaser:
    """The device side of one point: the chain where the variant reads it, the state word
    (offset of the current node) and a ring of per-launch records; launch(warm) enqueues one
    chase, check() follows every recorded launch on the CPU."""

    def __init__(self, gpu: Any, kernel: Any, variant: str, chain: ChainData, steps: int,
                 capacity: int) -> None:
        self.cuda, self.sync = gpu.cuda, gpu.synchronize
        self.variant, self.chain, self.steps = variant, chain, steps
        self.capacity, self.count, self.warms = capacity, 0, []
        self.func = kernel.function(f"chase_{variant}")
        self._allocs: list[Any] = []
        # one thread chases; the shared variant's block first copies the chain in
        self.args: tuple[Any, ...] = ()
        self.grid, self.block = (1, 1), (1, 1, 1)
        self.first = 0  # the chain is walked from node 0's offset
        try:
            self.state = self._alloc(8)
            self.slots = self._alloc(8 * SLOT_WORDS * capacity)
            # records() copies the whole ring back, slots no launch wrote yet included:
            # zeroed here, every byte copied back was written first
            self.cuda.memset_d32(self.slots, 0, 2 * SLOT_WORDS * capacity)
            self.cuda.memcpy_htod(self.state, np.array([self.first], np.uint64))
            self._load(kernel)
        except BaseException:
            self.free()
            raise

    def _load(self, kernel: Any) -> None:
        """Put the chain where the variant reads it; set the launch's arguments."""
        chain, variant = self.chain, self.variant
        if variant in GLOBAL:
            self.func.prepare("PPPiii")
            data = self._alloc(chain.n * chain.stride)
            self.cuda.memcpy_htod(data, chain_words(chain.nxt, chain.stride, np.uint64,
                                                    base=int(data)))
            self.args = (data, self.state, self.slots)
        elif variant == "shared":
            self.func.prepare("PiPPiii")
            words = chain_words(chain.nxt, chain.stride, np.uint32)
            data = self._alloc(words.nbytes)
            self.cuda.memcpy_htod(data, words)
            self.args = (data, np.int32(words.size), self.state, self.slots)
            self.block = (SHARED_COPY_THREADS, 1, 1)
        else:
            self.func.prepare("PPiii")
            ptr, size = kernel.module.get_global("latency_constant_chain")
            words = chain_words(chain.nxt, chain.stride, np.uint32)
            if words.nbytes > size:
                raise ValueError(f"a {words.nbytes}-byte chain does not fit the {size}-byte "
                                 "__constant__ array")
            self.cuda.memcpy_htod(ptr, words)
            self.args = (self.state, self.slots)

    def _alloc(self, nbytes: int) -> Any:
        a = self.cuda.mem_alloc(nbytes)
        self._allocs.append(a)
        return a

    def launch(self, warm: int) -> None:
        """Enqueue one chase of warm + steps steps (asynchronous: no sync, no allocation)."""
        slot = self.count % self.capacity
        self.count += 1
        self.warms.append(warm)
        self.func.prepared_call(self.grid, self.block, *self.args, slot, warm, self.steps)

    def records(self) -> tuple[np.ndarray, int]:
        """The per-launch records still in the ring, oldest first, and the index of the
        first of them among all launches."""
        self.sync()
        ring = np.empty((self.capacity, SLOT_WORDS), np.uint64)
        self.cuda.memcpy_dtoh(ring, self.slots)
        kept = min(self.count, self.capacity)
        first = self.count - kept
        order = [(first + i) % self.capacity for i in range(kept)]
        return ring[order], first

    def check(self) -> Check:
        recs, first = self.records()
        launches = [(int(r[0]), int(r[1]), self.warms[first + i]) for i, r in enumerate(recs)]
        return check_launches(launches, self.chain, self.steps,
                              self.first if first == 0 else None)

    def timed(self, throttled: list[bool]) -> np.ndarray:
        """Records of the harness's timed samples (one launch each, the last launches; one
        flag per sample), less those its observer flagged as throttled (all of them where
        every sample was: the harness's rule)."""
        recs, _ = self.records()
        last = recs[len(recs) - len(throttled):]
        clean = [not t for t in throttled]
        return last[clean] if any(clean) else last

    def free(self) -> None:
        for a in self._allocs:
            a.free()
        self._allocs = []
