"""Shared fixtures and the suite's selection rules.

* GPU tests (marked gpu) are skipped where no CUDA device is visible.
* Slow tests (marked slow: each takes seconds to minutes, e.g. real nvcc builds of every
  kernel, real Snakemake runs, a nested venv) are left out of a plain `pytest`; `--slow` (or
  CUDALAB_SLOW=1) adds them, as CI does. Naming files or a marker expression (`pytest -m gpu`,
  `pytest tests/test_x.py`) runs what was named, slow tests included.
* No test sees this machine's Slurm: its commands are hidden from PATH (see
  `path_without_slurm`), except for the tests marked slurm, which start their own cluster.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import pytest
import yaml
from worker_groups import worker_group

ROOT = Path(__file__).resolve().parent.parent
# the Slurm commands a test must not reach on a login node (or on CI with slurm-wlm installed)
SLURM_COMMANDS = frozenset({
    "sinfo", "sbatch", "squeue", "scancel", "sacct", "scontrol", "srun", "salloc", "sacctmgr",
    "sstat", "sshare", "sprio", "sreport", "sattach", "sbcast", "sdiag", "strigger"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (CI does; also CUDALAB_SLOW=1)")


def _run_slow(config: pytest.Config) -> bool:
    """Whether slow tests run: asked for, or the selection was named (files, -m, -k)."""
    if config.getoption("--slow") or os.environ.get("CUDALAB_SLOW") == "1":
        return True
    return bool(config.getoption("markexpr") or config.getoption("keyword")
                or config.getoption("file_or_dir"))


def _deselect_slow(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # a real cluster or browser takes seconds to start: slow by nature
        if item.get_closest_marker("slurm") or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.slow)
    if _run_slow(config):
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    if slow:
        items[:] = [i for i in items if i.get_closest_marker("slow") is None]
        config.hook.pytest_deselected(items=slow)
        config.stash[_SLOW_LEFT_OUT] = len(slow)
        if hasattr(config, "workeroutput"):  # a pytest-xdist worker: tell the controller
            config.workeroutput["cudalab_slow_left_out"] = len(slow)


_SLOW_LEFT_OUT = pytest.StashKey[int]()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (controller side)
def pytest_testnodedown(node, error) -> None:
    """Under `-n`, the workers collect (and leave out the slow tests): their count, for the
    summary's line below (every worker collects the whole suite: one count)."""
    n = getattr(node, "workeroutput", {}).get("cudalab_slow_left_out", 0)
    if n:
        node.config.stash[_SLOW_LEFT_OUT] = n


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    n = config.stash.get(_SLOW_LEFT_OUT, 0)
    if n:
        terminalreporter.write_line(f"cudalab: {n} slow tests left out; `pytest --slow` runs "
                                    "them too (CI does)")


def _gpu_available() -> tuple[bool, str]:
    try:
        import pycuda.driver as cuda

        cuda.init()
        if cuda.Device.count() > 0:
            return True, ""
        return False, "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any import or driver failure means no GPU
        return False, f"no usable CUDA GPU ({type(exc).__name__}: {exc})"


def _gpu_count() -> int:
    """GPUs this process may use: NVML's, less what CUDA_VISIBLE_DEVICES hides (0 without a
    driver). NVML starts no CUDA context, so the tests that pin a GPU later are unaffected;
    `nvidia-smi -L` would count GPUs that CUDA_VISIBLE_DEVICES hides (seen failing a
    2-GPU test pinned to one GPU of four)."""
    from cudalab import gpu_slots
    return len(gpu_slots.usable_gpus({}))


def _skip_multi_gpu(items) -> None:
    """Tests marked multi_gpu(n) are skipped where fewer than n GPUs are here."""
    wanted = [(i, i.get_closest_marker("multi_gpu")) for i in items]
    wanted = [(i, m.args[0] if m.args else 2) for i, m in wanted if m is not None]
    if not wanted:
        return
    have = _gpu_count()
    for item, n in wanted:
        if have < n:
            item.add_marker(pytest.mark.skip(reason=f"needs {n} GPUs, {have} here"))


def _group_for_workers(items) -> None:
    """With pytest-xdist (`pytest -n auto`, as CI runs it), the tests of a group run on one
    worker, one after another. Only read under `--dist loadgroup`; a plain run ignores it."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(worker_group(item)))


@pytest.hookimpl(wrapper=True)  # a wrapper runs before xdist's hook, which picks `load`
def pytest_cmdline_main(config: pytest.Config):
    """`pytest -n auto` (pytest-xdist) distributes by the groups above: as if `--dist
    loadgroup` were given (xdist's own default, `load`, would split a file's tests and the
    Slurm tests over workers). An explicit `--dist` is kept."""
    if getattr(config.option, "numprocesses", None) and config.option.dist == "no":
        config.option.dist = "loadgroup"
    return (yield)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook (controller side)
def pytest_configure_node(node) -> None:
    """A worker parses the command line again, without the choice above: tell it."""
    node.workerinput["cudalab_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    _deselect_slow(config, items)
    if getattr(config, "workerinput", {}).get("cudalab_loadgroup"):
        config.option.loadgroup = True  # read by xdist's hook, which runs after this one
    _group_for_workers(items)
    _skip_multi_gpu(items)
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


def path_without_slurm(path: str, farm: Path) -> str:
    """`path` with Slurm's commands left out: a folder holding any of them is replaced by a
    folder of links to everything else in it (the Python and shell tools stay reachable)."""
    out = []
    for i, entry in enumerate(path.split(os.pathsep)):
        folder = Path(entry)
        if not entry or not any((folder / c).exists() for c in SLURM_COMMANDS):
            out.append(entry)
            continue
        copy_dir = farm / f"{i}-{folder.name}"
        copy_dir.mkdir(parents=True, exist_ok=True)
        for f in folder.iterdir():
            if f.name not in SLURM_COMMANDS and not (copy_dir / f.name).exists():
                (copy_dir / f.name).symlink_to(f)
        out.append(str(copy_dir))
    return os.pathsep.join(out)


@pytest.fixture(scope="session")
def _path_without_slurm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return path_without_slurm(os.environ.get("PATH", ""), tmp_path_factory.mktemp("no-slurm"))


@pytest.fixture(autouse=True)
def _no_slurm_of_this_machine(request: pytest.FixtureRequest,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see no Slurm (as on a laptop), whatever this machine has; subprocesses too.
    Tests marked slurm start and use their own cluster instead."""
    if request.node.get_closest_marker("slurm") is None:
        monkeypatch.setenv("PATH", request.getfixturevalue("_path_without_slurm"))
