"""Real Slurm for tests marked `slurm`: a one-node cluster (slurmctld + slurmd + munged)
started once per session by tests/slurm/one_node_slurm.sh and stopped by PID afterwards.

Skipped, with the reason, where that cannot work: not root, Slurm or munge not installed
(`apt-get install -y slurm-wlm munge`), the Slurm executor plugin missing, or a Slurm
config that is not ours at /etc/slurm/slurm.conf (a real cluster: never touched).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "one_node_slurm.sh"
OUR_MARK = "# written by cudalab tests/slurm/one_node_slurm.sh"


def slurm_unavailable() -> str:
    """Why the slurm tests cannot run here ('' if they can)."""
    if os.geteuid() != 0:
        return "needs root (starts slurmctld, slurmd and munged)"
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "munged")
               if shutil.which(b) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install -y slurm-wlm munge)"
    for mod in ("snakemake_executor_plugin_slurm", "snakemake_executor_plugin_slurm_jobstep"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} not installed (pip install snakemake-executor-plugin-slurm)"
    conf = Path("/etc/slurm/slurm.conf")
    if conf.exists() and not conf.read_text().startswith(OUR_MARK):
        return f"{conf} belongs to a real Slurm installation; not touching it"
    return ""


def pytest_collection_modifyitems(config, items):
    # get_closest_marker, not item.keywords: "slurm" is also this folder's name
    mine = [i for i in items if i.get_closest_marker("slurm") is not None]
    if not mine:
        return
    why = slurm_unavailable()
    if why:
        skip = pytest.mark.skip(reason=f"Slurm test: {why}")
        for item in mine:
            item.add_marker(skip)


@pytest.fixture(scope="package")
def slurm_cluster(tmp_path_factory):
    """Bring the one-node cluster up for tests/slurm; yields its state directory. Down
    again before the rest of the suite: a `sinfo` that answers changes what `cudalab plan`
    says (and its exit code) in the tests that follow."""
    state = tmp_path_factory.mktemp("slurm-state")

    # 4 CPU slots even on a 2-core runner (oversubscribed) and 3 fake GPUs of 2 models: the three
    # workflow runs of test_slurm.py each get their one-CPU job started at once
    # two GPU models (gres types), so GPU-model requests and sweeps are tested for real
    env = {**os.environ, "SLURM_CPUS": str(max(4, os.cpu_count() or 1)),
           "FAKE_GPU_TYPES": "fake:2,h100:1"}

    def script(cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), cmd, str(state)], capture_output=True,
                              text=True, timeout=120, env=env)

    up = script("up")
    if up.returncode != 0:
        down = script("down")
        pytest.fail(f"one_node_slurm.sh up failed (rc {up.returncode}):\n{up.stdout}\n"
                    f"{up.stderr}\n-- down --\n{down.stdout}{down.stderr}")
    def stop() -> None:
        down = script("down")
        assert down.returncode == 0, f"one_node_slurm.sh down failed:\n{down.stderr}"
        for pidfile in ("slurmctld.pid", "slurmd.pid"):
            assert not (state / "run" / pidfile).exists(), f"{pidfile} left behind"

    _STOP.append(stop)
    try:
        yield state
    finally:
        _stop_cluster()


# The cluster's `down`, while it is up. A "package" fixture of a folder without __init__.py
# lives until the session ends, so the cluster also goes down after the last test of this
# folder (pytest_runtest_teardown): tests that run after it must not see a `sinfo` answer.
_STOP: list = []


def _stop_cluster() -> None:
    while _STOP:
        _STOP.pop()()


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None or HERE not in Path(str(nextitem.fspath)).parents:
        _stop_cluster()
