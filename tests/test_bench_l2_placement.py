"""scripts/bench_l2_placement.py's CPU-side pieces: the summary and the argument checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_l2_placement

    return bench_l2_placement


def test_spread_of_the_allocations_and_of_one_allocations_launches(bench):
    s = bench.spread([150.4, 134.2, 129.3, 141.0], [0.01, 0.02, 0.0, 0.01])
    assert (s["min"], s["max"], s["median"]) == (129.3, 150.4, pytest.approx(137.6))
    assert s["max_over_min"] == pytest.approx(150.4 / 129.3)
    assert s["launch_spread"] == 0.02


@pytest.mark.parametrize("args", [["--sizes", "100"], ["--sizes", "128"],
                                  ["--allocations", "1"]])
def test_bad_arguments_are_named_before_any_gpu_work(bench, args, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(args)
    assert exc.value.code == 2
    assert "--sizes must be multiples of 128" in capsys.readouterr().err
