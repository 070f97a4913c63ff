"""The shared correctness metric: rel_fro_error, computed block by block, must equal the plain
float64 formula (up to float64 rounding) and keep its rules for unwritten (non-finite)
outputs and zero references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab.experiments.base import (
    REL_FRO_CHUNK,
    Check,
    rel_fro_error,
    rel_fro_error_blocks,
    uniform_f32,
)

F64 = np.float64


def naive(out, ref) -> float:
    """The definition: norm(o - r) / norm(r) on full float64 copies (r = 0: divide by 1)."""
    o = np.asarray(out).astype(F64)
    r = np.asarray(ref).astype(F64)
    if not np.isfinite(o).all():
        return math.inf
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (denom if denom > 0 else 1.0))


def pair(rng, shape, out_dtype=np.float32, ref_dtype=F64, scale=1e-6):
    """A reference and an output off by a relative `scale` (like a float32 kernel's)."""
    ref = rng.standard_normal(shape).astype(ref_dtype)
    out = (ref * (1 + scale * rng.standard_normal(shape))).astype(out_dtype)
    return out, ref


def close(a: float, b: float, rel: float = 1e-12) -> bool:
    return a == b or abs(a - b) <= rel * abs(b)


ODD_LENGTHS = [1, 2, 7, 1000, REL_FRO_CHUNK - 1, REL_FRO_CHUNK, REL_FRO_CHUNK + 1,
               3 * REL_FRO_CHUNK + 12_345]


@pytest.mark.parametrize("n", ODD_LENGTHS)
@pytest.mark.parametrize("out_dtype,ref_dtype", [(np.float32, F64), (np.float32, np.float32),
                                                 (F64, F64), (F64, np.float32)])
def test_blockwise_equals_the_float64_formula_on_odd_lengths(n, out_dtype, ref_dtype):
    rng = np.random.default_rng(n)
    out, ref = pair(rng, n, out_dtype, ref_dtype)
    got, want = rel_fro_error(out, ref), naive(out, ref)
    assert isinstance(got, float)
    assert 0 < want < 1e-4
    assert close(got, want), (got, want)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (333, 517), (1000, 1000), (257, 3, 129)])
def test_blockwise_equals_the_formula_on_matrices(shape):
    rng = np.random.default_rng(sum(shape))
    out, ref = pair(rng, shape)
    assert close(rel_fro_error(out, ref), naive(out, ref))


def test_non_contiguous_views_and_lists():
    rng = np.random.default_rng(3)
    out, ref = pair(rng, (300, 401))
    for o, r in [(out.T, ref.T), (out[::3, 1::2], ref[::3, 1::2]),
                 (out[:, ::-1], ref[:, ::-1]), (np.asfortranarray(out), ref)]:
        assert close(rel_fro_error(o, r), naive(o, r))
    assert close(rel_fro_error([1.0, 2.0, 3.5], [1.0, 2.0, 3.0]), naive([1, 2, 3.5], [1, 2, 3]))
    assert close(rel_fro_error(np.arange(10), np.arange(10) + 1.0),
                 naive(np.arange(10), np.arange(10) + 1.0))


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 1000, 1 << 20])
def test_any_block_size_gives_the_same_value(chunk):
    rng = np.random.default_rng(chunk)
    out, ref = pair(rng, 4321)
    flat = ref.reshape(-1)
    got = rel_fro_error_blocks(out, lambda i, j: flat[i:j], chunk)
    assert close(got, naive(out, ref))


def test_a_reused_float32_reference_buffer_is_converted_exactly():
    rng = np.random.default_rng(4)
    out, ref = pair(rng, 10_001, ref_dtype=np.float32)
    buf = np.empty(97, np.float32)

    def block(i, j):  # one buffer reused by every call, as vector_add's reference does
        buf[: j - i] = ref[i:j]
        return buf[: j - i]

    assert close(rel_fro_error_blocks(out, block, 97), naive(out, ref))


def test_equal_arrays_give_exactly_zero():
    x = uniform_f32(np.random.default_rng(5), 3 * REL_FRO_CHUNK + 1)
    assert rel_fro_error(x, x) == 0.0
    assert rel_fro_error(x, x.astype(F64)) == 0.0
    assert rel_fro_error(np.zeros(0, np.float32), np.zeros(0)) == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, REL_FRO_CHUNK - 1, REL_FRO_CHUNK, -1])
def test_any_non_finite_output_gives_inf(bad, where):
    rng = np.random.default_rng(6)
    out, ref = pair(rng, 2 * REL_FRO_CHUNK + 7)
    out[where] = bad
    assert rel_fro_error(out, ref) == math.inf
    assert rel_fro_error(out.reshape(-1, 3), ref.reshape(-1, 3)) == math.inf
    assert not Check(rel_fro_error(out, ref), 1.0, "rel_fro").passed


def test_non_finite_output_where_the_reference_is_also_non_finite_gives_inf():
    # inf - inf = NaN: the block is still found non-finite, and the output's inf wins
    out = np.array([1.0, np.inf, 2.0], np.float32)
    assert rel_fro_error(out, np.array([1.0, np.inf, 2.0])) == math.inf
    assert rel_fro_error(np.full(5, np.nan, np.float32), np.full(5, np.nan)) == math.inf


def test_a_fully_unwritten_output_gives_inf():
    out = np.full((64, 64), np.nan, np.float32)
    assert rel_fro_error(out, np.ones((64, 64))) == math.inf


def test_zero_reference_gives_the_absolute_error():
    out = np.array([3.0, 4.0, 0.0], np.float32)
    assert rel_fro_error(out, np.zeros(3)) == 5.0
    assert rel_fro_error(np.zeros((4, 7)), np.zeros((4, 7))) == 0.0
    rng = np.random.default_rng(7)
    big = rng.standard_normal(REL_FRO_CHUNK + 3).astype(np.float32)
    assert close(rel_fro_error(big, np.zeros_like(big)), naive(big, np.zeros_like(big)))


def test_non_finite_reference_or_overflow_behaves_like_the_formula():
    # NaN in the reference (finite output): NaN, as the dense formula gives; a check fails
    out = np.ones(10, np.float32)
    ref = np.ones(10)
    ref[3] = np.nan
    assert math.isnan(rel_fro_error(out, ref))
    assert not Check(rel_fro_error(out, ref), 1.0, "rel_fro").passed
    # finite values whose squares overflow float64: inf / inf = NaN, as in the formula
    with np.errstate(over="ignore", invalid="ignore"):
        o = np.array([1e200, -1e200])
        r = np.array([-1e200, 1e200])
        want = naive(o, r)
        got = rel_fro_error(o, r)
    assert math.isnan(want) and math.isnan(got)


def test_shapes_that_only_broadcast_use_the_plain_formula():
    out = np.array([[1.0, 2.0], [3.0, 4.0]])
    ref = np.array([1.0, 2.5])
    assert close(rel_fro_error(out, ref), np.linalg.norm(out - ref) / np.linalg.norm(ref))


def test_a_reference_block_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="returned shape"):
        rel_fro_error_blocks(np.ones(10), lambda i, j: np.ones(3), 4)


def test_uniform_f32_draws_in_range_and_reproducibly():
    a = uniform_f32(np.random.default_rng(8), (3, 1000), -2.0, 3.0)
    b = uniform_f32(np.random.default_rng(8), (3, 1000), -2.0, 3.0)
    assert a.dtype == np.float32 and a.shape == (3, 1000)
    assert np.array_equal(a, b) and a.min() >= -2.0 and a.max() < 3.0


def test_an_8_byte_output_is_poisoned_with_nan_words():
    """verify_then_time poisons float64 outputs too: all-ones 32-bit words, two per element,
    read back as NaN, so an element the kernel does not write fails its check."""
    from types import SimpleNamespace

    from cudalab.experiments.base import Experiment, RunContext
    from cudalab.harness import Harness, Settings, WallTimer

    dev = np.zeros(6, np.float64)
    calls = []

    def memset_d32(d, word, count):
        calls.append((word, count))
        d.view(np.uint32)[:count] = word

    cuda = SimpleNamespace(memset_d32=memset_d32,
                           memcpy_dtoh=lambda host, d: np.copyto(host, d))
    gpu = SimpleNamespace(cuda=cuda, synchronize=lambda: None)
    ctx = RunContext(gpu=gpu, harness=Harness(Settings(warmup=0, min_samples=1,
                                                       max_samples=1)),
                     rng=np.random.default_rng(0), config={}, block={})
    host = np.zeros(6, np.float64)
    seen = []

    def launch():
        dev[:3] = 1.0  # writes half of its output

    Experiment().verify_then_time(ctx, launch, lambda out: seen.append(out.copy()),
                                  output=(dev, host), timer=WallTimer())
    assert calls == [(0xFFFFFFFF, 12)]
    assert (seen[0][:3] == 1.0).all() and np.isnan(seen[0][3:]).all()
