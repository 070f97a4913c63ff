"""The Slurm profile's polling, measured on the real one-node cluster: a run of one short
job costs seconds with profiles/slurm's settings, against ~80 s with the plugin's defaults.

Both runs (the same CPU-only grid: one sbatch job of a few seconds) start at once; the
profile's status polling is the only difference. The wall times are printed (pytest -s)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from test_slurm import PROFILE, snakemake_cmd, submitted, write_config

HERE = Path(__file__).resolve().parent


@pytest.mark.slurm
def test_short_jobs_cost_seconds_not_minutes(slurm_cluster, tmp_path_factory):
    procs = {}
    t0 = time.monotonic()
    for name in ("profile_squeue", "profile_plugin_defaults"):
        workdir = tmp_path_factory.mktemp(name)
        # doctor off: this measures polling, one job (the doctor job is one more wave)
        cmd = snakemake_cmd(workdir, write_config(workdir, ["cpu"], doctor=False),
                            "results/results.csv",
                            profiles=(PROFILE, HERE / name))
        procs[name] = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
    wall, logs = {}, {}
    for name, proc in procs.items():
        logs[name] = proc.communicate(timeout=240)[0]
        wall[name] = round(time.monotonic() - t0, 1)  # exit time: the first wait is the
        assert proc.returncode == 0, logs[name]      # shorter one, so this is fair
        assert len(submitted(logs[name])) == 1, logs[name]
    print(f"\nslurm polling, one short job to results.csv: profiles/slurm "
          f"{wall['profile_squeue']} s, the plugin's defaults {wall['profile_plugin_defaults']} s")
    assert wall["profile_squeue"] < 40, wall
    assert wall["profile_plugin_defaults"] > wall["profile_squeue"] + 20, wall
