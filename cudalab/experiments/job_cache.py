"""The job's cache of built kernels and device buffers, kept across the points of one job,
and the move of every cached device buffer to a fresh allocation between trials (so a
point's trials do not all read the same placement of its data).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:

    pass


class JobCache(dict[Any, Any]):
    """Per-job scratch: inputs, CPU references, host buffers, driver handles.

    keep(key, make): made on first use, kept for the whole job.
    one_per_slot(slot, key, make): one value per slot at a time. Points are ordered by size,
    so when a new key comes the slot's previous value (the previous size) is dropped and its
    device allocations are freed: one size in memory, other slots untouched.

    Trials (cudalab.trials) move a point's device buffers between measurements, so each
    trial sees another placement (DRAM pages, L2 slices) while the host inputs and CPU
    references stay: replace_device() moves every cached device allocation, and retire()
    keeps an allocation a measurement made itself alive until the point's trials end
    (release_retired), so the next trial's allocations cannot land on it again. Outside a
    point's trials (`holding` False: one trial, the profiler's child, a script calling
    measure()) retire() frees at once."""

    def __init__(self) -> None:
        super().__init__()
        self._slots: dict[str, Any] = {}
        self._retired: list[Any] = []
        self.holding = False  # set by cudalab.trials while a point's trials run

    def keep(self, key: Any, make: Callable[[], Any]) -> Any:
        if key not in self:
            self[key] = make()
        return self[key]

    def one_per_slot(self, slot: str, key: Any, make: Callable[[], Any]) -> Any:
        old = self._slots.get(slot)
        if old == key and key in self:
            return self[key]
        if old is not None and old in self:
            free_all(self.pop(old))
        self._slots[slot] = key
        self[key] = make()
        return self[key]

    def retire(self, *values: Any) -> None:
        """Free these (device allocations, or objects with free()) when the point's trials
        end, not now: a later trial's allocations then land elsewhere."""
        self._retired.extend(values)
        if not self.holding:
            self.release_retired()

    def release_retired(self) -> None:
        retired, self._retired = self._retired, []
        for v in retired:
            free_all(v)

    def replace_device(self, cuda: Any) -> tuple[int, int]:
        """Move every device allocation held in the cache (in dicts, lists and tuples) to a
        new allocation of the same size: allocate, copy device to device, retire the old one
        (new before free, so the address changes). Returns (moved, kept in place: no memory
        for a second copy even after the retired ones were freed)."""
        counts = [0, 0]
        for key in list(self):
            self[key] = _replaced(self[key], cuda, self, counts)
        return counts[0], counts[1]


def is_device_allocation(value: Any) -> bool:
    """A pycuda DeviceAllocation (by name: pycuda is not imported on CPU-only machines)."""
    return type(value).__name__ == "DeviceAllocation"


def _replaced(value: Any, cuda: Any, cache: JobCache, counts: list[int]) -> Any:
    """`value` with its device allocations moved (containers rebuilt or updated in place)."""
    if is_device_allocation(value):
        return _move(value, cuda, cache, counts)
    if isinstance(value, dict):
        for k in list(value):
            value[k] = _replaced(value[k], cuda, cache, counts)
    elif isinstance(value, list):
        value[:] = [_replaced(v, cuda, cache, counts) for v in value]
    elif isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_replaced(v, cuda, cache, counts) for v in value)
    return value


def _move(old: Any, cuda: Any, cache: JobCache, counts: list[int]) -> Any:
    _, size = cuda.mem_get_address_range(int(old))
    try:
        new = cuda.mem_alloc(size)
    except Exception:  # noqa: BLE001 - out of memory: free what earlier trials left, retry
        cache.release_retired()
        try:
            new = cuda.mem_alloc(size)
        except Exception:  # noqa: BLE001 - no room for two copies: it stays where it is
            counts[1] += 1
            return old
    cuda.memcpy_dtod(new, old, size)
    cache.retire(old)
    counts[0] += 1
    return new


def free_all(value: Any) -> None:
    """Free the device allocations in a cached value (a dict, tuple or list of them, or
    one); host arrays and anything already freed are left alone."""
    items = value.values() if isinstance(value, dict) else (
        value if isinstance(value, (list, tuple)) else [value])
    for v in items:
        if hasattr(v, "free") and not isinstance(v, np.ndarray):
            try:
                v.free()
            except Exception:  # noqa: BLE001 - already freed / context gone
                pass
