"""`snakemake --profile slurm` against real Slurm daemons (one node, fake GPU devices).

The workflow runs in a scratch directory with the real profile plus the test overrides:
    snakemake --profile profiles/slurm --profile tests/slurm/profile
(tests/slurm/profile: status via squeue, 1 s polling; the cluster has accounting where
mariadb-server and slurmdbd are installed, and test_slurm_site.py runs the pending case
through sacct too).
The three workflow runs (a doctor job and a measure job each) run at once; the file takes
about 50 s.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "slurm"
TEST_PROFILE = ROOT / "tests" / "slurm" / "profile"
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: ([^)]+)\)")


def write_config(workdir: Path, variants: list[str], doctor: bool = True, **extra) -> Path:
    """tests/data/config.cpu.yaml with a small slurm: block (the node has 2 cores) naming
    the test cluster's GPU type (one_node_slurm.sh: Gres=gpu:fake:2). doctor=False: no
    doctor job first (tests of something else; the doctor's own: test_slurm_site.py)."""
    cfg = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    cfg["experiments"]["matmul"]["variants"] = variants
    cfg["slurm"] = {"runtime_min": 10, "mem_mb": 512, "cpus_per_task": 1, "gpu_model": "fake",
                    "doctor": doctor}
    cfg.update(extra)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def snakemake_cmd(workdir: Path, config: Path, *extra: str,
                  profiles=(PROFILE, TEST_PROFILE), limit_s: int = 150) -> list[str]:
    """The command line; SIGINT on time-out (SIGINT makes the plugin scancel its jobs)."""
    cmd = ["timeout", "-s", "INT", "-k", "30", str(limit_s), "snakemake",
           "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(config)]
    for p in profiles:
        cmd += ["--profile", str(p)]
    return cmd + list(extra)


@dataclass
class Run:
    workdir: Path
    returncode: int
    log: str  # stdout + stderr
    wall_s: float = 0.0  # from the start of all runs to this one's exit


def run_all(specs: dict[str, tuple[list[str], Path]], limit_s: int = 150) -> dict[str, Run]:
    """Start every workflow at once (each in its own work dir) and wait for all of them."""
    procs = {}
    for name, (cmd, cwd) in specs.items():
        log = open(cwd / f"{name}.out", "w+")  # noqa: SIM115 - closed below
        procs[name] = (subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                        text=True), log)
    t0 = time.monotonic()
    ends: dict[str, float] = {}
    while len(ends) < len(procs) and time.monotonic() - t0 < limit_s + 60:
        for name, (proc, _) in procs.items():
            if name not in ends and proc.poll() is not None:
                ends[name] = time.monotonic() - t0
        time.sleep(0.2)
    runs = {}
    for name, (proc, log) in procs.items():
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
        log.seek(0)
        runs[name] = Run(specs[name][1], rc, log.read(), ends.get(name, time.monotonic() - t0))
        log.close()
    return runs


def scontrol_job(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                          text=True, timeout=30).stdout


def submitted(log: str, rule: str = "measure") -> list[tuple[str, str]]:
    """(job id, Slurm log) of the rule's sbatch jobs (rule='' : every job; the doctor rule
    runs first under Slurm, tests/slurm/test_slurm_site.py)."""
    return [j for j in SUBMITTED.findall(log) if f"rule_{rule}" in j[1]]


def read_results(workdir: Path) -> pd.DataFrame:
    return pd.read_csv(workdir / "results" / "results.csv", dtype=str, keep_default_na=False)


# -- the profile itself (no cluster needed) ------------------------------------------------
def test_bare_profile_name_resolves_from_project_root(monkeypatch):
    """`snakemake --profile slurm` from the project root finds ./slurm -> profiles/slurm."""
    from snakemake.cli import get_profile_dir

    monkeypatch.chdir(ROOT)
    found = get_profile_dir("slurm")
    assert found is not None, "snakemake does not find the profile 'slurm' from the root"
    assert found[1].resolve() == (PROFILE / "config.yaml").resolve()
    by_path = get_profile_dir("profiles/slurm")
    assert by_path is not None and by_path[1].resolve() == (PROFILE / "config.yaml").resolve()


@pytest.mark.parametrize("profiles", [[PROFILE], [PROFILE, TEST_PROFILE]],
                         ids=["slurm", "slurm+test"])
def test_profile_keys_are_snakemake_options(profiles):
    """Every key is an option of snakemake 9 + the slurm plugin (a typo fails here)."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake.cli import get_argument_parser

    files = [str(p / "config.yaml") for p in profiles]
    args = get_argument_parser(profiles=files).parse_args([])
    assert args.executor == "slurm"
    assert args.slurm_keep_successful_logs is True
    assert args.set_resource_scopes == {"gpu": "local"}
    if TEST_PROFILE in profiles:
        assert args.slurm_status_command == "squeue"
        assert args.slurm_init_seconds_before_status_checks == 1


def test_slurm_context_reads_the_inner_step_environment(monkeypatch):
    """What the plugin's inner srun step has (SLURM_GPUS / SLURM_JOB_GPUS stripped)."""
    from cudalab.provenance import slurm_context

    for var in [v for v in os.environ if v.startswith("SLURM")]:
        monkeypatch.delenv(var)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert set(slurm_context().values()) == {""}, "outside Slurm every field is empty"
    for var, value in {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu07",
                       "SLURM_JOB_PARTITION": "gpu", "SLURM_STEP_GPUS": "3",
                       "SLURM_JOB_NODELIST": "gpu07", "CUDA_VISIBLE_DEVICES": "0"}.items():
        monkeypatch.setenv(var, value)
    assert slurm_context() == {"slurm_job_id": "42", "slurm_node": "gpu07",
                               "slurm_partition": "gpu", "slurm_gpus": "3",
                               "cuda_visible_devices": "0"}


def test_plan_says_how_many_slurm_jobs(cpu_config, validated):
    """Every job that runs code is counted, the doctor too; a sweep's first line and its
    sweep line agree."""
    from cudalab.cli import plan_lines, slurm_submit_line
    from cudalab.site import FitCheck

    unchecked = FitCheck(False, [], error="sinfo not found")
    lines = plan_lines(validated(cpu_config), unchecked)
    assert lines[0].startswith("cudalab plan: 1 experiment job(s) (0 need a GPU) + 1 doctor")
    assert lines[1].strip().startswith("under Slurm (--profile slurm): at most 2 sbatch job(s)")
    sweep = validated(cpu_config | {"slurm": {"gpu_models": ["a100", "h100"]}})
    lines = plan_lines(sweep, unchecked)
    assert lines[0].startswith("cudalab plan: 2 experiment job(s) (2 need a GPU) + 2 doctor")
    assert "at most 4 sbatch job(s)" in lines[1]
    assert "= 2 measure job(s) + 2 doctor job(s)" in "\n".join(lines)
    off = validated(cpu_config | {"slurm": {"doctor": False}})
    assert "at most 1 sbatch job(s)" in plan_lines(off, unchecked)[1]
    line = slurm_submit_line([("doctor", "--gpus=1"), ("matmul", "--gpus=1")], 1)
    assert "submitting 2 Slurm job(s)" in line and "doctor (--gpus=1), matmul (--gpus=1)" in line
    assert "1 experiment job(s) already measured" in line


# -- real Slurm ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory) -> dict[str, Run]:
    """Three workflows at once on the one node (about 45 s):
    cpu    the CPU-only grid: a doctor job, then one measure job without GPUs
    gpu    the same with --set-resources measure:gpu=2: refused before anything is submitted
           (the GPU request comes from the config; a sweep's --gpus=<model>:1: test_sweep.py)
    fail   a GPU grid (gpu=1 by itself) whose GPU is not there: NoGpuError inside the job
           (gpu_index 63, the largest allowed, fails with or without a real GPU)
    """
    specs = {}
    for name, variants, extra, cli in [
        ("cpu", ["cpu"], {}, []),
        # up to results.csv only: the figures and report are the cpu run's business
        ("gpu", ["cpu"], {}, ["results/results.csv", "--set-resources", "measure:gpu=2"]),
        # doctor off: this run tests the measure job's own failure (test_slurm_site: the doctor's)
        ("fail", ["cpu", "naive"], {"gpu_index": 63}, []),
    ]:
        workdir = tmp_path_factory.mktemp(f"run-{name}")
        config = write_config(workdir, variants, doctor=name != "fail", **extra)
        specs[name] = (snakemake_cmd(workdir, config, *cli), workdir)
    return run_all(specs)


@pytest.mark.slurm
def test_dry_run_with_bare_profile_name(slurm_cluster, tmp_path):
    """From the project root, as a user types it; the work dir stays outside the repo."""
    config = write_config(tmp_path, ["cpu"])
    cmd = snakemake_cmd(tmp_path, config, "--dry-run", profiles=["slurm"], limit_s=60)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = Run(tmp_path, proc.returncode, proc.stdout + proc.stderr)
    assert out.returncode == 0, out.log
    assert "Using profiles slurm" in out.log or "Using profile slurm" in out.log, out.log
    assert "under Slurm (--profile slurm): at most 2 sbatch job(s)" in out.log, out.log
    assert re.search(r"^measure\s+1$", out.log, re.M), out.log
    assert not submitted(out.log), "a dry run submits nothing"
    assert not (tmp_path / "results").exists(), "nothing is written while Snakemake parses"


@pytest.mark.slurm
def test_cpu_workflow_runs_through_sbatch(runs):
    out = runs["cpu"]
    assert out.returncode == 0, out.log
    jobs = submitted(out.log)
    assert len(jobs) == 1, f"expected one sbatch job (measure), got {jobs}\n{out.log}"
    job_id, slurm_log = jobs[0]
    # every job counted: the doctor's and the measure job
    assert "cudalab: submitting 2 Slurm job(s) with sbatch: doctor, matmul." in out.log, out.log
    assert len(submitted(out.log, "doctor")) == 1, out.log
    for rule in ("aggregate", "figures_matmul", "html_report"):
        assert f"localrule {rule}:" in out.log, f"{rule} did not run locally\n{out.log}"

    info = scontrol_job(job_id)
    assert "JobState=COMPLETED" in info, info
    # found in squeue/sacct: the profile's prefix, and the rule and experiment in the comment
    assert re.search(r"JobName=cudalab_[0-9a-f-]{36}\b", info), info
    assert "Comment=rule_measure_wildcards_results_matmul" in info, info
    assert "gres:gpu" not in info, f"a CPU-only experiment asked for a GPU\n{info}"
    assert "Partition=gpu" in info and "TimeLimit=00:10:00" in info, info
    assert "MinMemoryNode=512M" in info and "CPUs/Task=1" in info, info
    assert Path(slurm_log).is_file(), "slurm-keep-successful-logs: the job log is kept"
    assert str(out.workdir / ".snakemake" / "slurm_logs" / "rule_measure") in slurm_log

    df = read_results(out.workdir)
    assert len(df) == 3
    assert set(df["slurm_job_id"]) == {job_id}, df["slurm_job_id"]
    assert (df["slurm_node"] != "").all() and (df["slurm_partition"] == "gpu").all()
    assert (out.workdir / "results" / "report.html").stat().st_size > 0


@pytest.mark.slurm
def test_a_gpu_override_is_refused_before_anything_is_submitted(runs):
    """--set-resources measure:gpu=2 would give the CPU-only jobs GPUs and leave the doctor
    asking another request: refused with the reason, no sbatch."""
    out = runs["gpu"]
    assert out.returncode == 1, out.log
    assert "cudalab: --set-resources measure:gpu is refused (nothing was submitted)" in out.log
    assert "slurm.gpu_model, slurm.gpu_models or slurm.constraint" in out.log, out.log
    assert not submitted(out.log, ""), out.log


@pytest.mark.slurm
def test_failing_job_names_rule_and_logs(runs):
    out = runs["fail"]
    assert out.returncode != 0, out.log
    jobs = submitted(out.log)
    assert len(jobs) == 1, out.log
    job_id, slurm_log = jobs[0]
    assert "Error in rule measure" in out.log, out.log
    after = out.log.split("Error in rule measure", 1)[1]
    assert "results/logs/measure_matmul.log" in after, out.log
    assert slurm_log in after, out.log
    info = scontrol_job(job_id)
    assert "JobState=FAILED" in info, info
    assert "TresPerJob=gres:gpu:fake:1" in info, f"GPU experiment: --gpus=<gpu_model>:1\n{info}"
    rule_log = (out.workdir / "results" / "logs" / "measure_matmul.log").read_text()
    assert "NoGpuError" in rule_log and "no usable CUDA GPU" in rule_log, rule_log
    # inside a Slurm job the message names the job and node and what to check (robust hook)
    assert f"This is Slurm job {job_id} on node " in rule_log, rule_log
    assert "slurm.gpu_model" in rule_log and "admins" in rule_log, rule_log
    assert "no usable CUDA GPU" in Path(slurm_log).read_text(), "failed jobs keep their log"
    assert not (out.workdir / "results" / "results.csv").exists()
    # the cause on the console: the failed job and the end of its logs (cudalab/failures.py)
    summary = out.log.split("cudalab: 1 job(s) failed: measure", 1)
    assert len(summary) == 2, out.log
    assert "--- measure: results/logs/measure_matmul.log (last 15 lines) ---" in summary[1]
    assert f"--- measure: {slurm_log} (last 15 lines) ---" in summary[1], summary[1]
    assert summary[1].count("error: NoGpuError: no usable CUDA GPU") == 2, summary[1]
    assert "SNAKEMAKE\n=====" not in summary[1], "the Slurm log's own command output only"
