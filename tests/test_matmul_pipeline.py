"""The ladder's cp.async rungs (cuda/matmul/matmul_pipeline.cu: matmul_pipelined, matmul_swizzled)
on the CPU: a numpy transcription of their index arithmetic (tile loads, the A swizzle, the
thread ownership, the guarded epilogue) on odd sizes, the shared-memory bank groups one
LDS.128 of A touches with and without the swizzle, the tile rules and their schema.

The GPU side: tests/gpu/test_matmul_ladder_gpu.py."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from cudalab import config as cfg
from cudalab.experiments import matmul as mm
from cudalab.experiments.base import Point

ROOT = Path(__file__).resolve().parent.parent
PIPE_CU = (ROOT / "cuda" / "matmul/matmul_pipeline.cu").read_text()


def _d(t: dict[str, int]) -> dict[str, int]:
    return mm.kernel_defines(Point("matmul", "swizzled", dict(t)))


def a_swz(r: int, bk: int, wtm: int, slab: int = 0) -> int:
    sch = min(bk, 16) // 4 if slab else bk // 4  # chunks in a row of a slab
    return (r // (8 // sch)) & (wtm * sch // 8 - 1)


def a_off(r: int, c: int, bk: int, wtm: int, swizzled: bool, bm: int = 0, slab: int = 0) -> int:
    """Float offset of 16-byte chunk c of row r in the A tile (a_off in the kernel): slab
    c // sch of bm rows (slab: 16-deep k slabs; otherwise one slab of bk), its row r."""
    ak = min(bk, 16) if slab else bk
    s, cc = divmod(c, ak // 4)
    return s * bm * ak + r * ak + 4 * ((cc ^ a_swz(r, bk, wtm, slab)) if swizzled else cc)


def pipe_ownership(d: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Thread t's tile-relative rows (TM, spaced WTM) and columns (TN, float4 groups spaced
    4*WTN): arow = (warp / NWN) * WM + lane / WTN, bcol = (warp % NWN) * WN + (lane % WTN) * 4."""
    wtn = 32 // d["WTM"]
    tm, tn, nwn = d["WM"] // d["WTM"], d["WN"] // wtn, d["BN"] // d["WN"]
    tid = np.arange(d["NTHREADS"])
    warp, lane = tid // 32, tid % 32
    arow = (warp // nwn) * d["WM"] + lane // wtn
    bcol = (warp % nwn) * d["WN"] + (lane % wtn) * 4
    rows = arow[:, None] + d["WTM"] * np.arange(tm)
    cols = (bcol[:, None, None] + 4 * wtn * np.arange(tn // 4)[:, None] + np.arange(4)).reshape(
        len(tid), tn)
    return rows, cols


def _load_stage(A, B, d, r0, c0, k0, interior, swizzled):
    """load_stage / load_stage_interior: every chunk of the A (row-major, swizzled) and B
    tiles once; the interior path copies 16-byte-aligned chunks of in-bounds data only."""
    M, K = A.shape
    N = B.shape[1]
    bm, bn, bk = d["BM"], d["BN"], d["BK"]
    As, Bs = np.full(bm * bk, np.nan), np.full(bk * bn, np.nan)
    for e in range(bm * bk // 4):
        r, c = e // (bk // 4), e % (bk // 4)
        gr, gc = r0 + r, k0 + 4 * c
        if interior:
            assert gr < M and gc + 3 < K and (gr * K + gc) % 4 == 0
        v = [A[gr, gc + j] if gr < M and gc + j < K else 0.0 for j in range(4)]
        o = a_off(r, c, bk, d["WTM"], swizzled, bm, d.get("SLAB", 0))
        assert np.isnan(As[o:o + 4]).all()  # no chunk written twice
        As[o:o + 4] = v
    for e in range(bk * bn // 4):
        r, c = e // (bn // 4), e % (bn // 4)
        gr, gc = k0 + r, c0 + 4 * c
        if interior:
            assert gr < K and gc + 3 < N and (gr * N + gc) % 4 == 0
        Bs[r * bn + 4 * c:r * bn + 4 * c + 4] = [
            B[gr, gc + j] if gr < K and gc + j < N else 0.0 for j in range(4)]
    return As, Bs


def emulate_pipeline(A, B, d, swizzled):
    """The kernel on the CPU, block by block: stages loaded as the kernel does (interior or
    guarded), A read as float4 along k at the swizzled offsets, C stored by put_c4."""
    from test_matmul import _store_c4

    M, K = A.shape
    N = B.shape[1]
    bm, bn, bk = d["BM"], d["BN"], d["BK"]
    rows, cols = pipe_ownership(d)
    C, writes = np.full((M, N), np.nan), np.zeros((M, N), int)
    for by, bx in itertools.product(range(-(-M // bm)), range(-(-N // bn))):
        r0, c0 = by * bm, bx * bn
        interior = r0 + bm <= M and c0 + bn <= N and K % bk == 0 and N % 4 == 0
        acc = np.zeros((len(rows), rows.shape[1], cols.shape[1]))
        for k0 in range(0, K, bk):
            As, Bs = _load_stage(A, B, d, r0, c0, k0, interior, swizzled)
            for c in range(bk // 4):
                offs = np.vectorize(lambda r, c=c: a_off(r, c, bk, d["WTM"], swizzled, bm,
                                                         d.get("SLAB", 0)))(rows)
                a = As[offs[..., None] + np.arange(4)]  # (threads, TM, 4 k)
                for kk in range(4):
                    b = Bs[(4 * c + kk) * bn + cols]
                    acc += a[:, :, kk, None] * b[:, None, :]
        assert not np.isnan(acc).any()
        for t, (i, j) in itertools.product(range(len(rows)), itertools.product(
                range(rows.shape[1]), range(0, cols.shape[1], 4))):
            _store_c4(C, writes, r0 + rows[t, i], c0 + cols[t, j], acc[t, i, j:j + 4])
    return C, writes


TILES = [mm._pt(64, 64, 16, 32, 32, 4, 3, 128), mm._pt(32, 64, 8, 32, 32, 8, 2, 64),
         mm._pt(64, 32, 32, 32, 32, 4, 2, 64), mm._pt(64, 32, 32, 32, 32, 4, 2, 64, slab=1)]


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("mkn", [(5, 7, 3), (33, 65, 17), (64, 64, 64), (70, 36, 68)])
def test_pipeline_index_arithmetic_on_odd_sizes(tile, swizzled, mkn):
    rng = np.random.default_rng(sum(mkn))
    a, b = rng.uniform(-1, 1, mkn[:2]), rng.uniform(-1, 1, mkn[1:])
    c, writes = emulate_pipeline(a, b, _d(tile), swizzled)
    assert (writes == 1).all()  # every element written once, nothing outside C
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tile", mm.DEFAULT_PIPE_TILES)
def test_default_tiles_own_every_output_once(tile):
    rows, cols = pipe_ownership(_d(tile))
    owned = np.zeros((tile["bm"], tile["bn"]), int)
    for t in range(len(rows)):
        owned[np.ix_(rows[t], cols[t])] += 1
    assert (owned == 1).all()


def lds128_wavefronts(words) -> int:
    """Shared-memory wavefronts of one warp-wide 128-bit load, half a warp at a time: within a
    half, distinct 16-byte chunks in one of the 8 four-bank groups are served one after
    another (the same chunk is a broadcast). ncu's counts on the H100 (NOTES.md) agree: no
    conflict where two rows of one load share a group but sit in different halves."""
    passes = 0
    for h in range(0, len(words), 16):
        groups: dict[int, set[int]] = {}
        for w in words[h:h + 16]:
            assert int(w) % 4 == 0
            groups.setdefault((int(w) // 4) % 8, set()).add(int(w) // 4)
        passes += max(len(s) for s in groups.values())
    return passes


def _a_read_passes(t: dict[str, int], swizzled: bool) -> int:
    rows, _ = pipe_ownership(_d(t))
    warp0 = rows[:32]
    return max(lds128_wavefronts([a_off(r, c, t["bk"], t["wtm"], swizzled, t["bm"],
                                        t.get("slab", 0))
                                  for r in warp0[:, i]])
               for i in range(warp0.shape[1]) for c in range(t["bk"] // 4))


@pytest.mark.parametrize("bk", [8, 16, 32])
@pytest.mark.parametrize("wtm", [4, 8])
def test_the_swizzle_spreads_a_warps_a_reads_over_the_bank_groups(bk, wtm):
    t = mm._pt(64, 128, bk, 32, 64, wtm, 2, 128)
    # a half warp reads wtm/2 consecutive rows of bk/4 chunks; 8/(bk/4) rows fill the 8 bank
    # groups once, further rows land on the same groups again
    assert _a_read_passes(t, False) == 2 * max(1, wtm * bk // 64)
    assert _a_read_passes(t, True) == 2


def test_the_measured_conflicts():
    # ncu on the H100: 134M A-load conflicts for the plain layout at bk 32 (wtm 4), none at
    # bk 16 (wtm 4), none with the swizzle
    assert _a_read_passes(mm._pt(64, 128, 32, 32, 64, 4, 2, 128), False) == 4
    assert _a_read_passes(mm._pt(64, 128, 16, 32, 64, 4, 2, 128), False) == 2
    assert _a_read_passes(mm._pt(64, 128, 32, 32, 64, 4, 2, 128), True) == 2
    # 16-deep k slabs read at bk 32 as bk 16 does, without the swizzle's registers
    assert _a_read_passes(mm._pt(64, 128, 32, 32, 64, 4, 2, 128, slab=1), False) == 2


def test_b_reads_and_a_copies_are_conflict_free():
    for t in mm.DEFAULT_PIPE_TILES:
        d = _d(t)
        _, cols = pipe_ownership(d)
        for j in range(0, cols.shape[1], 4):
            assert lds128_wavefronts(cols[:32, j]) == 2  # one k row of B, 16 bytes a lane
        ach = d["BK"] // 4
        for sw in (False, True):  # a warp's cp.async chunks: 32 distinct, 4 wavefronts
            offs = [a_off(e // ach, e % ach, d["BK"], d["WTM"], sw) for e in range(32)]
            assert len(set(offs)) == 32 and lds128_wavefronts(offs) == 4


def test_a_thread_shares_one_swizzle_over_its_rows():
    for t in mm.DEFAULT_PIPE_TILES + TILES:
        rows, _ = pipe_ownership(_d(t))
        swz = np.vectorize(lambda r, t=t: a_swz(r, t["bk"], t["wtm"]))(rows)
        assert (swz == swz[:, :1]).all()


def test_kernel_source_matches_the_python_rules():
    assert "NTHREADS == (BM / WM) * (BN / WN) * 32" in PIPE_CU
    assert "STAGES * 4 * BK * (BM + BN) <= 48 * 1024" in PIPE_CU
    assert "cp.async.cg.shared.global [%0], [%1], 16;" in PIPE_CU
    assert "cp.async.wait_group %0;" in PIPE_CU
    assert "return (r / (8 / SCH)) & (WTM * SCH / 8 - 1);" in PIPE_CU  # a_swz above
    assert "return s * (BM * AK) + r * AK + ((SWZ ? (cc ^ a_swz(r)) : cc) << 2);" in PIPE_CU
    for name in ("matmul_pipelined", "matmul_swizzled"):
        assert f"\n{name}(" in PIPE_CU, name
    enums = mm.PIPE_ENUMS
    assert set(enums["wtm"]) == {4, 8} and set(enums["bk"]) == {8, 16, 32}
    assert re.search(r"STAGES >= 2 && STAGES <= 8", PIPE_CU) and enums["stages"] == list(
        range(2, 9))
    for knob in ("KORDER == 1", "KORDER == 2", "FRAGDB", "SLAB && BK > 16"):
        assert f"#if {knob}" in PIPE_CU or f"#elif {knob}" in PIPE_CU, knob
    with pytest.raises(cfg.ConfigError):
        cfg.validate({"experiments": {"matmul": {"pipe_tiles": [
            mm.DEFAULT_PIPE_TILES[0] | {"korder": 3}]}}})


def test_defines_launch_geometry_and_points():
    dims = {"m": 1000, "k": 4100, "n": 37}
    p = Point("matmul", "pipelined", dims | mm._pt(128, 128, 16, 64, 32, 8, 3, 256))
    assert mm.kernel_source(p) == "matmul/matmul_pipeline.cu"
    assert mm.kernel_defines(p) == {"BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 32,
                                    "WTM": 8, "STAGES": 3, "NTHREADS": 256}
    assert mm.launch_geometry(p) == ((1, 8), (256, 1, 1))
    q = Point("matmul", "swizzled", dims | mm.DEFAULT_PIPE_TILES[0] | {"korder": 1})
    assert mm.kernel_defines(q) == {"BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64,
                                    "WTM": 4, "STAGES": 2, "NTHREADS": 128, "KORDER": 1}
    assert mm.launch_geometry(q) == ((1, 16), (128, 1, 1))
    blk = cfg.validate({"experiments": {"matmul": {
        "sizes": [64], "variants": ["swizzled"],
        "pipe_tiles": [mm.DEFAULT_PIPE_TILES[0],
                       mm.DEFAULT_PIPE_TILES[1] | {"korder": 0}]}}}
    )["experiments"]["matmul"]
    pts = mm.Matmul().points(blk)
    assert [x.point_id for x in pts] == [  # the optional keys only where they are set
        "swizzled-m64-k64-n64-bm64-bn128-bk16-wm32-wn64-wtm4-stages2-threads128-korder2",
        "swizzled-m64-k64-n64-bm64-bn128-bk16-wm32-wn64-wtm4-stages4-threads128"]


def test_pipe_tile_rules_say_what_is_wrong():
    assert all(mm.check_pipe_tile(t) == [] for t in mm.DEFAULT_PIPE_TILES + TILES)
    assert mm.pipe_geometry(mm.DEFAULT_PIPE_TILES[1])["smem"] == 48 * 1024
    bad = mm._pt(128, 128, 32, 64, 64, 4, 3, 256)
    msgs = mm.check_pipe_tile(bad)
    assert any("threads=256 must be (bm/wm)*(bn/wn)*32 = 128" in m for m in msgs)
    assert any("static shared memory" in m and "fewer stages" in m for m in msgs)
    odd = mm.check_pipe_tile(mm._pt(64, 64, 16, 32, 16, 4, 2, 128))
    assert any("wn=16 of 4*32/wtm = 32" in m for m in odd)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.validate({"experiments": {"matmul": {"pipe_tiles": [bad]}}})
    assert "pipe_tiles[0]" in str(e.value)
    with pytest.raises(cfg.ConfigError):
        cfg.validate({"experiments": {"matmul": {"pipe_tiles": [bad | {"wtm": 2}]}}})
