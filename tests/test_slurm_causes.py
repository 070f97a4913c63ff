"""Slurm's word on a failed job (cudalab/slurm_causes.py) on the console, when the failure
is seen (failures.FailureNow) and in the closing summary; fed the text sacct and the
executor plugin print (Slurm 22.05, plugin 2.8), as the real runs of
tests/slurm/test_slurm_cluster_limits.py see it."""

from __future__ import annotations

import logging
from pathlib import Path

from snakemake_interface_logger_plugins.common import LogEvent

from cudalab import failures, slurm_causes

# jobacct_gather's OverMemoryKill (the test cluster): the job FAILED, its step CANCELLED
SACCT_OVERMEMORY = "10|FAILED|256M||00:00:12|00:10:00\n10.batch|FAILED||154704K|00:00:12|\n" \
                   "10.0|CANCELLED by 0||371552K|00:00:02|\n"
# cgroups (a site's cluster): the step OUT_OF_MEMORY
SACCT_CGROUP = "77|OUT_OF_MEMORY|4Gn||00:01:02|01:00:00\n77.batch|OUT_OF_MEMORY||5000000K||\n"
SACCT_TIMEOUT = "78|TIMEOUT|16G||01:00:02|01:00:00\n78.batch|CANCELLED||2G||\n"
LOG_OVERMEMORY = """\
Shell command: python -m cudalab.cli measure matmul > results/logs/measure_matmul.log 2>&1
slurmstepd-vm: error: StepId=10.0 exceeded memory limit (380469248 > 268435456), being killed
slurmstepd-vm: error: Exceeded job memory limit
srun: error: vm: task 0: Killed
"""
LOG_CGROUP = "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=77.batch. Some of " \
             "your processes may have been killed by the cgroup out-of-memory handler.\n"
REFUSED = ("SLURM sbatch failed. The error message was 'sbatch: error: Batch job submission "
           "failed: Invalid qos specification'.")


def sacct(text: str):
    return lambda argv: text if argv[0] == "sacct" else ""


def test_oom_is_named_with_the_memory_asked_and_used(tmp_path: Path):
    log = tmp_path / "10.log"
    log.write_text(LOG_OVERMEMORY)
    c = slurm_causes.job_cause("10", log, sacct(SACCT_OVERMEMORY))
    assert c.oom and c.asked_mb == 256 and c.used_mb == 363, c
    assert c.text() == ("Slurm job 10 ran out of memory (OOM, killed for memory: asked 256 MB "
                        "(slurm.mem_mb), used 363 MB (MaxRSS)); fix: raise slurm.mem_mb above "
                        "363")
    # no accounting: the Slurm log alone says it
    c = slurm_causes.job_cause("10", log, lambda argv: "", wait_s=0)
    assert c.oom and c.asked_mb == 256 and c.used_mb == 362 and "Slurm's log" in c.text()
    log.write_text(LOG_CGROUP)
    c = slurm_causes.job_cause("77", log, sacct(SACCT_CGROUP))
    assert "(OOM, OUT_OF_MEMORY: asked 4096 MB (slurm.mem_mb), used 4883 MB" in c.text()
    assert c.lines and "oom-kill" in c.lines[0]


def test_timeout_and_a_plain_failure():
    assert "hit its time limit (TIMEOUT); fix: raise slurm.runtime_min" in \
        slurm_causes.job_cause("78", None, sacct(SACCT_TIMEOUT)).text()
    plain = slurm_causes.job_cause("9", None, sacct("9|FAILED|1G||00:00:03|00:10:00\n"))
    assert plain.text() == "" and not plain.oom
    assert slurm_causes.mem_mb("4Gc") == 4096 and slurm_causes.mem_mb("") is None


def refused_block(jobid: int, model: str) -> str:
    """What Snakemake 9 logs for a submission sbatch refused (the plugin's message holds
    an unindented line, which ended the block before its jobid and output)."""
    return "\n".join([
        "Error in rule measure:", f"    message: {REFUSED}", "    sbatch call:",
        f"        sbatch --parsable --qos=bogus --gpus={model}:1 --wrap=\"python -m ...\"",
        "For further error details see the cluster/cloud log and the log files of the "
        "involved rule(s).", f"    jobid: {jobid}",
        f"    output: results/gpu/{model}/raw/matmul/_manifest.json",
        f"    log: results/gpu/{model}/logs/measure_matmul.log (check log file(s) for error "
        "details)", "    shell:", "        { python -m cudalab.cli measure ...; }"])


def test_refused_submissions_are_counted_and_say_why(tmp_path: Path):
    log = tmp_path / "run.snakemake.log"
    log.write_text("\n".join([refused_block(5, "h100"), "[Fri Nov 27 06:56:37 2026]",
                              refused_block(3, "fake"), "Exiting because a job execution "
                              "failed. Look above for error messages"]))
    jobs = failures.failed_jobs(str(log))
    assert [(j.jobid, j.outputs) for j in jobs] == [
        ("5", ["results/gpu/h100/raw/matmul/_manifest.json"]),
        ("3", ["results/gpu/fake/raw/matmul/_manifest.json"])]
    text = failures.summary(str(log), tmp_path / "logs", 0.0, workdir=tmp_path)
    assert text.startswith("cudalab: 2 job(s) failed: measure (results/gpu/h100/"), text
    assert text.count("refused by sbatch: Invalid qos specification (nothing ran") == 2, text
    assert "last 15 lines" not in text, "a refused job ran nothing: no log to show"


def record(rule: str, message: str, logs: list[str]) -> logging.LogRecord:
    rec = logging.LogRecord("snakemake.logging", logging.ERROR, "", 0, f"Error in rule {rule}",
                            None, None)
    rec.__dict__.update(event=LogEvent.JOB_ERROR, rule_name=rule, rule_msg=message,
                        log=logs, jobid=1)
    return rec


def test_the_cause_is_printed_when_snakemake_reports_the_failure(tmp_path: Path):
    slurm_log = tmp_path / ".snakemake" / "slurm_logs" / "rule_measure" / "results_matmul" \
        / "10.log"
    slurm_log.parent.mkdir(parents=True)
    slurm_log.write_text(LOG_OVERMEMORY)
    (tmp_path / "results" / "logs").mkdir(parents=True)
    (tmp_path / "results" / "logs" / "measure_matmul.log").write_text("matmul: 1 grid point\n")
    said: list[str] = []
    handler = failures.FailureNow(tmp_path, out=said.append, read=sacct(SACCT_OVERMEMORY))
    logger = logging.getLogger("test.failure_now")
    logger.addHandler(handler)
    try:
        logger.info("Job 1 has been submitted with SLURM jobid 10")  # not a failure
        logger.error("x", extra={"event": LogEvent.JOB_INFO})
        msg = "SLURM-job '10' failed, SLURM status is: 'FAILED'. Detailed failure reason ..."
        logger.handle(record("measure", msg, ["results/logs/measure_matmul.log",
                                              f"{slurm_log} (check log file(s) for error "
                                              "details)"]))
        logger.handle(record("measure", REFUSED, ["results/gpu/fake/logs/measure_matmul.log"]))
    finally:
        logger.removeHandler(handler)
    assert len(said) == 2 and handler.failed == ["measure (results_matmul)", "measure"], said
    first = said[0].splitlines()
    assert first[0].startswith("cudalab: measure (results_matmul) failed at "), first
    assert first[0].endswith(": Slurm job 10 ran out of memory (OOM, killed for memory: asked "
                             "256 MB (slurm.mem_mb), used 363 MB (MaxRSS)); fix: raise "
                             "slurm.mem_mb above 363"), first
    assert "matmul: 1 grid point" in said[0] and "exceeded memory limit" in said[0]
    assert said[1].startswith("cudalab: measure failed at "), said[1]
    assert "refused by sbatch: Invalid qos specification" in said[1], said[1]
    assert "last 15 lines" not in said[1]


def test_an_oom_whose_sampled_maxrss_is_below_the_limit_is_not_told_to_fit_the_sample():
    """With cgroups the kernel kills the job between two samples of MaxRSS (seen on a site
    cluster: 103 MB sampled, 256 MB asked): the fix is above what was asked."""
    c = slurm_causes.JobCause("6", states=["FAILED", "OUT_OF_MEMORY"], oom=True,
                              asked_mb=256, used_mb=103)
    assert c.text() == ("Slurm job 6 ran out of memory (OOM, OUT_OF_MEMORY: asked 256 MB "
                        "(slurm.mem_mb), 103 MB at the last sample (MaxRSS) before the kill, "
                        "its peak above what was asked); fix: raise slurm.mem_mb above 256")
