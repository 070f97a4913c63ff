"""CPU tests of the transfer experiment (host <-> device copies, PCIe link).

Every results frame below is SYNTHETIC TEST DATA: records fabricated from a latency +
size / bandwidth model with numbers like a PCIe Gen5 x16 H100, never measurements.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest

from cudalab import claims, explain, fmt, results
from cudalab import config as cfg
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import RunContext
from cudalab.experiments.lesson import State
from cudalab.experiments.transfer import link_metrics, pcie_gbps, sizes
from cudalab.harness import Harness, Settings

matplotlib.use("Agg")

NAME = "transfer"
EXP = REGISTRY[NAME]
GEN5_X16 = {"pcie_gen_current": 5, "pcie_width_current": 16, "pcie_gen_max": 5,
            "pcie_width_max": 16}


def validate(block: dict) -> dict:
    return cfg.validate({"experiments": {NAME: block}})["experiments"][NAME]


def synthetic_record(variant, params, median_s, *, nbytes, metrics=None, status="ok"):
    """A fabricated raw record (SYNTHETIC TEST DATA), shaped like the runner's."""
    pid = "-".join([variant] + [f"{k}{v}" for k, v in params.items()])
    return {
        "schema_version": results.SCHEMA_VERSION, "experiment": NAME, "variant": variant,
        "point_id": pid, "params": params, "job_id": "synthetic", "status": status,
        "reason": "" if status == "ok" else "mismatched_bytes = 7 exceeds tolerance 0",
        "timing": {"samples_s": [median_s] * 3, "median": median_s, "iqr": 0.0, "cv": 0.0,
                   "min": median_s, "mean": median_s, "std": 0.0, "n": 3, "batch": 1,
                   "timer": "cuda_event", "stop_reason": "converged", "n_throttled": 0},
        "work": {"flops": math.nan, "bytes": nbytes},
        "check": {"error": 0.0 if status == "ok" else 7.0, "tolerance": 0.0,
                  "metric": "mismatched_bytes", "passed": status == "ok", "detail": ""},
        "metrics": metrics or {}, "provenance": {"gpu_name": "SYNTHETIC H100"},
    }


# SYNTHETIC (latency s, bandwidth GB/s) per (memory, direction)
MODEL = {("pinned", "h2d"): (8e-6, 55.0), ("pinned", "d2h"): (8e-6, 53.0),
         ("pageable", "h2d"): (12e-6, 22.0), ("pageable", "d2h"): (15e-6, 14.0)}


def synthetic_frame(model=None, link=None, bad=()):
    model = model or MODEL
    link = link_metrics(GEN5_X16 if link is None else link, "NVML Shared Library Not Found")
    recs = []
    for s in sizes({"min_bytes": 4096, "max_bytes": 1 << 30, "step": 4}):
        for (mem, d), (lat, bw) in model.items():
            recs.append(synthetic_record(mem, {"direction": d, "size": s},
                                         lat + s / (bw * 1e9), nbytes=float(s), metrics=link,
                                         status="wrong" if (mem, d, s) in bad else "ok"))
    return results.build_table(recs)


# -- config ---------------------------------------------------------------------------------
def test_defaults_span_4k_to_1g_in_powers_of_4():
    b = validate({})
    s = sizes(b)
    assert s[0] == 4096 and s[-1] == 1 << 30 and len(s) == 10
    assert all(b2 == 4 * a for a, b2 in zip(s, s[1:]))
    assert b["directions"] == ["h2d", "d2h"] and b["memory"] == ["pageable", "pinned"]


def test_step_2_and_configurable_max():
    s = sizes(validate({"max_bytes": 1 << 20, "step": 2}))
    assert s == [4096 << k for k in range(9)]


@pytest.mark.parametrize("block, where, says", [
    ({"memory": ["mapped"]}, "experiments.transfer.memory[0]", "allowed values"),
    ({"directions": ["d2d"]}, "experiments.transfer.directions[0]", "allowed values"),
    ({"step": 3}, "experiments.transfer.step", "allowed values: [2, 4]"),
    ({"max_bytes": 0}, "experiments.transfer.max_bytes", "out of range"),
    ({"max_bytes": 1 << 40}, "experiments.transfer.max_bytes", "out of range"),
    ({"min_bytes": 1 << 20, "max_bytes": 4096}, "experiments.transfer.min_bytes",
     "min_bytes <= max_bytes"),
    ({"max_size": 4096}, "experiments.transfer", "unknown key 'max_size'"),
])
def test_bad_blocks_name_the_key(block, where, says):
    with pytest.raises(ConfigError) as e:
        validate(block)
    assert where in str(e.value) and says in str(e.value)


def test_smoke_block_is_small():
    pts = EXP.points(validate(dict(EXP.smoke)))
    assert 0 < len(pts) <= 24
    assert max(p.params["size"] for p in pts) <= 1 << 22


# -- grid -----------------------------------------------------------------------------------
def test_points_are_size_by_memory_by_direction():
    b = validate({"max_bytes": 16384, "memory": ["pinned"]})
    pts = EXP.points(b)
    assert [(p.variant, p.params["direction"], p.params["size"]) for p in pts] == [
        ("pinned", "h2d", 4096), ("pinned", "d2h", 4096),
        ("pinned", "h2d", 16384), ("pinned", "d2h", 16384)]
    assert len({p.point_id for p in pts}) == len(pts)
    assert EXP.kernel_for(None, pts[0]) is None  # no kernel: copies only


# -- PCIe -----------------------------------------------------------------------------------
@pytest.mark.parametrize("gen, width, gbps", [
    (1, 16, 4.0), (2, 16, 8.0), (3, 16, 15.754), (4, 16, 31.508), (5, 16, 63.015),
    (5, 8, 31.508), (6, 16, 121.0),
])
def test_theoretical_pcie_bandwidth(gen, width, gbps):
    assert pcie_gbps(gen, width) == pytest.approx(gbps, rel=1e-3)


@pytest.mark.parametrize("gen, width", [(None, 16), (5, None), (9, 16), (5, 0), ("x", 4)])
def test_unknown_links_have_no_bandwidth(gen, width):
    assert math.isnan(pcie_gbps(gen, width))


def test_link_metrics_describe_the_link():
    m = link_metrics(GEN5_X16 | {"pcie_gen_current": 4})
    assert m["pcie_link"] == ("PCIe Gen4 x16 (max Gen5 x16), 31.5 GB/s per direction in "
                              "theory")
    assert m["pcie_theoretical_gbps"] == pytest.approx(31.508, rel=1e-3)
    assert m["pcie_gen_max"] == 5


def test_link_metrics_say_why_unavailable():
    m = link_metrics({}, "NVMLError_LibraryNotFound")
    assert m["pcie_link"] == "unavailable (NVMLError_LibraryNotFound)"
    assert math.isnan(m["pcie_theoretical_gbps"]) and m["pcie_gen_current"] is None


class _Nvml:
    def __init__(self, facts, handle="h", unavailable=""):
        self.facts, self.handle, self.unavailable = facts, handle, unavailable

    def device_facts(self):
        return self.facts


def test_link_is_read_from_the_nvml_observer_or_marked_unavailable():
    ctx = RunContext(None, Harness(Settings()), np.random.default_rng(0), {}, {})
    assert "unavailable (NVML not opened)" in EXP._link(ctx)["pcie_link"]
    ctx.cache["nvml"] = _Nvml({}, handle=None, unavailable="NVML unavailable: no driver")
    assert EXP._link(ctx)["pcie_link"] == "unavailable (NVML unavailable: no driver)"
    ctx.cache["nvml"] = _Nvml(GEN5_X16 | {"driver_version": "580"})
    assert EXP._link(ctx)["pcie_link"].startswith("PCIe Gen5 x16")


# -- claims and figures on SYNTHETIC frames ---------------------------------------------------
def _claims(df):
    return {r.key: r for r in claims.evaluate(NAME, df)}


def test_claims_seen_on_plausible_synthetic_data():
    ex = _claims(synthetic_frame())
    assert set(ex) == {"correct", "pinned_faster_h2d", "pinned_faster_d2h", "pinned_near_link",
                       "small_latency_bound", "pinned_levels_off"}
    assert all(e.passed for e in ex.values()), [(k, e.evidence) for k, e in ex.items()]
    h2d = ex["pinned_faster_h2d"]
    assert "1 GiB" in h2d.evidence and "PCIe Gen5 x16" in h2d.evidence
    assert "H2D: " in ex["pinned_near_link"].evidence and "D2H: " in \
        ex["pinned_near_link"].evidence


def test_claims_not_seen_when_pageable_wins_or_a_byte_changed():
    model = dict(MODEL)
    model[("pageable", "d2h")] = (15e-6, 60.0)
    ex = _claims(synthetic_frame(model, bad={("pinned", "h2d", 4096)}))
    assert ex["correct"].passed is False and "39/40" in ex["correct"].evidence
    assert ex["pinned_faster_d2h"].passed is False
    assert ex["pinned_faster_h2d"].passed is True


def test_a_slow_link_or_a_late_plateau_is_not_seen():
    model = dict(MODEL)
    model[("pinned", "d2h")] = (200e-6, 40.0)  # 63 % of the link, 4 MiB at a third of it
    ex = _claims(synthetic_frame(model))
    assert ex["pinned_near_link"].passed is False
    assert ex["pinned_levels_off"].passed is False
    assert "D2H: " in ex["pinned_levels_off"].evidence


def test_claim_without_link_is_not_measured():
    ex = _claims(synthetic_frame(link={}))
    assert ex["pinned_near_link"].state is State.NOT_MEASURED
    assert "PCIe link" in ex["pinned_near_link"].evidence


def test_the_fixed_cost_of_a_copy():
    df = synthetic_frame()
    s = " ".join(explain.explain(NAME, df))
    assert f"A copy of 4 KiB takes {fmt.seconds(8e-6 + 4096 / 55e9)} (pinned H2D)" in s


def test_link_survives_the_csv(tmp_path):
    df = synthetic_frame()
    results.write_table(df, tmp_path / "results.csv")
    back = results.read_table(tmp_path / "results.csv")
    assert back["m_pcie_link"].iloc[0].startswith("PCIe Gen5 x16")
    assert [e.state for e in claims.evaluate(NAME, back)] == [
        e.state for e in claims.evaluate(NAME, df)]


@pytest.mark.parametrize("link", [None, {}])
def test_bandwidth_figure(link):
    import matplotlib.pyplot as plt

    f = EXP.plot("bandwidth", synthetic_frame(link=link))
    assert f is not None and len(f.axes) == 2
    assert all(ax.get_title() and ax.get_xlabel() for ax in f.axes)
    assert f.axes[0].get_ylabel() == "bandwidth (GB/s)"
    assert ("Gen5" in f._suptitle.get_text()) == (link is None)
    plt.close(f)


def test_plot_of_nothing_is_none():
    df = synthetic_frame()
    assert EXP.plot("bandwidth", df[df["status"] == "nope"]) is None
    with pytest.raises(KeyError):
        EXP.plot("latency", df)


class _RecordingCuda:
    """The pieces of pycuda.driver transfer.measure() calls, copying for real on the host
    and naming each call, so a test sees which copy the timed function uses."""

    def __init__(self):
        self.calls: list[str] = []

    def mem_alloc(self, size):
        return np.zeros(size, np.uint8)

    def pagelocked_empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def memset_d8(self, dev, value, size):
        dev[:size] = value

    def _copy(self, name, dst, src):
        self.calls.append(name)
        dst[:] = src

    def memcpy_htod(self, dev, src):
        self._copy("memcpy_htod", dev, src)

    def memcpy_dtoh(self, dst, dev):
        self._copy("memcpy_dtoh", dst, dev)

    def memcpy_htod_async(self, dev, src, stream=None):
        self._copy("memcpy_htod_async", dev, src)

    def memcpy_dtoh_async(self, dst, dev, stream=None):
        self._copy("memcpy_dtoh_async", dst, dev)


@pytest.mark.parametrize("memory, direction, timed_call, queued", [
    ("pinned", "h2d", "memcpy_htod_async", True),
    ("pinned", "d2h", "memcpy_dtoh_async", True),
    ("pageable", "h2d", "memcpy_htod", False),
    ("pageable", "d2h", "memcpy_dtoh", False),
])
def test_pinned_copies_are_queued_pageable_ones_are_not(monkeypatch, memory, direction,
                                                        timed_call, queued):
    """Pinned copies are enqueued (async calls: the harness may queue a batch behind a held
    stream, so the host's call cost stays out); a pageable copy is staged by the host and
    must be timed one synchronous call at a time."""
    from types import SimpleNamespace

    fake = _RecordingCuda()
    gpu = SimpleNamespace(cuda=fake, synchronize=lambda: None, event_timer=lambda: None,
                          index=0, info={})
    seen = {}

    def verify_then_time(ctx, launch, check, **kw):
        c = check()
        fake.calls.clear()
        launch()
        seen.update(kw, calls=list(fake.calls))
        return c, None

    monkeypatch.setattr(EXP, "verify_then_time", verify_then_time)
    ctx = RunContext(gpu=gpu, harness=Harness(Settings()), rng=np.random.default_rng(1),
                     config={}, block={})
    ctx.cache["nvml"] = None
    res = EXP.measure(ctx, EXP.points({"min_bytes": 4096, "max_bytes": 4096, "step": 4,
                                       "directions": [direction], "memory": [memory]})[0])
    assert res.check.passed
    assert seen["calls"] == [timed_call]
    assert seen["asynchronous"] is queued
