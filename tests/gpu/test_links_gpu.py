"""The links between GPUs on a machine of 2+ GPUs: every copy arrives intact, and the peer
copy's bandwidth agrees with CuPy's cudaMemcpyPeer measured in the same test. Both run in
processes of their own: CuPy's runtime calls make the primary context current, which would
leave the test session's pycuda context stack wrong for the tests after this one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

CUPY_PEER = """
import statistics, sys, time
import cupy as cp
size, peer = int(sys.argv[1]), sys.argv[2] == "on"
if peer:  # without it cudaMemcpyPeer stages through the host: CuPy measured 38 GB/s on NV18
    for a, b in ((0, 1), (1, 0)):
        with cp.cuda.Device(a):
            cp.cuda.runtime.deviceEnablePeerAccess(b)
with cp.cuda.Device(0):
    src = cp.random.randint(0, 255, size, dtype=cp.uint8)
with cp.cuda.Device(1):
    dst = cp.empty(size, dtype=cp.uint8)
times = []
for i in range(11):
    cp.cuda.Device(0).synchronize()
    t = time.perf_counter()
    cp.cuda.runtime.memcpyPeer(dst.data.ptr, 1, src.data.ptr, 0, size)
    cp.cuda.Device(1).synchronize()
    if i:
        times.append(time.perf_counter() - t)
print(size / statistics.median(times) / 1e9)
"""


def cupy_peer_gbps(size: int, env: dict[str, str], peer: bool = True) -> float:
    """GB/s of CuPy's cudaMemcpyPeer from GPU 0 to GPU 1, in a process of its own, with
    peer access enabled both ways or not (then the driver stages the copy through the host)."""
    c = subprocess.run([sys.executable, "-c", CUPY_PEER, str(size), "on" if peer else "off"],
                       capture_output=True,
                       text=True, env=env, timeout=300)
    assert c.returncode == 0, c.stderr
    return float(c.stdout.strip())


@pytest.mark.multi_gpu(2)
def test_every_mode_arrives_intact_and_peer_agrees_with_cupy(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "cudalab.links", "--out", str(tmp_path / "l.csv"),
                        "--size-mib", "256", "--reps", "10"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    df = pd.read_csv(tmp_path / "l.csv")
    assert df["correct"].all(), df
    for mode, peer in (("peer", True), ("no_peer", False)):
        ours = float(df[(df["src"] == 0) & (df["dst"] == 1) & (df["mode"] == mode)]["gbps"].iloc[0])
        theirs = cupy_peer_gbps(256 << 20, env, peer)
        print(f"links: {mode} 0->1 {ours:.1f} GB/s (cudalab) vs {theirs:.1f} GB/s (CuPy)")
        assert ours == pytest.approx(theirs, rel=0.15), mode
