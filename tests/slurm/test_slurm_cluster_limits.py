"""QOS and association limits, and an out-of-memory kill, on the real one-node Slurm with
accounting (one_node_slurm.sh with SLURM_ACCT=slurmdbd enforces limits: QOS `short` allows
45 min a job, account `small` 1 CPU and 1000 MB a job; --mem is enforced by jobacct_gather's
OverMemoryKill). The runs start at once:

  qos_config  slurm.qos: short with runtime_min 60: refused at start-up, nothing submitted
  qos_cli     the same QOS on the command line (--slurm-qos short, the config asks none):
              refused at start-up too
  qos_forced  slurm.qos: short with runtime_min 45 (fits), the measure job's time forced
              past the plan (--set-resources measure:runtime=60): it PENDS with
              QOSMaxWallDurationPerJobLimit; the watcher cancels it and stops the run within
              a minute, saying the limit
  oom         a matmul CPU point of 6144 x 6144 with slurm.mem_mb 256: the job is killed for
              memory; the console names it OOM with the memory asked and used when the
              failure is seen, and again in the closing summary
plus `cudalab plan` refusing the QOS and the association limit by name.
"""

from __future__ import annotations

import os
import re
import time

import pytest
import yaml
from test_slurm import Run, run_all, snakemake_cmd, submitted, write_config
from test_slurm_site import cli, sacct_jobs, site_config

WALL = "QOS short allows 45 min a job (MaxWall)"


@pytest.fixture(scope="module")
def limit_runs(slurm_cluster, slurm_acct_off, tmp_path_factory) -> dict[str, Run]:
    specs = {}
    for name, slurm, extra in [
        ("qos_config", {"qos": "short", "runtime_min": 60}, []),
        ("qos_cli", {"runtime_min": 60}, ["--slurm-qos", "short"]),
        ("qos_forced", {"qos": "short", "runtime_min": 45},
         ["--set-resources", "measure:runtime=60"]),
        ("oom", {"mem_mb": 256}, []),
    ]:
        if name.startswith("qos") and slurm_acct_off:
            continue  # limits need accounting (the slurm_accounting tests skip or fail)
        workdir = tmp_path_factory.mktemp(f"limits-{name}")
        extra_cfg = {}
        if name == "oom":  # 3 x 6144^2 float32 inputs: about 450 MB in a 256 MB job
            extra_cfg = {"experiments": {"matmul": {"sizes": [6144], "variants": ["cpu"],
                                                    "cpu_max_size": 6144}}}
        config = write_config(workdir, ["cpu"], doctor=False, **extra_cfg)
        cfg = yaml.safe_load(config.read_text())
        cfg["slurm"].update(slurm)
        config.write_text(yaml.safe_dump(cfg))
        specs[name] = (snakemake_cmd(workdir, config, "results/results.csv", *extra,
                                     limit_s=120), workdir)
    os.environ["CUDALAB_PENDING_POLL_S"] = "2"  # inherited by the snakemake processes
    t0 = time.monotonic()
    try:
        runs = run_all(specs, limit_s=120)
    finally:
        del os.environ["CUDALAB_PENDING_POLL_S"]
    print(f"\nslurm limit runs ({len(runs)} at once): {time.monotonic() - t0:.0f} s")
    return runs


@pytest.mark.slurm
def test_plan_refuses_a_qos_and_an_association_limit(slurm_cluster, slurm_accounting,
                                                     tmp_path):
    long = cli("plan", str(site_config(tmp_path, qos="short", runtime_min=60)), cwd=tmp_path)
    assert long.returncode == 1, long.stdout + long.stderr
    assert "Slurm request (sinfo, sacctmgr) does not fit" in long.stdout, long.stdout
    assert (f"{WALL}; the measure jobs ask 60 (slurm.runtime_min); fix: slurm.runtime_min: "
            "45 or less") in long.stdout, long.stdout
    big = cli("plan", str(site_config(tmp_path, account="small", mem_mb=2000)), cwd=tmp_path)
    assert big.returncode == 1, big.stdout + big.stderr
    assert ("association root/small allows 1000 MB a job (MaxTRES); the measure jobs ask 2000 "
            "(slurm.mem_mb); fix: slurm.mem_mb: 1000 or less") in big.stdout, big.stdout
    bad = cli("plan", str(site_config(tmp_path, account="nosuch")), cwd=tmp_path)
    assert bad.returncode == 1 and "'nosuch' is not an account of user root" in bad.stdout
    ok = cli("plan", str(site_config(tmp_path, qos="short", runtime_min=45)), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ("Slurm request (sinfo): fits partition 'gpu'; within the limits of QOS short and "
            "account root (sacctmgr)") in ok.stdout, ok.stdout
    site = cli("site", str(tmp_path / "config.yaml"), cwd=tmp_path)
    assert "  QOS short: MaxWall 45 min a job" in site.stdout, site.stdout
    assert ("  account small: QOS normal, short (default normal); limits: MaxTRES "
            "cpu=1,mem=1000M a job") in site.stdout, site.stdout


@pytest.mark.slurm
@pytest.mark.parametrize("name", ["qos_config", "qos_cli"])
def test_a_qos_limit_stops_the_run_before_submitting(limit_runs, slurm_accounting, name):
    out = limit_runs[name]
    assert out.returncode == 1, out.log
    assert "nothing was submitted" in out.log and not submitted(out.log, ""), out.log
    assert f"{WALL}; the measure jobs ask 60 (slurm.runtime_min)" in out.log, out.log


@pytest.mark.slurm
def test_a_forced_qos_limit_is_cancelled_by_the_watcher_within_a_minute(limit_runs,
                                                                        slurm_accounting):
    out = limit_runs["qos_forced"]
    assert out.returncode == 1, f"the run stops by itself (124: it hung)\n{out.log}"
    jobs = submitted(out.log, "measure")
    assert len(jobs) == 1, out.log
    line = next((x for x in out.log.splitlines() if x.startswith("cudalab: cancelled Slurm")),
                "")
    assert line.startswith(f"cudalab: cancelled Slurm job {jobs[0][0]} "
                           "(rule_measure_wildcards_results_matmul): PENDING with reason "
                           f"QOSMaxWallDurationPerJobLimit, which never clears: {WALL}; "
                           "the job asks 60 (slurm.runtime_min)"), out.log
    assert out.log.count(line) == 2, "again in the closing summary"
    (state,), = [r[1:] for r in sacct_jobs([jobs[0][0]], "State")]
    assert state.startswith("CANCELLED"), state
    assert out.wall_s < 60 + 15, f"stopped {out.wall_s:.0f} s after the start"


@pytest.mark.slurm
def test_an_oom_kill_is_named_oom_when_it_happens(limit_runs, slurm_acct_off):
    out = limit_runs["oom"]
    assert out.returncode == 1, out.log
    (job_id, _), = submitted(out.log, "measure")
    # the cause follows Snakemake's own error block at once, before the run's last screen
    now = re.search(rf"^cudalab: measure \(results_matmul\) failed at [\d:]+: Slurm job "
                    rf"{job_id} ran out of memory \(OOM, (killed for memory|OUT_OF_MEMORY): "
                    r"asked 256 MB \(slurm.mem_mb\), used (\d+) MB \((MaxRSS|Slurm's log)\)\); "
                    r"fix: raise slurm.mem_mb above \d+$", out.log, re.M)
    assert now, out.log
    assert int(now[2]) > 256, now[0]
    assert out.log.index(now[0]) < out.log.index("cudalab: 1 job(s) failed: measure")
    summary = out.log.split("cudalab: 1 job(s) failed: measure", 1)[1]
    assert f"--- measure: Slurm job {job_id} ran out of memory (OOM" in summary, summary
    if not slurm_acct_off:  # sacct's MaxRSS of the killed step
        assert now[3] == "MaxRSS", now[0]
