"""The teacher's edition: every question of every lesson answered from this run's numbers.

`cudalab report --teacher` writes it (results/teacher.html by default), a file of its own
beside the student edition (report.html), which asks the same questions and answers none.
Each answer comes from its lesson's declaration (Question.answer in the lesson's folder):
the answer, the working (rows and columns of results.csv, the arithmetic, the result with
its unit), or "not measured in this run" with what would measure it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from cudalab import results, roofline, run_ceilings
from cudalab.experiments import REGISTRY
from cudalab.experiments.questions import Answer, Question, Run, not_measured
from cudalab.resources import TEMPLATES_DIR

TEMPLATE = "teacher.html.j2"
FILE_NAME = "teacher.html"


def answer(name: str, question: Question, run: Run) -> Answer:
    """The question's answer on this run; a lesson the run has no rows of is not measured."""
    if run.rows.empty:
        return not_measured(f"the run has no rows of {name}",
                            f"run it with experiments.{name}.enabled: true in the config")
    if run.ok().empty:  # every point left out: say why (a run without a GPU, a failure)
        reasons = run.rows.get("reason", pd.Series(dtype=str)).dropna().astype(str)
        why = f" ({reasons.iloc[0].removeprefix('not measured: ')})" if len(reasons) else ""
        return not_measured(f"no point of {name} was measured{why}",
                            f"run {name} where it can run (a GPU for the timed lessons)")
    if question.answer is None:  # a plain string: a site's lesson may still declare those
        return Answer(f"No answer declared: the lesson {name} asks this as plain text; "
                      "declare it as Question(text, answer) in its lesson.py.", measured=False)
    try:
        return question.answer(run)
    except KeyError as exc:  # a table older than the column the answer reads
        return not_measured(f"this run's table has no column {exc}",
                            "measure it again with this version of cudalab")


def lessons(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Every lesson of the catalogue, in the report's order, with each question answered on
    the run's table df (the one roofline.load_table reads; annotated here)."""
    full = roofline.annotate(df).copy()  # one block of memory: answers add columns
    ceilings = run_ceilings.ceilings_of(full)
    out = []
    for name, exp in REGISTRY.items():
        run = Run(full[full["experiment"] == name], full, ceilings)
        out.append({"name": name, "title": exp.lesson.title, "in_run": not run.rows.empty,
                    "questions": [{"text": q.text, "answer": answer(name, q, run)}
                                  for q in exp.lesson.questions]})
    return out


def _device(df: pd.DataFrame) -> str:
    names = df["gpu_name"].dropna().astype(str) if "gpu_name" in df else pd.Series([], dtype=str)
    names = names[names != ""]
    return names.iloc[0] if not names.empty else "no GPU (every GPU point not measured)"


def context(df: pd.DataFrame, config: dict[str, Any]) -> dict[str, Any]:
    """The template's context: the run, its device and every lesson's answers."""
    got = lessons(df)
    answers = [q["answer"] for lesson in got for q in lesson["questions"]]
    return {"title": config["report"]["title"], "run_name": config["run_name"],
            "generated": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"),
            "device": _device(df), "lessons": got,
            "n_answered": sum(a.measured for a in answers),
            "n_not_measured": sum(not a.measured for a in answers)}


def render(df: pd.DataFrame, config: dict[str, Any], out: Path) -> Path:
    """Write the teacher's edition of the run (df: its results table) to `out`."""
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR),
                      autoescape=select_autoescape(["html", "j2"]))
    page = env.get_template(TEMPLATE).render(**context(df, config))
    with results.atomic_path(out) as tmp:
        tmp.write_text(page)
    return out
