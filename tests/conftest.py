"""Shared fixtures. GPU tests (marked gpu) are skipped where no CUDA device is visible."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _gpu_available() -> tuple[bool, str]:
    try:
        import pycuda.driver as cuda

        cuda.init()
        if cuda.Device.count() > 0:
            return True, ""
        return False, "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any import or driver failure means no GPU
        return False, f"no usable CUDA GPU ({type(exc).__name__}: {exc})"


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    ok, why = _gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {why}; run with pytest -m gpu on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cpu_config() -> dict:
    return yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())


@pytest.fixture
def validated():
    """validated(dict) -> a validated deep copy (defaults filled)."""
    from cudalab import config as cfg

    return lambda c: cfg.validate(copy.deepcopy(c))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A scratch working directory for workflow runs (results/ never lands in the repo)."""
    shutil.copy(ROOT / "tests" / "data" / "config.cpu.yaml", tmp_path / "config.cpu.yaml")
    return tmp_path
