"""Real Slurm for tests marked `slurm`: a one-node cluster (slurmctld + slurmd + munged)
started once per session by tests/slurm/one_node_slurm.sh and stopped by PID afterwards.

With accounting where Debian's `mariadb-server slurmdbd` are installed (CI installs them):
SLURM_ACCT=slurmdbd adds a MariaDB and slurmdbd of the cluster's own, so sacct answers as on
a site's cluster (about 3 s more to start). The profiles that set `slurm-status-command:
squeue` work the same either way; the runs of tests/slurm/profile_sacct (the plugin's default
status command, sacct) need it: `slurm_accounting` says whether it is on, and why not.
CUDALAB_SLURM_ACCT=none|slurmdbd chooses instead of the packages found.

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


ACCT_BINARIES = ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb", "sacctmgr", "sacct")


def accounting_unavailable() -> str:
    """Why the cluster cannot have accounting here ('' if it can)."""
    if os.environ.get("CUDALAB_SLURM_ACCT", "") == "none":
        return "CUDALAB_SLURM_ACCT=none"
    missing = [b for b in ACCT_BINARIES if shutil.which(b) is None]
    if missing:
        return (f"{', '.join(missing)} not installed "
                "(apt-get install -y mariadb-server slurmdbd)")
    return ""


# what the running cluster has: "" = accounting on, else why it is off
_ACCT_OFF: list[str] = []


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

    def script(cmd: str, acct: str = "none") -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), cmd, str(state)], capture_output=True,
                              text=True, timeout=120, env={**env, "SLURM_ACCT": acct})

    acct_off = accounting_unavailable()
    up = script("up", "none" if acct_off else "slurmdbd")
    if up.returncode != 0 and not acct_off:
        # accounting would not start: the cluster without it, for every test but sacct's
        down = script("down")
        acct_off = (f"one_node_slurm.sh up with SLURM_ACCT=slurmdbd failed (rc "
                    f"{up.returncode}):\n{up.stdout}\n{up.stderr}\n-- down --\n{down.stderr}")
        up = script("up")
    if up.returncode != 0:
        down = script("down")
        pytest.fail(f"one_node_slurm.sh up failed (rc {up.returncode}):\n{up.stdout}\n"
                    f"{up.stderr}\n-- down --\n{down.stdout}{down.stderr}")
    _ACCT_OFF[:] = [acct_off]
    def stop() -> None:
        _ACCT_OFF.clear()
        down = script("down")
        assert down.returncode == 0, f"one_node_slurm.sh down failed:\n{down.stderr}"
        for pidfile in ("slurmctld.pid", "slurmd.pid"):
            assert not (state / "run" / pidfile).exists(), f"{pidfile} left behind"

    _STOP.append(stop)
    try:
        yield state
    finally:
        _stop_cluster()


@pytest.fixture(scope="package")
def slurm_acct_off(slurm_cluster) -> str:
    """'' where the cluster has accounting (slurmdbd), else why not."""
    return _ACCT_OFF[0] if _ACCT_OFF else "the cluster is down"


@pytest.fixture
def slurm_accounting(slurm_acct_off) -> None:
    """The cluster has accounting (slurmdbd): else skip, or fail where CI requires Slurm."""
    why = slurm_acct_off
    if why:
        if os.environ.get("CUDALAB_REQUIRE_SLURM"):
            pytest.fail(f"Slurm accounting is required here (CUDALAB_REQUIRE_SLURM): {why}")
        pytest.skip(f"no Slurm accounting: {why}")


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
