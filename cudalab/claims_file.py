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
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd

from cudalab import safe_io
from cudalab.experiments.lesson import State
from cudalab.run_claims import RunClaims, judge_lessons

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


# -- the run judged: its lessons, then the course on them -----------------------------------
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


