"""How soon a run ends after a failure, on the real one-node Slurm with the shipped polling.

Two experiment jobs start at once: vector_add (GPU points only) fails within seconds with
NoGpuError (no pycuda, no GPU: the doctor is off), matmul (CPU) runs for tens of seconds.
Status checks run at the shipped profile's pace (tests/slurm/profile_squeue: the plugin
backs off by 10 s per check up to 180 s), so only cudalab's wake-up can make them prompt.

  keep_going  the shipped profiles (keep-going: true): the failure's cause is printed
              within seconds of the failure, matmul finishes, and the run exits within
              seconds of its end (before: 15 s and 23 s here, and up to 180 s each).
  fail_fast   keep-going off: the run stops within seconds of the failure, matmul is
              cancelled, the closing line says "stopped after a failure", and no job of the
              run is left in the queue.
The times are printed (pytest -s) and bounded for a loaded CI machine: 15 s for the cause and
the exit after the last job (2-5 s measured; 17.8-39 s without the wake-up), 30 s for the stop
(2-6 s; 72.7 s without it, waiting for matmul to end).
"""

from __future__ import annotations

import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from test_slurm import PROFILE, Run, run_all, snakemake_cmd, submitted, write_config

HERE = Path(__file__).resolve().parent
BOUND_S = 30  # the stop after a failure
SEEN_S = 15  # the cause, and the exit after the last job (keep-going)


def _config(workdir: Path) -> Path:
    return write_config(
        workdir, ["cpu"], doctor=False,
        experiments={"matmul": {"sizes": [1024], "variants": ["cpu"]},
                     "vector_add": {"sizes": [50000], "threads": [256]}},
        # 1000 timed products of 1024^2 matrices: about 20-40 s of one CPU
        measurement={"warmup": 1, "min_samples": 1000, "max_samples": 1000, "budget_s": 60})


def _end(job_id: str) -> float:
    """The job's end (scontrol's EndTime, this machine's clock), as a Unix time."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                         text=True, timeout=30).stdout
    m = re.search(r"EndTime=(\S+)", out)
    assert m, out
    return datetime.fromisoformat(m.group(1)).timestamp()


def _state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                         text=True, timeout=30).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else out


def _said_at(log: str, what: str, day: float) -> float:
    """When the console said `what` (cudalab's "failed at HH:MM:SS"), as a Unix time."""
    m = re.search(rf"cudalab: {re.escape(what)} failed at (\d\d:\d\d:\d\d)", log)
    assert m, log
    day_of = datetime.fromtimestamp(day)
    return datetime.combine(day_of.date(), datetime.strptime(m.group(1), "%H:%M:%S").time()
                            ).timestamp()


def _jobs(run: Run) -> dict[str, str]:
    """experiment -> Slurm job id."""
    return {exp: jid for exp in ("matmul", "vector_add")
            for jid, log in submitted(run.log) if f"results_{exp}" in log}


@pytest.fixture(scope="module")
def fail_runs(slurm_cluster, tmp_path_factory) -> dict[str, tuple[Run, float]]:
    specs = {}
    shipped = (PROFILE, HERE / "profile_squeue")
    for name, extra in [("keep_going", ()),
                        ("fail_fast", (HERE / "profile_fail_fast",))]:
        workdir = tmp_path_factory.mktemp(f"fail-{name}")
        args = ["results/results.csv"] + (["--workflow-profile", "none"] if extra else [])
        specs[name] = (snakemake_cmd(workdir, _config(workdir), *args,
                                     profiles=shipped + extra, limit_s=240), workdir)
    t0 = time.time()
    runs = run_all(specs, limit_s=240)
    return {name: (run, t0 + run.wall_s) for name, run in runs.items()}


@pytest.mark.slurm
def test_a_failure_is_explained_at_once_and_the_run_ends_with_its_last_job(fail_runs):
    run, exit_at = fail_runs["keep_going"]
    jobs = _jobs(run)
    assert set(jobs) == {"matmul", "vector_add"}, run.log
    failed_at, last_end = _end(jobs["vector_add"]), _end(jobs["matmul"])
    assert _state(jobs["matmul"]) == "COMPLETED", run.log
    said = _said_at(run.log, "measure (results_vector_add)", failed_at) - failed_at
    # the console's time has whole seconds: up to 1 s early
    print(f"\nkeep-going: cause printed {said:.0f} s after the failure, exit "
          f"{exit_at - last_end:.1f} s after the last job ended")
    assert -1 <= said < SEEN_S, run.log
    assert "NoGpuError" in run.log.split("failed at", 1)[1][:2000], run.log
    assert 0 <= exit_at - last_end < SEEN_S, run.log
    assert run.returncode == 1 and "1 job(s) failed" in run.log, run.log
    assert "stopped after a failure" not in run.log and "stopped by you" not in run.log


@pytest.mark.slurm
def test_without_keep_going_a_failure_stops_the_run_and_cancels_the_rest(fail_runs):
    run, exit_at = fail_runs["fail_fast"]
    jobs = _jobs(run)
    assert set(jobs) == {"matmul", "vector_add"}, run.log
    failed_at = _end(jobs["vector_add"])
    print(f"\nkeep-going off: exit {exit_at - failed_at:.1f} s after the failure")
    assert 0 <= exit_at - failed_at < BOUND_S, run.log
    assert _state(jobs["matmul"]) == "CANCELLED", run.log
    assert "cudalab: measure (results_vector_add) failed at" in run.log, run.log
    assert ("cudalab: stopped after a failure (measure (results_vector_add)): keep-going is "
            "off, so the run's other Slurm jobs were cancelled at once. kept: 0 of 2") \
        in run.log, run.log
    assert "1 job(s) failed" in run.log and "stopped by you" not in run.log, run.log
    queue = subprocess.run(["squeue", "-h", "-o", "%i|%Z"], capture_output=True, text=True,
                           timeout=30).stdout
    assert str(run.workdir) not in queue, queue
