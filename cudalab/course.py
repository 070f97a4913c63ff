"""The course as a baseline: its published measurements beside this run's numbers, one row
per course measurement, with a verdict (does this GPU show the course's effect?) and why
they differ.

Each experiment's folder holds its part of the course in course.yaml (checked against SCHEMA
when loaded), a list of `lessons`:
  lesson   the lesson, as the course names it
  order    its place in the course table (the course's order, not the report's sections)
  course   value + unit as the course printed them, the GPU it ran on, a note
  match    point (a point_id) or variant (its first ok row) + metric (a column of
           results.csv), times scale (s -> ms: 1000), divided by the row's column `per`
           where given; `where` {column: value} keeps only such rows (an NVLink pair);
           or ratio: [point_a, point_b] = metric of point_a / metric of point_b;
           experiment: the folder's, unless named
  effect   how the course's effect is read from its number, for the verdict (VERDICTS):
           speedup (a ratio where 1 is no effect: a speed-up or a slow-down), level (the
           number itself: cycles, a share of time) or {shortfall_of: N} (how far the number
           stays below N: occupancy below 100 %, increments lost of those made)
  context  instead of effect: the row is a property of the GPU (SMs, peaks), not an effect
           of the course's code; it gets no verdict, and tool_check names the claim that
           checks cudalab's own reading of it (shown as a check of the tool)
  why      why this GPU's number differs from the course's, in one of three forms:
           claim: the key of a claim that measures the reason (its statement, state and
           evidence are shown); fact: the name of one of the lesson's course_facts, a
           sentence computed from this run's table (what the data shows, no verdict); or
           hypothesis: a reason this run cannot measure, worded as one (no measured
           number), with test: what would test it
  course_error  where the course itself is wrong: says (its words), fact, source
  k80      what cudalab's occupancy calculator says for the course's GPU (cc 3.7):
           occupancy_at: <block size> (in %) or api_block_size: true

The course ran on a Tesla K80 (compute capability 3.7); where cudalab's occupancy calculator
can compute that GPU, its numbers are shown beside the course's.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pandas as pd
import yaml

from cudalab import fmt
from cudalab import occupancy as occ
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Experiment
from cudalab.experiments.lesson import ClaimResult

if TYPE_CHECKING:
    from cudalab.run_claims import RunClaims

COURSE_FILE = "course.yaml"  # in an experiment's folder
COURSE_CC = "3.7"  # Tesla K80

_MATCH = {
    "type": "object", "additionalProperties": False,
    "required": ["metric"],
    "properties": {
        "experiment": {"type": "string"}, "point": {"type": "string"},
        "variant": {"type": "string"}, "metric": {"type": "string"},
        "scale": {"type": "number"}, "per": {"type": "string"},
        "ratio": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
        "where": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "oneOf": [{"required": ["point"]}, {"required": ["variant"]}, {"required": ["ratio"]}],
}
SCHEMA = {
    "type": "object", "required": ["lessons"], "additionalProperties": False,
    "properties": {"lessons": {"type": "array", "minItems": 1, "items": {
        "type": "object", "additionalProperties": False,
        "required": ["lesson", "order", "course", "match", "why"],
        "oneOf": [{"required": ["effect"]}, {"required": ["context", "tool_check"]}],
        "properties": {
            "lesson": {"type": "string"},
            "order": {"type": "integer"},
            "course": {"type": "object", "additionalProperties": False,
                       "required": ["value", "unit", "gpu"],
                       "properties": {"value": {"type": "number"}, "unit": {"type": "string"},
                                      "gpu": {"type": "string"}, "note": {"type": "string"}}},
            "match": _MATCH,
            "effect": {"oneOf": [
                {"enum": ["speedup", "level"]},
                {"type": "object", "additionalProperties": False,
                 "required": ["shortfall_of"],
                 "properties": {"shortfall_of": {"type": "number"}}}]},
            "context": {"type": "string"}, "tool_check": {"type": "string"},
            "why": {"oneOf": [
                {"type": "object", "additionalProperties": False, "required": ["claim"],
                 "properties": {"claim": {"type": "string"}}},
                {"type": "object", "additionalProperties": False, "required": ["fact"],
                 "properties": {"fact": {"type": "string"}}},
                {"type": "object", "additionalProperties": False,
                 "required": ["hypothesis", "test"],
                 "properties": {"hypothesis": {"type": "string"}, "test": {"type": "string"}}},
            ]},
            "course_error": {"type": "object", "additionalProperties": False,
                             "required": ["says", "fact", "source"],
                             "properties": {"says": {"type": "string"},
                                           "fact": {"type": "string"},
                                           "source": {"type": "string"}}},
            "k80": {"type": "object", "additionalProperties": False, "maxProperties": 1,
                    "properties": {"occupancy_at": {"type": "integer", "minimum": 1},
                                   "api_block_size": {"const": True}}},
        }}}},
}


def course_file(exp: Experiment) -> Path:
    """Where an experiment's folder keeps its part of the course (it may have none)."""
    return Path(inspect.getfile(type(exp))).resolve().parent / COURSE_FILE


def load_file(path: Path, experiment: str) -> list[dict[str, Any]]:
    """One experiment's course entries, checked; match.experiment defaults to it."""
    data = yaml.safe_load(Path(path).read_text())
    jsonschema.validate(data, SCHEMA)
    for entry in data["lessons"]:
        entry["match"].setdefault("experiment", experiment)
        if entry["match"]["experiment"] not in REGISTRY:
            raise ValueError(f"{path}: lesson {entry['lesson']!r}: unknown experiment "
                             f"{entry['match']['experiment']!r}; allowed: {sorted(REGISTRY)}")
    return data["lessons"]


def load() -> list[dict[str, Any]]:
    """Every experiment's course entries, in the course's order."""
    lessons = [entry for name, exp in REGISTRY.items() if course_file(exp).is_file()
               for entry in load_file(course_file(exp), name)]
    return sorted(lessons, key=lambda e: e["order"])


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _ok_row(df: pd.DataFrame, experiment: str, point: str | None = None,
            variant: str | None = None, where: dict[str, str] | None = None
            ) -> pd.Series | None:
    sel = (df["experiment"] == experiment) & (df["status"] == "ok")
    sel &= (df["point_id"] == point) if point is not None else (df["variant"] == variant)
    for column, value in (where or {}).items():
        sel &= (df[column].astype(str) == value) if column in df else False
    rows = df[sel]
    return rows.iloc[0] if len(rows) else None


def this_value(df: pd.DataFrame, match: dict[str, Any]) -> tuple[float | None, pd.Series | None]:
    """This run's number for a lesson (None where the point was not measured ok), and the
    row it came from."""
    metric, exp = match["metric"], match["experiment"]
    if "ratio" in match:
        a, b = (_ok_row(df, exp, point=p) for p in match["ratio"])
        if a is None or b is None or metric not in df:
            return None, None
        va, vb = _num(a[metric]), _num(b[metric])
        return (va / vb if va is not None and vb else None), a
    row = _ok_row(df, exp, match.get("point"), match.get("variant"), match.get("where"))
    if row is None or metric not in df:
        return None, row
    v = _num(row[metric])
    if v is not None and "per" in match:  # e.g. GFLOP/s per GB/s of the DRAM ceiling
        per = _num(row.get(match["per"]))
        v = v / per if per else None
    return (v * match.get("scale", 1) if v is not None else None), row


def k80_value(spec: dict[str, Any] | None, row: pd.Series | None) -> float | None:
    """cudalab's occupancy calculator on the course's K80, with the kernel's registers from
    this run (the same source compiled for another architecture may use a few more)."""
    if not spec or row is None or _num(row.get("m_num_regs")) is None:
        return None
    regs = int(row["m_num_regs"])
    if "occupancy_at" in spec:
        return 100 * occ.occupancy(COURSE_CC, spec["occupancy_at"], regs).occupancy
    return float(occ.max_potential_block_size(COURSE_CC, regs)[1])


def tool_check(judged: RunClaims, experiment: str, key: str | None) -> str:
    """The state of the claim that checks cudalab's reading of a context row ('' : the
    entry names none)."""
    if not key:
        return ""
    c = judged.claim(experiment, key)
    return c.state.value if c is not None else "not measured"


def why_row(entry: dict[str, Any], judged: RunClaims, experiment: str) -> dict[str, str]:
    """The 'why they differ' cell: a measured reason (a claim judged on this run), what
    the run's data shows (a course fact computed from the whole table), or a hypothesis
    with what would test it; claims and facts as the run's claims.json holds them."""
    why = entry["why"]
    if "fact" in why:
        said = judged.fact(experiment, why["fact"])
        return {"kind": "fact", "statement": said or "",
                "state": "computed" if said else "not measured",
                "evidence": "" if said else "not measured in this run"}
    if "claim" in why:
        c: ClaimResult | None = judged.claim(experiment, why["claim"])
        if c is None:  # the reader gets the claim's words, never its key
            spec = next((k for k in REGISTRY[experiment].lesson.claims
                         if k.key == why["claim"]), None)
            ran = bool(judged.claims(experiment))
            return {"kind": "claim", "statement": spec.statement if spec else why["claim"],
                    "state": "not measured",
                    "evidence": "not measured in this run" if ran
                    else f"the {experiment} lesson is not in this run"}
        return {"kind": "claim", "statement": c.statement, "state": c.state.value,
                "evidence": c.evidence}
    return {"kind": "hypothesis", "statement": why["hypothesis"], "test": why["test"]}


# -- the verdict: does this GPU show the course's effect? -----------------------------------
# The effect of a speed-up or slow-down is how far its ratio is from 1 (2.5x: 1.5), of a
# shortfall how far the number stays below its whole (25 % occupancy: 75 points); "share"
# is this GPU's effect over the course's, in the same direction when positive.
REPRODUCED_SHARE = 0.5  # at least half the course's effect (or more): reproduced
PARTLY_SHARE = 0.2  # a fifth to a half: partly; below a fifth, or reversed: not reproduced
# A level (cycles, a share of time) is reproduced within this factor of the course's either
# way, partly within PARTLY_FACTOR, else not reproduced.
LEVEL_FACTOR = 2.0
PARTLY_FACTOR = 4.0
REPRODUCED, PARTLY, NOT_REPRODUCED, NOT_MEASURED = (
    "reproduced", "partly", "not reproduced", "not measured")
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, NOT_MEASURED)


def effect_share(effect: str | dict[str, float], course: float, this: float) -> float | None:
    """This GPU's effect over the course's (None: the course's number shows no effect, or
    effect is a level, which has no share)."""
    if effect == "speedup":
        base = 1.0
    elif isinstance(effect, dict):
        base = float(effect["shortfall_of"])
    else:
        return None
    return (this - base) / (course - base) if course != base else None


def verdict(effect: str | dict[str, float], course: float, this: float | None,
            ) -> dict[str, Any]:
    """The course's effect against this GPU's: state (one of VERDICTS), the ratio it was
    judged on (share of the effect, or this / course for a level) and a short text."""
    if this is None or not math.isfinite(this):
        return {"state": NOT_MEASURED, "ratio": None, "text": "not measured in this run"}
    share = effect_share(effect, course, this)
    if share is not None:
        state = (REPRODUCED if share >= REPRODUCED_SHARE else
                 PARTLY if share >= PARTLY_SHARE else NOT_REPRODUCED)
        what = ("reversed: the opposite of the course's effect" if share < 0 else
                f"effect {fmt.ratio(share)} the course's")
        return {"state": state, "ratio": share, "text": what}
    if effect != "level" or not course or this <= 0 or course < 0:
        return {"state": NOT_MEASURED, "ratio": None, "text": "no effect to compare"}
    factor = this / course
    off = max(factor, 1 / factor)
    state = (REPRODUCED if off <= LEVEL_FACTOR else
             PARTLY if off <= PARTLY_FACTOR else NOT_REPRODUCED)
    return {"state": state, "ratio": factor, "text": f"{fmt.ratio(factor)} the course's"}


def verdict_rule() -> str:
    """The thresholds in words, for the table's caption and the docs."""
    return (f"reproduced: the same direction and at least {REPRODUCED_SHARE:.0%} of the "
            f"course's effect (a speed-up's effect is how far it is from 1×; a level within "
            f"{LEVEL_FACTOR:g}× of the course's either way); partly: {PARTLY_SHARE:.0%} to "
            f"{REPRODUCED_SHARE:.0%} of the effect (a level within {PARTLY_FACTOR:g}×); "
            "not reproduced: less, or the opposite direction; not measured: this run has "
            "no number for it")


def show(v: float | None) -> str:
    """A bare number for the table (cudalab.fmt: grouped, 3 significant digits)."""
    if v is None or not math.isfinite(v):
        return ""
    return fmt.number(round(v) if abs(v) >= 1000 else v)


def texts(value: float | None, unit: str, ratio: float | None, k80: float | None,
          has_k80: bool) -> dict[str, str]:
    """The cells of one lesson's row as a reader wants them: each number with its unit,
    rescaled (14 320 ms reads 14.3 s), the ratio as '1.31×', and for a cell left empty the
    reason (the *_why keys)."""
    ok = ratio is not None and math.isfinite(ratio)
    return {
        "this_q": fmt.quantity(value, unit) if value is not None else "",
        "ratio_x": fmt.ratio(ratio) if ok else "",
        "k80_q": fmt.quantity(k80, unit) if k80 is not None else "",
        "this_why": "" if value is not None else "not measured in this run",
        "ratio_why": "" if ok else "no number of this run to compare",
        "k80_why": "" if k80 is not None else (
            "no register count of this kernel in this run" if has_k80 else
            "cudalab's calculator applies to occupancy lessons only"),
    }


def course_table(df: pd.DataFrame, lessons: list[dict[str, Any]] | None = None,
                 judged: RunClaims | None = None) -> list[dict[str, Any]]:
    """One row per course measurement: the course's number, this GPU's, ratio (this /
    course), the verdict (a lesson row; a context row, a property of the GPU, has none and
    shows the tool's check instead), cudalab's calculator on the K80 where it applies, and
    why they differ. judged: the run's claims.json (claims_file; a table in memory without
    one is judged by run_claims.judge_lessons, the one place claims are judged)."""
    from cudalab.run_claims import RunClaims, judge_lessons

    lessons = lessons if lessons is not None else load()
    if judged is None:
        judged = RunClaims({"lessons": judge_lessons(df)})
    rows = []
    for entry in lessons:
        m, c = entry["match"], entry["course"]
        value, row = this_value(df, m)
        ratio = value / c["value"] if value is not None and c["value"] else None
        k80 = k80_value(entry.get("k80"), row)
        context = "context" in entry
        rows.append({
            "lesson": entry["lesson"], "experiment": m["experiment"],
            "kind": "context" if context else "lesson", "context": entry.get("context", ""),
            "course": c["value"], "unit": c["unit"], "course_gpu": c["gpu"],
            "course_note": c.get("note", ""), "this": value,
            "ratio": ratio, "k80_calc": k80,
            "verdict": None if context else verdict(entry["effect"], c["value"], value),
            "tool_check": (tool_check(judged, m["experiment"], entry["tool_check"])
                           if context else ""),
            "text": {"course": show(c["value"]), "this": show(value),
                     "ratio": show(ratio), "k80_calc": show(k80),
                     "course_q": fmt.quantity(c["value"], c["unit"]),
                     **texts(value, c["unit"], ratio, k80, "k80" in entry)},
            "why": why_row(entry, judged, m["experiment"]),
            "course_error": entry.get("course_error"),
            "measured": value is not None,
        })
    return rows


def verdict_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many lesson rows have each verdict (all four named, zeros included)."""
    return {v: sum(1 for r in rows if r["verdict"] and r["verdict"]["state"] == v)
            for v in VERDICTS}


def run_table(folder: Path) -> pd.DataFrame:
    """A result folder's table: its results.csv, else built from its raw records."""
    from cudalab import results

    csv = Path(folder) / "results.csv"
    if csv.is_file():
        return results.read_table(csv)
    return results.build_table(results.iter_records(Path(folder) / "raw"))


def headline_markdown(tables: dict[str, pd.DataFrame]) -> str:
    """The course beside several runs (label -> results table), one Markdown row per lesson:
    the course's number, then each run's (ratio to the course in brackets)."""
    from cudalab.run_claims import RunClaims

    lessons = load()
    # the verdicts read the numbers alone; the 'why' column (claims) is not shown here
    unjudged = RunClaims({"lessons": {}})
    cols = {label: course_table(df, lessons, unjudged) for label, df in tables.items()}
    head = ["lesson", "course", *[f"{label} ({_gpu(df)})" for label, df in tables.items()]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, entry in enumerate(lessons):
        c = entry["course"]
        k80 = next(iter(cols.values()))[i]["text"]["k80_q"] if cols else ""
        cells = [entry["lesson"], f"{fmt.quantity(c['value'], c['unit'])} ({c['gpu']}"
                 + (f"; cudalab's calculator: {k80})" if k80 else ")")]
        for rows in cols.values():
            r = rows[i]
            shown = (f"{r['text']['this_q']} ({r['text']['ratio_x']})"
                     if r["this"] is not None else "—")
            cells.append(shown + (f": {r['verdict']['state']}" if r["verdict"] else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _gpu(df: pd.DataFrame) -> str:
    gpus = df["gpu_name"].dropna() if "gpu_name" in df else []
    return str(gpus.iloc[0]) if len(gpus) else "no GPU"
