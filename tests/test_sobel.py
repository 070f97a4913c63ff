"""CPU tests of the sobel experiment: config, grid, the numpy reference against a slow
explicit loop, the pixel comparison, the lesson's claims and the figure.

Every results frame below is SYNTHETIC TEST DATA: records fabricated from a simple
bandwidth model, never measurements.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from cudalab import claims, results
from cudalab import config as cfg
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Point
from cudalab.experiments.sobel import SENTINEL, WX, WY, compare, make_image, reference

ROOT = Path(__file__).resolve().parent.parent

matplotlib.use("Agg")

NAME = "sobel"
EXP = REGISTRY[NAME]


def validate(block: dict) -> dict:
    return cfg.validate({"experiments": {NAME: block}})["experiments"][NAME]


def slow_sobel(u: np.ndarray, threshold: int) -> np.ndarray:
    """The course's formula, one pixel at a time, in Python integers."""
    h, w = u.shape
    u = u.astype(int)
    e = np.zeros((h, w), np.uint8)
    for i in range(1, h - 1):
        for j in range(1, w - 1):
            gx = ((u[i - 1][j + 1] - u[i - 1][j - 1]) + 2 * (u[i][j + 1] - u[i][j - 1])
                  + (u[i + 1][j + 1] - u[i + 1][j - 1]))
            gy = ((u[i - 1][j - 1] + 2 * u[i - 1][j] + u[i - 1][j + 1])
                  - (u[i + 1][j - 1] + 2 * u[i + 1][j] + u[i + 1][j + 1]))
            e[i][j] = 255 if gx * gx + gy * gy > threshold else 0
    return e


# -- config ---------------------------------------------------------------------------------
def test_defaults_are_the_course_grid():
    b = validate({})
    assert b["sizes"] == [512, 2048, 8192]
    assert b["variants"] == ["global", "shared", "constant"]
    assert [16, 16] in b["block_shapes"] and [32, 8] in b["block_shapes"]
    assert b["threshold"] == 10000


@pytest.mark.parametrize("block, where, says", [
    ({"block_shapes": [[64, 32]]}, "experiments.sobel.block_shapes[0]", "at most 1024"),
    ({"block_shapes": [[16, 16], [2048, 1]]}, "experiments.sobel.block_shapes[1][0]",
     "<= 1024"),
    ({"block_shapes": [[16]]}, "experiments.sobel.block_shapes[0]", "exactly 2"),
    ({"variants": ["texture"]}, "experiments.sobel.variants[0]",
     "allowed values: ['global', 'shared', 'constant']"),
    ({"sizes": [2]}, "experiments.sobel.sizes[0]", ">= 3"),
    ({"sizes": [[100, 100, 3]]}, "experiments.sobel.sizes[0]", "exactly 2"),
    ({"threshold": -1}, "experiments.sobel.threshold", ">= 0"),
    ({"block_shape": [[16, 16]]}, "experiments.sobel", "did you mean 'block_shapes'"),
])
def test_bad_blocks_name_the_key_and_what_is_allowed(block, where, says):
    with pytest.raises(ConfigError) as e:
        validate(block)
    assert where in str(e.value) and says in str(e.value), str(e.value)


def test_smoke_block_is_small_and_has_a_ragged_size():
    b = validate(dict(EXP.smoke))
    pts = EXP.points(b)
    assert 0 < len(pts) <= 24
    assert max(p.params["height"] * p.params["width"] for p in pts) <= 512 * 512
    # a size that is no multiple of any block edge exercises the bounds checks
    assert any(p.params["width"] % 8 and p.params["height"] % 8 for p in pts)


# -- grid -----------------------------------------------------------------------------------
def test_points_cover_sizes_variants_and_shapes_in_size_order():
    b = validate({"sizes": [2048, [100, 300], 64], "block_shapes": [[16, 16], [32, 8]]})
    pts = EXP.points(b)
    assert len(pts) == 3 * 3 * 2
    sizes = [(p.params["height"], p.params["width"]) for p in pts]
    assert sizes == sorted(sizes, key=lambda s: s[0] * s[1])
    assert sizes[0] == (64, 64) and (100, 300) in sizes
    assert {p.variant for p in pts} == {"global", "shared", "constant"}
    assert len({p.point_id for p in pts}) == len(pts)
    assert all(p.gpu for p in pts)


# -- reference ------------------------------------------------------------------------------
@pytest.mark.parametrize("h, w", [(3, 3), (4, 9), (17, 13), (40, 33)])
@pytest.mark.parametrize("threshold", [0, 1000, 10000, 200000])
def test_reference_matches_the_explicit_loop(h, w, threshold):
    rng = np.random.default_rng(h * 100 + w)
    u = rng.integers(0, 256, (h, w), dtype=np.uint8)
    assert np.array_equal(reference(u, threshold), slow_sobel(u, threshold))


def test_reference_on_the_test_image_and_in_any_chunking():
    u = make_image(61, 47, np.random.default_rng(3))
    ref = reference(u, 10000)
    assert np.array_equal(ref, slow_sobel(u, 10000))
    for rows in (1, 2, 7, 59, 60, 1000):
        assert np.array_equal(reference(u, 10000, rows_per_chunk=rows), ref)


def test_reference_extremes_and_border():
    u = np.zeros((5, 6), np.uint8)
    u[:, 3:] = 255  # a vertical step: gx = 4 * 255 = 1020 next to it
    e = reference(u, 1020 * 1020 - 1)
    assert (e[0] == 0).all() and (e[-1] == 0).all() and (e[:, 0] == 0).all()
    assert (e[1:-1, 2] == 255).all() and (e[1:-1, 3] == 255).all()
    assert (e[1:-1, 1] == 0).all() and (e[1:-1, 4] == 0).all()
    assert not reference(u, 1020 * 1020).any()  # "> threshold", not ">="
    flat = np.full((8, 8), 77, np.uint8)
    assert not reference(flat, 0).any()
    assert reference(np.zeros((2, 9), np.uint8), 0).shape == (2, 9)


def test_constant_memory_masks_are_the_formula():
    """sobel_wx[(di+1)*3 + (dj+1)] weighs u[i+di][j+dj] in cuda/sobel/sobel.cu."""
    rng = np.random.default_rng(0)
    u = rng.integers(0, 256, (9, 11)).astype(np.int64)
    i, j = 4, 5
    win = u[i - 1:i + 2, j - 1:j + 2]
    gx = ((u[i - 1][j + 1] - u[i - 1][j - 1]) + 2 * (u[i][j + 1] - u[i][j - 1])
          + (u[i + 1][j + 1] - u[i + 1][j - 1]))
    gy = ((u[i - 1][j - 1] + 2 * u[i - 1][j] + u[i - 1][j + 1])
          - (u[i + 1][j - 1] + 2 * u[i + 1][j] + u[i + 1][j + 1]))
    assert int((WX * win).sum()) == gx and int((WY * win).sum()) == gy
    assert WX.dtype == WY.dtype == np.int32 and WX.nbytes == 36


def test_test_image_is_deterministic_and_has_edges():
    a = make_image(256, 300, np.random.default_rng(7))
    b = make_image(256, 300, np.random.default_rng(7))
    assert a.dtype == np.uint8 and a.shape == (256, 300)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, make_image(256, 300, np.random.default_rng(8)))
    e = reference(a, 10000)
    frac = np.count_nonzero(e) / e.size
    assert 0.002 < frac < 0.5
    assert a.min() < 40 and a.max() > 215  # shapes span the grey range


def test_compare_counts_differing_pixels():
    ref = reference(make_image(32, 40, np.random.default_rng(1)), 10000)
    assert compare(ref.copy(), ref).passed and compare(ref.copy(), ref).error == 0
    out = ref.copy()
    out[5, 6] = 255 - out[5, 6]
    out[0, 0] = SENTINEL
    c = compare(out, ref)
    assert c.error == 2 and c.tolerance == 0 and not c.passed
    assert "row 0, column 0" in c.detail and "1 pixels unwritten" in c.detail


# -- expectations and figures on SYNTHETIC frames -------------------------------------------
def synthetic_record(variant, params, median_s, *, status="ok"):
    """A fabricated raw record (SYNTHETIC TEST DATA), shaped like the runner's."""
    h, w = params["height"], params["width"]
    return {
        "schema_version": results.SCHEMA_VERSION, "experiment": NAME, "variant": variant,
        "point_id": Point(NAME, variant, params).point_id, "params": params,
        "job_id": "synthetic", "status": status,
        "reason": "" if status == "ok" else "differing_pixels = 12 exceeds tolerance 0",
        "timing": {"samples_s": [median_s] * 3, "median": median_s, "iqr": 0.0, "cv": 0.0,
                   "min": median_s, "mean": median_s, "std": 0.0, "n": 3, "batch": 1,
                   "timer": "cuda_event", "stop_reason": "converged", "n_throttled": 0},
        "work": {"flops": math.nan, "bytes": 2.0 * h * w},
        "check": {"error": 0 if status == "ok" else 12, "tolerance": 0,
                  "metric": "differing_pixels", "passed": status == "ok", "detail": ""},
        "metrics": {"edge_fraction": 0.01, "threads_per_block": params["bx"] * params["by"]},
        "provenance": {"gpu_name": "SYNTHETIC TEST DATA"},
    }


def synthetic_frame(shared_speedup=1.1, wrong=()):
    """SYNTHETIC: time = 3 us + 2 bytes/pixel / (2500 GB/s x kernel factor x shape factor)."""
    kernel = {"global": 1.0, "shared": shared_speedup, "constant": 0.97}
    shape = {(16, 16): 1.0, (32, 8): 1.05, (32, 32): 0.95}
    recs = []
    for n in (512, 2048, 8192):
        for v, kf in kernel.items():
            for (bx, by), sf in shape.items():
                p = {"height": n, "width": n, "bx": bx, "by": by}
                t = 3e-6 + 2.0 * n * n / (2500e9 * kf * sf)
                st = "wrong" if (v, n, bx, by) in wrong else "ok"
                recs.append(synthetic_record(v, p, t, status=st))
    return results.build_table(recs)


def test_synthetic_frame_is_a_valid_table():
    df = synthetic_frame()
    assert results.check_table(df) == []
    assert {"p_height", "p_width", "p_bx", "p_by", "m_edge_fraction"} <= set(df.columns)
    assert df["gbps"].notna().all()


def _claims(df):
    return {r.key: r for r in claims.evaluate(NAME, df)}


def test_claims_seen_on_plausible_synthetic_data():
    ex = _claims(synthetic_frame())
    assert list(ex) == ["correct", "far_from_bandwidth", "shared_not_slower",
                        "constant_free", "wide_blocks"]
    ex.pop("far_from_bandwidth")  # no DRAM ceiling in a synthetic table: not measured
    assert all(e.passed for e in ex.values()), [(e.claim, e.evidence) for e in ex.values()]
    assert "27/27" in ex["correct"].evidence
    assert ("shared runs at 1.09× the speed of global at 8192 x 8192"
            in ex["shared_not_slower"].evidence)
    assert "course expectation" in ex["shared_not_slower"].claim
    assert "global 32 x 8" in ex["wide_blocks"].evidence


def test_claims_not_seen_when_the_data_says_so():
    ex = _claims(synthetic_frame(shared_speedup=0.8, wrong=(("shared", 512, 16, 16),)))
    assert ex["correct"].passed is False and "26/27" in ex["correct"].evidence
    assert ex["shared_not_slower"].passed is False
    assert "shared runs at 0.809×" in ex["shared_not_slower"].evidence
    # within 5 %: "not slower"
    assert _claims(synthetic_frame(shared_speedup=0.97))["shared_not_slower"].passed is True


def test_narrow_blocks_winning_contradicts_the_wide_block_claim():
    df = synthetic_frame()
    narrow = df["p_bx"] == 16
    df.loc[narrow, "time_median_s"] /= 1.2
    assert _claims(df)["wide_blocks"].passed is False


def test_claims_without_shared_say_less():
    df = synthetic_frame()
    ex = _claims(df[df["variant"] != "shared"])
    assert ex["shared_not_slower"].passed is None and ex["constant_free"].passed is True
    ex = _claims(df[df["variant"] == "global"])
    assert ex["shared_not_slower"].passed is None and ex["constant_free"].passed is None


def test_plot_draws_one_panel_per_size_with_units():
    df = synthetic_frame(wrong=(("global", 8192, 32, 32),))
    fig = EXP.plot("gbps", df)
    axes = fig.get_axes()
    assert len(axes) == 3
    assert "GB/s" in axes[0].get_ylabel() and "block shape" in axes[0].get_xlabel()
    assert [a.get_title() for a in axes] == ["512x512 pixels", "2048x2048 pixels",
                                            "8192x8192 pixels"]
    assert fig._suptitle is not None
    assert EXP.plot("gbps", df[df["status"] == "wrong"]) is None
    with pytest.raises(KeyError):
        EXP.plot("nope", df)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_every_declared_figure_draws():
    df = synthetic_frame()
    for name in EXP.lesson.figures:
        assert EXP.plot(name, df) is not None


# -- the GPU code path on a FAKE GPU (see test_fast_math.py) ----------------------------------
def _emulate(variant):
    def run(kernel, grid, block, u_d, e_d, h, w, thr):
        if variant == "shared":  # compiled for one block shape, launched with it
            assert (block[0], block[1]) == (kernel.defines["BX"], kernel.defines["BY"])
        u = u_d.buf[: h * w].reshape(h, w).astype(np.int64)
        e = e_d.buf[: h * w].reshape(h, w)
        if variant == "constant":  # the masks the host put in constant memory
            cuda = kernel.gpu.cuda
            wx = cuda.symbols[kernel.globals["sobel_wx"]].buf.view(np.int32).reshape(3, 3)
            wy = cuda.symbols[kernel.globals["sobel_wy"]].buf.view(np.int32).reshape(3, 3)
        else:
            wx, wy = WX, WY
        gx = np.zeros((h - 2, w - 2), np.int64)
        gy = np.zeros_like(gx)
        for di in range(3):
            for dj in range(3):
                win = u[di:h - 2 + di, dj:w - 2 + dj]
                gx += int(wx[di, dj]) * win
                gy += int(wy[di, dj]) * win
        full = np.zeros((h, w), np.uint8)
        full[1:-1, 1:-1] = np.where(gx * gx + gy * gy > thr, 255, 0)
        rows, cols = min(h, grid[1] * block[1]), min(w, grid[0] * block[0])
        e[:rows, :cols] = full[:rows, :cols]  # threads outside the image return
    return run


def _fake_gpu(**override):
    from test_fast_math import FakeGpu

    emus = {f"sobel_{v}": _emulate(v) for v in ("global", "shared", "constant")}
    return FakeGpu(emus | override, global_sizes={"sobel_wx": 36, "sobel_wy": 36})


def test_smoke_grid_through_the_runner_on_a_fake_gpu(tmp_path, monkeypatch):
    from test_fast_math import run_on_fake_gpu

    gpu = _fake_gpu()
    df = run_on_fake_gpu(NAME, EXP.smoke, gpu, tmp_path, monkeypatch)
    assert (df["status"] == "ok").all(), df[["point_id", "reason"]].to_string()
    assert len(df) == len(EXP.points(validate(dict(EXP.smoke))))
    assert (df["error_metric"] == "differing_pixels").all() and (df["error"] == 0).all()
    shared = {tuple(sorted(k.defines.items())) for k in gpu.kernels.values() if k.defines}
    assert shared == {(("BX", 16), ("BY", 16)), (("BX", 32), ("BY", 8))}
    row = df[(df["p_height"] == 37) & (df["p_width"] == 50)].iloc[0]
    assert row["bytes"] == 2 * 37 * 50
    # every record says how many blocks of how many threads its timed launch had
    blocks = -(-df["p_width"] // df["p_bx"]) * -(-df["p_height"] // df["p_by"])
    assert (df["launch_blocks"] == blocks).all()
    assert (df["launch_threads"] == df["p_bx"] * df["p_by"]).all()
    assert EXP.plot("gbps", df) is not None
    assert len(claims.evaluate(NAME, df)) == 5


def test_constant_weights_must_reach_the_device(tmp_path, monkeypatch):
    """If the masks were not copied to constant memory the edge map would be all zeros."""
    from test_fast_math import run_on_fake_gpu

    gpu = _fake_gpu()
    gpu.cuda.memcpy_htod_orig = gpu.cuda.memcpy_htod
    gpu.cuda.memcpy_htod = lambda dest, src: (None if isinstance(dest, int)
                                              else gpu.cuda.memcpy_htod_orig(dest, src))
    df = run_on_fake_gpu(NAME, {"sizes": [64], "variants": ["constant", "global"],
                                "block_shapes": [[16, 16]]}, gpu, tmp_path, monkeypatch)
    st = df.set_index("variant")["status"].to_dict()
    assert st == {"constant": "wrong", "global": "ok"}
    assert "differing_pixels" in df.set_index("variant").loc["constant", "reason"]


def test_a_grid_that_misses_pixels_fails_the_check(tmp_path, monkeypatch):
    from test_fast_math import run_on_fake_gpu

    def short(kernel, grid, block, *args):
        _emulate("global")(kernel, (grid[0], grid[1] - 1), block, *args)

    gpu = _fake_gpu(sobel_global=short)
    df = run_on_fake_gpu(NAME, {"sizes": [[40, 64]], "variants": ["global"],
                                "block_shapes": [[16, 16]]}, gpu, tmp_path, monkeypatch)
    row = df.iloc[0]
    assert row["status"] == "wrong" and row["error"] == 8 * 64
    assert "pixels unwritten" in row["reason"]


# -- the kernel source ----------------------------------------------------------------------
def test_kernel_and_symbol_names_match_the_source():
    import re

    src = (ROOT / "cuda" / "sobel/sobel.cu").read_text()
    names = set(re.findall(r'extern "C" __global__ void (\w+)\(', src))
    assert names == {f"sobel_{v}" for v in ("global", "shared", "constant")}
    assert "__constant__ int sobel_wx[9];" in src and "__constant__ int sobel_wy[9];" in src


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc not installed")
@pytest.mark.parametrize("bx, by", [(16, 16), (32, 8), (32, 32), (1, 1024)])
def test_source_compiles_for_every_block_shape(bx, by, tmp_path):
    import subprocess

    out = subprocess.run(["nvcc", "-O3", f"-DBX={bx}", f"-DBY={by}", "-Xptxas", "-v", "-c",
                          str(ROOT / "cuda" / "sobel/sobel.cu"), "-o", str(tmp_path / "s.o")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"{(bx + 2) * (by + 2)} bytes smem" in out.stderr  # the tile with its halo
