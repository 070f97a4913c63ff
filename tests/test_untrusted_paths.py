"""Paths a hostile user controls: a student's file, a class folder, a config's path, a
folder's entries. Real FIFOs, sockets, devices and symbolic links; a hang fails within its
deadline instead of hanging the suite."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hostile import ROOT, cudalab, deadline

from cudalab.cli import main
from cudalab.exercises import catalog, classroom

STARTER = catalog.EXERCISE_DIR / "vector_add.cu"
LONG = "a" * 300  # one path component longer than any file system allows


@pytest.fixture
def unix_socket(tmp_path):
    """A real listening Unix socket at tmp_path/'sock.cu'."""
    path = tmp_path / "sock.cu"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen()
    yield path
    s.close()


# -- a student's file -------------------------------------------------------------------------
def test_exercise_check_refuses_a_fifo_without_opening_it(tmp_path, capsys):
    fifo = tmp_path / "alice.cu"
    os.mkfifo(fifo)
    with deadline(20):
        assert main(["exercise", "check", str(fifo), "--no-gpu"]) == 1
    out = capsys.readouterr().out
    assert "not accepted" in out and "FIFO" in out


def test_exercise_check_refuses_a_socket(unix_socket, capsys):
    with deadline(20):
        assert main(["exercise", "check", str(unix_socket), "--no-gpu"]) == 1
    assert "socket" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["/dev/zero", "sparse"])
def test_a_device_or_a_huge_file_is_refused_before_it_is_read(target, tmp_path):
    """/dev/zero never ends and a sparse 64 GiB file reads as zeros: both must be refused by
    their type or size, before a byte is read (the child has 6 GiB of address space; a read
    whole ends in a MemoryError there)."""
    if target == "sparse":
        path = tmp_path / "big.cu"
        with path.open("wb") as f:
            f.truncate(64 * 1024 ** 3)
        target = str(path)
    r = cudalab("exercise", "check", target, "--no-gpu", "--student", "me", timeout=120)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert ("character device" in r.stdout) or ("at most 262144" in r.stdout), r.stdout


def test_a_file_name_too_long_is_a_clear_refusal(tmp_path, capsys):
    assert main(["exercise", "check", str(tmp_path / LONG / "x.cu"), "--no-gpu",
                 "--student", "me"]) == 1
    out = capsys.readouterr().out
    assert "has 300 bytes; a file or folder name may have at most 255" in out


# -- config paths -------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["validate", "plan"])
def test_a_config_path_with_a_long_name_is_a_clear_error(cmd, tmp_path):
    r = cudalab(cmd, str(tmp_path / LONG / "config.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "has 300 bytes" in r.stderr


def test_a_config_that_is_a_fifo_is_refused_unopened(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    r = cudalab("validate", str(fifo), timeout=60)
    assert r.returncode == 2 and "FIFO" in r.stderr, r.stderr


def _config_with(tmp_path: Path, **report) -> Path:
    c = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    c.setdefault("report", {}).update(report)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(c))
    return path


def test_a_baseline_with_a_long_name_is_named_by_validate_and_report(tmp_path):
    conf = _config_with(tmp_path, baselines=[str(tmp_path / LONG)])
    for args in (["validate", str(conf)], ["report", "--config", str(conf)]):
        r = cudalab(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "report.baselines[0]" in r.stderr and "has 300 bytes" in r.stderr


def test_compare_and_report_table_with_a_long_name(tmp_path):
    r = cudalab("compare", str(tmp_path / LONG), str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "baseline folder" in r.stderr and "has 300 bytes" in r.stderr
    r = cudalab("report", "--config", "tests/data/config.cpu.yaml", "--table",
                str(tmp_path / LONG / "results.csv"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "has 300 bytes" in r.stderr


# -- a class folder -----------------------------------------------------------------------------
def test_fifos_sockets_and_links_in_a_class_folder_are_named_not_opened(tmp_path,
                                                                         unix_socket):
    shutil.copy(STARTER, tmp_path / "alice.cu")
    os.mkfifo(tmp_path / "bob.cu")
    os.mkfifo(tmp_path / "pipe")  # no .cu: still named, it is no README
    (tmp_path / "carol").mkdir()
    os.mkfifo(tmp_path / "carol" / "k.cu")
    (tmp_path / "dave").symlink_to("/etc")
    with deadline(20):
        subs, rejected = classroom.discover(tmp_path)
    assert set(subs) == {"alice"}
    why = {r["name"]: r["why"] for r in rejected}
    assert "FIFO" in why["bob.cu"] and "FIFO" in why["pipe"]
    assert "socket" in why["sock.cu"]
    assert "FIFO" in why["carol"] and "symbolic link" in why["dave"]


@pytest.mark.parametrize("case", ["missing", "file", "loop", "/", "/etc", ".", "repository"])
def test_a_class_folder_that_is_no_class_folder_is_refused(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = {"missing": tmp_path / "nope", "file": tmp_path / "f.cu", "/": Path("/"),
              "/etc": Path("/etc"), ".": Path("."), "repository": ROOT,
              "loop": tmp_path / "loop"}[case]
    (tmp_path / "f.cu").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    expected = {"missing": "does not exist", "file": "not a folder",
                "loop": "symbolic link loop", "/": "system folder", "/etc": "system folder",
                ".": "the folder the run works in", "repository": "repository"}[case]
    with deadline(20), pytest.raises(classroom.ClassFolderError, match=expected):
        classroom.discover(folder)


def _snakemake(workdir: Path, conf: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "exercises", "-n", "-s", str(ROOT / "Snakefile"),
           "--directory", str(workdir), "--cores", "1", "--configfile", str(conf)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=workdir,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _class_config(tmp_path: Path, submissions: str) -> Path:
    c = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    c["exercises"] = {"submissions": submissions, "exercise": "vector_add"}
    path = tmp_path / "class.yaml"
    path.write_text(yaml.safe_dump(c))
    return path


def test_the_snakefile_parses_with_a_fifo_in_the_class_and_refuses_a_bad_folder(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(STARTER, subs / "alice.cu")
    os.mkfifo(subs / "mallory.cu")
    r = _snakemake(tmp_path, _class_config(tmp_path, "subs"))
    assert r.returncode == 0, r.stderr
    assert (r.stdout + r.stderr).count("rule exercise_judge:") == 1
    r = _snakemake(tmp_path, _class_config(tmp_path, "/etc"))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "exercises.submissions: the submissions folder /etc is /etc: a system folder" \
        in out and "rule exercise_judge" not in out


# -- the framework itself (imported here: the tests above run against any cudalab) -----------
def test_a_walk_bounds_depth_and_count_and_never_follows_a_link(tmp_path):
    from cudalab import safe_io

    deep = tmp_path / "e" / "g"
    deep.mkdir(parents=True)
    (tmp_path / "e" / "p.json").write_text("{}")
    (deep / "q.json").write_text("{}")
    (deep / "h").mkdir()
    (tmp_path / "e" / "up").symlink_to(tmp_path)  # a loop through a link
    (tmp_path / "e" / "x.json").symlink_to("/etc/passwd")
    w = safe_io.walk_files(tmp_path, ".json", max_depth=2, max_files=10, min_depth=1)
    assert w.files == [tmp_path / "e" / "g" / "q.json", tmp_path / "e" / "p.json"]
    why = {p.name: r for p, r in w.skipped}
    assert "not followed" in why["up"] and "not followed" in why["x.json"]
    assert "deeper than 2" in why["h"]
    for i in range(12):
        (tmp_path / "e" / f"n{i}.json").write_text("{}")
    with pytest.raises(safe_io.InputRefused, match="more than 10"):
        safe_io.walk_files(tmp_path, ".json", max_depth=2, max_files=10)


def test_a_file_that_grows_past_the_limit_while_read_is_refused(tmp_path):
    from cudalab import safe_io

    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with pytest.raises(safe_io.InputRefused, match="has 100 bytes; at most 50"):
        safe_io.read_bytes(path, 50)
    assert safe_io.read_bytes(path, 100) == b"x" * 100


def test_json_depth_is_counted_without_recursion():
    from cudalab import safe_io

    with pytest.raises(safe_io.InputRefused, match="nests 100000 levels"):
        safe_io.loads("[" * 100_000 + "]" * 100_000)
    assert safe_io.json_depth('{"a": "[[[[", "b": [[1]]}') == 3  # brackets in text: no level
    with pytest.raises(safe_io.InputRefused, match="not usable JSON"):
        safe_io.loads("1" * 5000)  # Python's integer-string limit
