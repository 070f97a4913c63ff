"""The teacher's edition: every question of every lesson answered from the run's numbers.

- The catalogue: each lesson declares one answer per question, beside it (Question(text,
  answer) in its lesson.py), read here from the lessons themselves.
- On the committed H100 reference (re-rendered into a temporary folder, never edited) every
  answer computes numbers, with its working; on a GPU-less run every answer says "not
  measured in this run" and what would measure it, with no number.
- Flips: the answers follow the data. Changing results.csv changes every answer's numbers,
  and targeted changes move a number as the arithmetic says (a doubled clock doubles the
  peak), or turn a cause over (blocks that no longer retire at one rate are no longer
  blamed on a fixed cost per block).
- The student edition (report.html) asks the questions and holds none of the answers; the
  teacher's edition is `cudalab report --teacher`, a file of its own.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_not_measured import not_measured_table

from cudalab import cli, fmt, report, results, roofline, run_ceilings, teacher
from cudalab import config as cfg
from cudalab.experiments import REGISTRY
from cudalab.experiments.lesson import Lesson, slower
from cudalab.experiments.questions import NOT_MEASURED, Question, Run

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
OTHER_RUNS = {"H200": ROOT / "reports" / "reference" / "NVIDIA-H200" / "results.csv",
              "H100 profiled": ROOT / "tests" / "data" / "h100_profiled_2026-11-25.csv.gz"}
# the H100 reference as it was before ceilings and several metric columns existed
OLD_TABLE = ROOT / "tests" / "data" / "h100_before_ceilings" / "results.csv"
# Columns a perturbation leaves alone: identities, the chip's architecture (its limits
# table is looked up by it) and the grid's parameters (the rows an answer picks).
FIXED = {"compute_capability", "m_cc", "m_warp_size", "sm_count", "schema_version"}
QUESTIONS = [(name, i) for name, exp in REGISTRY.items()
             for i in range(len(exp.lesson.questions))]


@pytest.fixture(scope="module")
def h100() -> pd.DataFrame:
    return results.read_table(REFERENCE / "results.csv")


@pytest.fixture(scope="module")
def h100_answers(h100) -> dict[tuple[str, int], object]:
    return _answers(h100)


def _answers(df: pd.DataFrame) -> dict[tuple[str, int], object]:
    return {(lesson["name"], i): q["answer"] for lesson in teacher.lessons(df)
            for i, q in enumerate(lesson["questions"])}


def _one(df: pd.DataFrame, name: str, i: int):
    full = roofline.annotate(df)
    run = Run(full[full["experiment"] == name], full, run_ceilings.ceilings_of(full))
    return teacher.answer(name, REGISTRY[name].lesson.questions[i], run)


# -- the catalogue ---------------------------------------------------------------------------
def test_every_lesson_declares_one_answer_per_question():
    for name, exp in REGISTRY.items():
        qs = exp.lesson.questions
        assert qs, name
        for q in qs:
            assert isinstance(q, Question) and callable(q.answer), (name, q)
            # declared beside its question: in the lesson's own folder
            assert q.answer.__module__.startswith(f"cudalab.experiments.{name}."), (name, q)


def test_a_plain_string_question_still_works_and_says_it_has_no_answer(h100):
    lesson = Lesson("t", "c", questions=["Why?"])
    assert lesson.questions == (Question("Why?"),) and str(lesson.questions[0]) == "Why?"
    full = roofline.annotate(h100)
    got = teacher.answer("vector_add", lesson.questions[0],
                         Run(full[full["experiment"] == "vector_add"], full,
                             run_ceilings.ceilings_of(full)))
    assert not got.measured and "No answer declared" in got.text


# -- answers from a real run -----------------------------------------------------------------
# the wgmma rungs' questions: no committed reference has run them yet (as in test_claims)
# the H100 reference is one GPU: the answers between GPUs are tested on a run of four below
AWAITING_A_RUN = {("interconnect", 0), ("interconnect", 1), ("interconnect", 2)}
INTERCONNECT_RUN = ROOT / "reports" / "reference" / "multi-gpu-4xH200-2026-11-27" / \
    "interconnect_results.csv"


def test_the_interconnect_answers_read_a_run_between_gpus():
    """Answered from the lesson run on four H200s (NV18), and the numbers follow the data."""
    df = results.read_table(INTERCONNECT_RUN)
    got = {k: a for k, a in _answers(df).items() if k[0] == "interconnect"}
    assert len(got) == 3 and all(a.measured and a.numbers for a in got.values()), got
    assert "twice" in got["interconnect", 0].text and "GB/s" in got["interconnect", 1].text
    slower_link = df.copy()
    m = slower_link["experiment"] == "interconnect"
    slower_link.loc[m, "gbps"] = pd.to_numeric(slower_link.loc[m, "gbps"]) * 0.5
    moved = {k: a for k, a in _answers(slower_link).items() if k[0] == "interconnect"}
    assert moved["interconnect", 1].numbers["share"] == pytest.approx(
        got["interconnect", 1].numbers["share"] * 0.5)


def test_the_h100_reference_answers_every_question_with_its_working(h100_answers):
    assert set(h100_answers) == set(QUESTIONS)
    for key, a in h100_answers.items():
        if key in AWAITING_A_RUN:
            assert not a.measured, f"{key} is measured now: take it out of AWAITING_A_RUN"
            assert a.text.startswith(NOT_MEASURED) and "to measure it" in a.text.lower()
            continue
        assert a.text and a.numbers, key  # each answer computed something from the run
        assert all(math.isfinite(v) for v in a.numbers.values()), (key, a.numbers)
        assert not re.search(r"\bnan\b|\binf\b", a.text.lower()), (key, a.text)
        assert "has no column" not in a.text, (key, a.text)
        if a.measured:
            assert a.working, key  # rows, columns and arithmetic
            assert any(" · " in w for w in a.working), (key, a.working)  # a cited cell
        else:  # what the run lacks, and what would measure it
            assert a.text.startswith(NOT_MEASURED) and "to measure it" in a.text.lower()
    measured = sum(a.measured for a in h100_answers.values())
    assert measured >= len(QUESTIONS) - len(AWAITING_A_RUN) - 3, measured


def test_a_table_older_than_an_answer_s_column_says_so():
    got = _answers(results.read_table(OLD_TABLE))
    assert set(got) == set(QUESTIONS)
    old = [a for a in got.values() if "has no column" in a.text]
    assert old and all(not a.measured and "measure it again" in a.text for a in old)


@pytest.mark.parametrize("label", sorted(OTHER_RUNS))
def test_other_runs_answer_every_question(label):
    got = _answers(results.read_table(OTHER_RUNS[label]))
    assert set(got) == set(QUESTIONS)
    assert all(a.text and (a.measured or a.text.startswith(NOT_MEASURED))
               for a in got.values())


def test_a_run_without_a_gpu_answers_not_measured_with_the_reason():
    df = pd.concat([not_measured_table(n, metric_cols=True) for n in REGISTRY],
                   ignore_index=True)
    got = _answers(df)
    assert set(got) == set(QUESTIONS)
    for key, a in got.items():
        assert not a.measured and not a.numbers, key
        assert a.text.startswith(NOT_MEASURED) and "no GPU here" in a.text, (key, a.text)


# -- flips: the answers follow the data ------------------------------------------------------
def _perturbed(df: pd.DataFrame, seed: int = 7) -> pd.DataFrame:
    """Every measured number times its own random factor in [0.5, 0.9]: the grid, the
    identities and the architecture unchanged."""
    rng = np.random.default_rng(seed)
    changed = {}
    for c in df.columns:
        if c.startswith("p_") or c in FIXED:
            continue
        v = pd.to_numeric(df[c], errors="coerce")
        if v.notna().any() and v.notna().sum() == df[c].notna().sum():
            changed[c] = v * rng.uniform(0.5, 0.9, len(df))
    return df.assign(**changed)


def test_every_answer_s_numbers_change_with_the_data(h100, h100_answers):
    moved = _answers(_perturbed(h100))
    same = [key for key, a in h100_answers.items()
            if moved[key].numbers == a.numbers and key not in AWAITING_A_RUN]
    assert not same, f"answers that do not depend on the data: {same}"


def _scale(df: pd.DataFrame, mask, column: str, factor: float) -> pd.DataFrame:
    d = df.copy()
    m = mask(d)
    assert m.any()
    d.loc[m, column] = pd.to_numeric(d.loc[m, column]) * factor
    return d


def _is(experiment: str, variant: str | None = None, **params):
    def mask(d: pd.DataFrame) -> pd.Series:
        m = d["experiment"] == experiment
        if variant is not None:
            m &= d["variant"] == variant
        for k, v in params.items():
            m &= (pd.to_numeric(d[f"p_{k}"], errors="coerce") == v) if isinstance(
                v, (int, float)) else (d[f"p_{k}"].astype(str) == v)
        return m
    return mask


@pytest.mark.parametrize("name, i, mask, column, factor, number, expect", [
    # the DRAM peak is 2 x clock x bus width: a doubled clock doubles it
    ("device_query", 0, _is("device_query"), "m_mem_clock_mhz", 2.0, "peak_gbps", 2.0),
    ("device_query", 1, _is("device_query"), "m_fp32_cores", 0.5, "peak_gflops", 0.5),
    # pinned over pageable: a pageable copy twice as slow doubles the gain
    ("transfer", 0, _is("transfer", "pageable", direction="h2d"), "gbps", 0.5,
     "gain_h2d", 2.0),
    # a warp that straddles sectors: offset 1 at half the speed doubles its cost
    ("coalescing", 1, _is("coalescing", "offset", offset=1), "gbps", 0.5, "slowdown", 2.0),
    # Little's law: twice the latency needs twice the warps in flight
    ("latency", 1, _is("latency", "global"), "m_ns_per_load", 2.0, "warps_per_sm", 2.0),
    # the conflicting tile twice as slow doubles what padding gains
    ("matmul", 2, _is("matmul", "tiled_conflict"), "time_median_s", 2.0, "gain_32", 2.0),
    # the serialised atomics: twice the time is twice the nanoseconds per addition
    ("atomics", 1, _is("atomics", "atomic_sum"), "time_median_s", 2.0, "ns_per_addition",
     2.0),
    ("streams", 2, _is("streams"), "m_d2h_s", 2.0, "ideal_one_engine_s", None),
    # one copy engine: H2D and D2H queue on it, the busiest engine carries both
    ("streams", 0, _is("streams"), "m_copy_engines", 1 / 3, "slowest_s", None),
    ("vector_add", 1, _is("vector_add", n=50000, threads=256), "m_blocks", 2.0, "blocks", 2.0),
])
def test_an_answer_moves_as_its_arithmetic_says(h100, name, i, mask, column, factor, number,
                                                expect):
    before = _one(h100, name, i).numbers[number]
    after = _one(_scale(h100, mask, column, factor), name, i).numbers[number]
    if expect is None:
        assert after > before
    else:
        assert after / before == pytest.approx(expect, rel=1e-6)


def test_the_small_block_answer_blames_a_cost_per_block_only_where_the_rate_holds(h100):
    """The cause flips: where 64- and 128-thread blocks no longer retire at the rate of
    32-thread blocks, the answer no longer says time follows the number of blocks."""
    rate = "time follows the number of blocks"
    a = _one(h100, "vector_add", 2)
    assert a.numbers["same_block_rate"] == 1 and rate in a.text
    assert "Latency hiding is not the cause" in a.text
    big = _is("vector_add", n=h100.loc[h100["experiment"] == "vector_add", "p_n"].max())
    flipped = h100
    for t, f in ((64, 2.0), (128, 4.0)):  # 64 and 128 threads: the same speed, other rates
        flipped = slower(flipped, lambda d, t=t: big(d) & (d["p_threads"] == t), f)
    b = _one(flipped, "vector_add", 2)
    assert b.numbers["same_block_rate"] == 0 and rate not in b.text
    assert "Latency hiding is not the cause" not in b.text


def test_the_streams_answer_names_the_memory_its_copies_match(h100):
    a = _one(h100, "streams", 1)
    assert "near the transfer lesson's pinned rate" in a.text
    slow = _scale(h100, _is("streams"), "m_h2d_s", a.numbers["h2d_gbps"]
                  / a.numbers["transfer_pageable_gbps"])
    assert "near the transfer lesson's pageable rate" in _one(slow, "streams", 1).text


def test_the_racy_count_is_compared_with_the_waves_it_ran_in(h100):
    a = _one(h100, "atomics", 0)
    assert "close to that" in a.text
    far = _scale(h100, _is("atomics", "racy_counter"), "m_counted", 100.0)
    assert "not close to that" in _one(far, "atomics", 0).text


# -- the two editions ------------------------------------------------------------------------
def _texts(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_the_student_edition_asks_every_question_and_answers_none(h100, h100_answers,
                                                                   tmp_path):
    conf = cfg.load(ROOT / "config.yaml")
    page = _texts(report.render(h100, tmp_path / "figures", conf,
                                tmp_path / "report.html").read_text())
    for name, exp in REGISTRY.items():
        if (h100["experiment"] == name).any():
            for q in exp.lesson.questions:
                assert q.text in page, q.text
    leaked = [key for key, a in h100_answers.items()
              if a.text[:80] in page or any(w[:80] in page for w in a.working)]
    assert not leaked, leaked


def test_cudalab_report_teacher_writes_the_teacher_s_edition(tmp_path, h100_answers):
    out = tmp_path / "teacher.html"
    rc = cli.main(["report", "--teacher", "--table", str(REFERENCE / "results.csv"),
                   "--results", str(tmp_path), "--config",
                   str(REFERENCE / "report-config.yaml"), "--out", str(out)])
    assert rc == 0 and out.is_file() and not (tmp_path / "report.html").exists()
    page = _texts(out.read_text())
    for name, exp in REGISTRY.items():
        for i, q in enumerate(exp.lesson.questions):
            assert q.text in page
            a = h100_answers[name, i]
            assert a.text[:80] in page and all(w in page for w in a.working), (name, i)


def test_a_changed_copy_of_results_csv_changes_the_teacher_s_edition(tmp_path):
    """Through the file and the command: the memory clock doubled in a copy of the
    reference's results.csv doubles the DRAM peak the teacher's edition derives."""
    table = pd.read_csv(REFERENCE / "results.csv", low_memory=False)
    dev = table["experiment"] == "device_query"
    clock, bus = (float(table.loc[dev, c].iloc[0]) for c in ("m_mem_clock_mhz",
                                                              "m_bus_width_bits"))
    table.loc[dev, "m_mem_clock_mhz"] = 2 * clock
    table.to_csv(tmp_path / "results.csv", index=False)
    pages = {}
    for label, csv in (("reference", REFERENCE / "results.csv"),
                       ("changed", tmp_path / "results.csv")):
        out = tmp_path / f"{label}.html"
        assert cli.main(["report", "--teacher", "--table", str(csv), "--results",
                         str(tmp_path), "--config", str(REFERENCE / "report-config.yaml"),
                         "--out", str(out)]) == 0
        pages[label] = _texts(out.read_text())
    peak = 2 * clock * 1e6 * bus / 8 / 1e9
    assert f"= {fmt.bandwidth(peak)}. The factor 2" in pages["reference"]
    assert f"= {fmt.bandwidth(2 * peak)}. The factor 2" in pages["changed"]
    assert f"= {fmt.bandwidth(peak)}. The factor 2" not in pages["changed"]


def _with_duplex(df: pd.DataFrame, h2d: float, d2h: float, both: float) -> pd.DataFrame:
    """The streams lesson's duplex points (H2D alone, D2H alone, both at once) added."""
    n = float(df.loc[df["experiment"] == "streams", "p_n"].max())
    rows = pd.DataFrame([{"experiment": "streams", "variant": "duplex", "status": "ok",
                          "point_id": f"duplex-n{int(n)}-direction{d}", "p_n": n,
                          "p_direction": d, "time_median_s": t}
                         for d, t in (("h2d", h2d), ("d2h", d2h), ("both", both))])
    return pd.concat([df, rows], ignore_index=True)


def test_the_duplex_answer_reads_the_duplex_points_and_names_what_they_show(h100):
    """Without the duplex points the answer is not measured; with them it is, and it says
    full duplex or one shared path as the times say (the cause flips with the data)."""
    assert not _one(h100, "transfer", 2).measured
    full = _one(_with_duplex(h100, 5.0e-3, 4.9e-3, 5.2e-3), "transfer", 2)
    assert full.measured and "full duplex" in full.text
    assert full.numbers["duplex_ratio"] == pytest.approx(9.9 / 5.2)
    shared = _one(_with_duplex(h100, 5.0e-3, 4.9e-3, 9.9e-3), "transfer", 2)
    assert shared.measured and "share one path" in shared.text
    assert "full duplex" not in shared.text
