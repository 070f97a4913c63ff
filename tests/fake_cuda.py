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
