"""A build's limit is CPU time, not wall time: a build that waits (idle priority on a busy
host: here a child that sleeps) is not killed at timeout_s, a build that computes past it is,
with its own message; the wall clock only stops a build WALL_FACTOR times slower. Real
processes stand in for nvcc (a shell script), since a real nvcc that spins on purpose would
take minutes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cudalab.experiments.static_analysis import builds


def _fake_nvcc(tmp_path: Path, body: str) -> str:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\n{body}\n")
    nvcc.chmod(0o755)
    return str(nvcc)


def test_a_build_waiting_past_its_cpu_limit_is_not_stopped(tmp_path):
    t0 = time.monotonic()
    code, _, cpu = builds.run_child([_fake_nvcc(tmp_path, "sleep 3; exit 0")], 1, False)
    assert code == 0 and time.monotonic() - t0 >= 3 and cpu < 1


def test_a_build_computing_past_its_cpu_limit_is_stopped_by_it(tmp_path):
    spin = _fake_nvcc(tmp_path, "while :; do :; done")
    t0 = time.monotonic()
    code, _, cpu = builds.run_child([spin], 1, False)
    assert code != 0 and cpu >= 0.9 and time.monotonic() - t0 < 9  # the CPU limit, not wall


def test_the_cpu_limit_has_its_own_message(tmp_path):
    with pytest.raises(builds.CompileError, match="used more than 1 s of CPU time"):
        builds.timed_report(_fake_nvcc(tmp_path, "while :; do :; done"), tmp_path / "k.cu",
                            "", "sm_90", timeout_s=1, background=False)


def test_the_wall_clock_still_stops_a_build_that_never_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(builds, "WALL_FACTOR", 2)
    with pytest.raises(builds.CompileError, match="longer than 2 s of wall time"):
        builds.timed_report(_fake_nvcc(tmp_path, "sleep 30"), tmp_path / "k.cu", "",
                            "sm_90", timeout_s=1, background=False)
