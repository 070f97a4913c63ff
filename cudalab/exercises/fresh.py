"""Fresh inputs for every timed sample, made on the device from a seed, and the check of a
timed launch's output against the content it actually read.

A kernel must never see the same input content twice while it is timed: a cache keyed on
pointers and a few sampled values (or on anything else) then never hits. Copying fresh
host arrays before every sample would cost more than the samples, so the inputs are
regenerated on the GPU by a counter-based generator: element i of an input is a function
of (i, seed) only, and the host computes the very same float for any element it needs. A
timed output is checked on a random subset of its elements against a float64 reference of
those elements (matmul: a few hundred dot products; a sum: the whole input, generated
vectorised), and every element is checked for the poison (never written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from cudalab.exercises import slots
from cudalab.exercises.catalog import Exercise
from cudalab.kernel_slot import Check

SUBSET = 4096  # elements of a vector add's or a transpose's output checked per sample
DOT_SUBSET = 256  # elements of a product checked per sample (each a K-long dot product)
FILL_THREADS = 256
FILL_MAX_BLOCKS = 4096
DIRTY_SMEM_BYTES = 48 * 1024  # the most a block takes without opting in
DIRTY_BLOCKS_PER_SM = 8  # more than fit at once: every SM's shared memory is written
NAN_WORD = 0x7FC00000

# The generator, on the device; value() must stay bit-identical to values() below: an
# integer hash, its top 24 bits as an exact float in [0, 1) (or [-1, 1) centred), written
# as float or double. No rounding happens anywhere, so no FMA contraction can differ.
SOURCE = r"""
__host__ __device__ __forceinline__ float cudalab_value(unsigned i, unsigned seed, int centred)
{
    unsigned h = i * 0x9E3779B9u + seed;
    h ^= h >> 16; h *= 0x7FEB352Du; h ^= h >> 15; h *= 0x846CA68Bu; h ^= h >> 16;
    int v = (int)(h >> 8);
    return centred ? (float)(v - (1 << 23)) * 0x1p-23f : (float)v * 0x1p-24f;
}
extern "C" __global__ void cudalab_fresh_f32(float* x, unsigned n, unsigned seed, int centred)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = cudalab_value(i, seed, centred);
}
// Leaves NaN words all over each SM's shared memory: a kernel that reads shared memory it
// never wrote (stale from an earlier block) then reads NaN, not a lucky zero.
extern "C" __global__ void cudalab_dirty_shared(unsigned word, unsigned words)
{
    extern __shared__ unsigned cudalab_smem[];
    volatile unsigned* s = cudalab_smem;
    for (unsigned i = threadIdx.x; i < words; i += blockDim.x) s[i] = word;
}
extern "C" __global__ void cudalab_fresh_f64(double* x, unsigned n, unsigned seed, int centred)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = (double)cudalab_value(i, seed, centred);
}
"""

# fill(device buffer, element count, dtype, seed, centred): the inputs rewritten in place
Filler = Callable[[Any, int, np.dtype, int, bool], None]


def values(index: np.ndarray, seed: int, centred: bool) -> np.ndarray:
    """Elements `index` of the input made from `seed` (float32, as the device makes them)."""
    with np.errstate(over="ignore"):
        h = np.asarray(index, dtype=np.uint32) * np.uint32(0x9E3779B9) + np.uint32(seed)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x7FEB352D)
        h ^= h >> np.uint32(15)
        h *= np.uint32(0x846CA68B)
        h ^= h >> np.uint32(16)
    v = (h >> np.uint32(8)).astype(np.int64)
    if centred:
        return ((v - (1 << 23)).astype(np.float32) * np.float32(2.0 ** -23)).astype(np.float32)
    return (v.astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)


def centred(ex: Exercise) -> bool:
    """Uniform in [-1, 1) as the slot's own inputs, or in [0, 1) for a sum."""
    return ex.kind != "reduction"


def input_seeds(seed: int, count: int) -> list[int]:
    """One seed per input of the slot, all from the sample's seed."""
    return [(seed + 0x632BE5AB * (j + 1)) & 0xFFFFFFFF for j in range(count)]


def device_filler(gpu: Any) -> Filler:
    """A Filler that launches the generator on the GPU, then leaves NaN in every SM's
    shared memory, and waits for both, so they are outside the sample's events and its
    wall-clock time alike."""
    from pycuda.compiler import SourceModule

    mod = SourceModule(SOURCE, no_extern_c=True, options=["-O3"])
    funcs = {np.dtype(np.float32): mod.get_function("cudalab_fresh_f32"),
             np.dtype(np.float64): mod.get_function("cudalab_fresh_f64")}
    for f in funcs.values():
        f.prepare("PIIi")
    dirty = mod.get_function("cudalab_dirty_shared")
    dirty.prepare("II")
    sms = int(gpu.attr("MULTIPROCESSOR_COUNT"))

    def fill(buf: Any, n: int, dtype: np.dtype, seed: int, centre: bool) -> None:
        blocks = max(1, min(FILL_MAX_BLOCKS, -(-n // FILL_THREADS)))
        funcs[np.dtype(dtype)].prepared_call((blocks, 1), (FILL_THREADS, 1, 1), buf,
                                             np.uint32(n), np.uint32(seed), np.int32(centre))
        dirty.prepared_call((DIRTY_BLOCKS_PER_SM * sms, 1), (FILL_THREADS, 1, 1),
                            np.uint32(NAN_WORD), np.uint32(DIRTY_SMEM_BYTES // 4),
                            shared_size=DIRTY_SMEM_BYTES)
        gpu.synchronize()

    return fill


def check(ex: Exercise, case: slots.Case, seed: int, out: np.ndarray, launches: int,
          rng: np.random.Generator) -> tuple[Check, dict[str, Any] | None]:
    """A timed output (`out`, copied back whole) against the inputs made from `seed`:
    unwritten elements anywhere, and a float64 reference on a random subset (a sum: the
    whole input). (the check, the first wrong element or None)."""
    unwritten = int(np.count_nonzero(~np.isfinite(out))) if ex.kind != "reduction" else 0
    idx, got, exp, c = _subset(ex, case, seed, out, launches, rng)
    if unwritten and c.passed:
        c = Check(float("inf"), c.tolerance, c.metric, f"{unwritten} unwritten elements")
    if c.passed:
        return c, None
    tol = 10 * slots.tolerance(ex) if ex.kind in ("vector_add", "matmul") else 0.0
    wrong = slots.first_wrong(got, exp, tol)
    if wrong is not None:
        flat = int(idx[wrong["index"][0]])
        shape = out.shape
        wrong["index"] = ([int(v) for v in np.unravel_index(flat, shape)] if len(shape) > 1
                          else [flat])
        wrong["unwritten"] = unwritten
        wrong["checked"] = int(len(idx))
    return c, wrong


def _subset(ex: Exercise, case: slots.Case, seed: int, out: np.ndarray, launches: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, Check]:
    """(flat indices checked, their output values, their reference values, the check)."""
    seeds, centre = input_seeds(seed, len(case.inputs)), centred(ex)
    flat = out.reshape(-1)
    tol, slot = slots.tolerance(ex), slots.slot_of(ex)
    if ex.kind == "reduction":
        x = values(np.arange(case.inputs[0].size), seeds[0], centre)
        ref = float(np.sum(x, dtype=np.float64))
        c = slot.check(float(flat[0]), launches, x, tol)
        return np.zeros(1, np.int64), flat[:1], np.array([launches * ref]), c
    idx = np.sort(rng.choice(flat.size, min(flat.size, _subset_size(ex)), replace=False))
    got = flat[idx]
    if ex.kind == "vector_add":
        a = values(idx, seeds[0], centre)
        b = values(idx, seeds[1], centre)
        return idx, got, a.astype(np.float64) + b, slot.check(got, a, b, tol)
    if ex.kind == "transpose":
        rows, cols = case.size
        j, i = np.divmod(idx, rows)  # out is cols x rows: out[j][i] = in[i][j]
        exp = values(i * cols + j, seeds[0], centre)
        return idx, got, exp, slot.check(got, exp)
    m, k, n = case.size
    r, col = np.divmod(idx, n)
    kk = np.arange(k)
    a = values(r[:, None] * k + kk[None, :], seeds[0], centre).astype(np.float64)
    b = values(kk[None, :] * n + col[:, None], seeds[1], centre).astype(np.float64)
    exp = np.einsum("ij,ij->i", a, b)
    return idx, got, exp, slot.check(got, exp, tol)


def _subset_size(ex: Exercise) -> int:
    return DOT_SUBSET if ex.kind == "matmul" else SUBSET
