"""The held-out class (tests/data/exercises_heldout/): submissions written without reading
the harness, with the verdict a right judge gives each in manifest.yaml. Without a GPU: the
manifest covers every entry and only known verdicts, and the verdicts decided before any
launch (compile errors, slot errors, refused files) come out of `exercise check --no-gpu`.
On a GPU: tools/exercises_heldout.sh runs the class mode on every folder and compares."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cudalab.cli import main
from cudalab.exercises import catalog

ROOT = Path(__file__).resolve().parents[1]
HELD = ROOT / "tests" / "data" / "exercises_heldout"
MANIFEST = yaml.safe_load((HELD / "manifest.yaml").read_text())
SCRIPT = ROOT / "tools" / "exercises_heldout.sh"
# verdicts `check` gives from nvcc and the file alone, before any launch
BEFORE_LAUNCH = {"compile_error", "slot_error", "rejected"}
# the name rule of the class mode: other names are refused there, not by `check`
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.cu")
def _expected(want: dict, sanitize: bool) -> list[str]:
    v = want.get("sanitize", want["verdict"]) if sanitize else want["verdict"]
    return v if isinstance(v, list) else [v]


def _entries() -> list[tuple[str, str, dict]]:
    return [(ex, name, want) for ex, entries in MANIFEST["exercises"].items()
            for name, want in entries.items()]


def test_the_manifest_names_every_entry_of_every_folder_and_nothing_else():
    folders = sorted(p.name for p in HELD.iterdir() if p.is_dir())
    assert folders == sorted(MANIFEST["exercises"])
    for ex in folders:
        assert ex in catalog.EXERCISES, f"{ex} is no exercise"
        on_disk = sorted(os.listdir(HELD / ex))  # symbolic links included, not followed
        assert on_disk == sorted(MANIFEST["exercises"][ex]), ex


def test_every_verdict_is_a_known_one_and_says_why():
    allowed = set(MANIFEST["allowed"])
    assert allowed >= BEFORE_LAUNCH | {"ok", "wrong", "crashed", "timeout", "memory_error"}
    for ex, name, want in _entries():
        assert set(want) <= {"verdict", "sanitize", "why"}, (ex, name)
        assert want["why"].strip(), (ex, name)
        for sanitize in (False, True):
            assert set(_expected(want, sanitize)) <= allowed, (ex, name)


def test_the_class_holds_every_failure_mode_and_correct_kernels():
    seen = {v for _, _, want in _entries() for s in (False, True) for v in _expected(want, s)}
    assert seen == set(MANIFEST["allowed"])
    plain_ok = [n for _, n, w in _entries() if w["verdict"] == "ok"]
    assert len(plain_ok) >= 3


def _before_launch_cases() -> list:
    cases = []
    for ex, name, want in _entries():
        path = HELD / ex / name
        if (set(_expected(want, False)) <= BEFORE_LAUNCH and path.is_file()
                and not path.is_symlink() and PLAIN_NAME.fullmatch(name)):
            cases.append(pytest.param(ex, name, want["verdict"], id=f"{ex}/{name}"))
    return cases


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("ex,name,verdict", _before_launch_cases())
def test_verdicts_decided_before_any_launch(ex, name, verdict, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "verdict.json"
    rc = main(["exercise", "check", str(HELD / ex / name), "--exercise", ex, "--no-gpu",
               "--json", str(out)])
    got = json.loads(out.read_text())["status"]
    assert got == verdict, capsys.readouterr().out
    assert rc == 1


def _table(stdout: str) -> dict[str, tuple[str, str, str]]:
    """The script's table: student -> (expected, got, match)."""
    rows = [re.split(r"\s{2,}", ln.strip()) for ln in stdout.splitlines()]
    return {r[0]: (r[1], r[2], r[3]) for r in rows if len(r) == 4 and "/" in r[0]}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("ex", ["vector_add", "tiled_matmul"])
@pytest.mark.slow
def test_the_script_judges_a_folder_and_reports_every_entry(ex, tmp_path):
    # with or without a GPU: entries refused or failing before any launch match already
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "--only", ex], capture_output=True,
                       text=True, timeout=900, cwd=ROOT)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    table = _table(r.stdout)
    assert sorted(table) == sorted(f"{ex}/{n}" for n in MANIFEST["exercises"][ex])
    for name, want in MANIFEST["exercises"][ex].items():
        expected, got, match = table[f"{ex}/{name}"]
        if set(_expected(want, False)) <= BEFORE_LAUNCH:
            assert (got, match) == (expected, "yes"), (name, r.stdout)
    assert (tmp_path / ex / "results" / "class" / ex / "index.html").exists()
    assert not list(tmp_path.rglob(MANIFEST["sentinel"]))


@pytest.mark.gpu
@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "sanitize"])
def test_the_held_out_class_is_judged_right_on_the_gpu(sanitize, tmp_path):
    # the script also fails when the file-name attack's sentinel appears in $HOME or OUT
    cmd = ["bash", str(SCRIPT), str(tmp_path / "out"), *(["--sanitize"] if sanitize else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3000, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
