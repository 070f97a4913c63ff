"""The course table (each experiment folder's course.yaml beside this run) on the real H100
reference, and its verdicts: each of reproduced, partly, not reproduced and not measured
produced from data."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pandas as pd
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
        if r["experiment"] not in measured:
            continue
        if r["kind"] == "context":
            assert r["verdict"] is None and r["tool_check"] in ("seen", "not seen"), r
        else:
            assert r["verdict"]["state"] in course.VERDICTS[:3], r
        if r["why"]["kind"] == "claim":
            # a reason read from the profiler's counters needs a run that profiled
            assert r["why"]["state"] in ("seen", "not seen") \
                or "profiled" in r["why"]["evidence"], r
        if r["why"]["kind"] == "fact":
            assert r["why"]["statement"], r


def test_every_reason_is_a_claim_a_fact_or_a_hypothesis_with_its_test():
    """'Why they differ' is a claim of the lesson (measured), a course fact of the lesson
    (computed), or a hypothesis worded as one, with what would test it; a context row's
    tool_check names a claim of the lesson."""
    for e in course.load():
        exp = REGISTRY[e["match"]["experiment"]]
        keys = {c.name for c in claims.lesson_claims(exp)}
        assert ("effect" in e) != ("context" in e), e["lesson"]
        if "context" in e:
            assert e["tool_check"] in keys, (e["lesson"], e["tool_check"], sorted(keys))
        why = e["why"]
        if "claim" in why:
            assert why["claim"] in keys, (e["lesson"], why["claim"])
        elif "fact" in why:
            assert why["fact"] in exp.lesson.course_facts, (e["lesson"], why["fact"])
        else:
            assert why["hypothesis"].strip() and why["test"].strip(), e["lesson"]


def test_each_course_measurement_is_one_row():
    """One K80 measurement, one row: no two rows carry the same course number and note."""
    seen = [(e["course"]["value"], e["course"]["unit"], e["course"].get("note", ""))
            for e in course.load()]
    assert len(seen) == len(set(seen)), seen


def test_the_course_s_own_errors_are_named_with_their_evidence():
    errors = {e["lesson"]: e["course_error"] for e in course.load() if e.get("course_error")}
    says = " ".join(x["says"] for x in errors.values())
    assert "2048 threads per block" in says and "256" in says, errors
    for x in errors.values():
        assert x["fact"] and x["source"]


def test_numbers_from_the_h100_run(rows, h100):
    sms = rows["vectorAdd: the GPU's streaming multiprocessors"]
    assert sms["this"] == 132 and sms["ratio"] == pytest.approx(132 / 13)
    assert sms["kind"] == "context" and sms["tool_check"] == "seen"
    speedup = rows["matmul 160×240 · 240×320: tiled / naive speed-up"]
    assert 1.0 < speedup["this"] < 2.5
    racy = rows["atomics: the racy counter"]
    counted = h100[h100["variant"] == "racy_counter"]["m_counted"].dropna()
    assert racy["this"] == counted.iloc[0] < 100
    copies = rows["nvprof: copies take the GPU's time"]
    assert 50 < copies["this"] < 100


def test_the_h100_verdicts_say_what_held(rows):
    """The rows the review found marked 'seen' although the course's number did not hold."""
    state = {k: r["verdict"]["state"] for k, r in rows.items() if r["verdict"]}
    assert state["coalescing: an uncoalesced (misaligned) copy"] == "not reproduced"
    assert state["latency: shared memory"] == "not reproduced"  # 5 -> 23 cycles
    assert state["matmul 160×240 · 240×320: tiled / naive speed-up"] == "partly"  # 2.5 -> 1.31
    assert state["occupancy: 64-thread blocks"] == "not reproduced"  # 100 % here
    assert state["streams: copy and compute overlap"] == "reproduced"
    assert state["latency: global memory (DRAM)"] == "reproduced"
    partly = rows["matmul 160×240 · 240×320: tiled / naive speed-up"]["verdict"]
    assert partly["ratio"] == pytest.approx((partly_this := rows[
        "matmul 160×240 · 240×320: tiled / naive speed-up"]["this"] - 1) / 1.5)
    assert partly_this > 0 and "the course's" in partly["text"]
    assert len(state) == len(rows) - 2  # the SMs and the FP32 peak are context


@pytest.mark.parametrize(("effect", "course_v", "this", "want"), [
    ("speedup", 2.5, 2.2, "reproduced"),  # 1.2 of 1.5: 80 % of the effect
    ("speedup", 2.5, 1.31, "partly"),  # 0.31 of 1.5: 21 %
    ("speedup", 1.19, 1.03, "not reproduced"),  # 0.03 of 0.19: 16 %
    ("speedup", 1.6, 0.9, "not reproduced"),  # slower with streams: reversed
    ("speedup", 1.9, 5.0, "reproduced"),  # a stronger effect still shows it
    ("level", 500, 685, "reproduced"),
    ("level", 5, 14, "partly"),  # 2.8x
    ("level", 5, 23, "not reproduced"),  # 4.6x
    ("level", 500, 100, "not reproduced"),  # 5x below
    ({"shortfall_of": 100}, 25, 50, "reproduced"),  # 50 of 75 points below full
    ({"shortfall_of": 100}, 25, 80, "partly"),  # 20 of 75
    ({"shortfall_of": 100}, 50, 100, "not reproduced"),  # full occupancy: no shortfall
    ("speedup", 1.19, None, "not measured"),
    ("level", 5, float("nan"), "not measured"),
])
def test_each_verdict_is_produced_from_data(effect, course_v, this, want):
    assert course.verdict(effect, course_v, this)["state"] == want


def _frame(offset1_s: float | None) -> pd.DataFrame:
    """A coalescing table: offset 0 at 1 ms, offset 1 at offset1_s (None: not measured)."""
    rows = [{"experiment": "coalescing", "variant": "offset", "status": "ok", "reason": "",
             "point_id": "offset-n67108864-offset0", "time_median_s": 1e-3}]
    rows.append({"experiment": "coalescing", "variant": "offset",
                 "status": "ok" if offset1_s is not None else "not_measured",
                 "reason": "" if offset1_s is not None else "no GPU",
                 "point_id": "offset-n67108864-offset1", "time_median_s": offset1_s})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("offset1_s", "want"), [
    (1.20e-3, "reproduced"), (1.06e-3, "partly"), (1.01e-3, "not reproduced"),
    (None, "not measured")])
def test_the_course_table_s_verdict_follows_the_run(offset1_s, want):
    """The same course row judged on four runs: each verdict from the run's own times."""
    entry = next(e for e in course.load() if e["match"]["experiment"] == "coalescing")
    row = course.course_table(_frame(offset1_s), [entry])[0]
    assert row["verdict"]["state"] == want, row["verdict"]
    assert course.verdict_counts([row])[want] == 1


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
    assert sms["this"] is None and sms["tool_check"] == "not measured"
    assert sms["why"]["kind"] == "hypothesis" or sms["why"]["state"] == "not measured"
    racy = rows["atomics: the racy counter"]
    assert racy["this"] is None and racy["verdict"]["state"] == "not measured"


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


def _render_course_table(rows) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(ROOT / "reports" / "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    env.filters["fmt"] = str
    return env.get_template("compare.html.j2").render(
        course_rows=rows, course_counts=course.verdict_counts(rows),
        course_rule=course.verdict_rule(), comparison=None)


def test_the_rendered_course_table_says_what_held(rows):
    """The teacher's table: a verdict per lesson row with its thresholds stated, the GPU's
    properties apart with the tool's check, and no 'seen' verdict column."""
    page = _render_course_table(list(rows.values()))
    shown = dict(re.findall(r'data-course-row="([^"]+)" data-verdict="([^"]+)"', page))
    assert shown["coalescing: an uncoalesced (misaligned) copy"] == "not reproduced"
    assert shown["matmul 160×240 · 240×320: tiled / naive speed-up"] == "partly"
    assert shown["the GPU&#39;s FP32 peak"] == "context"
    assert "does this GPU show it?" in page and "lesson seen here?" not in page
    assert "For scale: the two GPUs" in page and "check of the tool" in page
    assert course.verdict_rule() in page.replace("&#39;", "'")
    assert "Computed from this run:" in page  # the copies beside the transfer lesson


def test_a_run_without_a_gpu_gets_not_measured_verdicts(h100):
    """Every lesson row of a run that measured nothing is 'not measured', never a verdict,
    and no why cell calls a not-measured claim 'measured'."""
    empty = h100.assign(status="not_measured", reason="no GPU")
    rows = course.course_table(empty)
    assert {r["verdict"]["state"] for r in rows if r["verdict"]} == {"not measured"}
    page = _render_course_table(rows)
    assert "measured, not measured" not in page
    assert course.verdict_counts(rows)["not measured"] == sum(r["kind"] == "lesson"
                                                              for r in rows)


def test_a_reason_whose_lesson_did_not_run_gives_the_claims_words(rows):
    """A row whose reason is a claim of a lesson the run left out (the H100 reference has no
    interconnect lesson) states that claim and why it is not measured, not its key."""
    why = rows["multi-GPU: the host link"]["why"]
    statement = next(c.statement for c in REGISTRY["interconnect"].lesson.claims
                     if c.key == "host_is_bottleneck")
    assert why["state"] == "not measured" and why["statement"] == statement
    assert why["evidence"] == "the interconnect lesson is not in this run"
    page = _render_course_table(list(rows.values()))
    assert "host_is_bottleneck" not in page
