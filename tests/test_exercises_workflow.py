"""Class mode without a GPU: the config key, the rules' dry run (one job per valid
submission, hostile names never reach a shell), and `cudalab exercise` on the CPU."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cudalab import config as cfg
from cudalab.cli import main
from cudalab.exercises import catalog
from cudalab.exercises.cli import EXIT_NOT_JUDGED

ROOT = Path(__file__).resolve().parent.parent
STARTER = catalog.EXERCISE_DIR / "vector_add.cu"


def _config(tmp_path: Path, submissions: str) -> Path:
    c = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    c["exercises"] = {"submissions": submissions, "exercise": "vector_add"}
    path = tmp_path / "class.yaml"
    path.write_text(yaml.safe_dump(c))
    return path


@pytest.mark.parametrize("value", ["-rf", "a b", "$(id)", "x;y", "subs\nrm", "`id`"])
def test_a_submissions_folder_that_could_reach_a_shell_is_refused(value, cpu_config):
    with pytest.raises(cfg.ConfigError, match="exercises.submissions"):
        cfg.validate(cpu_config | {"exercises": {"submissions": value}})


def test_the_exercises_block_is_optional_and_filled(cpu_config):
    c = cfg.validate(dict(cpu_config))
    assert c["exercises"]["submissions"] == ""
    c = cfg.validate(cpu_config | {"exercises": {"submissions": "class/subs"}})
    assert c["exercises"]["exercise"] == "tiled_matmul"


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", *args, "-s", str(ROOT / "Snakefile"),
           "--directory", str(workdir), "--cores", "2"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=workdir,
                          env=dict(os.environ))


def test_dry_run_plans_one_job_per_submission_and_quotes_them(tmp_path):
    subs = tmp_path / "subs"
    (subs / "bob").mkdir(parents=True)
    shutil.copy(STARTER, subs / "alice.cu")
    shutil.copy(STARTER, subs / "bob" / "mine.cu")
    shutil.copy(STARTER, subs / "$(touch pwned).cu")
    shutil.copy(STARTER, subs / "x y.cu")
    conf = _config(tmp_path, "subs")
    r = _snakemake(tmp_path, "exercises", "-n", "--configfile", str(conf))
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert out.count("rule exercise_judge:") == 2
    assert "--student alice" in out and "subs/bob/mine.cu" in out
    assert "pwned" not in out and "x y" not in out
    assert "rule exercise_baseline:" in out and "rule exercise_report:" in out
    assert not (tmp_path / "pwned").exists()


def test_without_submissions_no_class_rule_exists(tmp_path):
    conf = _config(tmp_path, "")
    r = _snakemake(tmp_path, "-n", "--configfile", str(conf))
    assert r.returncode == 0, r.stderr
    assert "exercise_judge" not in r.stdout + r.stderr


CORRECT = """// cudalab-exercise: vector_add
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_check_without_a_gpu_compiles_and_analyses(capsys, tmp_path):
    good = tmp_path / "good.cu"
    good.write_text(CORRECT)
    assert main(["exercise", "check", str(good), "--no-gpu"]) == EXIT_NOT_JUDGED == 3
    out = capsys.readouterr().out
    assert "compiled, not judged: no GPU here" in out
    assert "registers" in out and "occupancy" in out
    # the untouched starter never writes its output: failed without any GPU
    assert main(["exercise", "check", str(STARTER), "--no-gpu"]) == 1
    assert "never writes its output" in capsys.readouterr().out
    bad = tmp_path / "bad.cu"
    bad.write_text(STARTER.read_text().replace("int n)\n{", "int n)\n{ oops"))
    assert main(["exercise", "check", str(bad), "--no-gpu"]) == 1
    assert "bad.cu:13: error" in capsys.readouterr().out


def test_check_refuses_an_include(capsys, tmp_path):
    f = tmp_path / "sneaky.cu"
    f.write_text('// cudalab-exercise: vector_add\n#include "../solutions/vector_add.cu"\n')
    assert main(["exercise", "check", str(f), "--no-gpu"]) == 1
    assert "not accepted" in capsys.readouterr().out


def test_class_report_from_verdicts(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(STARTER, subs / "alice.cu")
    shutil.copy(STARTER, subs / "bob.cu")
    verdicts = tmp_path / "verdicts"
    main(["exercise", "judge", str(subs / "alice.cu"), "--student", "alice", "--exercise",
          "vector_add", "--out", str(verdicts / "alice.json"), "--arch", "sm_80"])
    out = tmp_path / "report"
    assert main(["exercise", "report", "--exercise", "vector_add", "--submissions", str(subs),
                 "--verdicts", str(verdicts), "--out", str(out)]) == 0
    text = (out / "index.html").read_text()
    assert "alice" in text and "bob" in text  # bob has no verdict: said so, not dropped
    assert "no verdict was written" in (out / "leaderboard.csv").read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_check_on_a_machine_without_a_gpu_exits_not_judged(capsys, tmp_path):
    from cudalab.exercises import pipeline

    if pipeline.device_arch() is not None:
        pytest.skip("a GPU is here: the check judges for real (tests/gpu)")
    good = tmp_path / "good.cu"
    good.write_text(CORRECT)
    assert main(["exercise", "check", str(good)]) == EXIT_NOT_JUDGED
    assert "compiled, not judged: no GPU here (nvidia-smi finds none)" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None, reason="pycuda installed")
def test_a_gpu_without_pycuda_is_compiled_not_judged(monkeypatch):
    from cudalab.exercises import pipeline

    monkeypatch.setattr(pipeline, "device_arch", lambda: "sm_90")  # as if nvidia-smi saw one
    # the real judge process starts and finds no pycuda: that is no GPU here, not a failure
    v = pipeline.judge_text(CORRECT, catalog.get("vector_add"), "good.cu")
    assert v["status"] == "compiled", v
    assert v["message"].startswith("no GPU here (") and "pycuda" in v["message"]
