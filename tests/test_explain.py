"""Explanations and caption checks on synthetic data: every branch of every lesson, and the
registry of caption claims kept in step with the captions."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from cudalab import claims, explain, fmt, results, roofline, run_ceilings
from cudalab.experiments import REGISTRY
from cudalab.experiments.coalescing import lesson as coalescing_lesson
from cudalab.experiments.fast_math import lesson as fast_math_lesson
from cudalab.experiments.matmul import lesson as matmul_lesson
from cudalab.experiments.occupancy import lesson as occupancy_lesson
from cudalab.experiments.sobel import lesson as sobel_lesson
from cudalab.experiments.vector_add import lesson as vector_add_lesson

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"
MiB = 1 << 20
HOT = '{"cold_l2": false}'


def pt(experiment: str, variant: str, seconds: float, flops: float = math.nan,
       nbytes: float = 1e9, **extra) -> dict:
    gbps = nbytes / seconds / 1e9
    return {"experiment": experiment, "variant": variant, "status": "ok",
            "point_id": f"{variant}-{'-'.join(f'{k}{v}' for k, v in extra.items())}",
            "timer": "cuda_event_queued", "harness": HOT, "flops": flops, "bytes": nbytes,
            "time_median_s": seconds, "gbps": gbps, "gflops": flops / seconds / 1e9,
            "peak_mem_gbps": 3352.0, "pct_peak_gflops": 100 * flops / seconds / 1e9 / 66900,
            "l2_bytes": 50.0 * MiB, **extra}


def table(rows: list[dict], ceilings: bool = True) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    if ceilings:
        df["ceil_dram_gbps"], df["ceil_fp32_gflops"] = 3000.0, 60000.0
    return df


def matmul(naive_tflops: float = 5.0, **ncu) -> pd.DataFrame:
    n, fl, by = 4096, 2.0 * 4096 ** 3, 12.0 * 4096 ** 2
    size = {"p_m": n, "p_k": n, "p_n": n}
    rows = [pt("matmul", "naive", fl / naive_tflops / 1e12, fl, by, **size,
               **ncu.get("naive", {})),
            pt("matmul", "cublas", fl / 50e12, fl, by, **size),
            pt("matmul", "cpu", 10.0, fl, by, **size) | {"timer": "perf_counter"}]
    for tile, con, pad in ((32, 9.0e6, 0.0), (16, 4.0e6, 0.0)):
        rows += [pt("matmul", "tiled_conflict", fl / 2e12, fl, by, p_tile=tile, **size,
                    **({"m_ncu_smem_bank_conflicts_ld": con, "m_ncu_status": "ok"}
                       if ncu.get("conflicts") else {})),
                 pt("matmul", "tiled_padded", fl / 8e12, fl, by, p_tile=tile, **size,
                    **({"m_ncu_smem_bank_conflicts_ld": pad, "m_ncu_status": "ok"}
                       if ncu.get("conflicts") else {}))]
    return table(rows)


def _claim(name: str, df: pd.DataFrame, key: str) -> claims.ClaimResult:
    return next(r for r in claims.evaluate(name, df) if r.key == key)


def test_naive_matmul_served_by_caches_with_l2_hit_rate():
    c = _claim("matmul", matmul(5.0), "naive_cache_fed")
    assert c.passed is True
    assert ("5.00 TFLOP/s at 4096 = 6.67× what the measured DRAM ceiling 3.00 TB/s could "
            "feed at 4 bytes per flop (750 GFLOP/s)") in c.evidence
    assert "caches serve" in c.statement and "hit rate" not in c.evidence
    hit = matmul(5.0, naive={"m_ncu_l2_hit_rate_pct": 93.5, "m_ncu_status": "ok"})
    assert _claim("matmul", hit, "naive_cache_fed").evidence.endswith(
        "(750 GFLOP/s); Nsight Compute: L2 hit rate 94 %")
    skipped = matmul(5.0, naive={"m_ncu_l2_hit_rate_pct": 93.5,
                                 "m_ncu_status": "not profiled: ncu missing"})
    assert "hit rate" not in _claim("matmul", skipped, "naive_cache_fed").evidence


def test_naive_matmul_fed_by_dram_and_absent():
    assert _claim("matmul", matmul(0.5), "naive_cache_fed").passed is False
    df = matmul()
    no_naive = _claim("matmul", df[df["variant"] != "naive"], "naive_cache_fed")
    assert no_naive.passed is None and no_naive.state.value == "not measured"


def test_theoretical_ceiling_is_named_when_nothing_was_measured():
    df = matmul(5.0).drop(columns=["ceil_dram_gbps", "ceil_fp32_gflops"])
    c = _claim("matmul", df, "naive_cache_fed")
    assert f"theoretical DRAM ceiling {fmt.bandwidth(3352.0)}" in c.evidence


def test_bank_conflicts_only_with_profiler_counts():
    plain = roofline.annotate(matmul())
    assert matmul_lesson.matmul_bank_conflicts(plain, run_ceilings.ceilings_of(plain)) is None
    df = roofline.annotate(matmul(conflicts=True))
    s = matmul_lesson.matmul_bank_conflicts(df, run_ceilings.ceilings_of(df))
    assert s == ("Shared-memory bank conflicts counted by Nsight Compute at 4096³: tile 32: "
                 f"{fmt.integer(9e6)} conflicting vs 0 padded; tile 16: {fmt.integer(4e6)} "
                 "conflicting vs 0 padded.")


def test_best_matmul_against_the_roof_of_its_dtype():
    df = roofline.annotate(matmul())
    s = matmul_lesson.matmul_best_fp32(df, run_ceilings.ceilings_of(df))
    assert "cuBLAS SGEMM, reaches 50.0 TFLOP/s: 83 % of the measured FP32 ceiling" in s
    assert "at 683 FLOP/byte" in s  # 2n^3 / 12n^2 = n / 6
    assert matmul_lesson.matmul_best_fp64(df, run_ceilings.ceilings_of(df)) is None  # no float64


def occupancy(ncu: bool) -> pd.DataFrame:
    rows = []
    for bs, occ, gbps in ((32, 0.5, 600.0), (64, 1.0, 1200.0), (128, 1.0, 2500.0),
                          (256, 1.0, 2600.0), (1024, 0.75, 2450.0)):
        extra = {"m_ncu_achieved_occupancy_pct": 100 * occ * 0.7 if bs == 1024
                 else 100 * occ * 0.95, "m_ncu_status": "ok"} if ncu else {}
        rows.append(pt("occupancy", "vec_mul", 1e9 / gbps / 1e9, 1e6, 1e9, p_block_size=bs,
                       m_occupancy_theory=occ, **extra))
    return table(rows)


def test_occupancy_achieved_vs_theoretical():
    plain = roofline.annotate(occupancy(ncu=False))
    assert occupancy_lesson.occupancy_achieved(plain, run_ceilings.ceilings_of(plain)) is None
    df = roofline.annotate(occupancy(ncu=True))
    s = occupancy_lesson.occupancy_achieved(df, run_ceilings.ceilings_of(df))
    assert "vec_mul: achieved 70–95 % of theoretical over 5 block sizes" in s
    assert "least at 1024 threads (52 % of 75 %)" in s
    assert "1 points stay below 80% of their theoretical occupancy" in s


def test_occupancy_knee_and_what_occupancy_does_not_explain():
    df = roofline.annotate(occupancy(ncu=False))
    s = occupancy_lesson.occupancy_knee(df, run_ceilings.ceilings_of(df))
    assert (f"within 10% of its best {fmt.bandwidth(2600)} from 75 % theoretical occupancy "
            "up") in s
    assert f"below that it drops to {fmt.bandwidth(600)}" in s
    assert ("yet 1 block sizes with at least that occupancy stay below it (64 threads: "
            f"{fmt.bandwidth(1200)})") in s


def coalescing() -> pd.DataFrame:
    return table([
        pt("coalescing", "copy", 512 * MiB / 2.4e12, nbytes=512.0 * MiB),
        pt("coalescing", "stride", 512 * MiB / 0.3e12, nbytes=512.0 * MiB, p_stride=32),
        pt("coalescing", "stride", 512 * MiB / 2.3e12, nbytes=512.0 * MiB, p_stride=1),
        pt("coalescing", "transpose_padded", 32 * MiB / 3.8e12, nbytes=32.0 * MiB,
           p_size=2048),
        pt("coalescing", "transpose_padded", 512 * MiB / 2.7e12, nbytes=512.0 * MiB,
           p_size=8192),
    ])


def test_coalescing_share_of_the_copy_ceiling_leaves_out_l2_points():
    df = roofline.annotate(coalescing())
    s = coalescing_lesson.coalescing_vs_ceiling(df, run_ceilings.ceilings_of(df))
    assert s == (f"Against the measured DRAM ceiling {fmt.bandwidth(3000)} (DRAM-resident "
                 "points): copy 80 %, stride 10–77 %, transpose_padded 90 %.")


def test_transpose_above_the_dram_ceiling_is_called_l2_resident():
    df = roofline.annotate(coalescing())
    s = coalescing_lesson.coalescing_transpose_l2(df, run_ceilings.ceilings_of(df))
    assert (f"transpose_padded at 2048² ({fmt.bandwidth(3800)}, working set 32 MiB, "
            "L2-resident)") in s
    assert "fits the 50 MiB L2" in s and "8192" not in s
    below = df[df["p_size"] != 2048]
    assert coalescing_lesson.coalescing_transpose_l2(below, run_ceilings.ceilings_of(df)) is None


def test_vector_add_share_and_l2_sizes():
    df = roofline.annotate(table([
        pt("vector_add", "gpu", 805e6 / 2.7e12, 2.0 ** 26, 805e6, p_n=2 ** 26, p_threads=256),
        pt("vector_add", "gpu", 805e6 / 0.6e12, 2.0 ** 26, 805e6, p_n=2 ** 26, p_threads=32),
        pt("vector_add", "gpu", 12e6 / 3.2e12, 1e6, 12e6, p_n=10 ** 6, p_threads=256)]))
    s = vector_add_lesson.vector_add_share(df, run_ceilings.ceilings_of(df))
    assert s.startswith(f"At n = {fmt.integer(2 ** 26)} (768 MiB moved, dram) the best block "
                        f"size, 256 threads, reaches {fmt.bandwidth(2700)} = 90 % of the "
                        "measured DRAM ceiling")
    assert f"n = {fmt.integer(10 ** 6)} fit L2 on this hot run" in s


@pytest.mark.parametrize("shared_gbps, says", [(400.0, "shared / global = 0.667×"),
                                                (900.0, "shared / global = 1.50×")])
def test_sobel_caches_either_way(shared_gbps, says):
    """The sentence states the measured ratio either way; why the tile loses is a labelled
    hypothesis with the profile that would test it, never a measured cause."""
    df = roofline.annotate(table([
        pt("sobel", "global", 1 / 600, p_width=8192),
        pt("sobel", "shared", 1 / shared_gbps, p_width=8192),
        pt("sobel", "shared", 1 / 2000, p_width=512)]))
    said = sobel_lesson.sobel_caches(df, run_ceilings.ceilings_of(df))
    assert says in said
    assert ("Nsight Compute" in said) == (shared_gbps < 600), said


def test_fast_math_sides_of_the_ridge():
    rows = [pt("fast_math", v, t, fl, 128.0 * MiB, p_iterations=it, p_n=2 ** 24)
            for it, fl in ((1, 3.2e8), (256, 8.2e10)) for v, t in (("precise", 1e-3),
                                                                 ("fast_math", 5e-4))]
    df = roofline.annotate(table(rows))
    s = fast_math_lesson.fast_math_ridge(df, run_ceilings.ceilings_of(df))
    assert s.startswith("The measured ridge point is at 20 FLOP/byte")
    assert "1 iteration(s) sit left of it" in s and "256 iterations right of it" in s


def test_explain_reads_the_whole_table_and_skips_absent_experiments():
    df = pd.concat([matmul(), coalescing()], ignore_index=True)
    assert len(explain.explain("matmul", df)) == 1  # float32 only, no ncu: one sentence
    assert explain.explain("sobel", df) == []
    assert explain.explain("transfer", df) == []


# -- caption claims ------------------------------------------------------------------------
def _verdict(name: str, df: pd.DataFrame) -> list[bool | None]:
    """The verdicts of the lesson's own claims (not the older computed list)."""
    keys = {c.name for c in REGISTRY[name].lesson.claims}
    return [r.supported for r in claims.evaluate(name, df) if r.key in keys]


def test_claims_supported_and_contradicted():
    assert _by_key("matmul", matmul(), ["cublas_ceiling"]) == [True]
    slow = matmul()
    slow.loc[slow["variant"] == "cublas", "gflops"] = 1000.0
    assert _by_key("matmul", slow, ["cublas_ceiling"]) == [False]
    flat_key = ["offset_flat"]
    assert _by_key("coalescing", coalescing(), flat_key) == [None]  # no offset points
    flat = table([pt("coalescing", "offset", 1 / 2300, p_offset=o) for o in range(3)])
    assert _by_key("coalescing", flat, flat_key) == [True]
    flat.loc[1, "gbps"] = 1000.0
    assert _by_key("coalescing", flat, flat_key) == [False]


def test_occupancy_claim_smallest_full_block_is_slower():
    df, key = occupancy(ncu=False), ["full_but_slow"]
    assert _by_key("occupancy", df, key) == [True]  # 64 threads: 100 % on paper, 1,200 GB/s
    assert _by_key("occupancy", df[df["p_block_size"] != 64], key) == [False]  # 128: its best
    assert _by_key("occupancy", df[df["p_block_size"] == 32], key) == [None]  # none at 100 %


def test_vector_add_claims():
    rows = [pt("vector_add", "gpu", 1 / g, p_n=2 ** 26, p_threads=t)
            for t, g in ((32, 600.0), (256, 2700.0))]
    keys = ["large_near_bandwidth", "blocks_of_32_lag"]
    assert _by_key("vector_add", table(rows), keys) == [True, True]
    rows = [pt("vector_add", "gpu", 1 / g, p_n=2 ** 26, p_threads=t)
            for t, g in ((32, 1000.0), (256, 1100.0))]
    assert _by_key("vector_add", table(rows), keys) == [False, False]


def _by_key(name: str, df: pd.DataFrame, keys: list[str]) -> list[bool | None]:
    got = {r.key: r.supported for r in claims.evaluate(name, df)}
    return [got[k] for k in keys]


def test_sobel_and_fast_math_claims():
    far = ["far_from_bandwidth"]
    assert _by_key("sobel", table([pt("sobel", "global", 1 / 600, p_width=8192)]), far) == [
        True]
    assert _by_key("sobel", table([pt("sobel", "global", 1 / 2500, p_width=8192)]), far) == [
        False]
    one = [pt("fast_math", "precise", 1e-3, 1e6, p_iterations=1, p_n=2 ** 24),
           pt("fast_math", "fast_math", 5e-4, 1e6, p_iterations=1, p_n=2 ** 24)]
    key = ["smaller_gain_at_one"]
    assert _by_key("fast_math", table(one), key) == [None]  # nothing at more iterations
    many = [pt("fast_math", "precise", 8e-3, 1e6, p_iterations=50, p_n=2 ** 24),
            pt("fast_math", "fast_math", 2e-3, 1e6, p_iterations=50, p_n=2 ** 24)]
    assert _by_key("fast_math", table(one + many), key) == [True]  # 2x at 1, 4x at 50
    one[1]["time_median_s"] = 2.5e-4  # 4x at 1 as well: not smaller
    assert _by_key("fast_math", table(one + many), key) == [False]


def test_reference_run_explanations():
    """The committed H100 run: naive matmul served by caches, the 2048² padded transpose
    L2-resident, sobel far from the DRAM bandwidth (18 % of it)."""
    df = results.read_table(REFERENCE)
    assert _by_key("matmul", df, ["naive_cache_fed"]) == [True]
    co = " ".join(explain.explain("coalescing", df))
    assert "transpose_padded at 2048²" in co and "L2-resident" in co
    assert _by_key("sobel", df, ["far_from_bandwidth"]) == [True]
