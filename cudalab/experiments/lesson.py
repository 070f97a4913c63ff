"""What a lesson is made of, for the experiment folders' lesson modules.

Each folder's lesson.py builds one Lesson: everything the report, the slides and the course
table say about its experiment (title, caption, figure captions, claims, facts, Try-this,
questions, the sources of its numbers). The experiment declares it (`lesson = LESSON`) and
keeps only what it measures and draws.

A lesson says two kinds of things about a run, and nothing else:
- a **claim**: a predicate over this run's table with its threshold, written once in the
  lesson it belongs to. Judged on the run it has one of four states: seen, not seen (a
  contradiction, shown with its evidence), not measured (no data, with the reason) or not
  applicable (the chip has no such unit). Its statement says what is expected in general
  terms (a threshold, never a measured number); the numbers it read are its evidence.
- a **fact** (Explanation): a sentence computed from the table (rows and ceilings -> a
  sentence, or None where this run has nothing to say).
Captions, figure captions, Try-this and questions say what to look for and state no measured
number; the report's audit test holds them to that.

Every claim carries `flip`: a change of the data that turns its verdict over (seen <-> not
seen). The mutation test applies it to the committed references, so no claim is a sentence
that no data could contradict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Question, as_question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

# Within this share of its best bandwidth a kernel counts as "at full bandwidth".
FULL_BANDWIDTH_SHARE = 0.9
# A "large fraction of peak bandwidth" / "close to the memory bandwidth".
LARGE_FRACTION = 0.6

Explanation = Callable[[pd.DataFrame, "Ceilings"], str | None]
Verdict = tuple[bool | None, str]  # (supported; None: not enough data), evidence


class State(str, Enum):
    """The four states of a judged claim (its rendered words are the values)."""

    SEEN = "seen"
    NOT_SEEN = "not seen"
    NOT_MEASURED = "not measured"
    NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Judgement:
    state: State
    evidence: str  # the numbers the predicate read, or why it could not judge
    # the numbers it compared, by name (claims.json keeps them beside the evidence's words)
    numbers: Mapping[str, float] = field(default_factory=dict)


def judged(holds: bool, evidence: str, **numbers: float) -> Judgement:
    """Seen where the predicate holds, else not seen; evidence: the numbers it read (and,
    named, the ones it compared: judged(r >= 2, f"{r:.2f}x", ratio=r, threshold=2))."""
    return Judgement(State.SEEN if holds else State.NOT_SEEN, evidence, numbers)


def no_data(why: str) -> Judgement:
    """Not measured: the rows the claim needs are not in this run (why: which, and why)."""
    return Judgement(State.NOT_MEASURED, why)


def not_applicable(why: str) -> Judgement:
    """Not applicable: the claim cannot hold on this chip or grid (why: what is missing)."""
    return Judgement(State.NOT_APPLICABLE, why)


Judge = Callable[[pd.DataFrame, "Ceilings"], "Judgement | Verdict"]
Flip = Callable[[pd.DataFrame], pd.DataFrame]


@dataclass(frozen=True)
class Claim:
    """One sentence a lesson states about a run, and the predicate that judges it.

    statement: what is expected, in general terms with its threshold; judge(rows, ceilings):
    a Judgement (or the older (bool | None, evidence) pair: None is 'not measured');
    flip(rows): the experiment's rows changed so that the verdict turns over (the mutation
    test); key: a stable name (default: the judge's name); tool: a check of cudalab itself
    (its limits table against the driver, its peaks computed), not a lesson of the course:
    never a lesson's headline; figure: (figure name, panel index) the claim is about, which
    a slide stating it shows (None: the lesson's slide_figure)."""

    statement: str
    judge: Judge
    flip: Flip | None = None
    key: str = ""
    tool: bool = False
    figure: tuple[str, int] | None = None

    @property
    def name(self) -> str:
        return self.key or getattr(self.judge, "__name__", "claim").lstrip("_")

    @property
    def phrase(self) -> str:  # the older name: a claim's words
        return self.statement

    def evaluate(self, rows: pd.DataFrame, ceilings: Ceilings) -> Judgement:
        got = self.judge(rows, ceilings)
        if isinstance(got, Judgement):
            return got
        holds, evidence = got
        return no_data(evidence) if holds is None else judged(bool(holds), evidence)


@dataclass(frozen=True)
class ClaimResult:
    """A claim judged on a run: what the report renders."""

    statement: str
    state: State
    evidence: str
    key: str = ""
    experiment: str = ""
    numbers: Mapping[str, float] = field(default_factory=dict)

    @property
    def claim(self) -> str:  # the older names of the fields
        return self.statement

    @property
    def phrase(self) -> str:
        return self.statement

    @property
    def passed(self) -> bool | None:
        """True: seen, False: not seen, None: not measured or not applicable."""
        return {State.SEEN: True, State.NOT_SEEN: False}.get(self.state)

    supported = passed


def ok(d: pd.DataFrame) -> pd.DataFrame:
    """The rows measured ok."""
    return d[d["status"].astype(str) == "ok"]


def col(d: pd.DataFrame, c: str) -> pd.Series:
    """Column c as floats (NaN where absent or not a number)."""
    if c not in d.columns:
        return pd.Series(np.nan, index=d.index, dtype=float)
    return pd.to_numeric(d[c], errors="coerce").astype(float)


def ncu(d: pd.DataFrame, prefix: str) -> pd.Series:
    """The sum of the profiler columns starting with `prefix` per row, NaN where the point
    was not profiled (m_ncu_status other than 'ok') or the columns are absent."""
    cols = [c for c in d.columns if c.startswith(prefix)]
    if not cols:
        return pd.Series(np.nan, index=d.index, dtype=float)
    vals = pd.concat([col(d, c) for c in cols], axis=1)
    out = vals.sum(axis=1, min_count=1)
    if "m_ncu_status" in d.columns:
        out = out.where(d["m_ncu_status"].astype(str) == "ok")
    return out


def pct_range(lo: float, hi: float) -> str:
    """'68–70 %': one unit for both ends."""
    return f"{fmt.percent(lo)[:-2]}–{fmt.percent(hi)}"


def largest(d: pd.DataFrame, column: str = "flops") -> pd.DataFrame:
    """The rows at the largest value of `column` (none where it has no number)."""
    v = col(d, column)
    return d[v == v.max()] if v.notna().any() else d.iloc[:0]


def ref(c: Ceilings, level: str = "dram") -> tuple[float, str]:
    """A memory level's ceiling and how to name it in a sentence."""
    value, kind = c.bandwidth(level)
    return value, f"{kind} {level.upper()} ceiling {fmt.bandwidth(value)}"


class TryThis(NamedTuple):
    """A config change to try, what to expect, and (where one run can judge it) the claim
    that judges the expectation once that config has run."""

    change: str
    expect: str
    claim: Claim | None = None


# Try-this (and questions) per lesson: fewer than two leaves the reader nothing to compare,
# more than three do not fit the lesson's handout page beside its figure.
TRY_THIS_COUNT = (2, 3)


@dataclass(frozen=True)
class Lesson:
    """What the report says about one experiment: declared once, in its folder's lesson.py.

    title: the section's heading; caption: what to look for and the expected effects, shown
    above the figures; figures: figure name -> caption, in the report's order (the
    experiment's plot() draws each name); claims: judged on every run; explanations: the
    facts computed from the run; try_this: config changes to try with what to expect;
    questions for the reader; sources: each number the prose states (caption, figure
    captions, Try-this, questions) with where it comes from, since prose never states a
    measured number (tests/test_claims.py holds it to that); slide_figure: (figure name,
    axes index) of the slide, None: the first figure drawn; print_figure: (figure name,
    axes index or None for every panel) of the printed handout, None: the first figure
    (cudalab/handout.py draws it at its printed size); print_pages: the A4 pages its part
    of the handout may take (its printed text and figure; the Chromium print test holds it
    to that, and the handout's page count to the sum over the printed lessons); headline:
    the key of the claim the lesson's slide states (None: its first claim that is neither
    the correctness check nor a check of the tool).
    A lesson has TRY_THIS_COUNT[0] to TRY_THIS_COUNT[1] Try-this and as many questions."""

    title: str
    caption: str
    figures: Mapping[str, str] = field(default_factory=dict)
    claims: Sequence[Claim] = ()
    explanations: Sequence[Explanation] = ()
    try_this: Sequence[TryThis] = ()
    questions: Sequence[Question | str] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    slide_figure: tuple[str, int] | None = None
    print_figure: tuple[str, int | None] | None = None
    print_pages: float = 1.0
    course_facts: Mapping[str, Explanation] = field(default_factory=dict)
    headline: str | None = None

    def __post_init__(self) -> None:  # questions: Question(text, answer) (questions.py)
        object.__setattr__(self, "questions", tuple(as_question(q) for q in self.questions))


# -- flips: the data changes the mutation test applies ---------------------------------------
Mask = Callable[[pd.DataFrame], "pd.Series"]


def slower(d: pd.DataFrame, mask: Mask, factor: float) -> pd.DataFrame:
    """The rows in mask(d) take `factor` times as long: times x factor, rates / factor."""
    d = d.copy()
    m = mask(d)
    for c in ("time_median_s", "time_min_s", "time_mean_s", "m_kernel_s"):
        if c in d:
            d.loc[m, c] = col(d, c)[m] * factor
    for c in ("gflops", "gbps", "pct_peak_gflops", "pct_peak_gbps", "pct_ceil_gbps",
              "pct_ceil_gflops"):
        if c in d:
            d.loc[m, c] = col(d, c)[m] / factor
    return d


def with_value(d: pd.DataFrame, mask: Mask, column: str, value: object) -> pd.DataFrame:
    """The rows in mask(d) get `value` in `column`."""
    d = d.copy()
    if column in d and d[column].dtype.kind in "iuf" and isinstance(value, str):
        d[column] = d[column].astype(object)
    d.loc[mask(d), column] = value
    return d


def first_gpu(d: pd.DataFrame) -> pd.Series:
    """The first ok GPU row (a flip that makes one point wrong)."""
    gpu = (d["status"].astype(str) == "ok") & (d["variant"] != "cpu")
    return pd.Series(d.index == (d[gpu].index[0] if gpu.any() else None), index=d.index)


def one_wrong(d: pd.DataFrame) -> pd.DataFrame:
    """The flip of 'every result is correct': the first ok GPU point is wrong."""
    return with_value(d, first_gpu, "status", "wrong")


def all_correct(counted: str = "points correct") -> Judge:
    """The judge of "every measured point is right": seen where every point the run
    measured is ok, with 'k/n <counted>' and the first points that are not; a point left
    out (not measured) is neither."""
    def judge(d: pd.DataFrame, c: Ceilings) -> Judgement:
        done = d[d["status"].astype(str) != "not_measured"]
        bad = done[done["status"].astype(str) != "ok"]
        if done.empty:
            return no_data("no point measured")
        return judged(bad.empty, f"{len(done) - len(bad)}/{len(done)} {counted}"
                      + (f"; not ok: {', '.join(bad['point_id'].astype(str).head(5))}"
                         if len(bad) else ""))
    judge.__name__ = "_correct"
    return judge
