"""matmul on the CPU: config rules, grid expansion, launch geometry, a numpy transcription
of the kernels' index arithmetic (bounds on odd sizes, bank-conflict degrees), the expected
effects and figures on a synthetic results table, and the "skipped" status.

The GPU side runs in tests/gpu (smoke grid: every variant correct on a real device)."""

from __future__ import annotations

import copy
import itertools
import math
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeEvent

from cudalab import claims, course, figures, fmt, results
from cudalab import config as cfg
from cudalab.experiments import REGISTRY
from cudalab.experiments import matmul as mm
from cudalab.experiments.base import Experiment, Point, Result, RunContext, Skipped
from cudalab.harness import Harness, Settings, WallTimer

ROOT = Path(__file__).resolve().parent.parent
EXP = REGISTRY["matmul"]
CU = (ROOT / "cuda" / "matmul/matmul.cu").read_text()


def _err(block: dict) -> str:
    with pytest.raises(cfg.ConfigError) as e:
        cfg.validate({"experiments": {"matmul": block}})
    return str(e.value)


def _block(**kw) -> dict:
    return cfg.validate({"experiments": {"matmul": kw}})["experiments"]["matmul"]


# -- config --------------------------------------------------------------------------------
@pytest.mark.parametrize("block, needles", [
    ({"register_tiles": [{"rt": 3, "bt": 64, "bk": 16}]},
     ["experiments.matmul.register_tiles[0].rt", "3", "allowed values", "[2, 4, 8]"]),
    ({"register_tiles": [{"rt": 4, "bt": 48, "bk": 16}]},
     ["experiments.matmul.register_tiles[0].bt", "48", "[16, 32, 64, 128]"]),
    ({"register_tiles": [{"rt": 4, "bt": 64, "bk": 12}]},
     ["experiments.matmul.register_tiles[0].bk", "12", "[4, 8, 16, 32, 64]"]),
    ({"register_tiles": [{"rt": 4, "bt": 64}]},
     ["experiments.matmul.register_tiles[0]", "missing key 'bk'"]),
    ({"register_tiles": [{"rt": 4, "bt": 64, "bk": 8, "unroll": 2}]},
     ["experiments.matmul.register_tiles[0]", "'unroll'", "allowed keys"]),
    ({"tiles": [7]}, ["experiments.matmul.tiles[0]", "7", "allowed values", "[8, 16, 32]"]),
    ({"tiles": [64]}, ["experiments.matmul.tiles[0]", "64", "[8, 16, 32]"]),
    ({"variants": ["cuBLAS"]},
     ["experiments.matmul.variants[0]", "'cuBLAS'", "allowed values", "'cublas'",
      "'tiled_padded'", "'tiled_conflict'", "'register'"]),
])
def test_bad_values_name_the_key_and_the_allowed_values(block, needles):
    msg = _err(block)
    for n in needles:
        assert n in msg, (n, msg)


def test_more_than_1024_threads_is_refused_naming_the_entry():
    msg = _err({"register_tiles": [{"rt": 4, "bt": 64, "bk": 16},
                                   {"rt": 2, "bt": 128, "bk": 8}]})
    assert "experiments.matmul.register_tiles[1]:" in msg
    assert "register_tiles[0]" not in msg
    assert "4096 threads per block" in msg and "at most 1024" in msg and "rt >= 4" in msg


def test_blocks_of_less_than_two_warps_are_refused():
    msg = _err({"register_tiles": [{"rt": 8, "bt": 32, "bk": 8}]})
    assert "experiments.matmul.register_tiles[0]:" in msg
    assert "16 threads per block" in msg and "at least 64" in msg and "bt >= 64" in msg


def test_more_than_48_kib_of_shared_memory_is_refused():
    msg = _err({"register_tiles": [{"rt": 8, "bt": 128, "bk": 64}]})
    assert "experiments.matmul.register_tiles[0]:" in msg
    assert "66560 bytes of static shared memory" in msg and "49152" in msg


def test_matrices_past_32_bit_indexing_are_refused():
    msg = _err({"sizes": [1024, [65536, 65536, 16]]})
    assert "experiments.matmul.sizes[1]:" in msg and "sizes[0]" not in msg
    assert "4294967296 elements" in msg and "2147483647" in msg
    assert _block(sizes=[[46340, 46340, 16]])  # 46340^2 < 2^31


def test_cross_field_rule_matches_the_formulas_for_every_allowed_combination():
    for rt, bt, bk in itertools.product(mm.RT, mm.BT, mm.BK):
        msgs = EXP.check_config({"register_tiles": [{"rt": rt, "bt": bt, "bk": bk}]})
        threads = (bt // rt) ** 2
        smem = 4 * (bk * (bt + mm.APAD) + bk * bt)
        assert any("at most 1024" in m for m in msgs) == (threads > 1024), (rt, bt, bk)
        assert any("at least 64" in m for m in msgs) == (threads < 64), (rt, bt, bk)
        assert any("shared memory" in m for m in msgs) == (smem > 48 * 1024), (rt, bt, bk)


def test_defaults_and_smoke_grid_are_valid():
    b = _block()
    assert b["variants"] == mm.VARIANTS
    assert b["register_tiles"] == mm.DEFAULT_REGISTER_TILES
    assert EXP.check_config(b) == []
    smoke = _block(**copy.deepcopy(EXP.smoke))
    assert EXP.check_config(smoke) == []


def test_kernel_constants_match_the_python_rules():
    """The shared-memory formula and the 1024-thread rule mirror cuda/matmul/matmul.cu."""
    assert int(re.search(r"#define APAD (\d+)", CU).group(1)) == mm.APAD
    assert "__shared__ __align__(16) float As[BK][BM + APAD];" in CU
    assert "__shared__ __align__(16) float Bs[BK][BN];" in CU
    assert "#if NTHREADS > 1024" in CU
    for name in ("matmul_naive", "matmul_tiled", "matmul_tiled_padded",
                 "matmul_tiled_conflict", "matmul_register"):
        assert f"void {name}(" in CU or f"\n{name}(" in CU, name
    assert "matmul_transposed_b<TILE>(" in CU and "matmul_transposed_b<TILE + 1>(" in CU


# -- grid ----------------------------------------------------------------------------------
def test_default_grid_expansion_counts():
    """The grid of config.yaml (its matmul block adds float64 to the schema's default)."""
    b = cfg.load(ROOT / "config.yaml")["experiments"]["matmul"]
    assert b["vec4_tiles"] == mm.DEFAULT_VEC4_TILES and b["warp_tiles"] == mm.DEFAULT_WARP_TILES
    assert _block()["dtypes"] == ["float32"]
    pts = EXP.points(b)
    by = {}
    for p in pts:
        by[p.variant] = by.get(p.variant, 0) + 1
    n_sizes = len(b["sizes"])  # 6, up to 4096
    n_cpu = sum(max(mm._mkn(s)) <= b["cpu_max_size"] for s in b["sizes"])
    assert b["cpu_max_size"] == 2048 and n_cpu == 5
    assert b["dtypes"] == ["float32", "float64"]
    # float64: naive, tiled (every tile) and cuBLAS again, once per size
    assert by == {"cpu": n_cpu, "naive": 2 * n_sizes, "tiled": 2 * 3 * n_sizes,
                  "tiled_padded": 3 * n_sizes, "tiled_conflict": 3 * n_sizes,
                  "register": 3 * n_sizes, "vec4": 2 * n_sizes, "dbuf": 2 * n_sizes,
                  "warptile": 5 * n_sizes, "pipelined": 2 * n_sizes, "cublas": 2 * n_sizes}
    assert len(pts) == 185 and len({p.point_id for p in pts}) == 185
    assert sum(not p.gpu for p in pts) == n_cpu
    f64 = [p for p in pts if p.params.get("dtype") == "float64"]
    assert len(f64) == 5 * n_sizes and {p.variant for p in f64} == set(mm.FP64_VARIANTS)
    # float32 points keep the ids of the float32-only grid (the recorded references')
    assert "naive-m4096-k4096-n4096-tile16" in {p.point_id for p in pts}
    assert "naive-m4096-k4096-n4096-tile16-dtypefloat64" in {p.point_id for p in pts}
    # ordered by work, so inputs are made once per size
    work = [math.prod((p.params["m"], p.params["k"], p.params["n"])) for p in pts]
    assert work == sorted(work)


def test_register_and_cublas_points_carry_their_parameters():
    b = _block(sizes=[[160, 240, 320]], variants=["register", "cublas", "tiled_padded"],
               tiles=[16], register_tiles=[{"rt": 8, "bt": 128, "bk": 8}], dtypes=["float32"])
    pts = {p.variant: p for p in EXP.points(b)}
    assert pts["register"].params == {"m": 160, "k": 240, "n": 320, "rt": 8, "bt": 128, "bk": 8}
    assert pts["register"].point_id == "register-m160-k240-n320-rt8-bt128-bk8"
    assert pts["cublas"].params == {"m": 160, "k": 240, "n": 320}
    assert pts["tiled_padded"].point_id == "tiled_padded-m160-k240-n320-tile16"


def test_smoke_grid_covers_every_variant_and_odd_sizes():
    pts = EXP.points(_block(**copy.deepcopy(EXP.smoke)))
    assert {p.variant for p in pts} == set(mm.VARIANTS)
    dims = {(p.params["m"], p.params["k"], p.params["n"]) for p in pts}
    assert (5, 7, 3) in dims and (100, 100, 100) in dims and (160, 240, 320) in dims


def test_defines_and_launch_geometry_cover_the_output():
    P = lambda v, **kw: Point("matmul", v, {"m": 1000, "k": 999, "n": 37} | kw)  # noqa: E731
    assert mm.kernel_defines(P("naive", tile=16)) == {}
    assert mm.kernel_defines(P("tiled_conflict", tile=32)) == {"TILE": 32}
    assert mm.kernel_defines(P("register", rt=8, bt=128, bk=8)) == {
        "BM": 128, "BN": 128, "BK": 8, "RM": 8, "RN": 8}
    grid, block = mm.launch_geometry(P("register", rt=8, bt=128, bk=8))
    assert block == (16, 16, 1) and grid == (1, 8)
    grid, block = mm.launch_geometry(P("tiled", tile=32))
    assert block == (32, 32, 1) and grid == (2, 32)
    for rt, bt in itertools.product(mm.RT, mm.BT):
        grid, block = mm.launch_geometry(P("register", rt=rt, bt=bt, bk=8))
        assert grid[0] * bt >= 37 and grid[1] * bt >= 1000
        assert block[0] * rt == bt and block[1] * rt == bt


# -- numpy transcriptions of the kernels ---------------------------------------------------
# Line for line with cuda/matmul/matmul.cu (keep them in step). Shared arrays start as NaN, so a
# read of an element no thread wrote shows up in C; asserts flag shared-memory indices
# outside the declared arrays; `writes` counts the stores to every element of C.
def emulate_register(A, B, BM, BN, BK, RM, RN, APAD=mm.APAD):
    M, K = A.shape
    N = B.shape[1]
    NTX, NTY = BN // RN, BM // RM
    NT = NTX * NTY
    A_LOADS = (BM * BK + NT - 1) // NT
    B_LOADS = (BK * BN + NT - 1) // NT
    C = np.full((M, N), np.nan)
    writes = np.zeros((M, N), int)
    tid = np.arange(NT)
    ty, tx = tid // NTX, tid % NTX  # tid = ty * NTX + tx
    for by, bx in itertools.product(range(-(-M // BM)), range(-(-N // BN))):
        r0, c0 = by * BM, bx * BN
        acc = np.zeros((NT, RM, RN))
        for k0 in range(0, K, BK):
            As = np.full((BK, BM + APAD), np.nan)
            Bs = np.full((BK, BN), np.nan)
            for t in range(NT):
                for lo in range(A_LOADS):
                    e = t + lo * NT
                    if (BM * BK) % NT == 0 or e < BM * BK:
                        r, c = e // BK, e % BK
                        assert 0 <= r < BM and 0 <= c < BK
                        gr, gc = r0 + r, k0 + c
                        As[c, r] = A[gr, gc] if gr < M and gc < K else 0.0
                for lo in range(B_LOADS):
                    e = t + lo * NT
                    if (BK * BN) % NT == 0 or e < BK * BN:
                        r, c = e // BN, e % BN
                        assert 0 <= r < BK and 0 <= c < BN
                        gr, gc = k0 + r, c0 + c
                        Bs[r, c] = B[gr, gc] if gr < K and gc < N else 0.0
            for k in range(BK):  # every thread at once: a[t, i], b[t, j]
                a = As[k, ty[:, None] * RM + np.arange(RM)]
                b = Bs[k, tx[:, None] + np.arange(RN) * NTX]
                acc += a[:, :, None] * b[:, None, :]
        for t in range(NT):
            for i in range(RM):
                gr = r0 + ty[t] * RM + i
                if gr < M:
                    for j in range(RN):
                        gc = c0 + tx[t] + j * NTX
                        if gc < N:
                            C[gr, gc] = acc[t, i, j]
                            writes[gr, gc] += 1
    return C, writes


def emulate_transposed_b(A, B, TILE, pitch):
    """matmul_transposed_b<pitch>: tiled_conflict (pitch TILE) and tiled_padded (TILE + 1)."""
    M, K = A.shape
    N = B.shape[1]
    C = np.full((M, N), np.nan)
    writes = np.zeros((M, N), int)
    ty, tx = np.meshgrid(np.arange(TILE), np.arange(TILE), indexing="ij")
    for by, bx in itertools.product(range(-(-M // TILE)), range(-(-N // TILE))):
        row, col = by * TILE + ty, bx * TILE + tx
        acc = np.zeros((TILE, TILE))
        for t in range(0, K, TILE):
            As = np.full((TILE, TILE), np.nan)
            Bt = np.full((TILE, pitch), np.nan)
            for y, x in zip(ty.ravel(), tx.ravel()):
                r, c = row[y, x], col[y, x]
                As[y, x] = A[r, t + x] if r < M and t + x < K else 0.0
                Bt[x, y] = B[t + y, c] if t + y < K and c < N else 0.0
            for k in range(TILE):
                acc += As[ty, k] * Bt[tx, k]
        ok = (row < M) & (col < N)
        C[row[ok], col[ok]] = acc[ok]
        writes[row[ok], col[ok]] += 1
    return C, writes


LADDER_CU = (ROOT / "cuda/matmul/matmul_ladder.cu").read_text()


# cuda/matmul/matmul_ladder.cu, ATile / BTile: float4 e = tid + l * NT (e < V) covers each float4 of
# the tile once, so the emulation walks e directly. The fast path must stay inside the
# matrices and 16-byte aligned; the guarded path zero-fills.
def _load_a_t(A, BM, BK, r0, k0, APAD=mm.APAD):
    M, K = A.shape
    As = np.full((BK, BM + APAD), np.nan)
    fast = r0 + BM <= M and k0 + BK <= K and K % 4 == 0
    for e in range(BM * BK // 4):
        row, col = e // (BK // 4), (e % (BK // 4)) * 4
        gr, gc = r0 + row, k0 + col
        if fast:
            assert gr < M and gc + 3 < K and (gr * K + gc) % 4 == 0
            v = A[gr, gc:gc + 4]
        else:
            v = [A[gr, gc + j] if gr < M and gc + j < K else 0.0 for j in range(4)]
        As[col:col + 4, row] = v
    return As


def _load_b(B, BK, BN, k0, c0):
    K, N = B.shape
    Bs = np.full((BK, BN), np.nan)
    fast = k0 + BK <= K and c0 + BN <= N and N % 4 == 0
    for e in range(BK * BN // 4):
        row, col = e // (BN // 4), (e % (BN // 4)) * 4
        gr, gc = k0 + row, c0 + col
        if fast:
            assert gr < K and gc + 3 < N and (gr * N + gc) % 4 == 0
            v = B[gr, gc:gc + 4]
        else:
            v = [B[gr, gc + j] if gr < K and gc + j < N else 0.0 for j in range(4)]
        Bs[row, col:col + 4] = v
    return Bs


def _store_c4(C, writes, gr, gc, v):
    """store_c4: one float4 where aligned and inside, else element by element."""
    M, N = C.shape
    if gr >= M:
        return
    if N % 4 == 0 and gc + 3 < N:
        assert (gr * N + gc) % 4 == 0
        C[gr, gc:gc + 4] = v
        writes[gr, gc:gc + 4] += 1
    else:
        for j in range(4):
            if gc + j < N:
                C[gr, gc + j] = v[j]
                writes[gr, gc + j] += 1


def _ladder_gemm(A, B, BM, BN, BK, rows, cols):
    """The shared skeleton of the ladder kernels: rows[t] / cols[t] are the tile-relative
    rows / columns thread t owns (float4 groups: every 4 consecutive entries are one float4
    read from shared memory, which must be 16-byte aligned)."""
    M, K = A.shape
    N = B.shape[1]
    assert (rows % 4 == 0)[:, ::4].all() and (cols % 4 == 0)[:, ::4].all()
    assert (np.diff(rows.reshape(len(rows), -1, 4), axis=2) == 1).all()
    assert (np.diff(cols.reshape(len(cols), -1, 4), axis=2) == 1).all()
    C = np.full((M, N), np.nan)
    writes = np.zeros((M, N), int)
    for by, bx in itertools.product(range(-(-M // BM)), range(-(-N // BN))):
        r0, c0 = by * BM, bx * BN
        acc = np.zeros((len(rows), rows.shape[1], cols.shape[1]))
        for k0 in range(0, K, BK):
            As, Bs = _load_a_t(A, BM, BK, r0, k0), _load_b(B, BK, BN, k0, c0)
            assert (mm.APAD + BM) % 4 == 0  # float4 reads of As rows stay aligned
            for k in range(BK):
                acc += As[k, rows][:, :, None] * Bs[k, cols][:, None, :]
        for t in range(len(rows)):
            for i, r in enumerate(rows[t]):
                for j in range(0, cols.shape[1], 4):
                    _store_c4(C, writes, r0 + r, c0 + cols[t, j], acc[t, i, j:j + 4])
    return C, writes


def vec4_ownership(BM, BN, TM, TN):
    """matmul_vec4 / matmul_dbuf: rows i*(NTY*4) + ty*4 + q, cols j*(NTX*4) + tx*4 + q."""
    ntx, nty = BN // TN, BM // TM
    tid = np.arange(ntx * nty)
    tx, ty = tid % ntx, tid // ntx
    q = np.arange(4)
    rows = np.stack([(i * nty * 4 + ty[:, None] * 4 + q).T for i in range(TM // 4)]).reshape(
        TM, -1).T
    cols = np.stack([(j * ntx * 4 + tx[:, None] * 4 + q).T for j in range(TN // 4)]).reshape(
        TN, -1).T
    return rows, cols


def warptile_ownership(d):
    """matmul_warptile: warp (wrow, wcol), lane (trow, tcol), sub-tiles wm < WMITER, wn <
    WNITER."""
    g = mm.warp_geometry({k: d[k.upper() if k != "threads" else "NTHREADS"]
                          for k in mm.WARP_KEYS})
    wmiter, wsubm, wsubn, tcols = (int(g[k]) for k in ("wmiter", "wsubm", "wsubn", "tcols"))
    tid = np.arange(d["NTHREADS"])
    warp, lane = tid // 32, tid % 32
    wrow, wcol = warp // (d["BN"] // d["WN"]), warp % (d["BN"] // d["WN"])
    trow, tcol = lane // tcols, lane % tcols
    rows = np.concatenate([(wrow * d["WM"] + wm * wsubm + trow * d["TM"])[:, None]
                           + np.arange(d["TM"]) for wm in range(wmiter)], axis=1)
    cols = np.concatenate([(wcol * d["WN"] + wn * wsubn + tcol * d["TN"])[:, None]
                           + np.arange(d["TN"]) for wn in range(d["WNITER"])], axis=1)
    return rows, cols


def emulate_vec4(A, B, BM, BN, BK, TM, TN):
    return _ladder_gemm(A, B, BM, BN, BK, *vec4_ownership(BM, BN, TM, TN))


def emulate_warptile(A, B, d):
    return _ladder_gemm(A, B, d["BM"], d["BN"], d["BK"], *warptile_ownership(d))


SIZES = [(5, 7, 3), (1, 1, 1), (33, 65, 17), (16, 32, 48)]  # (M, K, N)


def _ab(m, k, n):
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    return rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))


@pytest.mark.parametrize("rt, bt, bk", [(2, 16, 8), (2, 32, 32), (4, 64, 16), (8, 128, 8),
                                        (4, 32, 4), (8, 64, 64), (2, 16, 64), (4, 128, 32)])
@pytest.mark.parametrize("mkn", SIZES)
def test_register_tiling_index_arithmetic_on_odd_sizes(rt, bt, bk, mkn):
    a, b = _ab(*mkn)
    c, writes = emulate_register(a, b, bt, bt, bk, rt, rt)
    assert (writes == 1).all()  # every element written once, nothing outside C
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tile", mm.TILES)
@pytest.mark.parametrize("pad", [0, 1])
@pytest.mark.parametrize("mkn", SIZES)
def test_transposed_b_tiles_index_arithmetic_on_odd_sizes(tile, pad, mkn):
    a, b = _ab(*mkn)
    c, writes = emulate_transposed_b(a, b, tile, tile + pad)
    assert (writes == 1).all()
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


def bank_ways(words) -> int:
    """Passes one warp's scalar shared-memory access needs: the most distinct words that
    fall into one of the 32 banks (the same word is broadcast: one pass)."""
    per_bank: dict[int, set[int]] = {}
    for w in words:
        per_bank.setdefault(int(w) % 32, set()).add(int(w))
    return max(len(s) for s in per_bank.values())


def _warp(tile, warp=0):
    tid = np.arange(32 * warp, 32 * warp + 32)
    return tid // tile, tid % tile  # ty, tx of a (tile x tile) block


@pytest.mark.parametrize("tile, conflict_ways", [(32, 32), (16, 8), (8, 2)])
def test_bank_conflict_degrees_stated_in_the_caption(tile, conflict_ways):
    ty, tx = _warp(tile)
    for k in range(tile):
        assert bank_ways(tx * tile + k) == conflict_ways  # tiled_conflict: Bt[tx][k]
        assert bank_ways(tx * (tile + 1) + k) == 1  # tiled_padded: Bt[tx][k], pitch + 1
        assert bank_ways(k * tile + tx) == 1  # tiled: Bs[k][tx]
        assert bank_ways(ty * tile + k) == 1  # As[ty][k]: a broadcast per row
    assert bank_ways(tx * tile + ty) == conflict_ways  # the transposing store Bt[tx][ty]
    assert bank_ways(tx * (tile + 1) + ty) == (1 if tile == 32 else 2)  # once per tile
    assert f"{conflict_ways}-way" in EXP.lesson.caption


@pytest.mark.parametrize("tiles", mm.DEFAULT_REGISTER_TILES)
def test_register_kernel_inner_loop_reads_are_conflict_free(tiles):
    rt, bt = tiles["rt"], tiles["bt"]
    ntx = bt // rt
    tid = np.arange(32)
    ty, tx = tid // ntx, tid % ntx
    for k in range(tiles["bk"]):
        for i in range(rt):
            assert bank_ways(k * (bt + mm.APAD) + ty * rt + i) == 1  # As[k][ty*RM + i]
        for j in range(rt):
            assert bank_ways(k * bt + tx + j * ntx) == 1  # Bs[k][tx + j*NTX]


# -- expectations and figures on a synthetic table -----------------------------------------
SYNTHETIC = "SYNTHETIC TEST DATA - fabricated, not a measurement"


def _rec(variant, params, gflops, status="ok", reason="", metrics=None):
    """A raw record as the runner writes it, with invented numbers (synthetic test data)."""
    m, k, n = params["m"], params["k"], params["n"]
    flops = 2.0 * m * k * n
    t = flops / (gflops * 1e9) if gflops else float("nan")
    pid = Point("matmul", variant, params).point_id
    rec = {
        "schema_version": results.SCHEMA_VERSION, "experiment": "matmul",
        "variant": variant, "point_id": pid, "params": params,
        "job_id": "synthetic-test-data", "seed": 0, "status": status, "reason": reason,
        "provenance": {"gpu_name": SYNTHETIC, "compute_capability": "9.0"},
        "t_start": 0.0, "t_end": 1.0,
    }
    if status == "skipped":
        return rec
    rec |= {
        "timing": {"median": t, "iqr": 0.0, "cv": 0.01, "min": t, "mean": t, "std": 0.0,
                   "n": 10, "batch": 1, "timer": "cuda_event", "stop_reason": "converged",
                   "n_throttled": 0},
        "work": {"flops": flops, "bytes": 4.0 * (m * k + k * n + m * n),
                 "peak_fp32_gflops": 66900.0},
        "check": {"error": 1e-7, "tolerance": 1e-4, "metric": "rel_fro",
                  "passed": status == "ok", "detail": ""},
        "metrics": metrics or {"kernel_s": t},
    }
    return rec


def synthetic_records(conflict_32=3000.0, cublas="ok", ladder=False):
    """Invented GFLOP/s shaped like an H100 run (NOT measured); `ladder`: with the kernels
    past register tiling and float64 points."""
    recs = []
    for size in ([160, 240, 320], 256, 1000, 4096):
        m, k, n = mm._mkn(size)
        dims = {"m": m, "k": k, "n": n}
        s = 1.0 if size == 4096 else 0.3  # small products run slower
        if max(m, k, n) <= 2048:
            recs.append(_rec("cpu", dims, 96.0))
        recs.append(_rec("naive", dims | {"tile": 16}, 5400 * s))
        for t, g in ((8, 6000), (16, 8000), (32, 9100)):
            copy_s = 2e-3 if size != 4096 else 2e-2
            kern = 2.0 * m * k * n / (g * s * 1e9)
            mets = {"kernel_s": kern, "alloc_s": 1e-4, "h2d_s": copy_s, "d2h_s": copy_s / 2,
                    "total_s": kern + 1e-4 + 1.5 * copy_s}
            mets["copy_share"] = 1.5 * copy_s / mets["total_s"]
            recs.append(_rec("tiled", dims | {"tile": t}, g * s, metrics=mets))
            recs.append(_rec("tiled_padded", dims | {"tile": t}, g * s))
            cg = {8: 5200, 16: 5000, 32: conflict_32}[t]
            recs.append(_rec("tiled_conflict", dims | {"tile": t}, cg * s))
        for rt, g in ((2, 9000), (4, 14000), (8, 20000)):
            p = dict(zip(("rt", "bt", "bk"), {2: (2, 32, 32), 4: (4, 64, 16),
                                                8: (8, 128, 8)}[rt]))
            recs.append(_rec("register", dims | p, g * s))
        if ladder:
            res = {"regs": 128, "smem_bytes": 16640, "occupancy": 0.25}
            for v, base_g in (("vec4", 30000), ("dbuf", 33000)):
                for bk, f in ((8, 1.0), (16, 1.02)):
                    recs.append(_rec(v, dims | {"rt": 8, "bt": 128, "bk": bk},
                                     base_g * f * s, metrics=res))
            for i, wt in enumerate(mm.DEFAULT_WARP_TILES):
                recs.append(_rec("warptile", dims | wt, (36000 - 1000 * i) * s,
                                 metrics=res | {"regs": 219}))
            f64 = {"dtype": "float64"}
            recs.append(_rec("naive", dims | {"tile": 16} | f64, 1500 * s,
                             metrics={"pct_peak_fp64": 4.5 * s}))
            recs.append(_rec("tiled", dims | {"tile": 32} | f64, 2500 * s,
                             metrics={"pct_peak_fp64": 7.5 * s}))
            recs.append(_rec("cublas", dims | f64, 52000 * s,
                             metrics={"pct_peak_fp64": 155.0 * s}))
        if cublas == "ok":
            recs.append(_rec("cublas", dims, 40000 * s))
        else:
            recs.append(_rec("cublas", dims, 0, status="skipped",
                             reason="cuBLAS is measured through CuPy, which is not importable"))
    return recs


def _table(recs):
    df = results.build_table(recs)
    assert results.check_table(df) == []
    assert (df["gpu_name"] == SYNTHETIC).all()
    return df


def _judged(df):
    """The lesson's claims (Try-this claims too) judged on a table, by key."""
    got = claims.evaluate("matmul", df) + claims.evaluate_try_this("matmul", df)
    return {r.key: r for r in got if r is not None}


def test_claims_on_a_synthetic_table():
    ex = _judged(_table(synthetic_records()))
    assert ex["correct"].passed is True
    assert ex["tiling_pays"].passed
    reg = ex["register_pays"]
    assert reg.passed and "2.20× at 4096" in reg.evidence
    assert "register 8x8 (128x128x8)" in reg.evidence and "tiled (32x32)" in reg.evidence
    pad = ex["padding_pays"]
    assert pad.passed and "TILE 32: 3.03×" in pad.evidence
    cub = ex["cublas_ceiling"]
    assert cub.passed and (f"n = {fmt.integer(4096)}: cuBLAS 40.0 TFLOP/s / register 8x8 "
                           "(128x128x8) 20.0 TFLOP/s = 2.00×") in cub.evidence
    cpu = ex["gpu_vs_cpu"]
    assert cpu.passed and "numpy BLAS, threads not recorded" in cpu.evidence
    assert ex["copies_dominate"].passed and "tiled (16x16)" in ex["copies_dominate"].evidence
    # no DRAM or shared-memory ceiling, no kernel past register tiling, no float64 point
    for key in ("naive_cache_fed", "naive_load_bound", "ladder_near_cublas",
                "dgemm_tensor_cores", "fp64_slower", "block_tile_tradeoff"):
        assert ex[key].state.value == "not measured", (key, ex[key])


@pytest.mark.parametrize(("asks", "state"), [(0.7, "seen"), (0.2, "not seen")])
def test_the_naive_load_claim_fails_for_a_kernel_held_by_something_else(asks, state):
    """'Its loads limit it' is judged against what the loads ask of the L1: a naive kernel
    as slow as before but on a GPU whose shared-memory ceiling is 5x its load traffic (held
    by latency, not its loads) is not seen; the old claim (under a quarter of the FP32
    ceiling) held for any slow kernel."""
    df = _table(synthetic_records())
    naive = _judged(df)["naive_load_bound"]
    assert naive.state.value == "not measured" and "shared-memory ceiling" in naive.evidence
    rows = df[(df["variant"] == "naive") & (df["status"] == "ok")]
    big = rows.loc[rows["flops"].astype(float).idxmax()]
    smem = float(big["gflops"]) * 4.0 / asks
    got = _judged(df.assign(ceil_smem_gbps=smem))["naive_load_bound"]
    assert got.state.value == state, got
    assert f"{fmt.percent(100 * asks)} of the measured shared-memory ceiling" in got.evidence


def test_claims_fail_when_the_data_says_so():
    recs = synthetic_records(conflict_32=12000.0)  # conflicting layout "faster": fails
    bad = next(r for r in recs if r["variant"] == "register" and r["params"]["m"] == 256)
    bad |= {"status": "wrong", "reason": "rel_fro = 0.5 exceeds tolerance 0.0001"}
    ex = _judged(_table(recs))
    assert ex["padding_pays"].passed is False
    corr = ex["correct"]
    assert corr.passed is False and corr.evidence.startswith("55/56 ")


def test_claims_when_cublas_is_skipped():
    ex = _judged(_table(synthetic_records(cublas="skipped")))
    corr = ex["correct"]
    assert corr.passed is True and "4 skipped (cuBLAS is measured through CuPy" in corr.evidence
    cub = ex["cublas_ceiling"]
    assert cub.passed is None and "not importable" in cub.evidence


def test_the_cpu_claim_names_the_blas_and_its_threads():
    df = _table(synthetic_records())
    df["cpu_threads"] = df["cpu_threads"].astype("Int64")
    df.loc[df["variant"] == "cpu", ["cpu_threads", "blas"]] = [16, "openblas 0.3.27"]
    cpu = _judged(df)["gpu_vs_cpu"]
    assert "numpy BLAS, 16 threads: openblas 0.3.27" in cpu.evidence
    assert "multithreaded" in cpu.statement and "one core" in cpu.statement


def test_gflops_figure_has_a_panel_per_lesson_and_percentages_of_cublas(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig = EXP.plot("gflops", _table(synthetic_records(ladder=True)))
    axes = [a for a in fig.get_axes() if a.get_visible()]
    assert [a.get_title() for a in axes] == [t for t, _ in mm.PANELS] + [
        "the course's product 160x240.240x320"]
    legend3 = [t.get_text() for t in axes[3].get_legend().get_texts()]
    assert "warptile 128x128x16 w64x64/4 t8x4: 90% at 4096" in legend3
    assert not any("float64" in t or "DGEMM" in t for a in axes if a.get_legend()
                   for t in [x.get_text() for x in a.get_legend().get_texts()])
    # square sizes on a numeric log2 axis (1000 is labelled here: no 1024 beside it)
    assert axes[0].get_xscale() == "log"
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["256", "1000", "4096"]
    legend = [t.get_text() for t in axes[2].get_legend().get_texts()]
    assert "register 8x8 (128x128x8): 50% at 4096" in legend
    assert "cuBLAS SGEMM (ceiling)" in legend
    legend0 = [t.get_text() for t in axes[0].get_legend().get_texts()]
    # the CPU's % at the largest size it ran at; entries in variant, then tile order
    assert legend0 == ["cpu: 1% at 1000", "naive (16x16): 14% at 4096",
                       "tiled (8x8): 15% at 4096", "tiled (16x16): 20% at 4096",
                       "tiled (32x32): 23% at 4096", "cuBLAS SGEMM (ceiling)"]
    paths = figures.save(fig, tmp_path / "gflops")
    assert all(p.stat().st_size > 1000 for p in paths)


def test_figures_draw_without_cublas_and_for_cpu_only_runs(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    df = _table(synthetic_records(cublas="skipped"))
    fig = EXP.plot("gflops", df)
    legend = [t.get_text() for t in fig.get_axes()[0].get_legend().get_texts()]
    assert "tiled (32x32)" in legend and not any("cuBLAS" in t for t in legend)
    split = EXP.plot("time_split", df)
    assert split is not None
    figures.save(split, tmp_path / "time_split")
    cpu_only = _table([r for r in synthetic_records() if r["variant"] == "cpu"])
    fig = EXP.plot("gflops", cpu_only)
    # the CPU's square sizes, and the course's rectangular product on its own
    assert [a.get_title() for a in fig.get_axes()] == [
        "global memory vs shared-memory tiles", "the course's product 160x240.240x320"]
    assert EXP.plot("time_split", cpu_only) is None


# -- skipped points ------------------------------------------------------------------------
def _no_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    mm._import_cupy.cache_clear()


def test_cublas_points_are_skipped_where_cupy_is_missing(monkeypatch):
    _no_cupy(monkeypatch)
    try:
        ctx = RunContext(gpu=None, harness=Harness(Settings()), rng=np.random.default_rng(0),
                         config={}, block=_block())
        point = Point("matmul", "cublas", {"m": 8, "k": 8, "n": 8})
        with pytest.raises(Skipped, match="CuPy, which is not importable"):
            EXP.kernel_for(ctx, point)
        with pytest.raises(Skipped, match="pip install cupy-cuda"):
            EXP.measure(ctx, point)
        assert ctx.cache == {}  # skipped before making inputs
    finally:
        mm._import_cupy.cache_clear()


class _Optional(Experiment):
    name = "optional_dep"
    schema = {"type": "object"}

    def points(self, block):
        return [Point(self.name, v, {"i": i}, gpu=False) for i, v in enumerate(["have", "lack"])]

    def measure(self, ctx, point):
        if point.variant == "lack":
            raise Skipped("libfoo is not installed")
        return Result(ctx.harness.measure(lambda: None, WallTimer()), flops=1.0)


def test_runner_records_skipped_points_with_their_reason(tmp_path):
    from cudalab.runner import run_experiment

    REGISTRY["optional_dep"] = _Optional()
    try:
        config = cfg.validate({"measurement": {"min_samples": 3, "budget_s": 0.01},
                               "experiments": {"optional_dep": {}}})
        m = run_experiment(config, "optional_dep", tmp_path)
    finally:
        REGISTRY.pop("optional_dep")
    assert m["points"] == {"have-i0": "ok", "lack-i1": "skipped"}
    assert m["counts"]["skipped"] == 1 and m["counts"]["ok"] == 1
    recs = {r["point_id"]: r for r in results.iter_records(tmp_path / "raw")}
    assert recs["lack-i1"]["status"] == "skipped"
    assert recs["lack-i1"]["reason"] == "libfoo is not installed"
    df = results.build_table(recs.values())
    assert results.check_table(df) == []
    row = df.set_index("point_id").loc["lack-i1"]
    assert row["status"] == "skipped" and np.isnan(row["gflops"])


# -- the measuring code on a fake GPU ------------------------------------------------------
# No GPU here: a numpy stand-in for pycuda (device buffers are numpy arrays, kernels run the
# transcriptions above) and for CuPy (gemm is numpy's), to exercise the glue of measure():
# argument order, launch geometry, the poisoned output, the cuBLAS wrapping and timer.
class FakeAlloc:
    def __init__(self, nbytes):
        self.buf = np.zeros(nbytes // 4, np.float32)  # raw words; .view() gives other dtypes
        self.freed = False

    def __int__(self):
        return id(self)

    def free(self):
        self.freed = True


class FakeFunc:
    def __init__(self, name, defines):
        self.name, self.d = name, defines

    def prepare(self, sig):
        assert sig == "PPPiii"

    def prepared_call(self, grid, block, a_d, b_d, c_d, M, N, K):  # the kernels' (A, B, C, M, N, K)
        d = self.d
        real = np.float64 if d.get("REAL") == "double" else np.float32
        A = a_d.buf.view(real)[:M * K].reshape(M, K).astype(np.float64)
        B = b_d.buf.view(real)[:K * N].reshape(K, N).astype(np.float64)
        if self.name in ("matmul_vec4", "matmul_dbuf"):
            nt = (d["BM"] // d["TM"]) * (d["BN"] // d["TN"])
            assert block == (nt, 1, 1) and grid == (-(-N // d["BN"]), -(-M // d["BM"]))
            C, _ = emulate_vec4(A, B, d["BM"], d["BN"], d["BK"], d["TM"], d["TN"])
        elif self.name == "matmul_warptile":
            assert block == (d["NTHREADS"], 1, 1)
            assert grid == (-(-N // d["BN"]), -(-M // d["BM"]))
            C, _ = emulate_warptile(A, B, d)
        elif self.name in ("matmul_pipelined", "matmul_swizzled"):
            from test_matmul_pipeline import emulate_pipeline

            assert block == (d["NTHREADS"], 1, 1)
            assert grid == (-(-N // d["BN"]), -(-M // d["BM"]))
            C, _ = emulate_pipeline(A, B, d, swizzled=self.name == "matmul_swizzled")
        elif self.name == "matmul_register":
            assert block == (d["BN"] // d["RN"], d["BM"] // d["RM"], 1)
            assert grid == (-(-N // d["BN"]), -(-M // d["BM"]))
            C, _ = emulate_register(A, B, d["BM"], d["BN"], d["BK"], d["RM"], d["RN"])
        elif self.name in ("matmul_tiled_conflict", "matmul_tiled_padded"):
            t = d["TILE"]
            assert block == (t, t, 1) and grid == (-(-N // t), -(-M // t))
            C, _ = emulate_transposed_b(A, B, t, t + (self.name == "matmul_tiled_padded"))
        else:  # naive, tiled: one thread per element of C
            assert grid[0] * block[0] >= N and grid[1] * block[1] >= M
            C = A @ B
        c_d.buf.view(real)[:M * N] = C.ravel()


class FakeKernel:
    def __init__(self, defines):
        self.defines, self.options, self.source_hash = defines, [], "fake"

    def function(self, name):
        return FakeFunc(name, self.defines)


class FakeGpu:
    index = 0

    def __init__(self):
        from types import SimpleNamespace

        self.context = SimpleNamespace(handle=0xC0FFEE)
        def htod(dst, src):
            dst.buf.view(np.uint8)[:src.nbytes] = np.ascontiguousarray(src).view(np.uint8).ravel()

        def dtoh(dst, src):
            dst.reshape(-1).view(np.uint8)[:] = src.buf.view(np.uint8)[:dst.nbytes]

        self.cuda = SimpleNamespace(
            mem_alloc=FakeAlloc, Event=FakeEvent, memcpy_htod=htod, memcpy_dtoh=dtoh,
            memset_d32=lambda dst, bits, n: dst.buf.view(np.uint32).__setitem__(
                slice(0, n), bits),
        )

    def compile(self, source, defines):
        ladder = any(k in defines for k in ("TM", "WM"))
        want = "matmul/" + ("matmul_pipeline.cu" if "WTM" in defines
                            else "matmul_ladder.cu" if ladder else "matmul.cu")
        assert source == want
        return FakeKernel(defines)

    def event_timer(self):
        from cudalab.gpu import EventTimer

        return EventTimer(self.cuda)

    def synchronize(self):
        pass


def fake_cupy(monkeypatch, ctx_handle=0xC0FFEE, math_mode=0):
    """Just enough of CuPy and its cuBLAS binding, backed by numpy."""
    from types import ModuleType, SimpleNamespace

    state = {"mode": math_mode, "calls": 0}
    cp = ModuleType("cupy")
    cp.__version__ = "0.0-fake"
    cp.float32, cp.float64 = np.float32, np.float64

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            assert ptr == int(owner) and size <= 4 * owner.buf.size and device_id == 0
            self.owner = owner

    class ndarray:  # noqa: N801 - CuPy's name
        def __init__(self, shape, dtype, memptr):
            assert dtype in (np.float32, np.float64) and memptr.offset == 0
            self.v = memptr.mem.owner.buf.view(dtype)[:shape[0] * shape[1]].reshape(shape)

    def gemm(ta, tb, a, b, out):
        assert (ta, tb) == ("N", "N")
        state["calls"] += 1
        out.v[...] = a.v @ b.v

    stream = SimpleNamespace(ptr=0, synchronize=lambda: None)
    cp.ndarray = ndarray
    cp.cuda = SimpleNamespace(
        driver=SimpleNamespace(ctxGetCurrent=lambda: ctx_handle),
        UnownedMemory=UnownedMemory,
        MemoryPointer=lambda mem, off: SimpleNamespace(mem=mem, offset=off),
        device=SimpleNamespace(get_cublas_handle=lambda: 7),
        get_current_stream=lambda: stream,
        Event=FakeEvent,
        get_elapsed_time=lambda s, e: (e.t - s.t) * 1e3,
    )
    cp.cublas = ModuleType("cupy.cublas")
    cp.cublas.gemm = gemm
    cublas = ModuleType("cupy_backends.cuda.libs.cublas")
    cublas.CUBLAS_DEFAULT_MATH = 0
    cublas.getMathMode = lambda h: state["mode"]
    cublas.setMathMode = lambda h, m: state.__setitem__("mode", m)
    cublas.getVersion = lambda h: 130000
    libs = ModuleType("cupy_backends.cuda.libs")
    libs.cublas = cublas
    for name, mod in {"cupy": cp, "cupy.cublas": cp.cublas, "cupy_backends": ModuleType("x"),
                      "cupy_backends.cuda": ModuleType("y"),
                      "cupy_backends.cuda.libs": libs,
                      "cupy_backends.cuda.libs.cublas": cublas}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    mm._import_cupy.cache_clear()
    return state


def _fake_ctx(**block):
    s = Settings(warmup=1, min_samples=3, max_samples=3, budget_s=0.001, min_sample_s=0)
    return RunContext(gpu=FakeGpu(), harness=Harness(s), rng=np.random.default_rng(1),
                      config={}, block=_block(**block))


@pytest.fixture
def clean_cupy_cache():
    mm._import_cupy.cache_clear()
    yield
    mm._import_cupy.cache_clear()


def test_every_variant_measures_and_checks_on_the_fake_gpu(monkeypatch, clean_cupy_cache):
    state = fake_cupy(monkeypatch)
    ctx = _fake_ctx(sizes=[[33, 17, 65]], tiles=[8, 32],
                    register_tiles=[{"rt": 2, "bt": 16, "bk": 8}, {"rt": 8, "bt": 64, "bk": 4}],
                    vec4_tiles=[{"rt": 4, "bt": 32, "bk": 8}],
                    warp_tiles=[mm.DEFAULT_WARP_TILES[0], mm.DEFAULT_WARP_TILES[3]],
                    pipe_tiles=[mm._pt(64, 64, 16, 32, 32, 4, 3, 128),
                                mm._pt(32, 64, 8, 32, 32, 8, 2, 64) | {"korder": 1}],
                    dtypes=["float32", "float64"])
    pts = EXP.points(ctx.block)
    assert {p.variant for p in pts} == set(mm.VARIANTS)
    assert {p.variant for p in pts if p.params.get("dtype")} == set(mm.FP64_VARIANTS)
    for p in pts:
        res = EXP.measure(ctx, p)
        assert res.check.passed, (p.point_id, res.check)
        assert res.timing.n == 3 and res.flops == 2.0 * 33 * 17 * 65
        if p.gpu:
            assert res.kernel is not None and "kernel_s" in res.metrics
        if p.gpu and p.variant != "cublas":  # every kernel family records its launch
            grid, block = mm.launch_geometry(p)
            assert (res.launch.blocks, res.launch.threads_per_block) == (
                math.prod(grid), math.prod(block)), p.point_id
        else:
            assert res.launch is None  # cuBLAS picks its own grid; the CPU has none
        if p.params.get("dtype") == "float64":
            assert res.check.tolerance == 1e-12 and res.bytes == 8.0 * (33 * 17 + 17 * 65 + 33 * 65)
            assert res.check.error < 1e-14  # float64 all the way: far below the tolerance
        elif p.variant == "tiled":
            assert {"h2d_s", "d2h_s", "alloc_s", "copy_share", "gpu_copy_share"} <= set(
                res.metrics)
        elif p.gpu:
            assert "h2d_s" not in res.metrics  # the time split is the tiled kernel's
    assert state["calls"] == 2 * (1 + 1 + 3)  # SGEMM and DGEMM: check + warm-up + 3 samples


def test_wrong_results_and_unwritten_elements_are_caught(monkeypatch):
    ctx = _fake_ctx(sizes=[[20, 20, 20]])
    point = Point("matmul", "register", {"m": 20, "k": 20, "n": 20, "rt": 2, "bt": 16, "bk": 8})
    real = FakeFunc.prepared_call

    def skip_last_row(self, grid, block, a_d, b_d, c_d, M, N, K):  # a bounds bug
        keep = c_d.buf.copy()
        real(self, grid, block, a_d, b_d, c_d, M, N, K)
        c_d.buf[(M - 1) * N:M * N] = keep[(M - 1) * N:M * N]

    monkeypatch.setattr(FakeFunc, "prepared_call", skip_last_row)
    res = EXP.measure(ctx, point)
    assert not res.check.passed and res.check.detail == "unwritten (NaN) elements"


def test_cublas_resets_a_tf32_math_mode_and_records_it(monkeypatch, clean_cupy_cache):
    state = fake_cupy(monkeypatch, math_mode=3)  # CUBLAS_TF32_TENSOR_OP_MATH
    ctx = _fake_ctx(sizes=[8])
    res = EXP.measure(ctx, Point("matmul", "cublas", {"m": 8, "k": 8, "n": 8}))
    assert res.check.passed and state["mode"] == 0
    assert res.extra["cublas_math_mode_before"] == 3 and res.extra["cublas_math_mode"] == 0
    assert res.extra["same_context_as_pycuda"] is True and res.timing.timer == "cuda_event"
    info = EXP.kernel_for(ctx, Point("matmul", "cublas", {"m": 8, "k": 8, "n": 8}))
    assert info.options == [] and len(info.source_hash) == 16


def test_cublas_refuses_to_run_on_another_context(monkeypatch, clean_cupy_cache):
    state = fake_cupy(monkeypatch, ctx_handle=0xBAD)
    ctx = _fake_ctx(sizes=[8])
    with pytest.raises(RuntimeError, match="not on the job's primary context"):
        EXP.measure(ctx, Point("matmul", "cublas", {"m": 8, "k": 8, "n": 8}))
    assert state["calls"] == 0


# -- the check: blockwise error, the host output reused across the variants of a size ------
def test_check_product_equals_the_float64_formula_and_names_unwritten_elements():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((129, 77)).astype(np.float32)
    b = rng.standard_normal((77, 515)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = a @ b
    want = np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref)
    chk = mm.check_product(c, ref, 1e-4)
    assert chk.error == pytest.approx(want, rel=1e-12) and chk.passed and chk.detail == ""
    assert chk.metric == "rel_fro"
    c[-1, -1] = np.nan
    bad = mm.check_product(c, ref, 1e-4)
    assert bad.error == math.inf and not bad.passed
    assert bad.detail == "unwritten (NaN) elements"


def test_the_end_to_end_split_is_measured_in_the_first_trial_only(monkeypatch):
    """A later trial of a tiled point times the kernel again but not the end-to-end split
    (host work that never gates); the point keeps the first trial's split."""
    from cudalab import trials

    ctx = _fake_ctx(sizes=[[20, 12, 36]])
    ctx.harness.settings = Settings(warmup=1, min_samples=3, max_samples=9, budget_s=0.001,
                                    min_sample_s=0, trials=3)
    calls = []
    real = mm.Matmul._end_to_end
    monkeypatch.setattr(mm.Matmul, "_end_to_end",
                        lambda self, *a: calls.append(1) or real(self, *a))
    point = Point("matmul", "tiled", {"m": 20, "k": 12, "n": 36, "tile": 8})
    res, done = trials.measure_trials(lambda: EXP.measure(ctx, point), ctx.harness,
                                      ctx.cache, ctx.gpu.cuda)
    assert len(done) > 1 and len(calls) == 1
    assert {"h2d", "d2h", "alloc"} <= set(res.phases) and "copy_share" in res.metrics


def test_variants_of_a_size_share_inputs_reference_and_host_output(monkeypatch):
    ctx = _fake_ctx(sizes=[[20, 12, 36]])
    dims = {"m": 20, "k": 12, "n": 36}
    assert EXP.measure(ctx, Point("matmul", "tiled", dims | {"tile": 8})).check.passed
    a, b, ref = ctx.cache[("matmul", 20, 12, 36)]
    out = ctx.cache[("matmul_out", 20, 12, 36)]
    assert out.shape == (20, 36) and out.dtype == np.float32
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-5)  # the correct product is left in it
    real = FakeFunc.prepared_call

    def skip_first_element(self, grid, block, a_d, b_d, c_d, M, N, K):
        keep = c_d.buf[0]
        real(self, grid, block, a_d, b_d, c_d, M, N, K)
        c_d.buf[0] = keep

    monkeypatch.setattr(FakeFunc, "prepared_call", skip_first_element)
    res = EXP.measure(ctx, Point("matmul", "tiled_padded", dims | {"tile": 16}))
    assert ctx.cache[("matmul", 20, 12, 36)][2] is ref  # no new reference for this size
    assert ctx.cache[("matmul_out", 20, 12, 36)] is out  # the same host buffer, whose stale
    assert not res.check.passed and res.check.error == math.inf  # values do not hide it
    assert res.check.detail == "unwritten (NaN) elements"
    monkeypatch.setattr(FakeFunc, "prepared_call", real)
    assert EXP.measure(ctx, Point("matmul", "naive", {"m": 8, "k": 8, "n": 8,
                                                      "tile": 16})).check.passed
    assert set(ctx.cache) == {("matmul", 8, 8, 8), ("matmul_out", 8, 8, 8)}


# -- the ladder: vec4, dbuf, warptile --------------------------------------------------------
LADDER_SIZES = SIZES + [(20, 24, 36), (64, 16, 128), (130, 20, 132)]


@pytest.mark.parametrize("rt, bt, bk", [(8, 128, 8), (4, 32, 16), (8, 64, 8), (4, 64, 32)])
@pytest.mark.parametrize("mkn", LADDER_SIZES)
def test_vec4_and_dbuf_index_arithmetic_on_odd_sizes(rt, bt, bk, mkn):
    a, b = _ab(*mkn)
    c, writes = emulate_vec4(a, b, bt, bt, bk, rt, rt)
    assert (writes == 1).all()
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("wt", mm.DEFAULT_WARP_TILES, ids=lambda t: "-".join(map(str, t.values())))
@pytest.mark.parametrize("mkn", [(5, 7, 3), (33, 65, 17), (128, 32, 128), (130, 20, 132)])
def test_warptile_index_arithmetic_on_odd_sizes(wt, mkn):
    a, b = _ab(*mkn)
    p = Point("matmul", "warptile", {"m": mkn[0], "k": mkn[1], "n": mkn[2]} | wt)
    c, writes = emulate_warptile(a, b, mm.kernel_defines(p))
    assert (writes == 1).all()
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)


def test_ladder_threads_own_every_output_of_the_block_tile_once():
    for t in mm.DEFAULT_VEC4_TILES:
        rows, cols = vec4_ownership(t["bt"], t["bt"], t["rt"], t["rt"])
        cells = {(r, c) for rr, cc in zip(rows, cols) for r in rr for c in cc}
        assert len(cells) == t["bt"] ** 2 == len(rows) * rows.shape[1] * cols.shape[1]
    for wt in mm.DEFAULT_WARP_TILES:
        d = mm.kernel_defines(Point("matmul", "warptile", dict(wt)))
        rows, cols = warptile_ownership(d)
        cells = {(r, c) for rr, cc in zip(rows, cols) for r in rr for c in cc}
        assert len(cells) == wt["bm"] * wt["bn"] == len(rows) * rows.shape[1] * cols.shape[1]


def bank_ways_128(words) -> int:
    """Passes one 128-bit shared-memory load of a warp needs: served a quarter warp (8
    threads) at a time; within one, 16-byte chunks in the same 4-bank group conflict unless
    they are the same chunk (a broadcast)."""
    ways = 1
    for q in range(0, len(words), 8):
        per_group: dict[int, set[int]] = {}
        for w in words[q:q + 8]:
            assert int(w) % 4 == 0
            per_group.setdefault((int(w) // 4) % 8, set()).add(int(w) // 4)
        ways = max(ways, max(len(s) for s in per_group.values()))
    return ways


def test_ladder_inner_loop_float4_reads_are_conflict_free():
    for t in mm.DEFAULT_VEC4_TILES:
        rows, cols = vec4_ownership(t["bt"], t["bt"], t["rt"], t["rt"])
        for warp in range(len(rows) // 32):
            lanes = slice(32 * warp, 32 * warp + 32)
            for k in range(t["bk"]):
                for g in range(0, t["rt"], 4):
                    assert bank_ways_128(k * (t["bt"] + mm.APAD) + rows[lanes, g]) == 1
                    assert bank_ways_128(k * t["bt"] + cols[lanes, g]) == 1
    for wt in mm.DEFAULT_WARP_TILES:
        rows, cols = warptile_ownership(mm.kernel_defines(Point("matmul", "warptile", dict(wt))))
        for warp in range(wt["threads"] // 32):
            lanes = slice(32 * warp, 32 * warp + 32)
            for g in range(0, rows.shape[1], 4):
                assert bank_ways_128((wt["bm"] + mm.APAD) + rows[lanes, g]) == 1
            for g in range(0, cols.shape[1], 4):
                assert bank_ways_128(wt["bn"] + cols[lanes, g]) == 1


def test_ladder_kernel_constants_match_the_python_rules():
    assert int(re.search(r"#define APAD (\d+)", LADDER_CU).group(1)) == mm.APAD
    assert "__shared__ __align__(16) float As[2][BK][BM + APAD];" in LADDER_CU
    assert "__shared__ __align__(16) float Bs[2][BK][BN];" in LADDER_CU
    assert "NTHREADS == (BM / WM) * (BN / WN) * 32" in LADDER_CU
    assert "cp.async.cg.shared.global [%0], [%1], 16;" in LADDER_CU
    for name in ("matmul_vec4", "matmul_dbuf", "matmul_warptile"):
        assert f"\n{name}(" in LADDER_CU, name


def test_ladder_defines_and_launch_geometry():
    dims = {"m": 1000, "k": 4100, "n": 37}
    v = Point("matmul", "dbuf", dims | {"rt": 8, "bt": 128, "bk": 16})
    assert mm.kernel_source(v) == "matmul/matmul_ladder.cu"
    assert mm.kernel_defines(v) == {"BM": 128, "BN": 128, "BK": 16, "TM": 8, "TN": 8}
    assert mm.launch_geometry(v) == ((1, 8), (256, 1, 1))
    w = Point("matmul", "warptile", dims | mm.DEFAULT_WARP_TILES[2])
    assert mm.kernel_defines(w) == {"BM": 128, "BN": 128, "BK": 16, "WM": 32, "WN": 64,
                                    "WNITER": 2, "TM": 8, "TN": 4, "NTHREADS": 256}
    assert mm.launch_geometry(w) == ((1, 8), (256, 1, 1))
    f64 = Point("matmul", "tiled", dims | {"tile": 32, "dtype": "float64"})
    assert mm.kernel_source(f64) == "matmul/matmul.cu"
    assert mm.kernel_defines(f64) == {"TILE": 32, "REAL": "double"}
    assert mm.kernel_defines(Point("matmul", "naive", dims | {"tile": 16, "dtype": "float64"})
                             ) == {"REAL": "double"}
    assert EXP.gpu_bytes(f64) == 2 * 8 * (1000 * 4100 + 4100 * 37 + 1000 * 37)


@pytest.mark.parametrize("tile, needles", [
    (mm._wt(128, 128, 16, 64, 64, 4, 8, 4, 256),
     ["warp_tiles[0]: threads=256 must be (bm/wm)*(bn/wn)*32", "= 128"]),
    (mm._wt(128, 128, 16, 64, 64, 8, 8, 8, 128),
     ["warp_tiles[0]: wm*wn = 4096 must be a multiple of 32*tm*tn*wniter = 16384"]),
    (mm._wt(128, 128, 16, 64, 32, 4, 8, 8, 256),
     ["warp_tiles[0]: wm*wn = 2048 must be a multiple of 32*tm*tn*wniter = 8192"]),
    (mm._wt(128, 128, 16, 128, 64, 4, 8, 4, 64),
     ["warp_tiles[0]: wm*wn/32 = 256 outputs per thread; at most 128"]),
    (mm._wt(256, 256, 32, 128, 64, 4, 8, 4, 256),
     ["warp_tiles[0]: needs 66048 bytes of static shared memory", "49152"]),
    (mm._wt(128, 64, 16, 64, 128, 4, 8, 4, 128),
     ["warp_tiles[0]: bm=128 must be a multiple of wm=64 and bn=64 of wn=128"]),
])
def test_bad_warp_tiles_are_refused_naming_the_entry(tile, needles):
    msg = _err({"warp_tiles": [tile]})
    assert "experiments.matmul.warp_tiles[0]:" in msg
    for n in needles:
        assert n in msg, (n, msg)
    # the second entry is named as such, the first (valid) one not at all
    msg = _err({"warp_tiles": [mm.DEFAULT_WARP_TILES[0], tile]})
    assert "warp_tiles[1]:" in msg and "warp_tiles[0]" not in msg


def test_sub_tile_rule_beyond_the_schema_s_values():
    """wn/wniter < tn cannot come from the schema's powers of two within its ranges; the
    pure rule still says it (the kernel's static_assert would)."""
    msgs = mm.check_warp_tile(mm._wt(256, 32, 8, 256, 32, 8, 4, 8, 32))
    assert msgs[0] == ("wn/wniter = 4 must be a multiple of tn=8 and wn/wniter/tn = 0.5 must "
                       "divide 32")


def test_warp_tile_schema_names_bad_values_and_missing_keys():
    bad = dict(mm.DEFAULT_WARP_TILES[0], tm=6)
    msg = _err({"warp_tiles": [bad]})
    assert "experiments.matmul.warp_tiles[0].tm" in msg and "[4, 8]" in msg
    short = {k: v for k, v in mm.DEFAULT_WARP_TILES[0].items() if k != "threads"}
    assert "missing key 'threads'" in _err({"warp_tiles": [short]})


def test_vec4_tiles_rules_count_dbuf_s_two_buffers():
    msg = _err({"vec4_tiles": [{"rt": 8, "bt": 128, "bk": 32}]})
    assert "experiments.matmul.vec4_tiles[0]:" in msg
    assert "66560 bytes of static shared memory" in msg and "2 buffers (dbuf)" in msg
    assert "allowed values" in _err({"vec4_tiles": [{"rt": 2, "bt": 32, "bk": 8}]})
    msg = _err({"vec4_tiles": [{"rt": 4, "bt": 16, "bk": 8}]})
    assert "16 threads per block" in msg and "at least 64" in msg


def test_defaults_and_smoke_tiles_pass_every_rule():
    for t in mm.DEFAULT_WARP_TILES + EXP.smoke["warp_tiles"]:
        assert mm.check_warp_tile(t) == [], t
        g = mm.warp_geometry(t)
        assert g["wmiter"] == int(g["wmiter"]) >= 1 and g["smem"] <= mm.MAX_STATIC_SMEM
    assert EXP.check_config(_block(**copy.deepcopy(EXP.smoke))) == []


def test_dtypes_expand_only_the_fp64_variants():
    b = _block(sizes=[[160, 240, 320], 1000], dtypes=["float64"])
    pts = EXP.points(b)
    assert {p.variant for p in pts} == set(mm.FP64_VARIANTS)
    assert all(p.params["dtype"] == "float64" and p.gpu for p in pts)
    assert len(pts) == 2 * (1 + 3 + 1)
    assert "cublas-m1000-k1000-n1000-dtypefloat64" in {p.point_id for p in pts}
    both = EXP.points(_block(sizes=[256], variants=["naive", "register"],
                             dtypes=["float32", "float64"]))
    assert [(p.variant, p.params.get("dtype")) for p in both] == [
        ("naive", None), ("register", None), ("register", None), ("register", None),
        ("naive", "float64")]
    with pytest.raises(cfg.ConfigError, match="experiments.matmul.dtypes"):
        _block(dtypes=["float16"])


def test_fp64_ratio_by_compute_capability():
    assert mm.fp64_ratio("9.0") == mm.fp64_ratio((8, 0)) == mm.fp64_ratio("sm_70") == 0.5
    assert mm.fp64_ratio("sm_86") == mm.fp64_ratio("8.9") == 1 / 64
    assert mm.fp64_ratio("7.5") is None and mm.fp64_ratio("not a cc") is None
    assert mm.ratio_text(0.5) == "1:2" and mm.ratio_text(None) == "unknown"


class _DeviceStub:
    """A GPU's facts for the derived metrics (H100 SXM clocks)."""

    info = {"compute_capability": "9.0"}
    _attrs = {"COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0,
              "MULTIPROCESSOR_COUNT": 132, "CLOCK_RATE": 1980000,
              "MEMORY_CLOCK_RATE": 2619000, "GLOBAL_MEMORY_BUS_WIDTH": 5120}

    def attr(self, name):
        return self._attrs[name]


def test_fp64_metrics_and_kernel_resources_from_device_facts():
    from types import SimpleNamespace

    gpu = _DeviceStub()
    m = mm.fp64_metrics(gpu, 2.0 * 4096**3, 4.0e-3)
    peak32 = 2 * 128 * 132 * 1.98e6 * 1e3 / 1e9
    assert m["peak_fp64_gflops"] == pytest.approx(peak32 / 2)
    assert m["pct_peak_fp64"] == pytest.approx(100 * 2 * 4096**3 / 4e-3 / 1e9 / (peak32 / 2))
    assert mm.fp64_metrics(SimpleNamespace(), 1.0, 1.0) == {}
    res = mm.kernel_resources(gpu, SimpleNamespace(num_regs=128, shared_size_bytes=16640), 256)
    assert res == {"regs": 128, "smem_bytes": 16640, "threads": 256, "occupancy": 0.25}
    assert mm.kernel_resources(gpu, SimpleNamespace(), 256) == {}


def test_float64_unwritten_elements_are_caught(monkeypatch):
    ctx = _fake_ctx(sizes=[[20, 20, 20]])
    point = Point("matmul", "tiled", {"m": 20, "k": 20, "n": 20, "tile": 8, "dtype": "float64"})
    real = FakeFunc.prepared_call

    def skip_last(self, grid, block, a_d, b_d, c_d, M, N, K):
        keep = c_d.buf.view(np.float64)[M * N - 1]
        real(self, grid, block, a_d, b_d, c_d, M, N, K)
        c_d.buf.view(np.float64)[M * N - 1] = keep

    monkeypatch.setattr(FakeFunc, "prepared_call", skip_last)
    res = EXP.measure(ctx, point)
    assert not res.check.passed and res.check.detail == "unwritten (NaN) elements"
    monkeypatch.setattr(FakeFunc, "prepared_call", real)
    res = EXP.measure(ctx, point)
    assert res.check.passed and ctx.cache[("matmul_out", 20, 20, 20, "float64")].dtype == np.float64


def test_naive_caption_no_longer_says_straight_from_global_memory():
    assert "straight from global memory" not in EXP.lesson.caption
    assert "2K global loads" in EXP.lesson.caption and "L1 and L2" in EXP.lesson.caption
    assert set(mm.LADDER_NOTES) == set(mm.LADDER)


def test_compile_variants_cover_every_ladder_kernel_and_tile():
    cvs = EXP.compile_variants(None)
    by = {}
    for cv in cvs:
        by.setdefault(cv.kernel, []).append(cv)
    assert len(by["matmul_register"]) == len(mm.DEFAULT_REGISTER_TILES)
    assert len(by["matmul_vec4"]) == len(by["matmul_dbuf"]) == len(mm.DEFAULT_VEC4_TILES)
    assert len(by["matmul_warptile"]) == len(mm.DEFAULT_WARP_TILES)
    assert {cv.file for k in ("matmul_vec4", "matmul_dbuf", "matmul_warptile")
            for cv in by[k]} == {"matmul/matmul_ladder.cu"}
    assert by["matmul_warptile"][0].defines["NTHREADS"] == 128
    for k in ("matmul_pipelined", "matmul_swizzled"):
        assert [cv.params for cv in by[k]] == mm.DEFAULT_PIPE_TILES
        assert {cv.file for cv in by[k]} == {"matmul/matmul_pipeline.cu"}
    assert by["matmul_swizzled"][1].defines == {"BM": 64, "BN": 128, "BK": 16, "WM": 32,
                                                "WN": 64, "WTM": 4, "STAGES": 4,
                                                "NTHREADS": 128, "KORDER": 2}
    config = cfg.validate({"experiments": {"matmul": {
        "warp_tiles": mm.DEFAULT_WARP_TILES[:1], "vec4_tiles": [{"rt": 4, "bt": 64, "bk": 8}]}}})
    got = EXP.compile_variants(config)
    assert [cv.params for cv in got if cv.kernel == "matmul_dbuf"] == [
        {"rt": 4, "bt": 64, "bk": 8}]
    assert len([cv for cv in got if cv.kernel == "matmul_warptile"]) == 1


def test_a_rung_the_run_never_launches_is_analysed_at_its_default_tiles():
    big = {"bm": 128, "bn": 256, "bk": 16, "wm": 64, "wn": 64, "wtm": 4, "stages": 2,
           "threads": 256, "korder": 2}
    config = cfg.validate({"experiments": {"matmul": {
        "variants": ["naive", "pipelined"], "pipe_tiles": [big]}}})
    got = EXP.compile_variants(config)
    assert [cv.params for cv in got if cv.kernel == "matmul_pipelined"] == [big]
    assert [cv.params for cv in got if cv.kernel == "matmul_swizzled"] == mm.DEFAULT_PIPE_TILES


# -- the ladder figure, tables and expectation ---------------------------------------------
def test_ladder_figure_labels_each_step_with_pct_of_cublas_and_of_peak(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from cudalab import figcheck

    fig = EXP.plot("ladder", _table(synthetic_records(ladder=True)))
    axes = fig.get_axes()
    assert [a.get_title() for a in axes] == [
        "largest square product: n = 4096", "the course's product 160x240.240x320"]
    ticks = [t.get_text() for t in axes[0].get_yticklabels()]
    assert ticks == ["naive (16x16)", "tiled (32x32)", "register 8x8 (128x128x8)",
                     "vec4 8x8 (128x128x16)", "dbuf 8x8 (128x128x16)",
                     "warptile 128x128x16 w64x64/4 t8x4", "cuBLAS SGEMM"]
    texts = [t.get_text() for t in axes[0].texts]
    # register 20000 of cuBLAS 40000 and of the 66.9 TFLOP/s peak; cuBLAS has no % of itself
    assert "20.0 TFLOP/s, 50% of cuBLAS, 30% of FP32 peak" in texts
    assert "36.0 TFLOP/s, 90% of cuBLAS, 54% of FP32 peak" in texts
    assert "40.0 TFLOP/s, 60% of FP32 peak" in texts
    assert "TFLOP/s" in axes[0].get_xlabel() and fig._suptitle.get_text()
    assert figcheck.problems(fig) == []
    figures.save(fig, tmp_path / "ladder")
    # without cuBLAS: bars without % of cuBLAS; without any GPU point: no figure
    fig = EXP.plot("ladder", _table(synthetic_records(cublas="skipped", ladder=True)))
    assert not any("of cuBLAS" in t.get_text() for t in fig.get_axes()[0].texts)
    assert EXP.plot("ladder", _table([r for r in synthetic_records()
                                      if r["variant"] == "cpu"])) is None


def test_ladder_claim_passes_fails_and_needs_cublas():
    ex = _judged(_table(synthetic_records(ladder=True)))
    e = ex["ladder_near_cublas"]
    assert e.passed is True and "warptile 128x128x16 w64x64/4 t8x4" in e.evidence
    assert "90 % of cuBLAS SGEMM (40.0 TFLOP/s) at 4096" in e.evidence
    slow = synthetic_records(ladder=True)
    for r in slow:
        if r["variant"] in mm.LADDER_KERNELS:
            r["timing"]["median"] *= 2  # the ladder at half speed: 45 % of cuBLAS
    assert _judged(_table(slow))["ladder_near_cublas"].passed is False
    no_cub = _judged(_table(synthetic_records(cublas="skipped", ladder=True)))
    assert no_cub["ladder_near_cublas"].passed is None
    assert "not importable" in no_cub["ladder_near_cublas"].evidence
    # the float64 rows take no part in the float32 claims
    cub = ex["cublas_ceiling"]
    assert cub.passed is True and "DGEMM" not in cub.evidence


def test_double_precision_claims_on_a_synthetic_table():
    ex = _judged(_table(synthetic_records(ladder=True)))
    dmma = ex["dgemm_tensor_cores"]  # 52 TFLOP/s against the CUDA cores' 33.5 (cc 9.0)
    assert dmma.passed is True and "cuBLAS DGEMM 52.0 TFLOP/s at 4096" in dmma.evidence
    assert ex["fp64_slower"].passed is True
    recs = synthetic_records(ladder=True)
    for r in recs:
        r["provenance"]["compute_capability"] = "8.6"  # no FP64 tensor cores
    assert _judged(_table(recs))["dgemm_tensor_cores"].state.value == "not applicable"


def test_ladder_and_fp64_tables():
    tables = EXP.tables(_table(synthetic_records(ladder=True)))
    assert [t["title"].split(" (")[0].split(":")[0] for t in tables] == [
        "The ladder, step by step", "Double precision"]
    lad = tables[0]["html"]
    assert "cp.async" in lad and "warptile 128x128x16 w64x64/4 t8x4" in lad
    assert "<td>219</td><td>16.2 KiB</td><td>25 %</td>" in lad
    assert "<td>–</td>" in lad  # naive has no recorded registers here
    fp64 = tables[1]["html"]
    assert "compute capability 9.0): 1:2" in fp64
    assert "cuBLAS DGEMM / SGEMM = 1.30× at 4096" in fp64
    # DGEMM against the FP64 tensor cores' peak (the FP32 peak on cc 9.0): 52 / 66.9
    assert ("<td>cublas</td><td>52.0 TFLOP/s</td><td>40.0 TFLOP/s</td><td>1.30×</td>"
            "<td>78 %</td>") in fp64
    # without float64 points (the H100 reference): the ladder table alone, of the steps run
    [only] = EXP.tables(_table(synthetic_records()))
    assert only["title"] == tables[0]["title"] and "warptile" not in only["html"]


# -- nvcc: every ladder kernel compiles as the experiment builds it ---------------------------
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit)")


def _flags(defines: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(defines.items()))


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.slow
def test_every_ladder_kernel_compiles_without_spills(arch):
    from cudalab.experiments import static_analysis as sa

    config = cfg.validate({"experiments": {"matmul": copy.deepcopy(EXP.smoke)}})
    cvs = EXP.compile_variants(None) + EXP.compile_variants(config)
    unique = {}
    for cv in cvs:
        if cv.kernel != "matmul_register":
            unique.setdefault((cv.kernel, _flags(cv.defines)), cv)
    seen = set(unique)

    def compile_one(cv):
        return sa.compile_report(NVCC, ROOT / "cuda" / cv.file, _flags(cv.defines), arch, 300)

    # one nvcc per core at a time: the compiles are independent (about 50 s in a row on 2)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        reports = list(pool.map(compile_one, unique.values()))
    for cv, rep_ in zip(unique.values(), reports, strict=True):
        u = rep_[cv.kernel]
        assert u["spill_stores"] == u["spill_loads"] == 0 and u["local"] == 0, (cv, u)
        if cv.kernel == "matmul_warptile":
            want = mm.warp_geometry(cv.params)["smem"]
            assert u["max_threads"] == cv.params["threads"]
        elif cv.kernel in ("matmul_pipelined", "matmul_swizzled"):
            want = mm.pipe_geometry(cv.params)["smem"]
        else:
            want = mm.vec4_smem_bytes(cv.params["bt"], cv.params["bk"],
                                      2 if cv.kernel == "matmul_dbuf" else 1)
            assert u["max_threads"] == mm.register_threads(cv.params["rt"], cv.params["bt"])
        assert u["smem_static"] == want, (cv, u)
    assert {k for k, _ in seen} == {"matmul_vec4", "matmul_dbuf", "matmul_warptile",
                                    "matmul_pipelined", "matmul_swizzled"}


@needs_nvcc
@pytest.mark.parametrize("arch, async_copy", [("sm_75", False), ("sm_80", True),
                                              ("sm_90", True)])
def test_dbuf_uses_cp_async_from_sm_80(arch, async_copy, tmp_path):
    import subprocess

    out = tmp_path / "dbuf.ptx"
    subprocess.run([NVCC, "-ptx", f"-arch={arch}", "-O3", "-DBM=128", "-DBN=128", "-DBK=8",
                    "-DTM=8", "-DTN=8", "-o", str(out), str(ROOT / "cuda/matmul/matmul_ladder.cu")],
                   check=True, capture_output=True)
    ptx = out.read_text()
    dbuf = ptx[ptx.index(".entry matmul_dbuf"):]
    assert ("cp.async.cg.shared.global" in dbuf) == async_copy
    vec4 = ptx[ptx.index(".entry matmul_vec4"):ptx.index(".entry matmul_dbuf")] \
        if ptx.index(".entry matmul_vec4") < ptx.index(".entry matmul_dbuf") else \
        ptx[ptx.index(".entry matmul_vec4"):]
    assert "ld.global.nc.v4.f32" in vec4 and "ld.shared.v4.f32" in vec4
    assert "cp.async" not in vec4


@needs_nvcc
@pytest.mark.parametrize("tile", [
    mm._wt(128, 128, 16, 64, 64, 4, 8, 4, 256),  # threads
    mm._wt(128, 128, 16, 64, 64, 8, 8, 8, 128),  # wm*wn vs 32*tm*tn*wniter
    mm._wt(256, 32, 8, 256, 32, 8, 4, 8, 32),  # sub-tile narrower than tn
    *mm.DEFAULT_WARP_TILES[:2],
])
def test_python_warp_tile_rules_match_the_kernel_s_static_asserts(tile):
    from cudalab.experiments import static_analysis as sa
    from cudalab.experiments.base import CompileFailure

    defines = mm.kernel_defines(Point("matmul", "warptile", dict(tile)))
    python_ok = not [m for m in mm.check_warp_tile(tile) if "outputs per thread" not in m]
    try:
        sa.compile_report(NVCC, ROOT / "cuda/matmul/matmul_ladder.cu", _flags(defines),
                          "sm_90", 300)
        compiled = True
    except CompileFailure:
        compiled = False
    assert compiled == python_ok, (tile, mm.check_warp_tile(tile))


# -- scripts/bench_matmul_ladder.py: its pure parts (the GPU run is in tests/gpu) -------------
def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_matmul_ladder", ROOT / "scripts" / "bench_matmul_ladder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_script_sizes_block_and_table():
    b = _bench()
    assert b.parse_size("4096") == 4096 and b.parse_size("160x240x320") == [160, 240, 320]
    with pytest.raises(Exception, match="give n or MxKxN"):
        b.parse_size("3x4")
    block = b.bench_block([4096, [160, 240, 320]], b.STEPS)
    pts = EXP.points(block)
    assert {p.variant for p in pts} == set(mm.LADDER) and block["dtypes"] == ["float32"]
    assert len([p for p in pts if p.variant == "warptile"]) == 2 * len(mm.DEFAULT_WARP_TILES)
    rows = [{"size": "4096", "variant": v, "config": c, "tflops": t, "error": 1e-7,
             "correct": True, "status": "ok"}
            for v, c, t in (("warptile", "warptile 128x128x16 w64x64/4 t8x4", 45.0),
                            ("cublas", "cuBLAS SGEMM", 50.0))]
    rows.append({"size": "1000", "variant": "naive", "config": "naive (16x16)",
                 "tflops": 5.0, "error": 1e-7, "correct": True, "status": "ok"})
    rows = b.with_pct_of_cublas(rows)
    assert rows[0]["pct_cublas"] == pytest.approx(90.0) and math.isnan(rows[2]["pct_cublas"])
    text = b.format_table(rows)
    assert "warptile 128x128x16 w64x64/4 t8x4" in text and "90 %" in text
    assert "yes (1.0e-07)" in text


@pytest.mark.parametrize("cc, variant, ratio, units", [
    ("9.0", "cublas", 1.0, "FP64 tensor cores"),  # H100: DGEMM on DMMA at the FP32 rate
    ("8.0", "cublas", 1.0, "FP64 tensor cores"),
    ("9.0", "naive", 0.5, "FP64 CUDA cores"),
    ("8.6", "cublas", 1 / 64, "FP64 CUDA cores"),  # no FP64 tensor cores: the CUDA cores
    ("5.0", "cublas", None, ""),
])
def test_fp64_peak_of_the_units_a_point_runs_on(cc, variant, ratio, units):
    """cuBLAS DGEMM is judged against the FP64 tensor cores where the GPU has them (else the
    H100's DGEMM, 63 TFLOP/s, would read 188 % of a CUDA-core FP64 peak)."""
    from cudalab.experiments.matmul import fp64_peak_ratio

    assert fp64_peak_ratio(cc, variant) == (ratio, units)


# -- the H100 reference: each dtype against its own roof, one number for the course table --
H100 = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"


@pytest.fixture(scope="module")
def h100():
    return results.read_table(H100)


def test_dgemm_is_judged_against_the_fp64_peak_of_its_units_on_the_h100(h100):
    """cuBLAS DGEMM at 4096 runs on the FP64 tensor cores: 94 % of their peak, as its record
    (m_pct_peak_fp64) says, in the double-precision table and in the float64 fact."""
    rows = h100[h100["experiment"] == "matmul"]
    dgemm = rows[(rows["variant"] == "cublas") & (rows["p_dtype"] == "float64")
                 & (rows["p_n"] == 4096)].iloc[0]
    assert dgemm["m_pct_peak_fp64"] == pytest.approx(94.16, abs=0.01)
    from cudalab.experiments.matmul.fp64 import fp64_peak

    peak, units = fp64_peak(dgemm)
    assert units == "FP64 tensor cores" and 100 * dgemm["gflops"] / peak == pytest.approx(
        dgemm["m_pct_peak_fp64"], rel=1e-3)
    fp64 = EXP.tables(rows)[1]["html"]
    assert "<td>4096</td><td>cublas</td><td>63.0 TFLOP/s</td>" in fp64
    assert "<td>1.22×</td><td>94 %</td>" in fp64
    from cudalab import explain

    facts = " ".join(explain.explain("matmul", h100))
    assert "In float64 at 4096³ the fastest variant, cuBLAS DGEMM, reaches 63.0 TFLOP/s: 94 %" \
        " of the FP64 peak of the units it runs on (FP64 tensor cores" in facts
    assert "In float32 at 4096³ the fastest variant, cuBLAS SGEMM, reaches 51.7 TFLOP/s" in facts
    assert "at 683 FLOP/byte" in facts and "at 341 FLOP/byte" in facts


def test_the_course_table_and_the_claim_state_one_copy_share(h100):
    """nvprof's share of GPU time (copies over copies + kernel, cudaMalloc left out): the
    course table's number is the one the claim reads."""
    row = next(r for r in course.course_table(h100) if r["lesson"].startswith("nvprof"))
    claim = _judged(h100)["copies_dominate"]
    assert row["verdict"]["state"] == "reproduced" and claim.state.value == "seen"
    # why: the copies' own rates beside the transfer lesson's pageable and pinned copies
    assert row["why"]["kind"] == "fact" and "pageable 8.25 GB/s" in row["why"]["statement"]
    assert "they run at the pageable rate" in row["why"]["statement"]
    assert f"= {fmt.percent(row['this'])} for tiled (16x16) at 160x240.240x320" in \
        claim.evidence
    assert 90 < row["this"] < 95  # the share with cudaMalloc counted read 80 %
