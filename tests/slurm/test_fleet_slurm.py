"""Fleet acceptance on the real one-node Slurm (gres fake:2 + h100:1: three GPUs that cannot
compute). What can be checked without GPUs: `cudalab accept --slurm` submits one job per node
of the partition asking for all of its GPUs, the job runs on that node and leaves its record
(acceptance cannot run there: no usable GPU), and the fleet page is built from what each
node's job wrote, here also the committed results of two H200s written by a job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cudalab import fleet, site

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "reports" / "reference" / "multi-gpu-2xH200-2026-11-27"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.slurm


def _scontrol(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                          timeout=30).stdout


def test_one_job_per_node_holding_all_its_gpus_and_the_fleet_page(slurm_cluster, tmp_path):
    out = tmp_path / "fleet"
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "accept", "--slurm",
                        "--partition", "gpu", "--config", str(ROOT / "config.yaml"),
                        "--out", str(out), "--time-min", "5"], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=300)
    nodes = [n for n in site.read_sinfo() if n.partition == "gpu"]
    jobs = json.loads((out / fleet.JOBS).read_text())["jobs"]
    assert sorted(j["node"] for j in jobs) == sorted(n.name for n in nodes), jobs
    assert all(j["job_id"] for j in jobs), "one job for every node"
    for job, node in zip(sorted(jobs, key=lambda j: j["node"]), sorted(nodes,
                                                                      key=lambda n: n.name)):
        info = _scontrol(job["job_id"])
        assert f"NodeList={node.name}" in info, info
        assert re.search(rf"TresPerNode=\S*gres[:/]gpu:{node.n_gpus}\b", info), info
        assert f"gres/gpu={node.n_gpus}," in info, "the allocation holds all its GPUs"
        rec = json.loads((out / node.name / fleet.NODE_RECORD).read_text())
        assert rec["slurm_job_id"] == job["job_id"] and rec["exit"] == 2, rec
    assert r.returncode == 2, r.stdout + r.stderr  # no node could be judged: no real GPU
    page = (out / "fleet.html").read_text()
    assert "cannot run" in page and "0 usable GPU(s)" in page
    assert f"{len(nodes)} node(s), 0 GPU(s) judged" in page


def test_the_fleet_page_from_results_a_job_wrote(slurm_cluster, tmp_path, monkeypatch):
    """Each node's job writes the H200s' acceptance (GPU 1 slowed on purpose) where its own
    measurement would go: the fleet collects it from the folders the jobs wrote."""
    out = tmp_path / "fleet"

    def stand_in(job: fleet.NodeJob, folder: Path) -> str:
        files = " ".join(str(REF / "accept-planted" / f) for f in
                         ("accept.csv", "points.csv", "accept.html"))
        record = (f"from pathlib import Path; from cudalab import fleet; "
                  f"fleet.write_node_record(Path({str(folder)!r}), 1, [])")
        return (f"cp {files} {REF / 'links.csv'} {folder}/ && "
                f"{sys.executable} -c {json.dumps(record)}")

    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])  # sbatch passes the environment on
    jobs = fleet.submit("gpu", "config.yaml", out, command=stand_in, time_min=5)
    fleet.wait(jobs, timeout_s=240)
    nodes, gpus = fleet.collect(out)
    assert list(nodes["verdict"]) == ["outlier"] * len(jobs), nodes
    bad = gpus[gpus["verdict"] != "ok"]
    assert list(bad["gpu_index"]) == [1] * len(jobs)
    page = fleet.write(out, nodes, gpus).read_text()
    assert "1 outlier GPU(s) on 1 node(s)" in page or len(jobs) != 1
    for j in jobs:
        rec = json.loads((out / j.node / fleet.NODE_RECORD).read_text())
        assert rec["slurm_job_id"] == j.job_id, "written by the node's job"
