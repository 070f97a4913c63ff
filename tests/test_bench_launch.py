"""scripts/bench_launch.py's CPU-side pieces: reading Nsight Compute's CSV."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')
ROW = ('"{i}","4242","python3.12","127.0.0.1","vector_add","1","7","(256, 1, 1)",'
       '"(196, 1, 1)","0","9.0","Command line profiler metrics","{metric}","{unit}","{value}"')
NCU_CSV = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    '==PROF== Profiling "vector_add" - 0: 0%....50%....100% - 1 pass',
    HEAD,
    ROW.format(i=0, metric="gpu__time_duration.sum", unit="usecond", value="2.91"),
    ROW.format(i=1, metric="gpu__time_duration.sum", unit="nsecond", value="2,048"),
    ROW.format(i=2, metric="sm__cycles_elapsed.avg", unit="cycle", value="3,900"),
    "==PROF== Disconnected from process 4242",
])


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_launch

    return bench_launch


def test_ncu_csv_gives_seconds_per_launch_in_any_unit(bench):
    assert bench.parse_ncu_csv(NCU_CSV) == pytest.approx([2.91e-6, 2.048e-6])
    assert bench.parse_ncu_csv("==PROF== ERR_NVGPUCTRPERM\n") == []


def test_ncu_absent_is_a_reason_not_an_error(bench, monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    assert bench.ncu_times("vector_add_50000") == "ncu (Nsight Compute) is not on PATH"
