"""docs/experiments.md's walk-through "Add a lesson", followed: a new lesson (a memset
bandwidth experiment, tests/data/new_lesson/memset_bw/) is added to a temporary copy of the
project as one folder plus one line of config.yaml, and the catalogue tests pass there
before the lesson has ever run on a GPU: the tests that read every lesson (its kernels'
owner, the import graph, code health, its claims and flips, its Try-this and questions, its
config, the course table). Its claims are reported as having no GPU reference yet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "new_lesson" / "memset_bw"
CONFIG_LINE = "  memset_bw: {}     # the driver's memset bandwidth against the buffer size\n"
# the catalogue tests: each reads every registered lesson's own declarations
CATALOGUE = ["tests/test_kernel_owners.py", "tests/test_import_graph.py",
             "tests/test_code_health.py", "tests/test_claims.py", "tests/test_config.py",
             "tests/test_course.py", "tests/test_docs.py::test_every_key_list_is_the_schemas",
             "tests/test_report.py::test_every_experiment_has_try_this_and_questions_that_are"
             "_valid_configs"]

pytestmark = pytest.mark.slow  # a copy of the project and a nested pytest of its catalogue


def _copy(dst: Path) -> Path:
    skip = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "results", ".snakemake",
                                  "*.egg-info", "build")
    shutil.copytree(ROOT, dst, ignore=skip, symlinks=True)
    return dst


def add_lesson(repo: Path) -> list[str]:
    """The walk-through's two steps; returns the paths it touched (relative to repo)."""
    shutil.copytree(FIXTURE, repo / "cudalab" / "experiments" / FIXTURE.name)
    config = repo / "config.yaml"
    text = config.read_text()
    config.write_text(text.replace("\nexperiments:\n", "\nexperiments:\n" + CONFIG_LINE, 1))
    return [f"cudalab/experiments/{FIXTURE.name}/", "config.yaml"]


def test_a_new_lesson_is_one_folder_and_one_config_line_and_passes_the_catalogue(tmp_path):
    repo = _copy(tmp_path / "project")
    touched = add_lesson(repo)
    assert touched == ["cudalab/experiments/memset_bw/", "config.yaml"]
    env = {k: v for k, v in os.environ.items() if k != "CUDALAB_EXPERIMENTS"}
    env["PYTHONPATH"] = str(repo)
    # the flips of the other lessons' claims are each one lesson's own (the main run flips
    # them): here only the new lesson's, which is most of the catalogue's time saved
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "-rs", "-k", "not test_the_flip_turns_the_verdict_over or memset_bw",
                           *CATALOGUE], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=1500)
    out = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, out
    # the copy's registry has the new lesson (not the checkout's), and its flips are
    # reported as waiting for a GPU reference rather than failing
    assert "lesson memset_bw has no GPU reference yet" in proc.stdout, out
