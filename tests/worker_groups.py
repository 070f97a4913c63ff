"""Which pytest-xdist worker group a test belongs to (tests/conftest.py marks every test with
it; `pytest -n auto` then runs a group's tests on one worker, one after another)."""

from __future__ import annotations

from pathlib import Path

SLURM_TESTS = Path(__file__).resolve().parent / "slurm"


def worker_group(item) -> str:
    """The group of a collected test: its file (its module fixtures, e.g. a Snakemake run,
    are made once), but every test of tests/slurm in one (one cluster), and every test
    marked gpu in one (on a GPU machine they time kernels: never two at once on a GPU)."""
    path = Path(str(item.fspath))
    if item.get_closest_marker("gpu") is not None:
        return "gpu"
    return "slurm" if SLURM_TESTS in path.parents else path.name
