"""A run's claims.json: every claim of every lesson judged once, beside results.csv.

aggregate writes <folder>/claims.json right after <folder>/results.csv (write_for_table),
from the table read back as every reader reads it (roofline.load_table). The report, the
slides, the course table and the teacher's edition only read it (for_table): none of them
judges a claim again, so the ✔/✘ a slide shows is the report's.

The file (SCHEMA, checked on every read):
  format, version    "cudalab-claims", 1
  judged_at          when it was judged (ISO 8601, UTC)
  table              the results.csv it was judged on: its name and sha256; a claims.json
                     whose table has changed since is refused (judged on other data)
  gpu                the GPU of the table's first GPU row (None: a run without a GPU)
  lessons            experiment -> title, headline (the key of the claim a slide states),
                     claims (key, statement, state, evidence, numbers, tool, figure),
                     try_this (one entry per Try-this: its claim judged, or None) and facts
                     (the lesson's course facts: a sentence computed from the table, or None)
  course             the course table's rows (cudalab.course.course_table): the course's
                     number beside this run's with the verdict, judged on these claims

numbers: each number the evidence states, as {text, value, unit, name}: the judge's own
named numbers (Judgement.numbers) first, then every number read out of the evidence's words
(fmt's formats: '1.31×', '2.51 TB/s', '94 %', '1 048 576', '9.00 × 10⁻⁷').

A folder from before claims.json (the committed references): for_table judges it once and
writes claims.json beside the renderer's output, never into the folder it reads, and says so.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd

from cudalab import safe_io
from cudalab.experiments.lesson import ClaimResult, State

FILE = "claims.json"
FORMAT, VERSION = "cudalab-claims", 1
MAX_BYTES = 16 * 1024 * 1024  # the default grid's file is about 60 kB

_NUMBER = {"type": "object", "additionalProperties": False,
           "required": ["text", "value", "unit", "name"],
           "properties": {"text": {"type": "string"}, "value": {"type": "number"},
                          "unit": {"type": "string"}, "name": {"type": ["string", "null"]}}}
_CLAIM = {"type": "object", "additionalProperties": False,
          "required": ["key", "statement", "state", "evidence", "numbers", "tool", "figure"],
          "properties": {
              "key": {"type": "string", "minLength": 1}, "statement": {"type": "string"},
              "state": {"enum": [s.value for s in State]}, "evidence": {"type": "string"},
              "numbers": {"type": "array", "items": _NUMBER}, "tool": {"type": "boolean"},
              "figure": {"oneOf": [{"type": "null"}, {
                  "type": "array", "minItems": 2, "maxItems": 2,
                  "prefixItems": [{"type": "string"}, {"type": "integer"}]}]}}}
_LESSON = {"type": "object", "additionalProperties": False,
           "required": ["title", "headline", "claims", "try_this", "facts"],
           "properties": {
               "title": {"type": "string"}, "headline": {"type": ["string", "null"]},
               "claims": {"type": "array", "items": _CLAIM},
               "try_this": {"type": "array", "items": {"oneOf": [{"type": "null"}, _CLAIM]}},
               "facts": {"type": "object", "additionalProperties": {"type": ["string", "null"]}}}}
_COURSE_ROW = {"type": "object",
               "required": ["lesson", "experiment", "kind", "course", "unit", "this", "ratio",
                            "verdict", "tool_check", "text", "why", "measured"],
               "properties": {
                   "lesson": {"type": "string"}, "experiment": {"type": "string"},
                   "kind": {"enum": ["lesson", "context"]}, "unit": {"type": "string"},
                   "course": {"type": "number"}, "this": {"type": ["number", "null"]},
                   "ratio": {"type": ["number", "null"]}, "measured": {"type": "boolean"},
                   "verdict": {"oneOf": [{"type": "null"}, {
                       "type": "object", "required": ["state", "ratio", "text"],
                       "properties": {"state": {"enum": ["reproduced", "partly",
                                                         "not reproduced", "not measured"]},
                                      "ratio": {"type": ["number", "null"]},
                                      "text": {"type": "string"}}}]},
                   "tool_check": {"type": "string"}, "text": {"type": "object"},
                   "why": {"type": "object"}}}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "additionalProperties": False,
    "required": ["format", "version", "judged_at", "table", "gpu", "lessons", "course"],
    "properties": {
        "format": {"const": FORMAT}, "version": {"const": VERSION},
        "judged_at": {"type": "string"},
        "table": {"type": "object", "additionalProperties": False, "required": ["file", "sha256"],
                  "properties": {"file": {"type": "string"},
                                 "sha256": {"type": ["string", "null"],
                                            "pattern": "^[0-9a-f]{64}$"}}},
        "gpu": {"type": ["string", "null"]},
        "lessons": {"type": "object", "additionalProperties": _LESSON},
        "course": {"type": "array", "items": _COURSE_ROW},
    },
}


class ClaimsFileError(ValueError):
    """A claims.json that cannot be used: unreadable, against its schema, or judged on
    another table. The message names the file and says how to write it again."""


def regenerate_hint(table: Path, out: Path | None = None) -> str:
    out = out or Path(table).parent / FILE
    return (f"judge the run again: cudalab claims --table {safe_io.shown(table)} "
            f"--out {safe_io.shown(out)}")


# -- numbers out of the evidence -------------------------------------------------------------
_SUP = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
_UNITS = ("TFLOP/s", "GFLOP/s", "MFLOP/s", "FLOP/byte", "TB/s", "GB/s", "MB/s", "kB/s",
          "GiB", "MiB", "KiB", "cycles", "ns", "µs", "ms", "s", "B", "%", "×")
_NUM = re.compile(
    r"(?<![\w.^/])(?P<sign>[-−])?(?P<int>\d{1,3}(?:\u202f\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?:[eE](?P<exp>[-+]?\d+)|[\s\u00a0]?×[\s\u00a0]?10(?P<sup>[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+))?"
    r"(?:[\s\u00a0\u202f]?(?P<unit>" + "|".join(re.escape(u) for u in _UNITS) + r")(?![\w/]))?")


def numbers_in(evidence: str) -> list[dict[str, Any]]:
    """Every number the evidence states, with its unit where fmt wrote one."""
    out = []
    for m in _NUM.finditer(evidence):
        after = evidence[m.end():m.end() + 1]
        if not m["unit"] and (after.isalpha() or after == "_"):
            continue  # part of a name or a shape: sm_90, 32x8
        digits = m["int"].replace("\u202f", "") + (m["frac"] or "")
        value = float(digits)
        if m["exp"]:
            value *= 10.0 ** int(m["exp"])
        elif m["sup"]:
            value *= 10.0 ** int(m["sup"].translate(_SUP))
        value = -value if m["sign"] else value
        out.append({"text": m.group(0).strip(), "value": value, "unit": m["unit"] or "",
                    "name": None})
    return out


# -- judging (the one place) -----------------------------------------------------------------
def _claim_entry(r: ClaimResult, tool: bool, figure: tuple[str, int] | None
                 ) -> dict[str, Any]:
    named = [{"text": "", "value": float(v), "unit": "", "name": k}
             for k, v in (r.numbers or {}).items()]
    return {"key": r.key, "statement": r.statement, "state": r.state.value,
            "evidence": r.evidence, "numbers": named + numbers_in(r.evidence),
            "tool": tool, "figure": list(figure) if figure else None}


def _entry(r: ClaimResult | None, declared: Mapping[str, Any]) -> dict[str, Any] | None:
    """A judged claim as claims.json holds it, with its declaration's tool flag and figure."""
    if r is None:
        return None
    c = declared.get(r.key)
    return _claim_entry(r, bool(c is not None and c.tool), getattr(c, "figure", None))


def headline_key(lesson: Any, judged: list[ClaimResult]) -> str | None:
    """The claim a slide states: the lesson's `headline` where it names one, else its first
    claim that is neither the correctness check nor a check of the tool, else its
    correctness check; None where every claim checks the tool (device_query)."""
    keys = [r.key for r in judged]
    if getattr(lesson, "headline", None) in keys:
        return lesson.headline
    from cudalab.claims import CORRECTNESS_KEY

    tools = {c.name for c in lesson.claims if c.tool}
    lessons = [k for k in keys if k not in tools]  # a check of the tool is never one
    point = [k for k in lessons if k != CORRECTNESS_KEY]
    return (point or lessons or [None])[0]


def judge_lessons(df: pd.DataFrame, names: list[str] | None = None
                  ) -> dict[str, dict[str, Any]]:
    """Every lesson of the table (or those of `names`) judged: its claims, Try-this claims
    and course facts."""
    from cudalab import claims
    from cudalab.experiments import REGISTRY

    present = set(df["experiment"].astype(str)) if "experiment" in df else set()
    out = {}
    for name, exp in REGISTRY.items():
        if name not in present or names is not None and name not in names:
            continue
        lesson = exp.lesson
        decl = {c.name: c for c in claims.lesson_claims(exp)}
        judged = claims.evaluate(name, df)
        out[name] = {"title": lesson.title, "headline": headline_key(lesson, judged),
                     "claims": [_entry(r, decl) for r in judged],
                     "try_this": [_entry(r, decl) for r in claims.evaluate_try_this(name, df)],
                     "facts": {k: claims.course_fact(name, k, df) for k in lesson.course_facts}}
    return out


def _gpu(df: pd.DataFrame) -> str | None:
    gpus = df["gpu_name"].dropna() if "gpu_name" in df else []
    return str(gpus.iloc[0]) if len(gpus) else None


def judge_run(df: pd.DataFrame, table: Path | None = None) -> RunClaims:
    """The whole run judged: its lessons, then the course table on those claims. df: the
    table as roofline.load_table reads it; table: the file it came from (its hash is kept)."""
    from cudalab import course

    doc: dict[str, Any] = {
        "format": FORMAT, "version": VERSION,
        "judged_at": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"),
        "table": {"file": Path(table).name if table else "",
                  "sha256": sha256(table) if table else None},
        "gpu": _gpu(df), "lessons": judge_lessons(df), "course": []}
    run = RunClaims(doc)
    doc["course"] = _plain(course.course_table(df, judged=run)) if len(df) else []
    return run


def _plain(v: Any) -> Any:
    """A course row as JSON holds it: NaN and infinities as null, numpy scalars as floats."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
        return None
    return v


def sha256(path: Path) -> str:
    from cudalab.results import MAX_TABLE_BYTES

    return hashlib.sha256(safe_io.read_bytes(path, MAX_TABLE_BYTES)).hexdigest()


# -- writing and reading -----------------------------------------------------------------------
def write(run: RunClaims, path: Path) -> Path:
    """claims.json, checked against SCHEMA, written atomically (fsynced, then renamed)."""
    from cudalab.results import write_json_atomic

    jsonschema.validate(run.doc, SCHEMA)
    write_json_atomic(Path(path), run.doc)
    return Path(path)


def write_for_table(table: Path, out: Path | None = None) -> Path:
    """Judge the run of results.csv `table` once and write its claims.json (default: beside
    it). aggregate calls this right after writing the table."""
    from cudalab import roofline

    return write(judge_run(roofline.load_table(Path(table)), Path(table)),
                 Path(out) if out else Path(table).parent / FILE)


def read(path: Path, table: Path | None = None) -> RunClaims:
    """A claims.json checked against SCHEMA; with `table`, also that it was judged on that
    results.csv (same sha256). ClaimsFileError says what is wrong and how to regenerate."""
    try:
        doc = safe_io.read_json(path, MAX_BYTES)
        jsonschema.validate(doc, SCHEMA)
    except safe_io.InputRefused as exc:
        raise ClaimsFileError(f"{exc}; {regenerate_hint(table or Path('results.csv'), path)}"
                              ) from None
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise ClaimsFileError(
            f"{safe_io.shown(path)}: not a claims file of this cudalab (at {where}: "
            f"{exc.message}); {regenerate_hint(table or Path('results.csv'), path)}") from None
    if table is not None and doc["table"]["sha256"] not in (None, sha256(table)):
        raise ClaimsFileError(
            f"{safe_io.shown(path)} was judged on another {doc['table']['file'] or 'table'} "
            f"than {safe_io.shown(table)} (the table changed since); "
            f"{regenerate_hint(table, path)}")
    return RunClaims(doc)


def for_table(table: Path, df: pd.DataFrame, out_dir: Path) -> RunClaims:
    """The claims a renderer shows for results.csv `table` (df: that table, loaded): its
    folder's claims.json; a folder from before claims.json is judged once here and its
    claims.json written into out_dir (the renderer's output), never into the run's folder."""
    own = Path(table).parent / FILE
    if own.exists():
        return read(own, Path(table))
    run = judge_run(df, Path(table))
    path = write(run, Path(out_dir) / FILE)
    print(f"note: {safe_io.shown(own)} does not exist (a run from before claims.json): "
          f"judged it once and wrote {safe_io.shown(path)}", file=sys.stderr)
    return run


@dataclass(frozen=True)
class RunClaims:
    """claims.json in memory: what the renderers ask of it."""

    doc: dict[str, Any]

    def lesson(self, name: str) -> Mapping[str, Any]:
        return self.doc["lessons"].get(name, {})

    def claims(self, name: str) -> list[ClaimResult]:
        """The lesson's claims as judged, in its order ([] : the run has no rows of it)."""
        return [_result(name, c) for c in self.lesson(name).get("claims", [])]

    def try_this(self, name: str) -> list[ClaimResult | None]:
        return [None if c is None else _result(name, c)
                for c in self.lesson(name).get("try_this", [])]

    def claim(self, name: str, key: str) -> ClaimResult | None:
        return next((c for c in self.claims(name) if c.key == key), None)

    def headline(self, name: str) -> ClaimResult | None:
        key = self.lesson(name).get("headline")
        return self.claim(name, key) if key else None

    def figure(self, name: str, key: str) -> tuple[str, int] | None:
        """The figure (name, panel) a claim is about, where its lesson names one."""
        got = next((c["figure"] for c in self.lesson(name).get("claims", [])
                    if c["key"] == key and c["figure"]), None)
        return (str(got[0]), int(got[1])) if got else None

    def fact(self, name: str, key: str) -> str | None:
        return self.lesson(name).get("facts", {}).get(key)

    def all(self) -> list[ClaimResult]:
        return [c for name in self.doc["lessons"] for c in self.claims(name)]

    @property
    def course(self) -> list[dict[str, Any]]:
        return self.doc["course"]

    @property
    def gpu(self) -> str | None:
        return self.doc["gpu"]


def _result(name: str, c: Mapping[str, Any]) -> ClaimResult:
    named = {n["name"]: n["value"] for n in c["numbers"] if n["name"]}
    return ClaimResult(c["statement"], State(c["state"]), c["evidence"], c["key"], name, named)
