"""Stand-ins for pieces of pycuda.driver that CPU tests of an experiment's measure() path
share (imported by name: tests/ is on sys.path while pytest collects it)."""

from __future__ import annotations

import time


class FakeEvent:
    """A CUDA event timed with the host clock: time_since() in milliseconds, as pycuda's."""

    def record(self, stream=None):
        self.t = time.perf_counter()
        return self

    def synchronize(self):
        return self

    def time_since(self, other):
        return (self.t - other.t) * 1e3


class SimGpu:
    """A default stream on a simulated device beside a simulated host clock, for the CPU
    tests of the harness's timing methods. Every launch costs the host `launch_s` and the
    device `kernel_s`; the device runs work in order, each item no earlier than the host
    issued it. While the stream is held (hold()), work queues; the hold ends when the host
    sets flag[0] (the host-mapped release word) or `timeout_s` after it began, and then
    flag[1] says it timed out, as cuda/common/hold.cu does."""

    def __init__(self, launch_s: float, kernel_s: float, timeout_s: float = float("inf")):
        self.launch_s, self.kernel_s, self.timeout_s = launch_s, kernel_s, timeout_s
        self.host = 0.0  # host clock
        self.device = 0.0  # when the device finishes the work issued so far
        self.held_since: float | None = None
        self.pending: list[tuple[float, object]] = []
        self.flag = SimFlag(self)
        self.launches = 0

    def launch(self) -> None:
        """The fn under test: one kernel launch."""
        self.host += self.launch_s
        self.launches += 1
        self._submit(self.host, None)

    def hold(self) -> None:
        self.host += self.launch_s
        self._submit(self.host, None, kernel_s=0.0)
        self.held_since = self.host

    def release(self) -> None:
        assert self.held_since is not None, "released a stream that was not held"
        ends = self.held_since + self.timeout_s
        self.flag.words[1] = int(self.host > ends)
        self.device = max(self.device, min(self.host, ends))
        self.held_since, pending = None, self.pending
        self.pending = []
        for t, event in pending:
            self._run(t, event, self.kernel_s)

    def _submit(self, t: float, event: object, kernel_s: float | None = None) -> None:
        if self.held_since is not None:
            self.pending.append((t, event))
        else:
            self._run(t, event, self.kernel_s if kernel_s is None else kernel_s)

    def _run(self, t: float, event: object, kernel_s: float) -> None:
        start = max(self.device, t)
        if event is None:
            self.device = start + kernel_s
        else:
            event.t = start
            self.device = start

    # the pieces of pycuda.driver the timers use
    def Event(self) -> SimEvent:  # noqa: N802 - pycuda's name
        return SimEvent(self)


class SimFlag:
    """The host-mapped [release, timed_out] words: setting word 0 releases the stream."""

    def __init__(self, gpu: SimGpu) -> None:
        self.gpu, self.words = gpu, [0, 0]

    def __getitem__(self, i: int) -> int:
        return self.words[i]

    def __setitem__(self, i: int, v: int) -> None:
        self.words[i] = v
        if i == 0 and v and self.gpu.held_since is not None:
            self.gpu.release()


class SimEvent:
    """A CUDA event on the simulated device (pycuda's record / synchronize / time_since)."""

    def __init__(self, gpu: SimGpu) -> None:
        self.gpu, self.t = gpu, None

    def record(self, stream=None):
        assert stream is None, "the simulation has the default stream only"
        self.t = None
        self.gpu._submit(self.gpu.host, self)
        return self

    def synchronize(self):
        assert self.t is not None, "synchronized on an event still held: would hang"
        self.gpu.host = max(self.gpu.host, self.t)
        return self

    def time_since(self, other):
        return (self.t - other.t) * 1e3
