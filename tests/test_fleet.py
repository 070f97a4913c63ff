"""Fleet acceptance under Slurm (cudalab/fleet.py) without a cluster: which nodes get a job
and what it asks for, and the fleet page from real per-node results (the committed accept
CSVs of two H200s, unchanged and with GPU 1 slowed on purpose). The submission to a real
Slurm is tests/slurm/test_fleet_slurm.py."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pandas as pd

from cudalab import fleet, site

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "reports" / "reference" / "multi-gpu-2xH200-2026-11-27"
SINFO = """\
a01|gpu*|64|512000|gpu:h100:8(S:0-1)|2-00:00:00|up|idle|
a02|gpu*|64|512000|gpu:h100:8(S:0-1)|2-00:00:00|up|mixed|
a03|gpu*|64|512000|gpu:h100:8(S:0-1)|2-00:00:00|up|drained|
a04|gpu*|64|512000|gpu:h100:1|2-00:00:00|up|idle|
b01|big|128|1024000|gpu:h200:4|2-00:00:00|up|idle|
"""


def test_one_job_per_usable_node_of_the_partition_asking_for_all_its_gpus(tmp_path):
    jobs = fleet.plan(site.parse_sinfo(SINFO), "gpu")
    assert [(j.node, j.gpus, bool(j.skip)) for j in jobs] == [
        ("a01", 8, False), ("a02", 8, False), ("a03", 8, True), ("a04", 1, True)]
    assert "drained" in jobs[2].skip and "1 GPU(s)" in jobs[3].skip
    args = fleet.sbatch_args(jobs[0], "gpu", tmp_path, "echo hi", account="proj")
    assert {"--nodelist=a01", "--nodes=1", "--gpus-per-node=8", "--exclusive",
            "--partition=gpu", "--account=proj", f"--output={tmp_path}/a01/slurm-%j.out"} \
        <= set(args)
    assert args[-2:] == ["--wrap", "echo hi"]
    cmd = fleet.node_command("my config.yaml", tmp_path / "a01")
    assert "-m cudalab.fleet node --config 'my config.yaml' --out" in cmd


def fleet_folder(tmp_path: Path) -> Path:
    """Four nodes as their jobs would leave them: two with real results, one whose
    acceptance could not run, one whose job left nothing."""
    out = tmp_path / "fleet"
    for node, run in (("n1", "accept-unchanged"), ("n2", "accept-planted")):
        shutil.copytree(REF / run, out / node)
        shutil.copy(REF / "links.csv", out / node / "links.csv")
        fleet.write_node_record(out / node, 1 if run.endswith("planted") else 0, [])
    (out / "n3").mkdir()
    fleet.write_node_record(out / "n3", 2, [
        "error: node acceptance compares GPUs with each other: 0 usable GPU(s) here"])
    (out / "n4").mkdir()
    (out / "n4" / "slurm-77.out").write_text("slurmstepd: error: *** JOB 77 CANCELLED ***\n")
    (out / fleet.JOBS).write_text(json.dumps({"partition": "gpu", "jobs": [
        {"node": n, "gpus": 2, "skip": "", "job_id": str(70 + i)}
        for i, n in enumerate(["n1", "n2", "n3", "n4"], 4)]
        + [{"node": "n5", "gpus": 1, "skip": "1 GPU(s) in its gres", "job_id": ""}]}))
    return out


def test_the_fleet_table_and_page_from_real_per_node_results(tmp_path):
    out = fleet_folder(tmp_path)
    nodes, gpus = fleet.collect(out)
    v = nodes.set_index("node")["verdict"].to_dict()
    assert v == {"n1": "ok", "n2": "outlier", "n3": "cannot run", "n4": "no result",
                 "n5": "not run"}
    assert len(gpus) == 4 and set(gpus["node"]) == {"n1", "n2"}
    bad = gpus[gpus["verdict"] != "ok"]
    assert list(zip(bad["node"], bad["gpu_index"])) == [("n2", 1)]
    n = nodes.set_index("node")
    assert "GPU 1: 6 kernel point(s) slower" in n.loc["n2", "why"]
    assert "0 usable GPU(s)" in n.loc["n3", "why"]
    assert "job 77 left no node.json" in n.loc["n4", "why"] and "CANCELLED" in n.loc["n4", "why"]
    page = fleet.write(out, nodes, gpus).read_text()
    assert "5 node(s), 4 GPU(s) judged: 1 outlier GPU(s) on 1 node(s); 3 node(s) without" \
        in page
    assert page.index(">n2</a>") < page.index(">n1</a>"), "outlier nodes first"
    assert "<a href='n2/accept.html'>" in page and "00000000:00:07.0" in page
    csv = pd.read_csv(out / "fleet.csv")
    assert list(csv.columns[:6]) == ["node", "gpu_index", "name", "pci_bus_id", "uuid",
                                     "verdict"]


def test_the_command_collects_again_and_its_exit_says_what_it_found(tmp_path, capsys):
    out = fleet_folder(tmp_path)
    a = argparse.Namespace(out=str(out), collect=True, partition="", config="config.yaml",
                           account="", time_min=30, no_wait=False, slurm=False)
    assert fleet.run(a) == 1, "an outlier GPU"
    shutil.rmtree(out / "n2")
    assert fleet.run(a) == 2, "nodes without a verdict and no outlier"
    said = capsys.readouterr().out
    assert "n3: cannot run: node acceptance compares GPUs" in said
    empty = argparse.Namespace(**{**vars(a), "out": str(tmp_path / "none")})
    assert fleet.run(empty) == 2
