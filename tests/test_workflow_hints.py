"""What the workflow says when a run cannot go on by itself: a killed run's stale lock (the
next run names `snakemake --unlock`), and a missing GPU extra (one line). Real Snakemake."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _snakemake(workdir: Path, *args: str, **kw) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
            str(workdir), "--cores", "1", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_after_a_kill_the_message_names_unlock_and_unlock_then_rerun_works(tmp_path):
    # static analysis (nvcc over every kernel) runs long enough to be killed mid-run
    (tmp_path / "config.yaml").write_text("experiments:\n  static_analysis: {archs: [sm_90]}\n")
    proc = subprocess.Popen(_snakemake(tmp_path), cwd=tmp_path, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    locks = tmp_path / ".snakemake" / "locks"
    deadline = time.monotonic() + 120
    while not any(locks.glob("*.lock")) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run, as a killed terminal would
    proc.wait()
    if not any(locks.glob("*.lock")):
        pytest.fail("the run never took its lock")
    again = subprocess.run(_snakemake(tmp_path, "-n"), cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=300)
    out = again.stdout + again.stderr
    assert "run `snakemake --unlock` once, then the same command again" in out, out
    unlock = subprocess.run(_snakemake(tmp_path, "--unlock"), cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert unlock.returncode == 0, unlock.stderr
    rerun = subprocess.run(_snakemake(tmp_path, "-n"), cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0 and "--unlock" not in rerun.stdout + rerun.stderr


@pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None,
                    reason="pycuda is installed here: no hint to give")
def test_missing_gpu_extra_gets_one_line(tmp_path):
    (tmp_path / "config.yaml").write_text("experiments:\n  vector_add: {}\n")
    r = subprocess.run(_snakemake(tmp_path, "-n"), cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=300)
    hint = [x for x in (r.stdout + r.stderr).splitlines() if "pycuda (the GPU extra)" in x]
    assert len(hint) == 1 and "pip install -e '.[gpu]'" in hint[0]
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("experiments:\n  matmul: {sizes: [64], variants: [cpu]}\n")
    r = subprocess.run(_snakemake(tmp_path, "-n", "--configfile", str(cpu)), cwd=tmp_path,
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert "pycuda (the GPU extra)" not in r.stdout + r.stderr  # no GPU point, no hint


def _path_without_slurm(tmp_path: Path) -> str:
    """A PATH of this machine's shell tools, without Slurm's commands: as on a laptop, also
    where the machine has Slurm (the tests control what they see, not the machine)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sh", "env", "which", "uname", "git", "nvcc"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_slurm") is None,
                    reason="the Slurm executor plugin is not installed (pip install -e .)")
def test_profile_slurm_without_slurm_says_so_in_one_line_and_submits_nothing(tmp_path):
    (tmp_path / "config.yaml").write_text("experiments:\n  matmul: {sizes: [64], "
                                          "variants: [cpu]}\n")
    cmd = _snakemake(tmp_path, "--profile", str(ROOT / "profiles" / "slurm"))
    env = _env() | {"PATH": _path_without_slurm(tmp_path)}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    said = [x for x in out.splitlines() if "this machine has no Slurm" in x]
    assert len(said) == 1 and "sbatch" in said[0] and "nothing was submitted" in said[0], out
    assert "submitting" not in out and "sacct" not in out  # stopped before the executor acts


@pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_slurm") is None,
                    reason="the Slurm executor plugin is not installed (pip install -e .)")
def test_profile_slurm_with_a_controller_that_does_not_answer_submits_nothing(tmp_path):
    (tmp_path / "config.yaml").write_text("experiments:\n  matmul: {sizes: [64], "
                                          "variants: [cpu]}\n")
    fake = tmp_path / "slurm-bin"  # Slurm's commands, as on a login node whose controller is down
    fake.mkdir()
    for tool in ("sinfo", "sbatch", "squeue", "scancel", "sacct", "scontrol"):
        (fake / tool).write_text(f"#!/bin/sh\necho '{tool}: error: Unable to contact slurm "
                                 "controller (connect failure)' >&2\nexit 1\n")
        (fake / tool).chmod(0o755)
    cmd = _snakemake(tmp_path, "--profile", str(ROOT / "profiles" / "slurm"))
    env = _env() | {"PATH": f"{fake}{os.pathsep}{_path_without_slurm(tmp_path)}"}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    said = [x for x in out.splitlines() if "Slurm does not answer here" in x]
    assert len(said) == 1 and "Unable to contact slurm controller" in said[0], out
    assert "nothing was submitted" in said[0] and "submitting" not in out


@pytest.mark.parametrize("plugin, tools, says", [
    (False, ("sbatch", "squeue", "scancel"), "pip install -e . (the plugin is one of its"),
    (True, (), "no Slurm (sbatch, squeue, scancel not on PATH)"),
    (True, ("sbatch",), "no Slurm (squeue, scancel not on PATH)"),
    (True, ("sbatch", "squeue", "scancel"), "")])
def test_what_stops_profile_slurm_is_named(tmp_path, plugin, tools, says):
    from cudalab.site import slurm_missing

    for t in tools:  # a PATH of our own, never the machine's
        (tmp_path / t).write_text("#!/bin/sh\n")
        (tmp_path / t).chmod(0o755)
    line = slurm_missing(plugin, lambda t: shutil.which(t, path=str(tmp_path)))
    assert (says in line) if says else line == ""
    assert "\n" not in line
