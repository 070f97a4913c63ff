"""The real workflow with a lesson split over two GPUs (listed through CUDALAB_TEST_GPUS,
gpu_slots' seam for NVML: this machine has no GPU, so the GPU points are recorded as not
measured): a shard job per GPU, each pinned to its own, the merged manifest and one table,
a resume that runs nothing and one that runs only the shard that was lost; with one GPU or
max_shards: 1, the jobs of a lesson are the one measure job of before. The split is the
default (max_shards: 8)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cudalab import gpu_slots
from cudalab.gpu_slots import Gpu

ROOT = Path(__file__).resolve().parent.parent
TWO = [Gpu(0, "GPU-aaaaaaaa-0000", "00000000:18:00.0", "NVIDIA H100"),
       Gpu(1, "GPU-bbbbbbbb-1111", "00000000:2A:00.0", "NVIDIA H100")]
# 32 points (16 sizes x cpu and tiled): large enough for two shards of 16 (MIN_POINTS_PER_SHARD)
SIZES = [16 + 8 * i for i in range(16)]
CONFIG = (f"measurement: {{budget_s: 0.02, min_samples: 3, trials: 1}}\n"
          f"experiments:\n  matmul:\n    sizes: {SIZES}\n"
          "    variants: [cpu, tiled]\n    tiles: [16]\n")
SPLIT = CONFIG  # the default (max_shards: 8) splits: checked on 4 H200s (docs/multi-gpu.md)
MIXED = [TWO[0], Gpu(1, "GPU-cccccccc-2222", "00000000:2A:00.0", "NVIDIA L40S")]
RAW = Path("results/raw/matmul")


def _snakemake(workdir: Path, gpus: list[Gpu], *extra: str, config: str = SPLIT
               ) -> tuple[int, str]:
    (workdir / "c.yaml").write_text(config)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
           str(workdir), "--cores", "2", "results/results.csv", "--configfile", "c.yaml",
           *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",
                                                             "SLURM_JOB_ID")}
    env |= {"XDG_RUNTIME_DIR": str(workdir),
            gpu_slots.TEST_GPUS_ENV: json.dumps([g.__dict__ for g in gpus])}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    return r.returncode, r.stdout + r.stderr


def _jobs(out: str) -> dict[str, int]:
    """Snakemake's job stats table: rule -> count."""
    block = out[out.index("Job stats:"):].split("total")[0] if "Job stats:" in out else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}


def _as_measured(path: Path) -> None:
    """The manifest as a GPU machine leaves it: no point left not measured (here the GPU
    points are, and a GPU-less run's manifest is stale by design: runner.rerun_reasons)."""
    m = json.loads(path.read_text())
    m["points"] = {k: "ok" for k in m["points"]}
    for shard in m.get("shards") or []:
        shard["points"] = {k: "ok" for k in shard["points"]}
    path.write_text(json.dumps(m))


@pytest.mark.slow
def test_a_lesson_runs_in_one_shard_per_gpu_merges_and_resumes(tmp_path):
    rc, out = _snakemake(tmp_path, TWO)
    assert rc == 0, out[-3000:]
    assert _jobs(out) == {"doctor": 1, "measure_shard": 2, "merge_shards": 1, "aggregate": 1}
    assert "lessons split over the GPUs (max_shards: 8): matmul in 2 shards" in out
    pinned = set()
    for tag in ("1of2", "2of2"):
        log = (tmp_path / f"results/logs/measure_matmul_shard-{tag}.log").read_text()
        assert f"16 grid points (8 on the GPU) in shard {tag[0]} of 2" in log
        pinned |= set(re.findall(r"CUDA_VISIBLE_DEVICES='(GPU-[\w-]+)'", log))
    assert pinned <= {g.uuid for g in TWO} and pinned, "each shard pinned itself to a GPU"
    merged = json.loads((tmp_path / RAW / "_manifest.json").read_text())
    assert [s["shard"] for s in merged["shards"]] == ["1of2", "2of2"]
    assert len(merged["points"]) == 32 and merged["counts"]["not_measured"] == 16
    table = pd.read_csv(tmp_path / "results/results.csv")
    assert len(table) == 32 and table["point_id"].is_unique
    assert set(table["job_id"]) == {s["job_id"] for s in merged["shards"]}

    # GPU points left not measured (no GPU here): the same command runs both shards again
    rc, out = _snakemake(tmp_path, TWO)
    assert rc == 0, out[-3000:]
    assert "matmul: 16 GPU point(s) not measured yet" in out
    assert _jobs(out) == {"doctor": 1, "measure_shard": 2, "merge_shards": 1, "aggregate": 1}

    # finished (as on a GPU machine): the same command runs nothing
    for name in ("_manifest.json", "_shard-1of2.json", "_shard-2of2.json"):
        _as_measured(tmp_path / RAW / name)
    shard1 = tmp_path / RAW / "_shard-1of2.json"
    before = shard1.stat().st_mtime_ns
    rc, out = _snakemake(tmp_path, TWO)
    assert rc == 0, out[-3000:]
    assert "measure_shard" not in _jobs(out) and "merge_shards" not in _jobs(out), out[-3000:]

    # a damaged record of shard 2's: shard 2 alone runs again (its rerun token), then the merge
    victim = sorted(json.loads((tmp_path / RAW / "_shard-2of2.json").read_text())["points"])[0]
    (tmp_path / RAW / f"{victim}.json").write_text("{damaged")
    rc, out = _snakemake(tmp_path, TWO)
    assert rc == 0, out[-3000:]
    assert _jobs(out) == {"doctor": 1, "measure_shard": 1, "merge_shards": 1, "aggregate": 1}
    assert "--shard 2of2" in out and "--shard 1of2" not in out
    assert json.loads((tmp_path / RAW / f"{victim}.json").read_text())["point_id"] == victim
    for name in ("_manifest.json", "_shard-2of2.json"):
        _as_measured(tmp_path / RAW / name)

    # stopped while shard 2 ran (Ctrl-C): its manifest, the lesson's and the table are
    # missing; the rerun measures shard 2 alone, then merges
    for lost in (RAW / "_shard-2of2.json", RAW / "_manifest.json", "results/results.csv"):
        (tmp_path / lost).unlink()
    rc, out = _snakemake(tmp_path, TWO)
    assert rc == 0, out[-3000:]
    assert _jobs(out).get("measure_shard") == 1 and _jobs(out).get("merge_shards") == 1
    assert "--shard 2of2" in out and "--shard 1of2" not in out
    assert shard1.stat().st_mtime_ns == before, "the finished shard was not run again"
    assert len(json.loads((tmp_path / RAW / "_manifest.json").read_text())["points"]) == 32


@pytest.mark.slow
@pytest.mark.parametrize("gpus,config", [
    (TWO[:1], SPLIT), (TWO, CONFIG + "max_shards: 1\n"), (MIXED, SPLIT)],
    ids=["one-gpu", "max_shards-1", "mixed-models"])
def test_with_one_gpu_or_max_shards_1_a_lesson_is_one_job(tmp_path, gpus, config):
    rc, out = _snakemake(tmp_path, gpus, "-n", config=config)
    assert rc == 0, out[-3000:]
    assert _jobs(out) == {"doctor": 1, "measure": 1, "aggregate": 1}
    assert "lessons split" not in out
    if gpus is MIXED:
        assert ("no lesson is split over the GPUs: its GPUs are of different models "
                "(NVIDIA H100, NVIDIA L40S)") in out
