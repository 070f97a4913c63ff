"""One meaning for a config: `snakemake --configfile my.yaml` runs what `cudalab plan my.yaml`
shows (my grid alone, not merged into config.yaml), and plain `snakemake` runs config.yaml.
Both checked with the real Snakemake (dry runs) against the real `cudalab plan`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MY = "experiments:\n  matmul: {sizes: [64], variants: [cpu, naive]}\nseed: 7\n"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # the plan's times read the load and the build cache: pinned, so two plans agree
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDALAB_PLAN_LOAD": "0",
           "CUDALAB_BUILD_CACHE": "off"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def _snakemake_plan(cwd: Path, *args: str) -> list[str]:
    r = _run(["-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(cwd),
              "--cores", "1", "-n", *args], cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return _plan_part(r.stderr)


def _cudalab_plan(cwd: Path, path: str) -> list[str]:
    r = _run(["-m", "cudalab.cli", "plan", path], cwd)
    assert r.returncode == 0, r.stderr
    return _plan_part(r.stdout)


def _plan_part(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("cudalab plan:"))
    block = [lines[start]]
    for x in lines[start + 1:]:
        if not x.startswith("  "):
            break
        block.append(x)
    return block


def test_configfile_replaces_the_default_grid(tmp_path):
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")  # the default grid is there
    (tmp_path / "my.yaml").write_text(MY)
    plan = _snakemake_plan(tmp_path, "--configfile", "my.yaml")
    assert plan == _cudalab_plan(tmp_path, "my.yaml")
    assert plan[0].startswith("cudalab plan: 1 experiment job(s)")
    assert "2 grid points" in plan[0]


def test_plain_snakemake_runs_config_yaml(tmp_path):
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")
    assert _snakemake_plan(tmp_path) == _cudalab_plan(tmp_path, "config.yaml")


def test_config_overrides_still_apply_on_top_of_the_given_file(tmp_path):
    (tmp_path / "my.yaml").write_text(MY)
    (tmp_path / "more.yaml").write_text("experiments:\n  vector_add: {sizes: [1024], "
                                        "threads: [256], probe_blocks: []}\n")
    plan = _snakemake_plan(tmp_path, "--configfile", "my.yaml", "more.yaml",
                           "--config", "max_points=3")
    assert "2 experiment job(s)" in plan[0] and "(max_points 3)" in "\n".join(plan)


def test_a_duplicate_key_stops_snakemake_with_the_same_message(tmp_path):
    (tmp_path / "dup.yaml").write_text("experiments:\n  matmul: {}\n  matmul: {}\n")
    r = _run(["-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
              "--cores", "1", "-n", "--configfile", "dup.yaml"], tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "duplicate key 'matmul' (first given on line 2, again on line 3)" in out
    assert "Traceback" not in out
