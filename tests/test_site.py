"""cudalab site / doctor / pending without a cluster: recorded `sinfo` outputs, real Lmod,
the doctor on this (GPU-less) machine. The real-Slurm side is in tests/slurm/test_slurm_site.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lmod_modules import LMOD_INIT, write_module

from cudalab import doctor, pending, site

ROOT = Path(__file__).resolve().parent.parent
SINFO = ROOT / "tests" / "data" / "sinfo"


def nodes(name: str) -> list[site.Node]:
    return site.parse_sinfo((SINFO / name).read_text())


def slurm(**kw) -> dict:
    base = {"partition": "", "account": "", "constraint": "", "gpu_model": "",
            "runtime_min": 60, "mem_mb": 16000, "cpus_per_task": 4, "modules": []}
    return base | kw


# -- sinfo parsing ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,want", [
    ("gpu:fake:2,gpu:h100:1", {"fake": 2, "h100": 1}),
    ("gpu:a100:4(S:0-1)", {"a100": 4}),
    ("gpu:h100:8(S:0,1),mps:400", {"h100": 8}),
    ("gpu:2", {"": 2}),
    ("(null)", {}),
    ("nvgpu:3", {}),
])
def test_parse_gres(text, want):
    assert site.parse_gres(text) == want


@pytest.mark.parametrize("text,minutes", [
    ("infinite", None), ("UNLIMITED", None), ("30:00", 30), ("12:00:00", 720),
    ("2-00:00:00", 2880), ("1-12:30:00", 2190), ("45", 45), ("0:30:30", 31),
])
def test_parse_time(text, minutes):
    assert site.parse_time(text) == minutes


def test_parse_recorded_cluster():
    ns = nodes("cluster.txt")
    assert len(ns) == 7
    first = ns[0]
    assert (first.name, first.partition, first.default, first.cpus, first.mem_mb) == (
        "cpu001", "cpu", True, 128, 515000)
    assert first.gpus == {} and first.time_limit_min == 2880 and first.features == ("epyc", "ib")
    assert site.default_partition(ns) == "cpu"
    assert site.gpu_models(ns) == {"a100": {"gpu"}, "h100": {"gpu-h100"}, "v100": {"old"}}
    assert not ns[-1].available and ns[-1].state == "down*"
    one = nodes("one_node_two_models.txt")[0]
    assert one.gpus == {"fake": 2, "h100": 1} and one.time_limit_min is None


# -- fitting a request -------------------------------------------------------------------------
def test_fits_one_node():
    assert site.fit_problems(slurm(gpu_model="h100", cpus_per_task=4, mem_mb=512),
                             nodes("one_node_two_models.txt"), needs_gpu=True) == []


@pytest.mark.parametrize("request_,needs_gpu,expect", [
    (dict(partition="gpu", gpu_model="b200"), True,
     ["'b200'", "GPU models here: a100 (partition gpu), h100 (partition gpu-h100)"]),
    (dict(partition="gpu", gpu_model="h100"), True, ["partition gpu-h100 has"]),
    (dict(partition="nope"), True, ["'nope' does not exist", "cpu, gpu, gpu-h100, debug"]),
    (dict(), True, ["'cpu' has no GPUs", "partitions with GPUs: debug, gpu, gpu-h100, old"]),
    (dict(partition="gpu", cpus_per_task=65), True, ["cpus_per_task: 65", "has 64 CPUs"]),
    (dict(partition="gpu", mem_mb=600000), True, ["mem_mb: 600000", "has 500000 MB"]),
    (dict(partition="debug", runtime_min=60), True, ["runtime_min: 60", "at most 30 minutes"]),
    (dict(partition="gpu-h100", gpu_model="h100", runtime_min=721), True, ["at most 720"]),
    (dict(partition="gpu", constraint="h100"), True, ["feature 'h100'", "a100, ib"]),
    (dict(partition="gpu,nope"), True, ["'nope' does not exist"]),
    (dict(partition="gpu,debug", cpus_per_task=65), True, ["has 64 CPUs", "has 16 CPUs"]),
])
def test_fit_problems_say_what_does_not_fit(request_, needs_gpu, expect):
    problems = site.fit_problems(slurm(**request_), nodes("cluster.txt"), needs_gpu)
    assert problems, request_
    text = "\n".join(problems)
    for part in expect:
        assert part in text, text


def test_cpu_only_config_fits_cpu_partition():
    assert site.fit_problems(slurm(), nodes("cluster.txt"), needs_gpu=False) == []
    assert site.fit_problems(slurm(partition="debug,gpu", runtime_min=60),
                             nodes("cluster.txt"), needs_gpu=True) == [], "gpu can run it"


def test_suggest_fits_and_names_a_model():
    ns = nodes("cluster.txt")
    block = site.suggest(ns, slurm(runtime_min=2000, cpus_per_task=4))
    assert block["partition"] == "gpu" and block["gpu_model"] == "a100"
    assert block["runtime_min"] == 1440 and block["cpus_per_task"] == 4
    assert site.fit_problems(block, ns, needs_gpu=True) == []
    one = site.suggest(nodes("one_node_two_models.txt"), {})
    assert one["partition"] == "gpu" and one["gpu_model"] == "fake"
    # one GPU's share of the node (4 CPUs, 12052 MB, 3 GPUs), never the whole node
    assert one["mem_mb"] == 4017 and one["cpus_per_task"] == 1 and one["runtime_min"] == 60
    big = site.suggest(ns, slurm(cpus_per_task=64, mem_mb=500000))  # 64 CPUs, 4 GPUs a node
    assert big["cpus_per_task"] == 16 and big["mem_mb"] == 125000


def test_plan_lines_with_nodes(cpu_config, validated):
    cfg = validated(cpu_config)
    ns = nodes("cluster.txt")
    assert site.plan_lines(cfg, ns) == ["  Slurm request (sinfo): fits partition 'cpu'"]
    cfg["slurm"]["cpus_per_task"] = 200
    lines = site.plan_lines(cfg, ns)
    assert "does not fit" in lines[0] and "cpus_per_task: 200" in lines[1]


def test_site_cli_with_recorded_sinfo(tmp_path, cpu_config):
    import yaml

    cpu_config["experiments"]["matmul"]["variants"] = ["cpu", "naive"]  # needs a GPU
    cpu_config["slurm"] = {"partition": "gpu", "gpu_model": "b200"}
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump(cpu_config))
    p = subprocess.run([sys.executable, "-m", "cudalab.cli", "site", str(cfgfile), "--sinfo",
                        str(SINFO / "cluster.txt")], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "gpu-h100" in p.stdout and "h100:8" in p.stdout and "Traceback" not in p.stderr
    assert "slurm:\n  partition: gpu\n" in p.stdout and "gpu_model: a100" in p.stdout
    assert "'b200'" in p.stdout and "GPU models here: a100" in p.stdout
    bad = subprocess.run([sys.executable, "-m", "cudalab.cli", "site", "--sinfo",
                          str(tmp_path / "missing.txt")], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr


# -- PENDING that will not clear -------------------------------------------------------------
def test_stuck_jobs_filter_and_message(tmp_path):
    wd = str(tmp_path)
    out = "\n".join([
        f"11|PENDING|PartitionConfig|rule_doctor|{wd}",
        f"12|PENDING|Resources|rule_measure_wildcards_matmul|{wd}",  # clears by itself
        f"13|PENDING|ReqNodeNotAvail, UnavailableNodes:gpu07|rule_measure_wildcards_x|{wd}",
        "14|PENDING|PartitionConfig|rule_measure|/elsewhere",  # another run's job
        f"15|PENDING|InvalidQOS|(null)|{wd}",  # not a Snakemake job
    ])
    stuck = pending.stuck_jobs(out, wd)
    assert [s[0] for s in stuck] == ["11", "13"]
    msg = pending.message(*stuck[1])
    assert "job 13" in msg and "ReqNodeNotAvail" in msg and "down, drained or reserved" in msg
    lines: list[str] = []
    watch = pending.PendingWatch(wd, emit=lines.append)
    assert watch.daemon


# -- the doctor ------------------------------------------------------------------------------
@pytest.mark.parametrize("nvcc,driver,status", [
    ("12.4", "12.8", doctor.OK), ("13.0", "12.8", doctor.FAIL), ("12.8", "12.4", doctor.WARN),
    ("", "12.4", doctor.INFO),
])
def test_driver_vs_nvcc(nvcc, driver, status):
    c = doctor.check_driver_vs_nvcc(nvcc, driver)
    assert c.status == status
    assert (c.fix != "") == (status in (doctor.FAIL, doctor.WARN))


@pytest.mark.slow
def test_doctor_cli_without_gpu(tmp_path):
    """On this machine (no GPU): a plain table, no traceback; rc 1 for a GPU config, 0 when
    no GPU is needed; JSON and markdown written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "cudalab.cli", "doctor", "--config", ""]
    p = subprocess.run(base + ["--json", str(tmp_path / "d.json"), "--md", str(tmp_path / "d.md")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    assert "cudalab doctor: FAILED" in p.stdout and "GPU" in p.stdout
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["ok"] is False and data["need_gpu"] is True
    names = [c["name"] for c in data["checks"]]
    for name in ("host", "Slurm allocation", "nvcc", "nvidia-smi", "pycuda"):
        assert name in names, names
    assert all(c["fix"] for c in data["checks"] if c["status"] == doctor.FAIL)
    md = (tmp_path / "d.md").read_text()
    assert md.startswith("cudalab doctor: FAILED") and "| status | check |" in md
    ok = subprocess.run(base + ["--need-gpu", "no"], capture_output=True, text=True, env=env,
                        timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "cudalab doctor: ok: this config needs no GPU" in ok.stdout


@pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod not installed (apt-get install lmod)")
def test_doctor_modules_with_real_lmod(tmp_path, monkeypatch):
    nvcc = write_module(tmp_path, "cuda/99.9")
    monkeypatch.setenv("MODULEPATH", str(tmp_path / "modulefiles"))
    monkeypatch.delenv("LOADEDMODULES", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    checks, env = doctor.check_modules(["cuda/99.9", "nope/1.0"], dict(os.environ))
    good, bad = checks
    assert good.status == doctor.INFO and "loadable" in good.value
    assert bad.status == doctor.FAIL and "nope/1.0" in bad.value and "unknown" in bad.value
    assert env["PATH"].split(":")[0] == str(nvcc.parent), "the loaded module's PATH is used"
    c, release = doctor.check_nvcc(env, required=True)
    assert c.status == doctor.OK and str(nvcc) in c.value and release


def test_the_watcher_cancels_what_never_clears_and_reports_what_may(tmp_path, monkeypatch):
    """PartitionTimeLimit: cancelled, with the reason and the fix; ReqNodeNotAvail: only
    cancelled where no node has the GPU type the job asks for; a partition down: reported."""
    wd = str(tmp_path)
    out = "\n".join([
        f"21|PENDING|PartitionTimeLimit|rule_doctor_wildcards_doctor|{wd}",
        f"22|PENDING|ReqNodeNotAvail, UnavailableNodes:gpu07|rule_measure_wildcards_a|{wd}",
        f"23|PENDING|ReqNodeNotAvail, UnavailableNodes:gpu08|rule_measure_wildcards_b|{wd}",
        f"24|PENDING|PartitionDown|rule_measure_wildcards_c|{wd}",
    ])
    monkeypatch.setattr(pending, "_run", lambda cmd: out if cmd[0] == "squeue" else "")
    monkeypatch.setattr(pending, "missing_gpu_type", lambda job: "a100" if job == "22" else "")
    cancelled: list[str] = []
    lines: list[str] = []
    stops: list[int] = []  # the run is stopped (SIGINT to Snakemake) after each cancel
    watch = pending.PendingWatch(wd, emit=lines.append, stop_run=lambda: stops.append(1))
    monkeypatch.setattr(watch, "cancel", lambda job: cancelled.append(job) or True)
    watch.poll()
    watch.poll()  # once per job and reason
    assert cancelled == ["21", "22"] and len(lines) == 4 and stops == [1, 1]
    assert lines[0].startswith("cudalab: cancelled Slurm job 21 (rule_doctor_wildcards_doctor):"
                               " PENDING with reason PartitionTimeLimit, which never clears")
    assert "slurm.runtime_min" in lines[0]
    assert "GPU type a100" in lines[1] and "gpu_model" in lines[1]
    assert "job 23" in lines[2] and "is PENDING" in lines[2] and "down, drained" in lines[2]
    assert "job 24" in lines[3] and "partition is down" in lines[3]
    assert watch.cancelled == lines[:2]


def test_missing_gpu_type_asks_scontrol_and_sinfo(monkeypatch):
    monkeypatch.setattr(pending, "_run", lambda cmd: "JobId=5 TresPerJob=gres:gpu:a100:1 x=y")
    monkeypatch.setattr(site, "read_sinfo", lambda timeout_s=20: nodes("cluster.txt"))
    assert pending.missing_gpu_type("5") == ""  # cluster.txt has a100
    monkeypatch.setattr(pending, "_run", lambda cmd: "JobId=5 TresPerJob=gres:gpu:b200:1")
    assert pending.missing_gpu_type("5") == "b200"
    monkeypatch.setattr(pending, "_run", lambda cmd: "JobId=5 TresPerJob=gres:gpu:1")
    assert pending.missing_gpu_type("5") == "", "an untyped GPU: any node's"


def test_a_sweep_is_fitted_model_by_model_and_every_problem_says_the_fix():
    ns = nodes("one_node_two_models.txt")
    assert site.fit_problems(slurm(gpu_models=["fake", "h100"], mem_mb=512), ns, True) == []
    problems = site.fit_problems(slurm(gpu_models=["fake", "b200"], mem_mb=512), ns, False)
    assert len(problems) == 1 and problems[0].startswith("slurm.gpu_models: no node")
    assert "'b200'" in problems[0] and "fix:" in problems[0]
    for p in site.fit_problems(slurm(partition="gpu", cpus_per_task=65, mem_mb=600000,
                                     runtime_min=721, gpu_model="a100"),
                               nodes("cluster.txt"), True):
        assert "fix: " in p, p


def test_plan_exit_codes(tmp_path, cpu_config, monkeypatch):
    """cudalab plan: 0 fits (or no sinfo to ask), 1 cannot fit, 2 invalid config."""
    import yaml

    from cudalab import cli

    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(cpu_config | {"slurm": {"cpus_per_task": 4, "mem_mb": 512}}))
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(cpu_config | {"slurm": {"cpus_per_task": 64}}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("slurm: {cpus_per_task: -1}\n")
    check_fit = site.check_fit
    monkeypatch.setattr(site, "check_fit", lambda c, n=None: site.FitCheck(False, [], error="x"))
    assert cli.main(["plan", str(big)]) == cli.PLAN_OK, "no sinfo answered: not checked"
    monkeypatch.setattr(site, "check_fit",
                        lambda c, n=None: check_fit(c, nodes("one_node_two_models.txt")))
    assert cli.main(["plan", str(ok)]) == cli.PLAN_OK
    assert cli.main(["plan", str(big)]) == cli.PLAN_DOES_NOT_FIT
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", str(bad)])
    assert exc.value.code == cli.PLAN_INVALID


def test_wait_for_jobs_waits_for_the_runs_doctor_jobs_only(tmp_path, monkeypatch):
    wd = str(tmp_path)
    answers = [f"31|RUNNING|None|rule_doctor_wildcards_doctor|{wd}\n"
               f"32|RUNNING|None|rule_measure_wildcards_results_x|{wd}",
               f"32|RUNNING|None|rule_measure_wildcards_results_x|{wd}\n"
               f"33|RUNNING|None|rule_doctor_wildcards_doctor|/elsewhere"]
    monkeypatch.setattr(pending.shutil, "which", lambda name: "/usr/bin/squeue")
    monkeypatch.setattr(pending, "_run", lambda cmd: answers.pop(0))
    assert pending.wait_for_jobs(wd, "rule_doctor", poll_s=0) and answers == []
    monkeypatch.setattr(pending, "_run", lambda cmd: f"31|COMPLETING|None|rule_doctor|{wd}")
    assert not pending.wait_for_jobs(wd, "rule_doctor", timeout_s=0, poll_s=0)
