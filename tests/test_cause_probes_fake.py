"""The probes' measuring code on a numpy stand-in for pycuda (no GPU here): argument order,
launch geometry, the one-load probe's flag check, the duplex copies' streams and bit-for-bit
check, through the real harness. The GPU tests (tests/gpu/test_cause_probes_gpu.py) time
them for real."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fake_cuda import FakeEvent

from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Point, RunContext
from cudalab.experiments.streams import duplex
from cudalab.experiments.vector_add import block_rate
from cudalab.harness import Harness, Settings


class Alloc:
    def __init__(self, nbytes):
        self.buf = np.zeros(max(nbytes // 4, 1), np.int32)

    def __int__(self):
        return id(self)

    def free(self):
        pass


class Func:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def prepare(self, sig):
        assert sig == {"block_empty": "i", "block_one_load": "PIiP"}[self.name]

    def prepared_call(self, grid, block, *args):
        self.log.append((self.name, grid, block))
        if self.name == "block_empty":
            assert len(args) == 1
            return
        a_d, mask, flag, sink = args
        idx = np.arange(grid[0] * block[0], dtype=np.int64) & int(mask)
        if (a_d.buf[idx] == int(flag)).any():
            sink.buf[0] = int(flag)


class Gpu:
    def __init__(self, break_copies: bool = False):
        self.log: list = []
        self.streams: list = []

        def htod(dst, src, stream=None):
            if not break_copies:
                dst.buf.view(np.uint8)[:src.nbytes] = np.ascontiguousarray(src).view(
                    np.uint8).ravel()
            self.log.append(("htod", stream))

        def dtoh(dst, src, stream=None):
            dst.reshape(-1).view(np.uint8)[:] = src.buf.view(np.uint8)[:dst.nbytes]
            self.log.append(("dtoh", stream))

        def stream():
            s = SimpleNamespace(wait_for_event=lambda e: None)
            self.streams.append(s)
            return s

        self.cuda = SimpleNamespace(
            mem_alloc=Alloc, Event=FakeEvent, memcpy_htod=htod, memcpy_dtoh=dtoh,
            memcpy_htod_async=htod, memcpy_dtoh_async=dtoh, Stream=stream,
            pagelocked_empty=lambda n, dtype: np.empty(n, dtype),
            memset_d32=lambda dst, bits, n: dst.buf.view(np.uint32).__setitem__(
                slice(0, n), bits))

    def compile(self, source, defines=None):
        assert source == block_rate.KERNEL_FILE
        log = self.log
        return SimpleNamespace(function=lambda name: Func(name, log), options=[],
                               source_hash="fake")

    def event_timer(self):
        from cudalab.gpu import EventTimer

        return EventTimer(self.cuda)

    def synchronize(self):
        pass


def _ctx(gpu, block):
    s = Settings(warmup=1, min_samples=3, max_samples=3, budget_s=0.001, min_sample_s=0)
    return RunContext(gpu=gpu, harness=Harness(s), rng=np.random.default_rng(1), config={},
                      block=block)


@pytest.fixture
def small_buffer(monkeypatch):
    monkeypatch.setattr(block_rate, "BUFFER_INTS", 1 << 12)


def test_the_probe_launches_its_blocks_and_checks_the_loads(small_buffer):
    exp = REGISTRY["vector_add"]
    gpu = Gpu()
    ctx = _ctx(gpu, exp.settings_in(None))
    one = exp.measure(ctx, Point("vector_add", "block_rate",
                                 {"kind": "one_load", "threads": 64, "blocks": 100}))
    assert one.check is not None and one.check.passed, one.check
    assert one.bytes == 4.0 * 64 * 100 and one.launch.blocks == 100
    assert one.metrics["blocks"] == 100 and one.metrics["blocks_per_ns"] > 0
    assert ("block_one_load", (100, 1), (64, 1, 1)) in gpu.log
    empty = exp.measure(ctx, Point("vector_add", "block_rate",
                                   {"kind": "empty", "threads": 32, "blocks": 7}))
    assert empty.check is None and empty.no_check_reason
    assert ("block_empty", (7, 1), (32, 1, 1)) in gpu.log


def test_the_probe_check_fails_where_the_loads_miss(small_buffer, monkeypatch):
    exp = REGISTRY["vector_add"]
    monkeypatch.setattr(Func, "prepared_call", lambda self, grid, block, *a: None)
    got = exp.measure(_ctx(Gpu(), exp.settings_in(None)),
                      Point("vector_add", "block_rate",
                            {"kind": "one_load", "threads": 32, "blocks": 4}))
    assert not got.check.passed and "sink holds" in got.check.detail


@pytest.mark.parametrize("direction", duplex.DIRECTIONS)
def test_the_duplex_copies_run_on_two_streams_and_are_checked(direction):
    exp = REGISTRY["streams"]
    gpu = Gpu()
    block = exp.settings_in(None)
    got = exp.measure(_ctx(gpu, block), Point("streams", "duplex",
                                              {"n": 4096, "direction": direction}))
    assert got.check.passed, got.check
    assert got.bytes == 4.0 * 4096 * (2 if direction == "both" else 1)
    timed = [s for op, s in gpu.log if s is not None]
    assert timed and set(map(id, timed)) <= set(map(id, gpu.streams[:2]))
    if direction == "both":
        assert {id(s) for op, s in gpu.log if op == "htod" and s is not None} != \
            {id(s) for op, s in gpu.log if op == "dtoh" and s is not None}


def test_the_duplex_check_finds_a_copy_that_did_not_arrive():
    exp = REGISTRY["streams"]
    got = exp.measure(_ctx(Gpu(break_copies=True), exp.settings_in(None)),
                      Point("streams", "duplex", {"n": 1024, "direction": "h2d"}))
    assert not got.check.passed and "differ" in got.check.detail
