"""The course as a baseline: its published measurements (cudalab/data/course.yaml) beside
this run's numbers, one row per lesson, with the lesson's check and why they differ.

The course ran on a Tesla K80 (compute capability 3.7); where cudalab's occupancy calculator
can compute that GPU, its numbers are shown beside the course's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import yaml

from cudalab import occupancy as occ
from cudalab.experiments import REGISTRY

COURSE_FILE = Path(__file__).resolve().parent / "data" / "course.yaml"
COURSE_CC = "3.7"  # Tesla K80

_MATCH = {
    "type": "object", "additionalProperties": False,
    "required": ["experiment", "metric"],
    "properties": {
        "experiment": {"type": "string"}, "point": {"type": "string"},
        "variant": {"type": "string"}, "metric": {"type": "string"},
        "scale": {"type": "number"},
        "ratio": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
    },
    "oneOf": [{"required": ["point"]}, {"required": ["variant"]}, {"required": ["ratio"]}],
}
SCHEMA = {
    "type": "object", "required": ["lessons"], "additionalProperties": False,
    "properties": {"lessons": {"type": "array", "minItems": 1, "items": {
        "type": "object", "additionalProperties": False,
        "required": ["lesson", "course", "match", "why", "why_plain"],
        "properties": {
            "lesson": {"type": "string"},
            "course": {"type": "object", "additionalProperties": False,
                       "required": ["value", "unit", "gpu"],
                       "properties": {"value": {"type": "number"}, "unit": {"type": "string"},
                                      "gpu": {"type": "string"}, "note": {"type": "string"}}},
            "match": _MATCH,
            "check": {"type": "string"}, "why": {"type": "string"},
            "why_plain": {"type": "string"},
            "k80": {"type": "object", "additionalProperties": False, "maxProperties": 1,
                    "properties": {"occupancy_at": {"type": "integer", "minimum": 1},
                                   "api_block_size": {"const": True}}},
        }}}},
}

# device_query metrics a sentence may name: {name} in why -> column m_<name>
DEVICE_VARS = ("sm_count", "sm_clock_mhz", "copy_engines", "peak_mem_gbps",
               "peak_fp32_gflops", "max_blocks_per_sm", "max_warps_per_sm",
               "max_threads_per_sm", "fp32_cores_per_sm", "cc")


def load(path: Path = COURSE_FILE) -> list[dict[str, Any]]:
    data = yaml.safe_load(Path(path).read_text())
    jsonschema.validate(data, SCHEMA)
    for entry in data["lessons"]:
        if entry["match"]["experiment"] not in REGISTRY:
            raise ValueError(f"{path}: lesson {entry['lesson']!r}: unknown experiment "
                             f"{entry['match']['experiment']!r}; allowed: {sorted(REGISTRY)}")
    return data["lessons"]


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _ok_row(df: pd.DataFrame, experiment: str, point: str | None = None,
            variant: str | None = None) -> pd.Series | None:
    sel = (df["experiment"] == experiment) & (df["status"] == "ok")
    sel &= (df["point_id"] == point) if point is not None else (df["variant"] == variant)
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
    row = _ok_row(df, exp, match.get("point"), match.get("variant"))
    if row is None or metric not in df:
        return None, row
    v = _num(row[metric])
    return (v * match.get("scale", 1) if v is not None else None), row


def run_vars(df: pd.DataFrame) -> dict[str, Any]:
    """Numbers of this run a sentence may name (only those that exist)."""
    out: dict[str, Any] = {}
    dev = _ok_row(df, "device_query", variant="device") if len(df) else None
    if dev is not None:
        for name in DEVICE_VARS:
            v = _num(dev.get(f"m_{name}"))
            if v is not None:
                out[name] = v
        l2, gen = _num(dev.get("m_l2_bytes")), _num(dev.get("m_pcie_gen_current"))
        width = _num(dev.get("m_pcie_width_current"))
        if l2:
            out["l2_mib"] = l2 / 2**20
        if gen and width:
            out["pcie_gen"], out["pcie_width"] = gen, width
        if "sm_count" in out and "max_threads_per_sm" in out:
            out["resident_threads"] = out["sm_count"] * out["max_threads_per_sm"]
    gpus = df["gpu_name"].dropna() if "gpu_name" in df else []
    if len(gpus):
        out["gpu"] = gpus.iloc[0]
    if "cc" in out:
        out["cc"] = f"{out['cc']:.1f}"
    return out


def k80_value(spec: dict[str, Any] | None, row: pd.Series | None) -> float | None:
    """cudalab's occupancy calculator on the course's K80, with the kernel's registers from
    this run (the same source compiled for another architecture may use a few more)."""
    if not spec or row is None or _num(row.get("m_num_regs")) is None:
        return None
    regs = int(row["m_num_regs"])
    if "occupancy_at" in spec:
        return 100 * occ.occupancy(COURSE_CC, spec["occupancy_at"], regs).occupancy
    return float(occ.max_potential_block_size(COURSE_CC, regs)[1])


def lesson_check(checks: dict[str, list[Any]], experiment: str, words: str | None) -> str:
    """seen / not seen / n/a from the experiment's expected effect whose claim holds the words."""
    if not words:
        return ""
    for e in checks.get(experiment, []):
        if words in e.claim:
            return {True: "seen", False: "not seen", None: "n/a"}[e.passed]
    return "not checked in this run"


def show(v: float | None) -> str:
    """A number for the table: thousands grouped, else 3 significant digits."""
    if v is None or not math.isfinite(v):
        return ""
    return f"{v:,.0f}".replace(",", "\u2009") if abs(v) >= 1000 else f"{v:.3g}"


def _sentence(entry: dict[str, Any], names: dict[str, Any]) -> str:
    try:
        return entry["why"].format_map(names)
    except (KeyError, ValueError, TypeError):
        return entry["why_plain"]


def course_table(df: pd.DataFrame, lessons: list[dict[str, Any]] | None = None,
                 ) -> list[dict[str, Any]]:
    """One row per lesson: the course's number, this GPU's, ratio (this / course), the
    lesson's check, cudalab's calculator on the K80 where it applies, and why they differ."""
    lessons = lessons if lessons is not None else load()
    base = run_vars(df)
    checks = {name: REGISTRY[name].expectations(sub)
              for name, sub in df.groupby("experiment") if name in REGISTRY}
    rows = []
    for entry in lessons:
        m, c = entry["match"], entry["course"]
        value, row = this_value(df, m)
        names = dict(base, course=c["value"])
        if row is not None and isinstance(row.get("cpu_model"), str):
            names["cpu_model"] = row["cpu_model"]
        if value is not None:
            names.update(value=value, ratio=value / c["value"] if c["value"] else math.nan,
                         change_pct=100 * (value - 1))
        rows.append({
            "lesson": entry["lesson"], "experiment": m["experiment"],
            "course": c["value"], "unit": c["unit"], "course_gpu": c["gpu"],
            "course_note": c.get("note", ""), "this": value,
            "ratio": names.get("ratio"), "k80_calc": k80_value(entry.get("k80"), row),
            "check": lesson_check(checks, m["experiment"], entry.get("check")),
            "text": {"course": show(c["value"]), "this": show(value),
                     "ratio": show(names.get("ratio")),
                     "k80_calc": show(k80_value(entry.get("k80"), row))},
            "why": _sentence(entry, names) if value is not None else
            "not measured in this run (experiment or point not in the grid, or not ok)",
        })
    return rows


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
    lessons = load()
    cols = {label: course_table(df, lessons) for label, df in tables.items()}
    head = ["lesson", "course", *[f"{label} ({_gpu(df)})" for label, df in tables.items()]]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, entry in enumerate(lessons):
        c = entry["course"]
        k80 = next(iter(cols.values()))[i]["text"]["k80_calc"] if cols else ""
        cells = [entry["lesson"], f"{show(c['value'])} {c['unit']} ({c['gpu']}"
                 + (f"; cudalab's calculator: {k80})" if k80 else ")")]
        for rows in cols.values():
            r = rows[i]
            cells.append(f"{r['text']['this']} {r['unit']} (×{r['text']['ratio']})"
                         if r["this"] is not None else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _gpu(df: pd.DataFrame) -> str:
    gpus = df["gpu_name"].dropna() if "gpu_name" in df else []
    return str(gpus.iloc[0]) if len(gpus) else "no GPU"
