"""A class: the submissions of a folder, the leaderboard, and the class report.

A class folder holds one file per student (<student>.cu) or one folder per student
(<student>/<file>.cu, exactly one .cu file). Student ids and file names must match
source.NAME_PATTERN (they become job names, wildcards and file names); anything else, and
symbolic links (which could point at another student's file or a solution), FIFOs, sockets
and devices, is listed as rejected in the report and never judged (class_folder.discover).
"""

from __future__ import annotations

import csv
import hashlib
import html
import math
from pathlib import Path
from typing import Any

from cudalab import fmt, safe_text
from cudalab.exercises import feedback
from cudalab.exercises.class_folder import ClassFolderError, discover  # noqa: F401
from cudalab.exercises.source import valid_name

STATUS_ORDER = ["ok", "gamed", "wrong", "memory_error", "crashed", "timeout", "slot_error",
                "compile_error", "rejected", "compiled", "no_gpu"]


def _time(v: dict[str, Any]) -> float:
    t = v.get("timing") or {}
    return float(t.get("median_s", math.nan)) if v.get("status") == "ok" else math.nan


def leaderboard(verdicts: list[dict[str, Any]], baselines: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """Rows of students and baselines: correct ones by time, then the rest by status.
    Each row: rank (students only), name, status, time, rate, % of cuBLAS, × the course's
    best kernel, registers, occupancy."""
    cublas = [_time(b) for b in baselines if b.get("baseline") == "cublas"]
    course = [t for b in baselines if b.get("baseline") == "course"
              if math.isfinite(t := _time(b))]
    ref = cublas[0] if cublas and math.isfinite(cublas[0]) else math.nan
    best_course = min(course) if course else math.nan
    rows = []
    for v in [*verdicts, *baselines]:
        t = _time(v)
        usage = (v.get("build") or {}).get("usage") or {}
        timing = v.get("timing") or {}
        rows.append({
            "name": v.get("student", "?"), "baseline": v.get("baseline", ""),
            "status": v.get("status", "?"), "correct": v.get("status") == "ok",
            "time_s": t, "gflops": timing.get("gflops", math.nan),
            "gbps": timing.get("gbps", math.nan),
            "pct_cublas": 100 * ref / t if t > 0 and math.isfinite(ref) else math.nan,
            "vs_course": best_course / t if t > 0 and math.isfinite(best_course) else math.nan,
            "registers": usage.get("registers", math.nan),
            "occupancy": usage.get("occupancy", math.nan),
            "message": v.get("message", ""), "suspect": bool(timing.get("suspect")),
        })
    rows.sort(key=lambda r: (not r["correct"], r["time_s"] if r["correct"] else 0,
                             STATUS_ORDER.index(r["status"]) if r["status"] in STATUS_ORDER
                             else len(STATUS_ORDER), r["name"]))
    rank = 0
    for r in rows:
        r["rank"] = (rank := rank + 1) if r["correct"] and not r["baseline"] else None
    return rows


def alias(name: str, salt: str) -> str:
    """A stable pseudonym for the projected view (the salt keeps it unguessable)."""
    return "student-" + hashlib.sha256(f"{salt}\0{name}".encode()).hexdigest()[:6]


def refused_rows(rejected: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The entries refused before any job, as leaderboard rows: named as on disk (a second
    submission of a student shares the student's id), `refused` set."""
    return [{"name": r["name"], "baseline": "", "status": "rejected", "refused": True,
             "message": r["why"]} for r in rejected]


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    cols = ["rank", "name", "baseline", "status", "time_s", "gflops", "gbps", "pct_cublas",
            "vs_course", "registers", "occupancy", "suspect", "refused", "message"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(safe_text.csv_row(r) for r in rows)  # names and messages: no formulas


def _cell(r: dict[str, Any], key: str) -> str:
    v = r.get(key)
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return {"time_s": fmt.seconds, "gflops": fmt.flop_rate, "gbps": fmt.bandwidth,
            "pct_cublas": fmt.percent, "vs_course": fmt.ratio,
            "occupancy": lambda x: fmt.percent(x, fraction=True)}.get(key, str)(v)


def table_html(rows: list[dict[str, Any]], anonymous: bool, salt: str) -> str:
    head = ["#", "submission", "correct?", "time", "GFLOP/s", "GB/s", "% of cuBLAS",
            "× course's best", "registers", "occupancy"]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for r in rows:
        name = r["name"]
        if r["baseline"]:
            who = f"<em>{html.escape(name)}</em>"
        elif anonymous:
            who = html.escape(alias(name, salt))
        else:
            who = f'<a href="students/{html.escape(name)}.html">{html.escape(name)}</a>'
        ok = "✔" if r["correct"] else f"✘ {html.escape(r['status'])}"
        ok += " (timed by wall clock)" if r["suspect"] else ""
        cells = [str(r["rank"] or ""), who, ok] + [
            _cell(r, k) for k in ("time_s", "gflops", "gbps", "pct_cublas", "vs_course",
                                  "registers", "occupancy")]
        cls = ' class="baseline"' if r["baseline"] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


STYLE = ("<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}"
         "td:nth-child(2),td:nth-child(3){text-align:left}tr.baseline{background:#eef}"
         "pre{background:#f6f6f6;padding:1em;white-space:pre-wrap}</style>")


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title>{STYLE}</head><body><h1>{html.escape(title)}</h1>{body}</body></html>")


def write_report(verdicts: list[dict[str, Any]], baselines: list[dict[str, Any]],
                 rejected: list[dict[str, str]], exercise: str, out: Path,
                 salt: str = "") -> Path:
    """index.html (leaderboard, names linked to a page per student), anonymous.html (for
    projecting: pseudonyms, no links), leaderboard.csv and students/<name>.html."""
    rows = leaderboard(verdicts, baselines)
    (out / "students").mkdir(parents=True, exist_ok=True)
    write_csv(rows + refused_rows(rejected), out / "leaderboard.csv")
    device = next((v["device"] for v in [*baselines, *verdicts] if v.get("device")), {})
    about = (f"<p>Exercise <b>{html.escape(exercise)}</b>; {len(verdicts)} submissions"
             + (f" on {html.escape(device.get('gpu_name', ''))}" if device else "")
             + ". Shaded rows: the course's kernels and cuBLAS through the same slot, "
             "checks and timing.</p>")
    rej = "".join(f"<li>{html.escape(r['name'])}: {html.escape(r['why'])}</li>"
                  for r in rejected)
    rej_html = f"<h2>Not judged</h2><ul>{rej}</ul>" if rej else ""
    title = f"cudalab class report: {exercise}"
    (out / "index.html").write_text(page(title, about + table_html(rows, False, salt)
                                         + rej_html))
    (out / "anonymous.html").write_text(page(title, about + table_html(rows, True, salt)))
    for v in verdicts:
        name = v.get("student", "")
        if valid_name(name):
            text = html.escape(feedback.render(v))
            (out / "students" / f"{name}.html").write_text(
                page(f"{name}: {exercise}", f"<pre>{text}</pre>"
                     '<p><a href="../index.html">back to the class</a></p>'))
    return out / "index.html"
