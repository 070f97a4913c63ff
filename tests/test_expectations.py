"""Every expected effect can fail: for each check, the H100 reference results (which show
the effect) are edited so the effect is gone, and the check must then say "not seen".

The edits are small and physical: a variant made slower or faster (time, GB/s and GFLOP/s
scaled together), a point marked wrong, a count changed. The reference frame itself must
pass every check (except the ones the H100 does not show, listed in NOT_ON_H100), so each
case is a pair: with the effect -> seen, without it -> not seen.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cudalab import results
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Experiment

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"

# checks the H100 run does not pass (the report flags them as contradicting the caption)
NOT_ON_H100 = {("sobel", "(course expectation) the shared-memory tiled kernel")}


@pytest.fixture(scope="module")
def ref() -> pd.DataFrame:
    return results.read_table(REFERENCE)


def scale(df: pd.DataFrame, mask: pd.Series, f: float) -> pd.DataFrame:
    """The rows in `mask` take f times as long: time x f, rates / f."""
    df = df.copy()
    for c in ("time_median_s", "time_min_s", "time_mean_s", "m_kernel_s"):
        if c in df:
            df.loc[mask, c] = df.loc[mask, c] * f
    for c in ("gflops", "gbps", "pct_peak_gflops", "pct_peak_gbps"):
        df.loc[mask, c] = df.loc[mask, c] / f
    return df


def setv(df: pd.DataFrame, mask: pd.Series, col: str, value) -> pd.DataFrame:
    df = df.copy()
    df.loc[mask, col] = value
    return df


def var(df: pd.DataFrame, *variants: str) -> pd.Series:
    return df["variant"].isin(variants)


def first(df: pd.DataFrame, mask: pd.Series) -> pd.Series:
    return df.index == df[mask].index[0]


def largest(df: pd.DataFrame, col: str) -> pd.Series:
    return df[col] == df[col].max()


def _mm_course(d):
    return (d["p_m"] == 160) & (d["p_k"] == 240) & (d["p_n"] == 320)


# (experiment, start of the claim, edit that removes the effect)
Edit = Callable[[pd.DataFrame], pd.DataFrame]
CASES: list[tuple[str, str, Edit]] = [
    ("device_query", "cudalab's limits table", lambda d: setv(d, d.index == d.index[0],
                                                              "status", "wrong")),
    ("device_query", "the theoretical peaks could be computed",
     lambda d: setv(d, d.index == d.index[0], "m_peak_mem_gbps", np.nan)),
    ("vector_add", "every GPU result matches", lambda d: setv(d, first(d, d["gbps"] > 0),
                                                              "status", "wrong")),
    ("vector_add", "the largest vector reaches at least 60%",
     lambda d: scale(d, largest(d, "p_n"), 2.0)),
    ("vector_add", "the smallest vector is far from the bandwidth limit",
     lambda d: scale(d, d["p_n"] == d["p_n"].min(), 1 / 60)),
    ("vector_add", "at the largest n, blocks of 128 or more threads",
     lambda d: scale(d, largest(d, "p_n") & (d["p_threads"] == 32), 1 / 3.5)),
    ("occupancy", "every point is correct", lambda d: setv(d, d.index == d.index[3],
                                                           "status", "wrong")),
    ("occupancy", "the occupancy calculator agrees with the CUDA driver",
     lambda d: setv(d, d.index == d.index[3], "m_calc_agrees", 0)),
    ("occupancy", "the calculator picks the block size",
     lambda d: setv(d, d.index == d.index[3], "m_api_agrees", 0)),
    ("occupancy", "more registers per thread, fewer resident warps",
     lambda d: setv(d, var(d, "vec_mul_regs"), "m_occupancy_theory", 1.0)),
    ("occupancy", "below 25 % occupancy a memory-bound kernel loses",
     lambda d: setv(d, var(d, "vec_mul", "vec_mul_regs", "vec_smem"), "gbps", 2000.0)),
    ("occupancy", "the calculator's best square tile",
     lambda d: scale(d, var(d, "matmul_tiled_dyn") & (d["p_tile"] == 32), 2.0)),
    ("static_analysis", "nvcc compiles every kernel file",
     lambda d: setv(d, d.index == d.index[0], "status", "failed")),
    ("static_analysis", "no kernel spills", lambda d: setv(d, d.index == d.index[0],
                                                            "m_spill_stores", 64)),
    ("static_analysis", "every kernel can launch 256-thread blocks",
     lambda d: setv(d, d.index == d.index[0], "m_occupancy_256", 0.0)),
    ("static_analysis", "register allocation depends on the target",
     lambda d: setv(d, d.index >= 0, "m_registers", 32)),
    ("matmul", "every GPU result matches", lambda d: setv(d, first(d, var(d, "naive")),
                                                          "status", "wrong")),
    # tiling must pay at both sizes: removing it at the course's size alone fails the check
    ("matmul", "shared-memory tiling (best tile) is at least 1.2x",
     lambda d: scale(d, var(d, "naive") & _mm_course(d), 1 / 1.25)),
    ("matmul", "register tiling is at least 1.2x", lambda d: scale(d, var(d, "register"), 3.0)),
    ("matmul", "padded shared tiles are more than 1.1x",
     lambda d: scale(d, var(d, "tiled_conflict") & (d["p_tile"] == 8), 1 / 1.25)),
    ("matmul", "cuBLAS SGEMM is the ceiling", lambda d: scale(d, var(d, "cublas"), 2.0)),
    ("matmul", "the GPU is at least 10x faster than the CPU",
     lambda d: scale(d, var(d, "cpu"), 1 / 100)),
    ("matmul", "copies (H2D + D2H) are more than 50%",
     lambda d: setv(d, d["m_copy_share"].notna(), "m_copy_share", 0.3)),
    ("matmul", "the best hand-written kernel reaches at least 80%",
     lambda d: scale(d, var(d, "register", "vec4", "dbuf", "warptile"), 1.2)),
    ("transfer", "every copied byte arrives", lambda d: setv(d, d.index == d.index[0],
                                                             "status", "wrong")),
    ("transfer", "pinned memory is at least 1.5x faster than pageable for the largest H2D",
     lambda d: scale(d, d["p_direction"].str.contains("h2d") & (d["variant"] == "pageable"),
                     1 / 7)),
    ("transfer", "pinned memory is at least 1.5x faster than pageable for the largest D2H",
     lambda d: scale(d, d["p_direction"].str.contains("d2h") & (d["variant"] == "pageable"),
                     1 / 4.5)),
    ("transfer", "large pinned copies reach at least half",
     lambda d: scale(d, d["variant"] == "pinned", 2.0)),
    ("transfer", "the smallest copies are latency-bound",
     lambda d: scale(d, d["p_size"] == d["p_size"].min(), 1 / 50)),
    ("streams", "every GPU result matches", lambda d: setv(d, d.index == d.index[0],
                                                           "status", "wrong")),
    ("streams", "with 2 or more streams the pipeline beats the serial",
     lambda d: scale(d, var(d, "serial"), 1 / 1.5)),
    ("streams", "with enough streams the pipeline gets within 35%",
     lambda d: scale(d, var(d, "streams"), 1.6)),
    ("streams", "one stream is no faster than the serial",
     lambda d: scale(d, var(d, "streams") & (d["p_nstreams"] == 1), 0.8)),
    ("coalescing", "every GPU result matches", lambda d: setv(d, d.index == d.index[0],
                                                              "status", "wrong")),
    ("coalescing", "coalesced reads (offset 0) are at least 2x faster",
     lambda d: scale(d, var(d, "stride") & (d["p_stride"] == 32), 1 / 4)),
    ("coalescing", "stride 2 already loses bandwidth",
     lambda d: scale(d, var(d, "stride") & (d["p_stride"] == 2), 1 / 1.2)),
    ("coalescing", "the shared-memory tiled transpose (padded) is at least 1.5x",
     lambda d: scale(d, var(d, "transpose_naive"), 1 / 5)),
    ("coalescing", "the padded tile is more than 1.1x faster",
     lambda d: scale(d, var(d, "transpose_tiled"), 1 / 1.55)),
    ("coalescing", "the coalesced copy reaches at least 60%",
     lambda d: scale(d, var(d, "copy", "offset"), 1.5)),
    ("coalescing", "the best copy kernel reaches at least 90%",
     lambda d: scale(d, ~var(d, "memcpy"), 1.15)),
    ("latency", "every chase matches", lambda d: setv(d, d.index == d.index[0],
                                                      "status", "wrong")),
    ("latency", "shared memory latency is at least 10x lower",
     lambda d: setv(d, var(d, "shared"), "m_cycles_per_load", 200.0)),
    ("latency", "each cache level is at least 1.5x faster",
     lambda d: setv(d, var(d, "global"), "m_cycles_per_load", 300.0)),
    ("latency", "the course's ~500 cycles for global memory",
     lambda d: setv(d, var(d, "global", "global_cg"), "m_cycles_per_load", 2000.0)),
    ("latency", "a cached constant read",
     lambda d: setv(d, var(d, "constant"), "m_cycles_per_load", 300.0)),
    ("fast_math", "every build stays within its stated error bound",
     lambda d: setv(d, d.index == d.index[0], "status", "wrong")),
    ("fast_math", "fast math is at least 1.2x faster",
     lambda d: scale(d, var(d, "precise"), 1 / 2.2)),
    ("fast_math", "the fast builds are less accurate",
     lambda d: setv(d, var(d, "precise"), "error", 1e-3)),
    ("atomics", "the atomicAdd counter counts every increment",
     lambda d: setv(d, var(d, "atomic_counter"), "m_counted", 1_000_000)),
    ("atomics", "the racy counter loses updates",
     lambda d: setv(d, var(d, "racy_counter"), "m_counted", 1_048_576)),
    ("atomics", "the racy counter's count changes between repeats",
     lambda d: setv(setv(d, var(d, "racy_counter"), "m_racy_repeats", "[5, 5, 5, 5, 5]"),
                    var(d, "racy_counter"), "m_counted", 5)),
    ("atomics", "both float sums are within", lambda d: setv(d, var(d, "reduce_sum") & (
        d["p_n"] == d["p_n"].min()), "status", "wrong")),
    ("atomics", "the tree reduction is at least 10x faster",
     lambda d: scale(d, var(d, "reduce_sum"), 60.0)),
    ("atomics", "the tree reduction is at least as accurate",
     lambda d: setv(d, var(d, "reduce_sum"), "error", 1e-4)),
    ("sobel", "every kernel reproduces the CPU edge map",
     lambda d: setv(d, d.index == d.index[0], "status", "wrong")),
    ("sobel", "weights in constant memory cost nothing",
     lambda d: scale(d, var(d, "constant"), 1.2)),
]
# checks the H100 does not show, with the edit that ADDS the effect
ADD_EFFECT = {
    ("sobel", "(course expectation) the shared-memory tiled kernel"):
        lambda d: scale(d, var(d, "shared"), 0.6),
}


def _check(df: pd.DataFrame, exp: str, claim: str):
    hits = [e for e in REGISTRY[exp].expectations(df) if e.claim.startswith(claim)]
    assert len(hits) == 1, (claim, [e.claim for e in REGISTRY[exp].expectations(df)])
    return hits[0]


def test_every_check_of_every_experiment_has_a_case(ref):
    """No check escapes this file: every claim made on the reference run is covered."""
    covered = {(e, c) for e, c, _ in CASES} | set(ADD_EFFECT)
    for name, exp in REGISTRY.items():
        for e in exp.expectations(ref[ref["experiment"] == name]):
            assert any(name == n and e.claim.startswith(c) for n, c in covered), \
                (name, e.claim)


def _converted(exp: str) -> bool:
    """The lesson states Claims with their flips (tests/test_claims.py turns them over)."""
    return type(REGISTRY[exp]).expectations is Experiment.expectations


@pytest.mark.parametrize("exp, claim, edit", CASES, ids=[f"{e}: {c}" for e, c, _ in CASES])
def test_check_sees_the_effect_and_not_its_absence(ref, exp, claim, edit):
    if _converted(exp):
        pytest.skip("its claims carry their flips: tests/test_claims.py")
    d = ref[ref["experiment"] == exp].reset_index(drop=True)
    with_effect = _check(d, exp, claim)
    assert with_effect.passed is True, with_effect.evidence
    without = _check(edit(d), exp, claim)
    assert without.passed is False, without.evidence


@pytest.mark.parametrize("key", list(ADD_EFFECT), ids=[c for _, c in ADD_EFFECT])
def test_checks_the_h100_fails_pass_with_the_effect(ref, key):
    exp, claim = key
    if _converted(exp):
        pytest.skip("its claims carry their flips: tests/test_claims.py")
    d = ref[ref["experiment"] == exp].reset_index(drop=True)
    assert _check(d, exp, claim).passed is False
    assert _check(ADD_EFFECT[key](d), exp, claim).passed is True
    assert key in NOT_ON_H100


def test_racy_counts_are_shown_run_by_run(ref):
    d = ref[ref["experiment"] == "atomics"]
    [table] = REGISTRY["atomics"].tables(d)
    row = d[d["variant"] == "racy_counter"].iloc[0]
    counts = [int(row["m_counted"]), *json.loads(row["m_racy_repeats"])]
    assert len(counts) >= 2 and f"run {len(counts)}" in table["html"]
    cells = "".join(f"<td>{c}</td>" for c in counts)  # every run's count, in run order
    assert cells in table["html"] and "1,048,576" in table["html"]
