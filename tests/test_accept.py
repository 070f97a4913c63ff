"""Node acceptance (cudalab accept): the verdict of each GPU against the others' median, and
the command's plumbing (one pinned run folder per GPU, the table and the page). The GPU
machine runs it for real (reports/reference/); here the GPUs come from CUDALAB_TEST_GPUS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cudalab import accept, result_folders
from cudalab.gpu_slots import TEST_GPUS_ENV, Gpu

ROOT = Path(__file__).resolve().parent.parent
GPUS = {i: Gpu(i, f"GPU-0000000{i}-aaaa", f"00000000:1{i}:00.0", "NVIDIA H100")
        for i in range(4)}


def run_of(i: int, times: dict[str, float], spread: float = 0.005, seed: int = 0
           ) -> result_folders.Run:
    """A run of kernel points with these median times (s), trial spread `spread`."""
    rng = np.random.default_rng(seed + i)
    rows = [{"experiment": "vector_add", "point_id": pid, "variant": "gpu", "gpu": "H100",
             "status": "ok", "median_s": t * (1 + rng.normal(0, spread / 3)),
             "noise": spread, "n_samples": 50, "method": "events", "trial_spread": spread,
             "floor_s": 1e-7, "blocks": 100000.0, "sm_count": 132.0}
            for pid, t in times.items()]
    return result_folders.Run(f"GPU {i}", Path("."), "H100",
                       pd.DataFrame(rows).reindex(columns=result_folders.POINT_COLS))


TIMES = {f"p{k}": 1e-3 * (k + 1) for k in range(6)}


def test_equal_gpus_are_all_ok():
    table, _ = accept.judge({i: run_of(i, TIMES) for i in range(4)})
    assert (table["slower"] == 0).all(), table


def test_a_gpu_30_percent_slower_is_the_one_flagged():
    slow = {k: v * 1.3 for k, v in TIMES.items()}
    runs = {0: run_of(0, TIMES), 1: run_of(1, TIMES), 2: run_of(2, slow), 3: run_of(3, TIMES)}
    table, detail = accept.judge(runs)
    flagged = table[table["slower"] > 0]["gpu_index"].tolist()
    assert flagged == [2], table
    assert table.set_index("gpu_index").loc[2, "worst_ratio"] == pytest.approx(1.3, rel=0.05)
    assert set(detail["gpu_index"]) == {0, 1, 2, 3}


def test_with_two_gpus_the_slow_one_is_slower_and_the_other_only_faster():
    slow = {k: v * 1.3 for k, v in TIMES.items()}
    table, _ = accept.judge({0: run_of(0, TIMES), 1: run_of(1, slow)})
    t = table.set_index("gpu_index")
    assert t.loc[1, "slower"] == len(TIMES) and t.loc[0, "slower"] == 0
    assert t.loc[0, "faster"] == len(TIMES)


def test_a_difference_inside_the_noise_flags_nothing():
    noisy = {k: v * 1.04 for k, v in TIMES.items()}  # under the 5 % threshold
    table, _ = accept.judge({0: run_of(0, TIMES), 1: run_of(1, noisy), 2: run_of(2, TIMES)})
    assert (table["slower"] == 0).all(), table


def test_health_columns_make_an_outlier_even_when_times_agree(tmp_path):
    table, _ = accept.judge({i: run_of(i, TIMES) for i in range(2)})
    before = {GPUS[0].uuid: {"ecc_uncorrected": 0}, GPUS[1].uuid: {"ecc_uncorrected": 0}}
    after = {GPUS[0].uuid: {"ecc_uncorrected": 0},
             GPUS[1].uuid: {"ecc_uncorrected": 2, "remap_pending": True}}
    folders = {i: tmp_path / f"gpu{i}" for i in range(2)}
    out = accept.verdicts(table, GPUS, before, after, folders).set_index("gpu_index")
    assert out.loc[0, "verdict"] == "ok"
    assert out.loc[1, "verdict"] == "outlier"
    assert "2 new ecc uncorrected" in out.loc[1, "why"] and "remapping" in out.loc[1, "why"]


def test_the_page_names_each_gpu_and_escapes_what_it_shows(tmp_path):
    table, _ = accept.judge({i: run_of(i, TIMES) for i in range(2)})
    gpus = {0: GPUS[0], 1: Gpu(1, GPUS[1].uuid, GPUS[1].pci_bus_id, "<b>odd</b>")}
    out = accept.verdicts(table, gpus, {}, {}, {i: tmp_path for i in range(2)})
    accept.write_page(out, tmp_path / "accept.html", "node1", 12.0)
    page = (tmp_path / "accept.html").read_text()
    assert "all 2 GPUs agree within the noise" in page
    assert "&lt;b&gt;odd&lt;/b&gt;" in page and "<b>odd</b>" not in page


def test_one_gpu_is_refused_with_the_reason(tmp_path, capsys):
    env = {TEST_GPUS_ENV: json.dumps([GPUS[0].__dict__])}
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "accept", "--out",
                        str(tmp_path / "a")], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 2
    assert "compares GPUs with each other: 1 usable GPU(s)" in r.stdout + r.stderr


@pytest.mark.slow
def test_the_command_runs_one_pinned_folder_per_gpu(tmp_path):
    """No GPU here: every GPU point is not measured, so both GPUs are outliers for that
    reason; what is checked is the plumbing: a run folder per GPU, each job pinned to its
    GPU, the table and the page."""
    env = {TEST_GPUS_ENV: json.dumps([GPUS[0].__dict__, GPUS[1].__dict__]),
           "XDG_RUNTIME_DIR": str(tmp_path)}
    run_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "accept", "--out",
                        str(tmp_path / "a")], capture_output=True, text=True, cwd=ROOT,
                       env={**run_env, **env, "PYTHONPATH": str(ROOT)}, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    table = pd.read_csv(tmp_path / "a" / "accept.csv")
    assert table["gpu_index"].tolist() == [0, 1]
    assert table["why"].str.contains("not ok").all()
    for i in (0, 1):
        log = (tmp_path / "a" / f"gpu{i}.log").read_text()
        assert f"CUDA_VISIBLE_DEVICES='{GPUS[i].uuid}'" in log, log[-1500:]
        assert (tmp_path / "a" / f"gpu{i}" / "raw" / "vector_add" / "_manifest.json").exists()
    assert "GPU 1 (00000000:11:00.0): outlier" in out
    assert (tmp_path / "a" / "accept.html").exists()
