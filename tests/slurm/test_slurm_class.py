"""A class run (`snakemake exercises --profile slurm`) on the real one-node Slurm, whose GPUs
are fake devices: no judge may run there.

    doctor   the judges' doctor job (--gpus=fake:1) finds no usable GPU: the run stops with
             its table before any judge job; the console named what would be judged and
             where the leaderboard goes, and claims no report
    nodoc    slurm.doctor off: the judge job lands on the GPU-less node and fails
             (NoGpuError), writing no verdict, instead of ending rc 0 with "compiled"

and `cudalab plan` refuses a class whose gpu_model no node has (its grid needs no GPU: the
judges do).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from test_slurm import ROOT, run_all, snakemake_cmd, submitted, write_config

LEADERBOARD = "results/class/vector_add/index.html"
CORRECT = """// cudalab-exercise: vector_add
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }
"""


def _class_config(workdir, students: list[str], doctor: bool = True, model: str = "fake"):
    subs = workdir / "subs"
    subs.mkdir()
    for s in students:
        (subs / f"{s}.cu").write_text(CORRECT)  # a GPU would judge it correct
    config = write_config(workdir, ["cpu"], doctor=doctor)
    cfg = yaml.safe_load(config.read_text())
    cfg["slurm"]["gpu_model"] = model
    cfg["exercises"] = {"submissions": "subs", "exercise": "vector_add",
                        "sandbox": "optional"}
    config.write_text(yaml.safe_dump(cfg))
    return config


@pytest.fixture(scope="module")
def class_runs(slurm_cluster, tmp_path_factory):
    specs = {}
    for name, students, doctor in [("doctor", ["alice", "bob"], True),
                                   ("nodoc", ["carol"], False)]:
        workdir = tmp_path_factory.mktemp(f"class-{name}")
        config = _class_config(workdir, students, doctor)
        specs[name] = (snakemake_cmd(workdir, config, "exercises"), workdir)
    return run_all(specs)


@pytest.mark.slurm
def test_the_class_console_says_what_is_judged_and_where_the_leaderboard_goes(class_runs):
    out = class_runs["doctor"]
    assert "cudalab plan: a class run (snakemake exercises); no experiment is measured" \
        in out.log, out.log
    assert ("cudalab: this class run judges 2 of 2 submission(s) of subs for exercise "
            "vector_add on GPU model fake; the course's kernels and cuBLAS as the baseline. "
            f"Leaderboard: {LEADERBOARD}") in out.log, out.log
    assert "cudalab: submitting 4 Slurm job(s) with sbatch: doctor_class (--gpus=fake:1), " \
        "exercise_judge alice (--gpus=fake:1)" in out.log, out.log
    assert "report written to" not in out.log and "results/report.html" not in out.log


@pytest.mark.slurm
def test_judges_never_start_where_the_doctor_finds_no_gpu(class_runs):
    out = class_runs["doctor"]
    assert out.returncode != 0, out.log
    doctors = submitted(out.log, "doctor")
    assert len(doctors) == 1 and "doctor_class" in doctors[0][1], out.log
    assert not submitted(out.log, "exercise"), "a judge job was queued\n" + out.log
    assert "measure" not in {p.split("rule_")[1].split("/")[0] for _, p in submitted(out.log, "")}
    assert not (out.workdir / "results" / "class" / "vector_add" / "verdicts").exists()
    assert "doctor_class.md; no judge job was submitted)" in out.log, out.log
    # the node holds a (fake) GPU it cannot use: asking for one again would not help
    table = (out.workdir / "results" / "doctor" / "doctor_class.md").read_text()
    assert "this Slurm job holds GPU" in table and "a Slurm job with --gpus" not in table
    assert "plain `snakemake` (without --profile slurm)" in table, table


@pytest.mark.slurm
def test_a_judge_on_a_gpu_less_node_fails_and_writes_no_verdict(class_runs):
    out = class_runs["nodoc"]
    assert out.returncode != 0, out.log
    assert len(submitted(out.log, "exercise_judge")) == 1, out.log
    assert "error: NoGpuError: no usable CUDA GPU" in out.log, out.log
    assert "This is Slurm job" in out.log, "the message names the job and node\n" + out.log
    verdicts = out.workdir / "results" / "class" / "vector_add" / "verdicts"
    assert not (verdicts / "carol.json").exists(), "a 'compiled' verdict was written"


@pytest.mark.slurm
def test_plan_refuses_a_class_gpu_model_the_cluster_lacks(slurm_cluster, tmp_path):
    config = _class_config(tmp_path, ["dave"], model="v100")
    proc = subprocess.run([sys.executable, "-m", "cudalab.cli", "plan", str(config)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "slurm.gpu_model: no node of partition 'gpu' has GPU model 'v100'" in out, out
