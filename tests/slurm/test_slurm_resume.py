"""Resuming after Ctrl-C on the real one-node Slurm: the rerun submits only what is missing.

A GPU-model sweep (the test cluster's two gres types, one CPU-only matmul job per model, a
doctor per model) runs its jobs one at a time (`--jobs 1`). As soon as the first measure job
has finished (Snakemake said so), the run gets one SIGINT, as from Ctrl-C. The rerun must queue no
job of a finished experiment (counted from the plugin's `has been submitted with SLURM
jobid` lines, each naming its job's Slurm log, hence its rule and folder), no doctor for a
model without work, and say as many jobs on its submit line as it submits. Before that,
the stopped run must have said that you stopped it and what it kept, and have exited
within seconds of the signal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
import yaml
from test_slurm import snakemake_cmd, submitted, write_config

MODELS = ["fake", "h100"]


def _manifests(workdir) -> list[str]:
    """The models whose measure job finished (its manifest is there)."""
    return [m for m in MODELS
            if (workdir / "results" / "gpu" / m / "raw" / "matmul" / "_manifest.json").exists()]


FINISHED = re.compile(r"Finished jobid: \d+ \(Rule: measure\)")


def _stop_after_first_measure_job(workdir, cmd) -> tuple[str, float]:
    """Run until Snakemake has seen one measure job finish (a job still running at Ctrl-C
    loses its output, the manifest too), then SIGINT Snakemake once. Returns the output and
    the seconds from the signal to the exit."""
    proc = subprocess.Popen(cmd, cwd=workdir, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if FINISHED.search(line):
            break
    t_sig = time.monotonic()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    rest = proc.communicate(timeout=120)[0]
    return "".join(lines) + rest, time.monotonic() - t_sig


@pytest.fixture(scope="module")
def resumed(slurm_cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run-resume")
    config = write_config(workdir, ["cpu"])
    cfg = yaml.safe_load(config.read_text())
    cfg["slurm"] = {"runtime_min": 10, "mem_mb": 512, "cpus_per_task": 1,
                    "gpu_models": MODELS}
    config.write_text(yaml.safe_dump(cfg))
    cmd = snakemake_cmd(workdir, config, "--jobs", "1", limit_s=240)
    first, stop_s = _stop_after_first_measure_job(workdir, cmd)
    finished = _manifests(workdir)
    again = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300)
    for name, text in (("first", first), ("again", again.stdout + again.stderr)):
        (workdir / f"{name}.out").write_text(text)  # to read after a failure
    (workdir / "stop_s.txt").write_text(f"{stop_s:.1f}\n")
    return (workdir, first, stop_s, finished, again.returncode,
            again.stdout + again.stderr)


@pytest.mark.slurm
def test_ctrl_c_says_you_stopped_it_and_what_was_kept(resumed):
    _, first, stop_s, finished, *_ = resumed
    assert FINISHED.search(first), f"no measure job finished before the time limit\n{first}"
    assert len(finished) == 1, f"one model finished, one not: {finished}\n{first}"
    assert "cudalab: stopped by you (Ctrl-C)" in first, first
    kept = re.search(r"kept: (\d+) of 2 experiment job\(s\) finished", first)
    assert kept and int(kept.group(1)) == len(finished), first
    assert "job(s) failed" not in first, "a stop by the user is not a failure\n" + first
    assert stop_s < 10, f"the stopped run took {stop_s:.1f} s to exit\n{first}"


@pytest.mark.slurm
def test_resume_submits_no_finished_experiment(resumed):
    workdir, _, _, finished, rc, log = resumed
    assert finished, "nothing finished before the Ctrl-C: the test would prove nothing"
    assert rc == 0, log
    jobs = submitted(log, "")
    measured = [p for _, p in submitted(log, "measure")]
    doctors = [p for _, p in submitted(log, "doctor")]
    for model in finished:  # neither its measure job nor its doctor is queued again
        assert not [p for p in measured if f"results_gpu_{model}_matmul" in p], log
        assert not [p for p in doctors if f"doctor_{model}" in p], log
    todo = [m for m in MODELS if m not in finished]
    assert len(measured) == len(todo) and len(doctors) == len(todo), log
    # the console's count is what sbatch got
    line = re.search(r"cudalab: submitting (\d+) Slurm job\(s\) with sbatch", log)
    assert line and int(line.group(1)) == len(jobs), log
    assert f"{len(finished)} experiment job(s) already measured, not resubmitted" in log
    assert _manifests(workdir) == MODELS, log
