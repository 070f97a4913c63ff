"""The claims about a cause read the run's own measurement of it, and fail where the competing
cause is at work: the small-block claim reads the block-rate probe (a fixed cost per block
against latency hiding), the streams claim reads the duplex copies (full duplex against one
shared path). Also the probes' grids, their fits, and a GPU-less run of them."""

from __future__ import annotations

import math
from pathlib import Path

import cause_data
import matplotlib
import numpy as np
import pandas as pd
import pytest

from cudalab import claims, config, results, roofline, run_ceilings
from cudalab.experiments import REGISTRY
from cudalab.experiments.lesson import State
from cudalab.experiments.streams import duplex
from cudalab.experiments.vector_add import block_rate
from cudalab.experiments.vector_add.lesson import block_rate_fact

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"


@pytest.fixture(scope="module")
def h100() -> pd.DataFrame:
    return results.read_table(H100)


def _claim(name: str, key: str):
    return next(c for c in claims.lesson_claims(REGISTRY[name]) if c.name == key)


def _state(name: str, key: str, df: pd.DataFrame) -> claims.ClaimResult:
    got = claims.evaluate_claim(name, _claim(name, key), df)
    assert got is not None
    return got


# -- block rate --------------------------------------------------------------------------------
def test_the_fit_recovers_the_block_rate_and_the_launch_time():
    blocks = np.array(block_rate.DEFAULT_BLOCKS, float)
    rate, fixed = block_rate.fit_rate(blocks, 4e-6 + blocks / 1.65e9)
    assert rate == pytest.approx(1.65, rel=1e-9) and fixed == pytest.approx(4e-6, rel=1e-6)
    assert math.isnan(block_rate.fit_rate(np.array([8.0, 8.0]), np.array([1.0, 2.0]))[0])
    assert math.isnan(block_rate.fit_rate(blocks, 1e-3 - blocks * 1e-12)[0])  # falling: none


def test_the_probe_grid_covers_kinds_sizes_and_counts():
    exp = REGISTRY["vector_add"]
    block = exp.settings_in(None) | {"threads": [32, 1024], "probe_blocks": [64, 4096]}
    probe = [p for p in exp.points(block) if p.variant == block_rate.VARIANT]
    assert len(probe) == 2 * 2 * 2
    assert {p.point_id for p in probe} >= {"block_rate-kindone_load-threads32-blocks64"}
    assert exp.gpu_bytes(probe[-1]) == 4 * block_rate.BUFFER_INTS + 4  # one_load last
    assert not [p for p in exp.points(block | {"probe_blocks": []})
                if p.variant == block_rate.VARIANT]


def test_fixed_cost_claim_is_seen_where_blocks_cost_and_not_where_latency_hiding_holds(h100):
    rate = cause_data.fixed_cost_rate(h100)
    seen = _state("vector_add", "fixed_cost_per_block", cause_data.block_rate_run(h100))
    assert seen.state is State.SEEN, seen.evidence
    assert "resident warps per SM" in seen.evidence and "blocks in" in seen.evidence
    # latency hiding: blocks ten times cheaper, the same slow small-block times
    cheap = cause_data.block_rate_run(h100, 10 * rate)
    got = _state("vector_add", "fixed_cost_per_block", cheap)
    assert got.state is State.NOT_SEEN, got.evidence
    # blocks only somewhat cheaper than the threshold allows: still not seen
    edge = cause_data.block_rate_run(h100, rate / (block_rate_share := 0.5))
    assert _state("vector_add", "fixed_cost_per_block", edge).state is State.NOT_SEEN
    assert block_rate_share < 0.6  # the lesson's BLOCK_SHARE


def test_fixed_cost_claim_flips_both_ways(h100):
    claim = _claim("vector_add", "fixed_cost_per_block")
    for df in (cause_data.block_rate_run(h100),
               cause_data.block_rate_run(h100, 10 * cause_data.fixed_cost_rate(h100))):
        assert claims.flip_audit("vector_add", claim, df) == (True, "")


def test_without_the_probe_the_claim_is_not_measured_and_says_why(h100):
    got = _state("vector_add", "fixed_cost_per_block", h100)
    assert got.state is State.NOT_MEASURED and "probe_blocks" in got.evidence


def test_the_block_rate_fact_and_figure(h100):
    d = cause_data.block_rate_run(h100)
    full = roofline.annotate(d)
    sub = full[full["experiment"] == "vector_add"]
    fact = block_rate_fact(sub, run_ceilings.ceilings_of(full))
    assert fact and "one-load blocks" in fact and "empty blocks" in fact, fact
    assert block_rate_fact(h100[h100["experiment"] == "vector_add"], None) is None
    exp = REGISTRY["vector_add"]
    fig = exp.plot("block_rate", sub)
    assert fig is not None and len(fig.axes) == 2
    # the vector-add figures leave the probe's rows out
    assert exp.plot("bandwidth", sub) is not None


# -- duplex ------------------------------------------------------------------------------------
def test_duplex_claim_is_seen_at_full_duplex_and_not_on_a_shared_path(h100):
    full = _state("streams", "copies_full_duplex", cause_data.duplex_run(h100, 1.9))
    assert full.state is State.SEEN and "1.90×" in full.evidence, full.evidence
    shared = _state("streams", "copies_full_duplex", cause_data.duplex_run(h100, 1.05))
    assert shared.state is State.NOT_SEEN, shared.evidence
    edge = _state("streams", "copies_full_duplex",
                  cause_data.duplex_run(h100, duplex.DUPLEX_MIN * 0.97))
    assert edge.state is State.NOT_SEEN
    claim = _claim("streams", "copies_full_duplex")
    for r in (1.9, 1.05):
        assert claims.flip_audit("streams", claim, cause_data.duplex_run(h100, r)) == (True, "")
    none = _state("streams", "copies_full_duplex", h100)
    assert none.state is State.NOT_MEASURED and "duplex" in none.evidence


def test_the_duplex_grid_and_the_pipelines_figures(h100):
    exp = REGISTRY["streams"]
    block = exp.settings_in(None)
    pts = [p for p in exp.points(block) if p.variant == duplex.VARIANT]
    assert [p.params["direction"] for p in pts] == duplex.DIRECTIONS
    assert not [p for p in exp.points(block | {"variants": ["serial", "streams"]})
                if p.variant == duplex.VARIANT]
    d = cause_data.duplex_run(h100, 1.9)
    rows = d[d["experiment"] == "streams"]
    assert exp.plot("pipeline", rows) is not None  # the duplex rows stay out of the pipelines
    fact = duplex.duplex_fact(rows, None)
    assert fact and "both at once" in fact


# -- without a GPU -----------------------------------------------------------------------------
def test_a_gpu_less_run_leaves_the_probes_not_measured(tmp_path):
    """The default grid holds the probes; without a GPU their points are 'not measured' and
    so are the claims that read them."""
    cfg = config.load(ROOT / "config.yaml")
    va = REGISTRY["vector_add"].grid(cfg)
    st = REGISTRY["streams"].grid(cfg)
    assert any(p.variant == block_rate.VARIANT for p in va)
    assert any(p.variant == duplex.VARIANT for p in st)
    rows = pd.DataFrame([{"experiment": p.experiment, "variant": p.variant,
                          "point_id": p.point_id, "status": "not_measured",
                          "reason": "not measured: no GPU here"} for p in va + st])
    for name, key in (("vector_add", "fixed_cost_per_block"),
                      ("streams", "copies_full_duplex")):
        got = claims.evaluate_claim(name, _claim(name, key), rows)
        assert got is not None and got.state is State.NOT_MEASURED, got


# -- the nvprof row's copies -------------------------------------------------------------------
def test_the_nvprof_rows_copies_are_blamed_on_pageable_staging_only_where_measured(h100):
    """The course table's nvprof row reads the transfer lesson's pageable and pinned copies:
    at the pageable rate it names the staging; where the course's copies run at the pinned
    rate (the link itself sets their time) it does not."""
    said = claims.course_fact("matmul", "copies_pageable", h100)
    assert said and "pageable" in said and "not the link" in said, said
    fast = h100.copy()
    tiled = (fast["experiment"] == "matmul") & (fast["variant"] == "tiled")
    for c in ("m_h2d_s", "m_d2h_s"):  # about 7x faster: the pinned rate
        fast.loc[tiled, c] = pd.to_numeric(fast.loc[tiled, c]) / 7
    said = claims.course_fact("matmul", "copies_pageable", fast)
    assert said and "not the link" not in said, said
    no_transfer = h100[h100["experiment"] != "transfer"]
    assert claims.course_fact("matmul", "copies_pageable", no_transfer) is None


# -- FMAs per shared-memory load ---------------------------------------------------------------
def test_fmas_per_load_come_from_the_configuration():
    from cudalab.experiments.matmul import smem_reuse

    assert smem_reuse.fma_per_load("tiled", math.nan) == 0.5
    assert [smem_reuse.fma_per_load("register", rt) for rt in (2, 4, 8)] == [1, 2, 4]
    assert math.isnan(smem_reuse.fma_per_load("naive", 8))


def test_fma_per_load_claim_fails_where_another_limit_holds(h100):
    from cudalab.experiments.matmul import smem_reuse

    claim = _claim("matmul", "fma_per_load_sets_speed")
    seen = _state("matmul", "fma_per_load_sets_speed", h100)
    assert seen.state is State.SEEN and "register rt 8: 4 FMAs per load" in seen.evidence
    rows = h100["experiment"] == "matmul"
    flat = pd.concat([h100[~rows], smem_reuse.other_limit(h100[rows].copy())])
    assert _state("matmul", "fma_per_load_sets_speed", flat).state is State.NOT_SEEN
    assert claims.flip_audit("matmul", claim, h100) == (True, "")
    assert claims.flip_audit("matmul", claim, flat) == (True, "")


def test_the_occupancy_course_row_reads_the_block_rate(h100):
    """The course table's '32-thread blocks are slower' row explains vec_mul's small blocks
    with the probe's rate where the fixed cost holds, and says it does not where blocks are
    cheap; without the probe it has nothing to say."""
    none = claims.course_fact("occupancy", "small_blocks_block_rate", h100)
    assert none and "did not run" in none, none
    no_occupancy = h100[h100["experiment"] != "occupancy"]
    assert claims.course_fact("occupancy", "small_blocks_block_rate", no_occupancy) is None
    held = claims.course_fact("occupancy", "small_blocks_block_rate",
                              cause_data.block_rate_run(h100))
    assert held and "mostly the fixed cost" in held, held
    cheap = cause_data.block_rate_run(h100, 10 * cause_data.fixed_cost_rate(h100))
    said = claims.course_fact("occupancy", "small_blocks_block_rate", cheap)
    assert said and "unexplained" in said and "mostly the fixed cost" not in said, said
