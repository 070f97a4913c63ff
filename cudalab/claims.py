"""Every claim of a lesson judged on a run's table: the one place the report, the course
table and the slides get their verdicts from.

A claim (cudalab/experiments/lesson.py) is judged on its experiment's rows, annotated with
the run's ceilings (roofline.annotate). Rows a GPU-less run left out are never evidence
against a claim: where none of the experiment's rows was measured every claim is "not
measured", with the reason, and where a claim lacks data while some rows were left out,
its reason says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from cudalab import roofline, run_ceilings
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import NOT_MEASURED, Experiment, not_measured_evidence
from cudalab.experiments.lesson import Claim, ClaimResult, Lesson, State, no_data

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings


def evaluate(name: str, df: pd.DataFrame) -> list[ClaimResult]:
    """The claims of experiment `name` judged on this run. df: the whole table (its
    ceilings and L2 size), or the experiment's rows."""
    full = roofline.annotate(df)
    sub = full[full["experiment"] == name]
    if sub.empty or name not in REGISTRY:
        return []
    return judge(REGISTRY[name], sub, run_ceilings.ceilings_of(full))


def judge(exp: Experiment, rows: pd.DataFrame, ceilings: Ceilings) -> list[ClaimResult]:
    """exp's claims judged on its (annotated) rows."""
    if rows.empty:
        return []
    return [_judge_one(exp, claim, rows, ceilings) for claim in exp.lesson.claims]


def _left_out(rows: pd.DataFrame) -> tuple[str, bool]:
    """Why some rows were not measured ('' : all were), and whether none was."""
    status = rows["status"].astype(str) if "status" in rows else pd.Series(dtype=str)
    left_out = rows[status == NOT_MEASURED]
    return (not_measured_evidence(left_out) if len(left_out) else "",
            len(left_out) == len(rows))


def _judge_one(exp: Experiment, claim: Claim, rows: pd.DataFrame,
               ceilings: Ceilings) -> ClaimResult:
    why, nothing = _left_out(rows)
    if nothing:
        return ClaimResult(claim.statement, State.NOT_MEASURED, why, claim.name, exp.name)
    try:
        j = claim.evaluate(rows, ceilings)
    except KeyError as exc:  # a table without a column the claim reads (an older run)
        j = no_data(f"this table has no {exc} column")
    evidence = j.evidence
    if j.state is State.NOT_MEASURED and why and why not in evidence:
        evidence = f"{why}; {evidence}"
    return ClaimResult(claim.statement, j.state, evidence, claim.name, exp.name, j.numbers)


def lesson_claims(exp: Experiment) -> list[Claim]:
    """Every claim a lesson states: its own, then those of its Try-this predictions."""
    lesson = exp.lesson
    return list(lesson.claims) + [t.claim for t in lesson.try_this if t.claim is not None]


def evaluate_claim(name: str, claim: Claim, df: pd.DataFrame) -> ClaimResult | None:
    """One claim of experiment `name` judged on this run (None: no rows of it)."""
    full = roofline.annotate(df)
    sub = full[full["experiment"] == name]
    if sub.empty:
        return None
    return _judge_one(REGISTRY[name], claim, sub, run_ceilings.ceilings_of(full))


JUDGED = (State.SEEN, State.NOT_SEEN)


def flip_audit(name: str, claim: Claim, df: pd.DataFrame) -> tuple[bool, str]:
    """Whether `claim` of experiment `name` is judged on df, and what is wrong with its
    flip there ('' : nothing). A claim judged seen or not seen must turn over when its flip
    is applied: one whose check gives the same state on the data and on the flipped data
    passes (or fails) whatever the data, so it cannot fail; a flip that changes no value,
    or leaves the claim without a verdict, shows nothing either."""
    rows = df["experiment"] == name
    before = evaluate_claim(name, claim, df) if rows.any() else None
    if before is None or before.state not in JUDGED:
        return False, ""
    label = f"{name}:{claim.name}"
    if claim.flip is None:
        return True, f"{label} has no flip: nothing shows it can fail"
    changed = claim.flip(df[rows].copy())
    if changed.reset_index(drop=True).equals(df[rows].reset_index(drop=True)):
        return True, f"{label}: its flip changes no value of the data"
    after = evaluate_claim(name, claim, pd.concat([df[~rows], changed], ignore_index=True))
    if after is None or after.state not in JUDGED:
        return True, (f"{label}: {before.state.value} on the data, "
                      f"{after.state.value if after else 'no rows'} on its flip")
    if after.state is before.state:
        return True, (f"{label} is {before.state.value} on the data and on its flipped data: "
                      "its check gives the same answer either way, so it cannot fail")
    return True, ""


def evaluate_try_this(name: str, df: pd.DataFrame) -> list[ClaimResult | None]:
    """Each Try-this prediction of the lesson judged on this run (None: it has no claim,
    or the run has no rows of the experiment)."""
    exp = REGISTRY.get(name)
    if exp is None:
        return []
    return [evaluate_claim(name, t.claim, df) if t.claim is not None else None
            for t in exp.lesson.try_this]


def course_fact(name: str, key: str, df: pd.DataFrame) -> str | None:
    """The course fact `key` of experiment `name`'s lesson, computed from the whole run's
    table (None: this run has nothing to say)."""
    exp = REGISTRY.get(name)
    fact = exp.lesson.course_facts.get(key) if exp is not None else None
    if fact is None:
        raise KeyError(f"{name}: no course fact {key!r}; the lesson has "
                       f"{sorted(exp.lesson.course_facts) if exp else []}")
    full = roofline.annotate(df)
    try:
        return fact(full, run_ceilings.ceilings_of(full))
    except KeyError:  # a table without a column the fact reads (an older run)
        return None


# The claim every lesson opens with: its results are right. A precondition of the lesson,
# not its point, so a slide's one sentence is the first claim after it.
CORRECTNESS_KEY = "correct"


def headline_key(lesson: Lesson, judged: list[ClaimResult]) -> str | None:
    """The claim a slide states: the lesson's `headline` where it names one, else its first
    claim that is neither the correctness check nor a check of the tool, else its
    correctness check; None where every claim checks the tool (device_query)."""
    keys = [r.key for r in judged]
    if lesson.headline in keys:
        return lesson.headline
    tools = {c.name for c in lesson.claims if c.tool}
    lessons = [k for k in keys if k not in tools]  # a check of the tool is never one
    point = [k for k in lessons if k != CORRECTNESS_KEY]
    return (point or lessons or [None])[0]


def headline(name: str, df: pd.DataFrame) -> ClaimResult | None:
    """The lesson's point judged on this run (the slides' one sentence): the claim its
    Lesson names as headline, else its first claim other than the correctness check and the
    checks of the tool (Claim.tool), else the correctness check (headline_key)."""
    got = evaluate(name, df)
    exp = REGISTRY.get(name)
    key = headline_key(exp.lesson, got) if exp is not None else None
    return next((r for r in got if r.key == key), None)


def counts(results: list[ClaimResult]) -> dict[str, int]:
    """How many claims are in each state (all four named, zeros included)."""
    return {s.value: sum(r.state is s for r in results) for s in State}
