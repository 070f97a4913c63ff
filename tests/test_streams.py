"""CPU tests of the streams experiment (copy/compute overlap).

Every results frame below is SYNTHETIC TEST DATA: pipeline times and timelines fabricated
from a 3-stage pipeline model (one H2D engine, one D2H engine, one kernel at a time) with
H100-like numbers, never measurements.
"""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pytest

from cudalab import claims, fmt, results
from cudalab import config as cfg
from cudalab.config import ConfigError
from cudalab.experiments import REGISTRY
from cudalab.experiments.streams import (
    CHUNK_ALIGN,
    busy_spans,
    chunk_bounds,
    lesson,
    map_reference,
    pipeline_model,
    timeline_rows,
)

matplotlib.use("Agg")

NAME = "streams"
EXP = REGISTRY[NAME]


def validate(block: dict) -> dict:
    return cfg.validate({"experiments": {NAME: block}})["experiments"][NAME]


def synthetic_record(variant, params, median_s, *, nbytes, metrics=None, status="ok"):
    """A fabricated raw record (SYNTHETIC TEST DATA), shaped like the runner's."""
    pid = "-".join([variant] + [f"{k}{v}" for k, v in params.items()])
    return {
        "schema_version": results.SCHEMA_VERSION, "experiment": NAME, "variant": variant,
        "point_id": pid, "params": params, "job_id": "synthetic", "status": status,
        "reason": "",
        "timing": {"samples_s": [median_s] * 3, "median": median_s, "iqr": 0.0, "cv": 0.0,
                   "min": median_s, "mean": median_s, "std": 0.0, "n": 3, "batch": 1,
                   "timer": "cuda_event", "stop_reason": "converged", "n_throttled": 0},
        "work": {"flops": math.nan, "bytes": nbytes},
        "check": {"error": 1e-7 if status == "ok" else math.inf, "tolerance": 1e-5,
                  "metric": "rel_l2_sampled", "passed": status == "ok", "detail": ""},
        "metrics": metrics or {}, "provenance": {"gpu_name": "SYNTHETIC H100"},
    }


def simulated_marks(h2d, kernel, d2h, k):
    """SYNTHETIC event times (ms) of k equal chunks: each stage one engine, FIFO."""
    free = [0.0, 0.0, 0.0]
    marks = []
    for _ in range(k):
        t = [0.0]
        for s, dur in enumerate((h2d / k, kernel / k, d2h / k)):
            start = max(t[-1], free[s])
            free[s] = start + dur
            t.append(free[s])
        marks.append(t)
    return marks


PHASES_MS = {5: (5.0, 1.0, 5.2), 50: (5.0, 9.0, 5.2)}  # SYNTHETIC h2d, kernel, d2h


def synthetic_frame(slow_streams=False, timeline_k=4, n=1 << 26, wrong=()):
    recs = []
    for it, (h, c, d) in PHASES_MS.items():
        base = {"h2d_s": h / 1e3, "kernel_s": c / 1e3, "d2h_s": d / 1e3,
                "ideal_s": max(h, c, d) / 1e3, "no_overlap_s": (h + c + d) / 1e3}
        for variant, ks in (("serial", [1]), ("streams", [1, 2, 4, 8, 16])):
            for k in ks:
                model = pipeline_model(h, c, d, k)
                t = (h + c + d) * 1.3 if slow_streams and k > 1 else model * 1.04
                tl = timeline_rows(simulated_marks(h, c, d, k))
                m = base | {"model_s": model / 1e3, "chunks": k,
                            "overlap_efficiency": max(h, c, d) / t}
                if variant == "serial" or k == timeline_k:
                    m["timeline"] = json.dumps(tl, separators=(",", ":"))
                st = "wrong" if (variant, it, k) in wrong else "ok"
                recs.append(synthetic_record(variant, {"n": n, "iterations": it,
                                                       "nstreams": k}, t / 1e3,
                                             nbytes=8.0 * n, metrics=m, status=st))
    return results.build_table(recs)


# -- config ---------------------------------------------------------------------------------
def test_defaults():
    b = validate({})
    assert b["n"] == 1 << 26 and b["streams"] == [1, 2, 4, 8, 16]
    assert b["timeline_streams"] == 4 and b["variants"] == ["serial", "streams", "duplex"]


@pytest.mark.parametrize("block, where, says", [
    ({"streams": [3]}, "experiments.streams.streams[0]", "allowed values"),
    ({"timeline_streams": 8, "streams": [1, 2, 4]}, "experiments.streams.timeline_streams",
     "allowed values: [1, 2, 4]"),
    ({"n": 100}, "experiments.streams.n", "out of range"),
    ({"iterations": [0]}, "experiments.streams.iterations[0]", "out of range"),
    ({"threads": 100}, "experiments.streams.threads", "allowed values"),
    ({"stream": [2]}, "experiments.streams", "did you mean 'streams'"),
])
def test_bad_blocks_name_the_key(block, where, says):
    with pytest.raises(ConfigError) as e:
        validate(block)
    assert where in str(e.value) and says in str(e.value)


def test_timeline_streams_is_free_without_the_streams_variant():
    validate({"variants": ["serial"], "streams": [2], "timeline_streams": 4})


def test_smoke_block_is_small():
    b = validate(dict(EXP.smoke))
    pts = EXP.points(b)
    assert 0 < len(pts) <= 8 and b["n"] <= (1 << 20) + 1024


# -- grid -----------------------------------------------------------------------------------
def test_points_serial_then_streams_per_iteration_count():
    pts = EXP.points(validate({"iterations": [50, 5], "streams": [4, 1]}))
    duplex = [p.params["direction"] for p in pts if p.variant == "duplex"]
    assert duplex == ["h2d", "d2h", "both"]  # once, after the pipelines
    pts = [p for p in pts if p.variant != "duplex"]
    assert [(p.variant, p.params["iterations"], p.params["nstreams"]) for p in pts] == [
        ("serial", 5, 1), ("streams", 5, 1), ("streams", 5, 4),
        ("serial", 50, 1), ("streams", 50, 1), ("streams", 50, 4)]
    assert len({p.point_id for p in pts}) == len(pts)


@pytest.mark.parametrize("n", [1024, 1 << 20, (1 << 20) + 3, 1 << 26, 5000])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 16, 32])
def test_chunks_cover_the_array_once_aligned(n, k):
    b = chunk_bounds(n, k)
    assert b[0][0] == 0 and b[-1][1] == n
    assert all(hi > lo for lo, hi in b)
    assert all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1))
    assert all(lo % CHUNK_ALIGN == 0 for lo, _ in b)
    assert len(b) <= k
    if n % (k * CHUNK_ALIGN) == 0:
        assert len(b) == k and len({hi - lo for lo, hi in b}) == 1


# -- CPU reference and models ---------------------------------------------------------------
def test_map_reference_matches_the_formula():
    x = np.array([0.0, 0.25, 0.999], np.float32)
    want = np.zeros(3)
    for k in range(3):
        t = x.astype(np.float64) + k / 64
        want += np.sin(t) * np.cos(t) + np.sqrt(t)
    got = map_reference(x, 3)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-7)


@pytest.mark.parametrize("iterations", [5, 50, 4096])
def test_float32_kernel_arithmetic_is_within_the_default_tolerance(iterations):
    """numpy float32 doing what the kernel does stays well inside the tolerance: the check
    can only fail on a real bug (unwritten or misplaced chunks)."""
    from cudalab.experiments.base import rel_fro_error

    x = np.random.default_rng(1).random(2000, dtype=np.float32)
    acc = np.zeros_like(x)
    for k in range(iterations):
        t = x + np.float32(k * 0.015625)
        acc += np.sin(t) * np.cos(t) + np.sqrt(t)
    err = rel_fro_error(acc, map_reference(x, iterations))
    assert err < validate({})["tolerance"] / 5
    shifted = np.roll(acc, 1)  # a misplaced chunk is far outside it
    assert rel_fro_error(shifted, map_reference(x, iterations)) > 1e-3


def test_pipeline_model_limits():
    assert pipeline_model(5, 1, 5, 1) == 11
    assert pipeline_model(5, 1, 5, 4) == pytest.approx(11 / 4 + 3 / 4 * 5)
    assert pipeline_model(5, 9, 5, 10_000) == pytest.approx(9, rel=1e-3)


def test_timeline_rows():
    rows = timeline_rows([[0, 1, 2, 3.123456], [1, 2, 3, 4]])
    assert rows[0] == [0, "H2D", 0.0, 1.0] and rows[2] == [0, "D2H", 2.0, 3.1235]
    assert [r[1] for r in rows] == ["H2D", "kernel", "D2H"] * 2 and rows[3][0] == 1


def test_busy_spans_queue_each_kind_of_operation():
    # two streams ready at once: the second H2D waits for the first, kernels and D2H too
    tl = timeline_rows([[0, 2, 3, 5], [0, 4, 6, 8]])
    spans = busy_spans(tl)
    assert spans[0] == [0, "H2D", 0.0, 0.0, 2.0]
    assert spans[3] == [1, "H2D", 0.0, 2.0, 4.0]  # ready at 0, ran 2 -> 4
    assert spans[4] == [1, "kernel", 4.0, 4.0, 6.0]
    assert spans[5] == [1, "D2H", 6.0, 6.0, 8.0]
    assert all(r[2] <= r[3] <= r[4] for r in spans)


# -- claims and figures on SYNTHETIC frames ---------------------------------------------------
def _claims(df):
    return {r.key: r for r in claims.evaluate(NAME, df)}


def test_claims_seen_on_plausible_synthetic_data():
    ex = _claims(synthetic_frame())
    assert set(ex) == {"correct", "beats_serial", "stage_balance", "one_stream_no_gain",
                       "timeline_overlaps", "copies_full_duplex"}
    # the duplex claim reads the duplex points (tests/test_cause_claims.py)
    assert ex.pop("copies_full_duplex").passed is None
    assert all(e.passed for e in ex.values()), [(k, e.evidence) for k, e in ex.items()]
    ev = ex["stage_balance"].evidence
    assert "5 iterations" in ev and "50 iterations" in ev
    # 5 iterations: (5 + 1 + 5.2) / 5.2 ms bound the speedup
    assert f"bound {fmt.ratio(11.2 / 5.2)}" in ev
    [hides] = claims.evaluate_try_this(NAME, synthetic_frame())[:1]
    assert hides.passed and "50 iterations" in hides.evidence and "5 iterations" not in \
        hides.evidence  # the kernel is the slowest stage at 50 iterations only


def test_claims_not_seen_without_overlap():
    ex = _claims(synthetic_frame(slow_streams=True, wrong={("streams", 5, 2)}))
    assert ex["correct"].passed is False
    assert ex["beats_serial"].passed is False and ex["stage_balance"].passed is False


def test_a_pipeline_faster_than_its_stages_allow_is_not_the_stage_balance():
    df = synthetic_frame()
    fast = (df["variant"] == "streams") & (df["p_nstreams"] == 16)
    df.loc[fast, "time_median_s"] /= 2  # half of the slowest stage alone: impossible
    assert _claims(df)["stage_balance"].passed is False


def test_timeline_overlap_share():
    tl = timeline_rows(simulated_marks(5.0, 1.0, 5.2, 4))
    share = lesson.overlap_share(tl)
    assert 0.5 < share < 0.7
    assert lesson.overlap_share(lesson.serialised(tl)) == 0
    assert lesson.overlap_share(timeline_rows(simulated_marks(5.0, 1.0, 5.2, 1))) == 0


def test_timeline_survives_the_csv_and_is_drawn(tmp_path):
    import matplotlib.pyplot as plt

    df = synthetic_frame()
    results.write_table(df, tmp_path / "results.csv")
    back = results.read_table(tmp_path / "results.csv")
    rows = back.dropna(subset=["m_timeline"])
    assert sorted(zip(rows["variant"], rows["p_nstreams"])) == [
        ("serial", 1), ("serial", 1), ("streams", 4), ("streams", 4)]
    tl = json.loads(rows[rows["variant"] == "streams"]["m_timeline"].iloc[0])
    assert len(tl) == 12 and {r[0] for r in tl} == {0, 1, 2, 3}
    f = EXP.plot("timeline", back)
    assert f is not None and len(f.axes) == 4
    assert all(ax.get_xlabel() == "time since start (ms)" for ax in f.axes)
    assert "4 streams" in f.axes[1].get_title()
    plt.close(f)


def test_pipeline_figure():
    import matplotlib.pyplot as plt

    f = EXP.plot("pipeline", synthetic_frame())
    assert f is not None and len(f.axes) == 2
    ax = f.axes[0]
    assert ax.get_ylabel() == "pipeline time (ms)" and "streams" in ax.get_xlabel()
    labels = ax.get_legend_handles_labels()[1]
    assert any(lbl.startswith("serial") for lbl in labels)
    assert any(lbl.startswith("ideal") for lbl in labels)
    plt.close(f)


def test_no_timeline_no_figure():
    df = synthetic_frame().drop(columns=["m_timeline"])
    assert EXP.plot("timeline", df) is None
    assert EXP.plot("pipeline", df[df["status"] == "nope"]) is None
    with pytest.raises(KeyError):
        EXP.plot("gantt", df)
