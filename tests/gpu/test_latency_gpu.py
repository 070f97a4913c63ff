"""On a GPU machine (pytest -m gpu): the pointer-chasing latency experiment through the real
runner. Every chase lands on the node the CPU reaches; an L1-sized chain is faster than an
L2-sized one, which is faster than a DRAM-sized one; L1-bypassing loads start at the L2
level; shared memory takes under 100 cycles; DRAM between 200 and 2000; the kernel's own
nanosecond timer agrees with the CUDA events around its launch; and a chain changed on the
device behind the CPU's back fails the check."""

from __future__ import annotations

import numpy as np
import pytest

from cudalab import claims as claims_of
from cudalab import config as cfg
from cudalab import results
from cudalab.experiments import REGISTRY
from cudalab.experiments.latency import ChainData, Chaser, chain_words, levels, make_chain
from cudalab.runner import run_experiment

pytestmark = pytest.mark.gpu

NAME = "latency"
EXP = REGISTRY[NAME]
KIB, MIB = 1024, 1 << 20
STEPS = 4096


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    config = cfg.validate({
        "measurement": {"warmup": 1, "min_samples": 3, "max_samples": 10, "budget_s": 0.05},
        "experiments": {NAME: {"min_bytes": 16 * KIB, "max_bytes": 512 * MIB,
                               "steps": STEPS}},
    })
    out = tmp_path_factory.mktemp("latency")
    manifest = run_experiment(config, NAME, out)
    recs = list(results.iter_records(out / "raw"))
    assert manifest["counts"]["ok"] == len(recs) > 0
    return results.build_table(recs)


def _cycles(df, variant, ws):
    row = df[(df["variant"] == variant) & (df["p_working_set"] == ws)]
    assert len(row) == 1, (variant, ws)
    return float(row["m_cycles_per_load"].iloc[0])


def test_every_chase_lands_on_the_cpus_node(table):
    bad = table[table["status"] != "ok"]
    assert bad.empty, bad[["point_id", "reason"]].to_string()
    assert (table["error"] == 0).all()
    assert (table["error_metric"] == "launches_off_the_chain").all()
    assert (table["m_launches"] >= 3).all()


def test_l1_then_l2_then_dram(table):
    l2 = float(table["m_l2_bytes"].iloc[0])
    l2_ws = max(ws for ws in table["p_working_set"] if ws <= l2 / 4 and ws >= 1 * MIB)
    l1 = _cycles(table, "global", 16 * KIB)
    mid = _cycles(table, "global", l2_ws)
    dram = _cycles(table, "global", 512 * MIB)
    assert 1.3 * l1 < mid and 1.3 * mid < dram, (l1, mid, dram)
    # ld.global.cg skips L1: a chain that L1 holds comes from L2
    assert _cycles(table, "global_cg", 16 * KIB) > 1.3 * l1


def test_shared_and_dram_in_their_ranges(table):
    shared = table[table["variant"] == "shared"]["m_cycles_per_load"]
    assert len(shared) and (shared < 100).all(), shared.tolist()
    dram = _cycles(table, "global", 512 * MIB)
    assert 200 <= dram <= 2000, dram


def test_cycles_and_ns_agree_with_the_sm_clock(table):
    mhz = table["m_sm_clock_mhz"]
    assert ((mhz > 300) & (mhz < 3500)).all(), mhz.tolist()
    derived = table["m_cycles_per_load"] / table["m_ns_per_load"] * 1e3
    assert np.allclose(derived, mhz, rtol=0.05)


def test_kernel_timer_agrees_with_the_launch_time(table):
    """A DRAM chain launch is its timed loop (no untimed warm-up at 512 MiB): the events
    around the launch must cover the kernel's own globaltimer interval, plus little more."""
    row = table[(table["variant"] == "global") & (table["p_working_set"] == 512 * MIB)].iloc[0]
    assert row["m_warm_steps"] == 0 and not row["m_primed"]
    loop_s = STEPS * row["m_ns_per_load"] * 1e-9
    assert 0.97 * loop_s <= row["time_median_s"] <= 1.1 * loop_s + 50e-6, (
        row["time_median_s"], loop_s)


def test_levels_and_expectations_on_this_gpu(table):
    lv = {x.key: x for x in levels(EXP._frame(table))}
    assert {"l1", "l2", "shared", "constant"} <= set(lv)
    judged = {c.key: c for c in claims_of.evaluate("latency", table)}
    assert judged["correct"].passed, judged
    if 512 * MIB >= 8 * float(table["m_l2_bytes"].iloc[0]):  # a DRAM-sized chain was run
        assert "dram" in lv
    assert EXP.plot("latency", table) is not None


def test_a_chain_changed_behind_the_cpus_back_fails_the_check():
    from cudalab.gpu import open_session

    gpu = open_session(0)
    kernel = gpu.compile("latency/latency.cu")
    chain = ChainData(make_chain(64, np.random.default_rng(0)), 128)
    chaser = Chaser(gpu, kernel, "global", chain, 1024, capacity=4)
    try:
        chaser.launch(0)
        assert chaser.check().passed
        other = chain.nxt.copy()
        a, b = 3, int(other[3])
        other[a], other[b] = other[b], other[a]  # splits the cycle in two
        data = chaser.args[0]
        gpu.cuda.memcpy_htod(data, chain_words(other, 128, np.uint64, base=int(data)))
        chaser.launch(0)
        c = chaser.check()
        assert not c.passed and "launch 1" in c.detail, c.detail
    finally:
        chaser.free()
