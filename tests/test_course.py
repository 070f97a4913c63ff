"""The course table (cudalab/data/course.yaml beside this run) on the real H100 reference."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from cudalab import claims, course, results
from cudalab.experiments import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"


@pytest.fixture(scope="module")
def h100():
    return results.read_table(TABLE)


@pytest.fixture(scope="module")
def rows(h100):
    return {r["lesson"]: r for r in course.course_table(h100)}


def test_every_lesson_matches_a_point_of_the_default_grid(rows, h100):
    # an experiment newer than the reference run is matched against its grid in its own tests
    measured = set(h100["experiment"])
    missing = [name for name, r in rows.items()
               if r["this"] is None and r["experiment"] in measured]
    assert not missing, missing
    for r in rows.values():
        if r["experiment"] in measured:
            assert r["check"] in ("seen", "not seen"), r
            if r["why"]["kind"] == "claim":
                # a reason read from the profiler's counters needs a run that profiled
                assert r["why"]["state"] in ("seen", "not seen") \
                    or "profiled" in r["why"]["evidence"], r


def test_every_reason_is_a_claim_or_a_hypothesis_with_its_test():
    """'Why they differ' is a claim of the lesson (measured) or a hypothesis worded as one,
    with what would test it; `check` names a claim of the lesson."""
    for e in course.load():
        exp = REGISTRY[e["match"]["experiment"]]
        keys = {c.name for c in claims.lesson_claims(exp)}
        assert e.get("check") in keys, (e["lesson"], e.get("check"), sorted(keys))
        why = e["why"]
        assert isinstance(why, dict), (e["lesson"], "an older free-text reason")
        if "claim" in why:
            assert why["claim"] in keys, (e["lesson"], why["claim"])
        else:
            assert why["hypothesis"].strip() and why["test"].strip(), e["lesson"]


def test_the_course_s_own_errors_are_named_with_their_evidence():
    errors = {e["lesson"]: e["course_error"] for e in course.load() if e.get("course_error")}
    says = " ".join(x["says"] for x in errors.values())
    assert "2048 threads per block" in says and "256" in says, errors
    for x in errors.values():
        assert x["fact"] and x["source"]


def test_numbers_from_the_h100_run(rows, h100):
    sms = rows["vectorAdd: the GPU's streaming multiprocessors"]
    assert sms["this"] == 132 and sms["ratio"] == pytest.approx(132 / 13)
    assert sms["check"] == "seen"
    naive = rows["matmul 160×240 · 240×320: the naive kernel"]
    assert naive["unit"] == "ms" and 0.001 < naive["this"] < 0.1  # seconds scaled to ms
    speedup = rows["matmul 160×240 · 240×320: tiled / naive speed-up"]
    assert 1.0 < speedup["this"] < 2.5
    racy = rows["atomics: the racy counter"]
    counted = h100[h100["variant"] == "racy_counter"]["m_counted"].dropna()
    assert racy["this"] == counted.iloc[0] < 100
    copies = rows["nvprof: copies take the GPU's time"]
    assert 50 < copies["this"] < 100


def test_calculator_reproduces_the_courses_k80_occupancy(rows):
    """cc 3.7: 16 blocks per SM, 64 warps: one-warp blocks reach 25 %, two-warp 50 %."""
    assert rows["occupancy: 32-thread blocks"]["k80_calc"] == pytest.approx(25.0)
    assert rows["occupancy: 64-thread blocks"]["k80_calc"] == pytest.approx(50.0)
    assert rows["occupancy API: the block size it picks"]["k80_calc"] == 1024
    # the H100 holds 32 blocks per SM: the same 32-thread blocks reach 50 % there
    assert rows["occupancy: 32-thread blocks"]["this"] == pytest.approx(50.0)
    assert all(r["k80_calc"] is None for n, r in rows.items() if "occupancy" not in n)


def test_a_run_without_device_query_or_a_point(h100):
    rows = {r["lesson"]: r for r in course.course_table(
        h100[~h100["experiment"].isin(["device_query", "atomics"])])}
    sms = rows["vectorAdd: the GPU's streaming multiprocessors"]
    assert sms["this"] is None and sms["check"] == "not measured"
    assert sms["why"]["kind"] == "hypothesis" or sms["why"]["state"] == "not measured"
    assert rows["atomics: the racy counter"]["this"] is None


def test_course_file_is_checked(tmp_path):
    text = course.course_file(REGISTRY["device_query"]).read_text()
    bad = yaml.safe_load(text)
    bad["lessons"][0]["match"]["metrix"] = "m_sm_count"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(jsonschema.ValidationError, match="metrix"):
        course.load_file(tmp_path / "c.yaml", "device_query")
    bad = yaml.safe_load(text)
    bad["lessons"][0]["match"]["experiment"] = "vectoradd"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="unknown experiment 'vectoradd'"):
        course.load_file(tmp_path / "c.yaml", "device_query")


def test_each_lesson_keeps_its_course_numbers_in_its_folder():
    """The course table reads every folder's course.yaml, in the course's order, and an
    entry's experiment is its folder's."""
    lessons = course.load()
    assert [e["order"] for e in lessons] == list(range(1, len(lessons) + 1))
    for e in lessons:
        assert course.course_file(REGISTRY[e["match"]["experiment"]]).is_file()
    assert lessons[0]["match"]["experiment"] == "device_query"
