"""The claims of a run as the renderers read them (RunClaims, a view of claims.json), and the
judging of every lesson of a table into that form (judge_lessons): the claims, the Try-this
claims and the course facts, each claim with the numbers its evidence states.

cudalab/claims_file.py writes and reads the file; cudalab/claims.py judges one claim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from cudalab.experiments.lesson import ClaimResult, State

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
        out[name] = {"title": lesson.title, "headline": claims.headline_key(lesson, judged),
                     "claims": [_entry(r, decl) for r in judged],
                     "try_this": [_entry(r, decl) for r in claims.evaluate_try_this(name, df)],
                     "facts": {k: claims.course_fact(name, k, df) for k in lesson.course_facts}}
    return out


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
