"""The links between the GPUs of one machine: for every ordered pair, a copy of `size` bytes
with peer access on (NVLink or PCIe peer-to-peer, as the topology allows) and off (the
driver stages it through the host), staged by hand through pinned host memory, both
directions at once, and a kernel on one GPU reading the other's memory directly. Each copy's
data is checked byte for byte; times are CUDA events (one GPU) or the host clock around a
synchronised batch (two GPUs at once). `nvidia-smi topo -m` gives each pair's link type.

    python -m cudalab.links --out links.csv [--size-mib 256] [--reps 10]

Run by `cudalab accept` after its per-GPU runs (the GPUs are idle then), which flags a pair
slower than the others of its link type and draws the matrix.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

MODES = ("peer", "no_peer", "host_staged", "bidirectional", "remote_read")
MODE_LABEL = {"peer": "copy, peer access on", "no_peer": "copy, peer access off",
              "host_staged": "staged through pinned host memory",
              "bidirectional": "both directions at once (peer on; GB/s of both)",
              "remote_read": "kernel reading the other GPU's memory"}
SLOW_LINK = 0.8  # a pair below this share of its link type's median peer bandwidth is slow

# In cuda/ (interconnect/read_remote.cu): one source for this module and the lesson.
READ_REMOTE_FILE = "interconnect/read_remote.cu"


def topology_text() -> str:
    """`nvidia-smi topo -m` as printed, its terminal colour codes removed ('' without
    nvidia-smi or where it fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout) if out.returncode == 0 else ""


def topology(text: str | None = None) -> dict[tuple[int, int], str]:
    """Each GPU pair's link as `nvidia-smi topo -m` names it (NV<n>: NVLink with n links;
    PIX, PXB, PHB, NODE, SYS: PCIe paths through a switch, bridges, the host bridge, the
    NUMA node, across sockets)."""
    if text is None:
        text = topology_text()
    # a GPU's row starts at the line's start; the header (GPU0 GPU1 ... after a tab) not
    rows = [ln.split() for ln in text.splitlines() if re.match(r"^GPU\d+\s", ln)]
    out = {}
    for r in rows:
        i = int(r[0][3:])
        for j, cell in enumerate(r[1:1 + len(rows)]):
            if j != i:
                out[(i, j)] = cell
    return out


class Pair:
    """Two GPUs' primary contexts, buffers of `size` bytes on each and pinned host memory."""

    def __init__(self, cuda: Any, src: int, dst: int, size: int) -> None:
        self.cuda, self.size = cuda, size
        self.dev = [cuda.Device(src), cuda.Device(dst)]
        self.ctx = [d.retain_primary_context() for d in self.dev]
        self.buf, self.stream = [], []
        for c in self.ctx:
            c.push()
            self.buf.append((cuda.mem_alloc(size), cuda.mem_alloc(size)))
            self.stream.append(cuda.Stream())
            c.pop()
        self.data = np.random.default_rng().integers(0, 256, size, dtype=np.uint8)
        self.ctx[0].push()
        self.host = cuda.pagelocked_empty(size, np.uint8)  # pinned: needs a current context
        cuda.memcpy_htod(self.buf[0][0], self.data)
        self.ctx[0].pop()
        self.ctx[1].push()
        cuda.memcpy_htod(self.buf[1][0], self.data[::-1].copy())
        self.ctx[1].pop()
        self.peer_on = False  # a new context has peer access off
        self.peer_ok = bool(self.dev[0].can_access_peer(self.dev[1])
                            and self.dev[1].can_access_peer(self.dev[0]))

    def set_peer(self, on: bool) -> None:
        """Peer access both ways on or off (the driver refuses to enable what is enabled, or
        to disable what is not: the pair keeps its state)."""
        if on == self.peer_on:
            return
        for a, b in ((0, 1), (1, 0)):
            self.ctx[a].push()
            try:
                if on:
                    self.cuda.Context.enable_peer_access(self.ctx[b])
                else:
                    self.cuda.Context.disable_peer_access(self.ctx[b])
            finally:
                self.ctx[a].pop()
        self.peer_on = on

    def check(self, side: int, expect: np.ndarray) -> bool:
        """Whether side's destination buffer holds `expect`; it is poisoned afterwards."""
        self.ctx[side].push()
        got = np.empty(self.size, np.uint8)
        self.cuda.memcpy_dtoh(got, self.buf[side][1])
        self.cuda.memset_d8(self.buf[side][1], 0xA5, self.size)
        self.cuda.Context.synchronize()
        self.ctx[side].pop()
        return bool(np.array_equal(got, expect))

    def free(self) -> None:  # a job's cache frees what it drops by free()
        self.release()

    def release(self) -> None:
        self.set_peer(False)  # primary contexts outlive the pair: leave them as found
        self.ctx[0].push()
        self.host.base.free()  # before its context goes
        self.ctx[0].pop()
        for c, (a, b) in zip(self.ctx, self.buf):
            c.push()
            a.free()
            b.free()
            c.pop()
            c.detach()


def _events_time(pair: Pair, fn: Any, reps: int, side: int = 0) -> float:
    """Seconds per call of fn() on GPU `side`'s stream (0: the source), by CUDA events, the
    median of reps after one warm-up call."""
    cuda = pair.cuda
    pair.ctx[side].push()
    try:
        fn()
        cuda.Context.synchronize()
        times = []
        for _ in range(reps):
            a, b = cuda.Event(), cuda.Event()
            a.record(pair.stream[side])
            fn()
            b.record(pair.stream[side])
            b.synchronize()
            times.append(b.time_since(a) / 1e3)
        return statistics.median(times)
    finally:
        pair.ctx[side].pop()


def _wall_time(pair: Pair, fn: Any, reps: int) -> float:
    """Seconds per call of fn() (work on both GPUs), by the host clock around a batch."""
    fn()
    sync_both(pair)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync_both(pair)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def sync_both(pair: Pair) -> None:
    """Wait for both GPUs' streams of the pair."""
    for c, s in zip(pair.ctx, pair.stream):
        c.push()
        s.synchronize()
        c.pop()


@dataclass
class Op:
    """One mode's copy between a pair's GPUs. run(): one copy (enqueued on `side`'s stream;
    where both GPUs work, side is None and run() is timed by the host clock up to both
    streams' end, sync_both); moved: bytes per run; peer: the peer-access state it needs
    (set_peer before running); check(): whether the last run's data arrived intact (the
    destination is poisoned afterwards); kernel: the loaded module where a kernel of
    cudalab's moves the data (its provenance)."""

    mode: str
    run: Callable[[], None]
    side: int | None
    moved: int
    peer: bool
    check: Callable[[], bool]
    kernel: Any = None


NO_PEER = "no peer access between these GPUs"


def op(pair: Pair, mode: str, read_remote: Callable[[], Any] | None = None) -> Op | str:
    """Mode `mode` of the pair as an Op, or why it cannot run here (no peer access).
    read_remote(): the read_remote kernel loaded in the destination's context (called with
    that context current; default: compiled from cuda/ by pycuda)."""
    cuda, size = pair.cuda, pair.size
    s_src, d_dst = pair.buf[0][0], pair.buf[1][1]
    if mode in ("peer", "bidirectional", "remote_read") and not pair.peer_ok:
        return NO_PEER

    def intact() -> bool:
        return pair.check(1, pair.data)

    if mode in ("peer", "no_peer"):
        return Op(mode, lambda: cuda.memcpy_dtod_async(d_dst, s_src, size, pair.stream[0]),
                  0, size, mode == "peer", intact)
    if mode == "host_staged":
        def staged() -> None:
            pair.ctx[0].push()
            cuda.memcpy_dtoh_async(pair.host, s_src, pair.stream[0])
            pair.stream[0].synchronize()
            pair.ctx[0].pop()
            pair.ctx[1].push()
            cuda.memcpy_htod_async(d_dst, pair.host, pair.stream[1])
            pair.ctx[1].pop()
        return Op(mode, staged, None, size, False, intact)
    if mode == "bidirectional":
        def both() -> None:
            pair.ctx[0].push()
            cuda.memcpy_dtod_async(d_dst, s_src, size, pair.stream[0])
            pair.ctx[0].pop()
            pair.ctx[1].push()
            cuda.memcpy_dtod_async(pair.buf[0][1], pair.buf[1][0], size, pair.stream[1])
            pair.ctx[1].pop()
        return Op(mode, both, None, 2 * size, True,
                  lambda: pair.check(1, pair.data) and pair.check(0, pair.data[::-1]))
    if mode == "remote_read":
        return _remote_read(pair, read_remote or _compiled_read_remote)
    raise ValueError(f"mode {mode!r}; allowed: {', '.join(MODES)}")


def _compiled_read_remote() -> Any:
    from pycuda.compiler import SourceModule

    from cudalab.resources import CUDA_DIR

    return SourceModule((CUDA_DIR / READ_REMOTE_FILE).read_text(), no_extern_c=True)


def _remote_read(pair: Pair, load: Callable[[], Any]) -> Op:
    """A kernel on the destination GPU copying the source GPU's buffer into its own: loads
    over the link."""
    pair.ctx[1].push()
    try:
        module = load()
        fn = module.get_function("read_remote")
        sms = pair.dev[1].get_attribute(pair.cuda.device_attribute.MULTIPROCESSOR_COUNT)
    finally:
        pair.ctx[1].pop()
    n = np.uint64(pair.size // 16)

    def launch() -> None:
        fn(pair.buf[0][0], pair.buf[1][1], n, block=(256, 1, 1), grid=(sms * 8, 1),
           stream=pair.stream[1])

    return Op("remote_read", launch, 1, pair.size, True, lambda: pair.check(1, pair.data),
              module)


def measure_pair(cuda: Any, src: int, dst: int, size: int, reps: int,
                 read_remote: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
    """Every mode's GB/s from GPU src to GPU dst (CUDA ordinals), each with its byte check,
    timed by this module's own loop (the median of reps after a warm-up)."""
    pair = Pair(cuda, src, dst, size)
    rows = []
    try:
        for mode in ("no_peer", "peer", "host_staged", "bidirectional", "remote_read"):
            o = op(pair, mode, read_remote)
            if isinstance(o, str):
                rows.append({"src": src, "dst": dst, "mode": mode, "bytes": size,
                             "seconds": math.nan, "gbps": math.nan, "correct": False,
                             "note": o})
                continue
            pair.set_peer(o.peer)
            t = (_events_time(pair, o.run, reps, o.side) if o.side is not None
                 else _wall_time(pair, o.run, reps))
            ok = o.check()
            rows.append({"src": src, "dst": dst, "mode": mode, "bytes": o.moved, "seconds": t,
                         "gbps": o.moved / t / 1e9 if t and ok else math.nan, "correct": ok,
                         "note": ""})
        return rows
    finally:
        pair.release()


def measure_all(size: int, reps: int) -> pd.DataFrame:
    # CUDA's ordinals in nvidia-smi's order, the topology's (CUDA's default: fastest first)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import pycuda.driver as cuda

    cuda.init()
    n = cuda.Device.count()
    topo = topology()
    rows = []
    for src in range(n):
        for dst in range(n):
            if src != dst:
                rows += measure_pair(cuda, src, dst, size, reps)
    df = pd.DataFrame(rows)
    df["link"] = [topo.get((s, d), "") for s, d in zip(df["src"], df["dst"])]
    return df


def slow_pairs(df: pd.DataFrame, share: float = SLOW_LINK) -> pd.DataFrame:
    """Pairs whose peer copy is below `share` of the median of their link type's pairs
    (an NVLink pair is judged against the NVLink pairs, a PCIe path against its kind)."""
    peer = df[(df["mode"] == "peer") & df["gbps"].notna()].copy()
    if peer.empty:
        return peer
    med = peer.groupby("link")["gbps"].transform("median")
    peer["share_of_median"] = peer["gbps"] / med
    return peer[peer["share_of_median"] < share]


def matrix_figure(df: pd.DataFrame, modes: tuple[str, ...] = MODES, title: str = "") -> Any:
    """Each mode's bandwidth matrix (GB/s; source GPU rows, destination columns), one heatmap
    per mode on one colour scale, up to three per row; None where no mode has a number.
    df: one row per pair and mode (src, dst, mode, gbps), as links.csv. The cells' labels
    shrink with the GPU count so that an 8 x 8 matrix stays legible."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    have = [m for m in modes if (df["mode"] == m).any() and df.loc[df["mode"] == m, "gbps"]
            .notna().any()]
    if not have:
        return None
    gpus = sorted(set(df["src"]) | set(df["dst"]))
    n, cols = len(gpus), min(3, len(have))
    rows = math.ceil(len(have) / cols)
    side = 3.2 + 0.35 * n
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols, side * 0.9 * rows + 0.6),
                             squeeze=False)
    top = float(df["gbps"].max())
    for ax, mode in zip(axes.flat, have):
        m = (df[df["mode"] == mode].pivot_table(index="src", columns="dst", values="gbps")
             .reindex(index=gpus, columns=gpus))
        sns.heatmap(m, annot=True, fmt=".0f", cmap="viridis", vmin=0, vmax=top, ax=ax,
                    annot_kws={"fontsize": 10 if n <= 4 else 7}, linewidths=0.5,
                    cbar_kws={"label": "GB/s"}, mask=m.isna())
        ax.set_facecolor("0.85")  # the diagonal and unmeasured pairs: grey, no number
        ax.set(title=MODE_LABEL.get(mode, mode), xlabel="destination GPU",
               ylabel="source GPU")
        ax.title.set_fontsize(9)
    for ax in list(axes.flat)[len(have):]:
        ax.set_visible(False)
    fig.suptitle(title or "Copies between GPUs (GB/s)", fontsize=11)
    fig.tight_layout()
    return fig


def link_label(link: str) -> str:
    m = re.fullmatch(r"NV(\d+)", link or "")
    if m:
        return f"NVLink ({m.group(1)} links)"
    return {"PIX": "PCIe, one switch", "PXB": "PCIe, several bridges",
            "PHB": "PCIe through the host bridge", "NODE": "PCIe within a NUMA node",
            "SYS": "PCIe across sockets (SMP link)"}.get(link, link or "unknown")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cudalab.links", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="CSV: one row per pair and mode")
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    if not 1 <= a.size_mib <= 16384 or not 1 <= a.reps <= 1000:
        print("error: --size-mib 1..16384 and --reps 1..1000", file=sys.stderr)
        return 2
    df = measure_all(a.size_mib << 20, a.reps)
    from cudalab import results, safe_text

    with results.atomic_path(Path(a.out)) as tmp:
        safe_text.write_frame(df, tmp)
    print(df.pivot_table(index=["src", "dst", "link"], columns="mode", values="gbps")
          .round(1).to_string())
    return 0 if df["correct"].where(df["note"] == "", True).all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
