"""Fitting a real site, on the real one-node Slurm (gres fake:2 + h100:1, MaxTime 60 min)
with Debian's Lmod; the runs start at once:

  modules   slurm.modules: [cuda/99.9, python/3.99] (modulefiles of ours: a marked nvcc, and
            a `python`/`python3` first on PATH that fails whatever it runs): the doctor and
            the measure job load them, the measure job still works (it runs Snakemake's
            interpreter by path), its records name that interpreter, the modules and nvcc
  badmod    slurm.modules: [cuda/0.0-missing]: the doctor's table names it with Lmod's error,
            the run stops, no measure job is submitted
  nodoctor  the same module with the doctor off: the measure job itself fails, naming it
  nogpu     a GPU grid where no GPU can run it: the doctor stops the run
  pending   a doctor of 120 min (--set-resources, which the plan cannot see) on a partition
            of 60: PENDING (PartitionTimeLimit); the watcher cancels it, the run exits 1
  pending_sacct  the same with the plugin's default status command, sacct, on the cluster
            with accounting (tests/slurm/profile_sacct): sacct says "CANCELLED by 0", which
            the plugin (2.8) does not know, so only cudalab's own stop ends the run
  refused   cpus_per_task 64 on a 4-CPU node: refused before anything is submitted
plus `cudalab site` and `cudalab plan` reading the real sinfo, and (with accounting) the
jobs' rule and experiment in sacct.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from lmod_modules import LMOD_INIT, write_module, write_python_module
from test_slurm import PROFILE, ROOT, Run, run_all, snakemake_cmd, submitted

LMOD_PROFILE = Path("/etc/profile.d/lmod.sh")  # what a login shell sources: exports BASH_ENV
SACCT_PROFILE = Path(__file__).resolve().parent / "profile_sacct"
ACTIVE = "PENDING,RUNNING,COMPLETING,CONFIGURING,SUSPENDED"


def site_config(workdir: Path, variants=("cpu",), **slurm) -> Path:
    cfg = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    cfg["experiments"]["matmul"]["variants"] = list(variants)
    cfg["slurm"] = {"runtime_min": 10, "mem_mb": 512, "cpus_per_task": 1, "gpu_model": "fake",
                    **slurm}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def with_lmod(cmd: list[str], modulepath: Path) -> list[str]:
    """Run cmd as from a login shell with Lmod: the profile exports BASH_ENV (so every
    non-interactive bash, e.g. Snakemake's in the job, has `module`) and MODULEPATH."""
    script = (f'. {LMOD_PROFILE} && export MODULEPATH="$1:$MODULEPATH" && shift && '
              'exec "$@"')
    return ["bash", "-c", script, "_", str(modulepath), *cmd]


def end_stamp(cmd: list[str], stamp: Path) -> list[str]:
    """cmd, then the time it ended (epoch seconds) written to stamp."""
    return ["bash", "-c", '"${@:2}"; rc=$?; date +%s.%N > "$1"; exit $rc', "_", str(stamp),
            *cmd]


def sacct_jobs(job_ids: list[str], fields: str, wait_s: float = 15) -> list[list[str]]:
    """sacct's rows (fields split) of these jobs, once slurmdbd has them all (it gets them
    from slurmctld a moment after each change)."""
    end = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["sacct", "-X", "-P", "-n", "--clusters", "all", "-j",
                              ",".join(job_ids), "-o", f"JobIDRaw,{fields}"],
                             capture_output=True, text=True, timeout=30).stdout
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        if {r[0] for r in rows} >= set(job_ids) or time.monotonic() > end:
            return rows
        time.sleep(0.5)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cudalab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def site_runs(slurm_cluster, slurm_acct_off, tmp_path_factory) -> dict[str, Run]:
    if not (LMOD_INIT.is_file() and LMOD_PROFILE.is_file()):
        if os.environ.get("CUDALAB_REQUIRE_SLURM"):
            pytest.fail("Lmod is not installed (apt-get install lmod) and CI requires it")
        pytest.skip("Lmod not installed (apt-get install lmod)")
    mods = tmp_path_factory.mktemp("lmod")
    nvcc = write_module(mods, "cuda/99.9")
    python = write_python_module(mods, "python/3.99")
    specs = {}
    for name, slurm, extra, limit_s in [
        # the longest run (a doctor, a measure job, the report): room for a loaded machine
        ("modules", {"modules": ["cuda/99.9", "python/3.99"]}, [], 240),
        ("badmod", {"modules": ["cuda/0.0-missing"]}, [], 150),
        ("nodoctor", {"modules": ["cuda/0.0-missing"], "doctor": False}, [], 150),
        ("nogpu", {}, [], 150),  # a GPU grid (naive) where no GPU can run it (no pycuda/GPU)
        ("pending", {}, ["--set-resources", "doctor:runtime=120"], 90),
        ("refused", {"cpus_per_task": 64}, [], 60),
    ]:
        workdir = tmp_path_factory.mktemp(f"site-{name}")
        variants = ("cpu", "naive") if name == "nogpu" else ("cpu",)
        config = site_config(workdir, variants, **slurm)
        cmd = snakemake_cmd(workdir, config, *extra, limit_s=limit_s)
        specs[name] = (with_lmod(cmd, mods / "modulefiles"), workdir)
    if not slurm_acct_off:  # the cluster has accounting: the pending case with sacct status
        workdir = tmp_path_factory.mktemp("site-pending_sacct")
        cmd = snakemake_cmd(workdir, site_config(workdir), "--set-resources",
                            "doctor:runtime=120", profiles=(PROFILE, SACCT_PROFILE), limit_s=75)
        specs["pending_sacct"] = (end_stamp(with_lmod(cmd, mods / "modulefiles"),
                                            workdir / "ended"), workdir)
    os.environ["CUDALAB_PENDING_POLL_S"] = "2"  # inherited by the snakemake processes
    t0 = time.monotonic()
    try:
        runs = run_all(specs, limit_s=240)
    finally:
        del os.environ["CUDALAB_PENDING_POLL_S"]
    runs["modules"].nvcc = nvcc  # type: ignore[attr-defined]
    runs["modules"].python = python  # type: ignore[attr-defined]
    print(f"\nslurm site runs ({len(runs)} at once): {time.monotonic() - t0:.0f} s")
    return runs


@pytest.mark.slurm
def test_modules_loaded_in_the_jobs(site_runs):
    out = site_runs["modules"]
    assert out.returncode == 0, out.log
    doctor_jobs, measure_jobs = submitted(out.log, "doctor"), submitted(out.log, "measure")
    assert len(doctor_jobs) == 1 and len(measure_jobs) == 1, out.log
    table = (out.workdir / "results" / "doctor" / "doctor.md").read_text()
    assert table.startswith("cudalab doctor: ok"), table
    assert "| ok | module cuda/99.9 | loaded in this job" in table, table
    assert f"| ok | nvcc | {out.nvcc} (CUDA " in table, f"the marked nvcc\n{table}"
    assert "| ok | Slurm allocation | job " in table, table
    for _, log in doctor_jobs + measure_jobs:
        assert "Activating environment modules: cuda/99.9, python/3.99" in Path(log).read_text()
    rec = json.loads(next((out.workdir / "results" / "raw" / "matmul").glob("cpu-*.json"))
                     .read_text())["provenance"]
    # one interpreter: the doctor checked the one the measure job ran, not the module's
    assert f"| ok | Python (the jobs') | {rec['python_executable']} (Python " in table, table
    assert f"`python3` first on PATH is {out.python}, which the jobs do not use" in table, table
    assert os.path.realpath(rec["python_executable"]) == os.path.realpath(sys.executable), rec
    assert rec["cudalab_path"] == str(ROOT / "cudalab"), rec
    assert rec["loaded_modules"].split(":") == ["cuda/99.9", "python/3.99"], rec
    assert rec["nvcc_path"] == str(out.nvcc), rec
    assert "was run" not in out.log, "the module's python ran"
    assert not (out.workdir / "results" / "doctor" / "ok").exists(), "temp flag removed"
    assert (out.workdir / "results" / "report.html").is_file()
    assert int(doctor_jobs[0][0]) < int(measure_jobs[0][0]), "the doctor ran first"
    # run again: nothing to do (the doctor's flag is temp() and ancient(): no rerun)
    cmd = with_lmod(snakemake_cmd(out.workdir, out.workdir / "config.yaml"),
                    out.nvcc.parents[2] / "modulefiles")
    again = subprocess.run(cmd, cwd=out.workdir, capture_output=True, text=True, timeout=200)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout + again.stderr
    assert not submitted(again.stdout + again.stderr, ""), "nothing submitted"


@pytest.mark.slurm
def test_doctor_stops_a_gpu_grid_without_gpu(site_runs):
    """This machine has fake GPU device files and no CUDA: the GPU grid must not start."""
    out = site_runs["nogpu"]
    assert out.returncode != 0, out.log
    assert len(submitted(out.log, "doctor")) == 1 and submitted(out.log, "measure") == []
    table = (out.workdir / "results" / "doctor" / "doctor.md").read_text()
    assert table.startswith("cudalab doctor: FAILED"), table
    assert "| FAIL | pycuda |" in table or "| FAIL | GPU(s) |" in table, table
    assert "gres gres:gpu:fake:1" in table, f"the doctor asked for a measure job's GPU\n{table}"
    assert "no measure job was submitted" in out.log, out.log


@pytest.mark.slurm
def test_missing_module_stops_before_the_grid(site_runs):
    out = site_runs["badmod"]
    assert out.returncode != 0, out.log
    assert len(submitted(out.log, "doctor")) == 1, out.log
    assert submitted(out.log, "measure") == [], f"no grid job may be submitted\n{out.log}"
    assert "Error in rule doctor" in out.log, out.log
    # the table printed at the end names the module and Lmod's error
    assert "| FAIL | module cuda/0.0-missing | `module load cuda/0.0-missing` failed" in out.log
    assert "unknown" in out.log and "no measure job was submitted" in out.log, out.log
    assert "results/logs/doctor.log" in out.log


@pytest.mark.slurm
def test_a_module_that_does_not_load_fails_the_measure_job(site_runs):
    """The doctor off: the measure job checks LOADEDMODULES itself and fails, and the
    console shows why (the end of its log)."""
    out = site_runs["nodoctor"]
    assert out.returncode != 0, out.log
    assert len(submitted(out.log, "measure")) == 1 and not submitted(out.log, "doctor")
    summary = out.log.split("cudalab: 1 job(s) failed: measure", 1)[-1]
    assert "cudalab: module cuda/0.0-missing is not loaded in this job" in summary, out.log
    assert "Fix slurm.modules in config.yaml" in summary, out.log
    assert not list((out.workdir / "results" / "raw").glob("matmul/cpu-*.json")), "nothing ran"


@pytest.mark.slurm
def test_a_job_pending_for_ever_is_cancelled_with_its_reason(site_runs):
    out = site_runs["pending"]
    assert out.returncode == 1, f"the run stops by itself (not SIGINT 130)\n{out.log}"
    assert "Slurm request (sinfo): fits partition 'gpu'" in out.log, "the config itself fits"
    line = next((x for x in out.log.splitlines() if x.startswith("cudalab: cancelled Slurm")),
                "")
    # Slurm names the time limit, or (seen on a busy node) the partition's limits at large
    assert re.search(r"\(rule_doctor_wildcards_doctor\): PENDING with reason "
                     r"(PartitionTimeLimit|PartitionConfig), which never clears", line), out.log
    assert "Fix the slurm: block" in line, line
    assert submitted(out.log, "measure") == [], "nothing after the doctor"
    # the reason again in the closing summary: the watcher stopped the run as Ctrl-C does
    assert out.log.count(line) == 2 and "cudalab: the run stopped." in out.log, out.log
    assert out.wall_s < 75, f"cancelled within a minute of its start ({out.wall_s:.0f} s)"


@pytest.mark.slurm
def test_a_job_pending_for_ever_stops_the_run_with_sacct_status(site_runs, slurm_accounting):
    """With accounting, the executor plugin reads job states from sacct (its default), which
    calls the cancelled job "CANCELLED by 0": a state the plugin (2.8) does not match, so it
    would wait for ever. cudalab's watcher stops the run itself (cudalab/pending.py)."""
    assert "slurm-status-command" not in yaml.safe_load((SACCT_PROFILE / "config.yaml")
                                                        .read_text())
    out = site_runs["pending_sacct"]
    # the plugin (2.8) says this only where its status command is sacct
    assert "'squeue' should work reliably for status queries." in out.log, out.log
    assert out.returncode == 1, (f"the run stops by itself, exit 1 (124: `timeout` had to "
                                 f"stop it, the run waited for ever)\n{out.log}")
    jobs = submitted(out.log, "doctor")
    assert len(jobs) == 1 and submitted(out.log, "measure") == [], out.log
    job_id = jobs[0][0]
    line = next((x for x in out.log.splitlines() if x.startswith("cudalab: cancelled Slurm")),
                "")
    assert re.search(rf"job {job_id} \(rule_doctor_wildcards_doctor\): PENDING with reason "
                     r"(PartitionTimeLimit|PartitionConfig), which never clears", line), out.log
    assert "Fix the slurm: block" in line, line
    # stopped as Ctrl-C stops it: the reason again in the closing summary
    assert out.log.count(line) == 2 and "cudalab: the run stopped." in out.log, out.log
    # what the plugin saw: sacct's state of the cancelled job, with its rule in the comment
    rows = sacct_jobs([job_id], "State,Comment,Submit")
    assert len(rows) == 1, rows
    _, state, comment, submit = rows[0]
    assert state.startswith("CANCELLED by "), rows
    assert comment == "rule_doctor_wildcards_doctor", rows
    ended = float((out.workdir / "ended").read_text())
    after = ended - datetime.fromisoformat(submit).timestamp()
    assert 0 <= after < 60, f"snakemake exited {after:.0f} s after the job's submission"
    left = subprocess.run(["squeue", "-h", "-t", ACTIVE, "-o", "%i|%Z"], capture_output=True,
                          text=True, timeout=30).stdout
    mine = [x for x in left.splitlines()
            if os.path.realpath(x.split("|")[-1]) == os.path.realpath(out.workdir)]
    assert not mine, f"jobs of the run left in squeue: {mine}"
    print(f"\npending with sacct status: {state}; snakemake exit {out.returncode} "
          f"{after:.0f} s after submission")


@pytest.mark.slurm
def test_jobs_are_found_in_sacct_by_rule_and_experiment(site_runs, slurm_accounting):
    """Issue 25 item 8: slurmdbd keeps the plugin's comment (AccountingStoreFlags=
    job_comment): the rule and the experiment of each job, under the run's one job name."""
    out = site_runs["modules"]
    jobs = {j: rule for rule in ("doctor", "measure") for j, _ in submitted(out.log, rule)}
    assert len(jobs) == 2, out.log
    rows = {r[0]: r[1:] for r in sacct_jobs(list(jobs), "JobName,Comment,State")}
    assert set(rows) == set(jobs), rows
    comments = {jobs[j]: rows[j][1] for j in jobs}
    assert comments == {"doctor": "rule_doctor_wildcards_doctor",
                        "measure": "rule_measure_wildcards_results_matmul"}, rows
    names = {rows[j][0] for j in jobs}
    assert len(names) == 1 and re.fullmatch(r"cudalab_[0-9a-f-]{36}", names.pop()), rows
    assert all(rows[j][2] == "COMPLETED" for j in jobs), rows
    # without job_comment sacct's Comment is empty, but SubmitLine (kept whatever the flags;
    # seen on 22.05 with the flag off) is the plugin's sbatch line, with the rule in it
    lines = {r[0]: r[1] for r in sacct_jobs(list(jobs), "SubmitLine")}
    assert all(f"--comment {comments[jobs[j]]}" in lines[j] for j in jobs), lines


@pytest.mark.slurm
def test_a_request_that_cannot_fit_is_refused_before_submitting(site_runs):
    out = site_runs["refused"]
    assert out.returncode != 0, out.log
    assert not submitted(out.log, ""), f"nothing submitted\n{out.log}"
    assert "nothing was submitted" in out.log, out.log
    assert ("slurm.cpus_per_task: 64 but the largest node of partition 'gpu' with GPU model "
            "'fake' has 4 CPUs" in out.log) or "cpus_per_task: 64 but" in out.log, out.log
    assert "fix: slurm.cpus_per_task: 4 or less" in out.log, out.log


@pytest.mark.slurm
def test_site_and_plan_read_real_sinfo(slurm_cluster, tmp_path):
    p = cli("site", "--sinfo", "", cwd=tmp_path)  # '' -> ask sinfo itself
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fake:2" in p.stdout and "h100:1" in p.stdout
    assert "GPU models here: fake (partition gpu), h100 (partition gpu)" in p.stdout
    assert "slurm:\n  partition: gpu\n" in p.stdout and "gpu_model: fake" in p.stdout
    cfg = site_config(tmp_path, variants=("cpu", "naive"), gpu_model="a100")
    p = cli("site", str(cfg), cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "no node of partition 'gpu' has GPU model 'a100'" in p.stdout
    assert "GPU models here: fake" in p.stdout
    p = cli("plan", str(cfg), cwd=tmp_path)
    assert "does not fit" in p.stdout and "'a100'" in p.stdout and "h100" in p.stdout, p.stdout
    assert p.returncode == 1, "exit 1: the request cannot fit this cluster"
    ok = cli("plan", str(site_config(tmp_path, variants=("cpu", "naive"), gpu_model="h100")),
             cwd=tmp_path)
    assert "Slurm request (sinfo): fits partition 'gpu'" in ok.stdout, ok.stdout
    assert ok.returncode == 0
    long = cli("plan", str(site_config(tmp_path, runtime_min=120)), cwd=tmp_path)
    assert long.returncode == 1, long.stdout + long.stderr
    assert ("slurm.runtime_min: 120 but partition 'gpu' allows at most 60 minutes "
            "(PartitionTimeLimit" in long.stdout), long.stdout
    assert "fix: slurm.runtime_min: 60 or less" in long.stdout
    sweep = cli("plan", str(site_config(tmp_path, gpu_models=["fake", "a100"], gpu_model="")),
                cwd=tmp_path)  # gpu_model beside gpu_models is refused: the sweep alone
    assert sweep.returncode == 1 and "slurm.gpu_models: no node" in sweep.stdout, sweep.stdout
    assert cli("plan", str(tmp_path / "missing.yaml"), cwd=tmp_path).returncode == 2
