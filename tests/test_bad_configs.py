"""Malformed configs written the way users get them wrong (tests/data/bad_configs/): each is
rejected by `cudalab validate` with exit code 2, names its key, and no traceback reaches the
user. Each file says in its header which text the message must contain.

The set runs through cli.main() in this process (an uncaught exception fails the test with
its traceback), a few cases through the real command line in a subprocess."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudalab import cli

ROOT = Path(__file__).resolve().parent.parent
BAD = sorted((ROOT / "tests" / "data" / "bad_configs").glob("*.yaml"))


def _validate(path: Path | str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "cudalab.cli", "validate", str(path)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def _header(path: Path, field: str) -> str | None:
    m = re.search(rf"^# {field}: (.+)$", path.read_bytes().decode("latin-1"), re.M)
    return m.group(1).strip() if m else None


def test_the_set_is_large_and_says_what_each_must_name():
    assert len(BAD) >= 40
    for p in BAD:
        assert _header(p, "must name"), p.name


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_config_is_rejected_naming_its_key(path, capsys):
    if _header(path, "needs") == "nvcc" and not shutil.which("nvcc"):
        pytest.skip("needs nvcc to know which architectures it can build")
    with pytest.raises(SystemExit) as e:
        cli.main(["validate", str(path)])
    r = capsys.readouterr()
    out = r.out + r.err
    assert e.value.code == 2, out
    assert "Traceback" not in out
    assert _header(path, "must name") in out, out
    assert out.startswith("error: "), out


@pytest.mark.parametrize("name, needle", [
    ("missing.yaml", "no such file"),
    (".", "is a directory"),
    ("empty.yaml", "is empty"),
    ("not_utf8.yaml", "not UTF-8"),
    ("both_rounds.yaml", "min_samples"),
])
def test_real_command_line_gives_a_message_not_a_traceback(tmp_path, name, needle):
    (tmp_path / "empty.yaml").write_text("")
    for f in ("not_utf8.yaml", "both_rounds.yaml"):
        shutil.copy(ROOT / "tests" / "data" / "bad_configs" / f, tmp_path / f)
    r = _validate(tmp_path / name)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_the_shipped_config_passes_the_same_command():
    r = _validate(ROOT / "config.yaml")
    assert r.returncode == 0, r.stderr
