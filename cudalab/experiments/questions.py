"""A lesson's questions, each with the teacher's answer computed from the run.

A lesson declares its questions as Question(text, answer): the text is what the student
edition (report.html) asks; answer(run) is what the teacher's edition (cudalab report
--teacher) says, computed from this run's table: the answer in words, the working (which
rows and columns of results.csv it read, the arithmetic, each result with its unit) and the
numbers it computed by name. Where the run lacks the rows, the answer says "not measured in
this run" and what would measure it; it never states a number the run did not produce.

Helpers here pick a row by its parameters and cite a cell as the working shows it, so every
lesson's answers read the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import pandas as pd

from cudalab import fmt

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

NOT_MEASURED = "Not measured in this run"


@dataclass(frozen=True)
class Answer:
    """text: the answer, its numbers included; working: the steps (rows and columns read,
    arithmetic, result with unit); numbers: each computed number by name (tests change the
    data and watch these move); measured: False where the run lacks the data."""

    text: str
    working: Sequence[str] = ()
    numbers: Mapping[str, float] = field(default_factory=dict)
    measured: bool = True


def not_measured(missing: str, would: str) -> Answer:
    """The answer where the run lacks the data: what is missing, and what would measure it."""
    end = "" if would.endswith(".") else "."
    return Answer(f"{NOT_MEASURED}: {missing}. To measure it: {would}{end}", measured=False)


class Run(NamedTuple):
    """What an answer reads: the lesson's rows (annotated), the whole table (other lessons'
    rows: device limits, copy engines) and the run's ceilings."""

    rows: pd.DataFrame
    table: pd.DataFrame
    ceilings: Ceilings

    def ok(self, experiment: str | None = None) -> pd.DataFrame:
        """The rows measured ok: the lesson's, or another experiment's."""
        d = self.rows if experiment is None else self.table[
            self.table["experiment"] == experiment]
        return d[d["status"].astype(str) == "ok"] if "status" in d else d.iloc[:0]

    def device(self) -> pd.Series | None:
        """device_query's row (the GPU's limits), None where it was not measured."""
        d = self.ok("device_query")
        if d.empty:
            return None
        row = d.iloc[0].copy()
        row["point_id"] = "device_query"  # its one row, cited by the lesson's name
        return row


AnswerFn = Callable[[Run], Answer]


@dataclass(frozen=True)
class Question:
    """A question for the reader and the function that answers it from a run. str() is the
    text, so the student edition renders it as before."""

    text: str
    answer: AnswerFn | None = None

    def __str__(self) -> str:
        return self.text


def as_question(q: Question | str) -> Question:
    """A plain string is a question without an answer (the catalogue test fails it)."""
    return q if isinstance(q, Question) else Question(str(q))


# -- reading cells ---------------------------------------------------------------------------
def num(v: Any) -> float:
    """A cell as a float (NaN where empty or not a number)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def have(*values: float) -> bool:
    """Every value is a finite number."""
    return all(math.isfinite(num(v)) for v in values)


def pick(d: pd.DataFrame, variant: str | None = None, **params: Any) -> pd.Series | None:
    """The one ok row of `variant` whose p_<key> columns equal the given values (the first
    where several match), None where none does."""
    m = pd.Series(True, index=d.index)
    if variant is not None:
        m &= d["variant"].astype(str) == variant
    for k, v in params.items():
        c = f"p_{k}"
        if c not in d:
            return None
        m &= (pd.to_numeric(d[c], errors="coerce") == v) if isinstance(v, (int, float)) \
            else (d[c].astype(str) == str(v))
    hit = d[m]
    return None if hit.empty else hit.iloc[0]


def cite(row: pd.Series, column: str, show: Callable[[Any], str] = fmt.number,
         label: str | None = None) -> str:
    """'<point_id> · column = value' : where a number of the working comes from (label: a
    shorter name of the row where its point id is long)."""
    name = label or row.get("point_id", row.get("variant", ""))
    return f"{name} · {column} = {show(row.get(column))}"


def ratio_text(a: float, b: float) -> str:
    return fmt.ratio(a / b) if have(a, b) and b else "n/a"
