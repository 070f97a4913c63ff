"""The links between GPUs on a machine of 2+ GPUs: every copy arrives intact, and the peer
copy's bandwidth agrees with CuPy's cudaMemcpyPeer measured in the same test."""

from __future__ import annotations

import statistics
import time

import pytest

pytestmark = pytest.mark.gpu


def _gpu_count() -> int:
    try:
        import pycuda.driver as cuda

        cuda.init()
        return cuda.Device.count()
    except Exception:  # noqa: BLE001
        return 0


needs_two = pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 GPUs (a multi-GPU machine)")


def _cupy_peer_gbps(size: int, reps: int = 10) -> float:
    import cupy as cp

    with cp.cuda.Device(0):
        src = cp.random.randint(0, 255, size, dtype=cp.uint8)
    with cp.cuda.Device(1):
        dst = cp.empty(size, dtype=cp.uint8)
    times = []
    for i in range(reps + 1):
        cp.cuda.Device(0).synchronize()
        t = time.perf_counter()
        cp.cuda.runtime.memcpyPeer(dst.data.ptr, 1, src.data.ptr, 0, size)
        cp.cuda.Device(1).synchronize()
        if i:
            times.append(time.perf_counter() - t)
    return size / statistics.median(times) / 1e9


@needs_two
def test_every_mode_arrives_intact_and_peer_agrees_with_cupy():
    import pycuda.driver as cuda

    from cudalab import links

    cuda.init()
    size = 256 << 20
    rows = {r["mode"]: r for r in links.measure_pair(cuda, 0, 1, size, reps=10)}
    assert all(r["correct"] for r in rows.values() if not r["note"]), rows
    ours = rows["peer"]["gbps"]
    theirs = _cupy_peer_gbps(size)
    print(f"links: peer 0->1 {ours:.1f} GB/s (cudalab) vs {theirs:.1f} GB/s (CuPy memcpyPeer)")
    assert ours == pytest.approx(theirs, rel=0.15)
