"""QOS and association limits (cudalab/slurm_limits.py) and the pending watcher's use of
them, fed the text sacctmgr, scontrol and squeue print (Slurm 22.05 with slurmdbd, as the
test cluster of tests/slurm/one_node_slurm.sh prints it); the real cluster's runs are in
tests/slurm/test_slurm_cluster_limits.py."""

from __future__ import annotations

import pytest

from cudalab import pending, slurm_limits
from cudalab.slurm_limits import Request

ENFORCE = "AccountingStorageEnforce = associations,limits,qos\nClusterName = ci\n"
QOS = "normal|||||||||||\nshort|00:45:00||||||||||\n" \
      "gpu|2-00:00:00|cpu=8,gres/gpu=2|gres/gpu=4|2||cpu=64,mem=512G|||||\n" \
      "big||||||||||cpu=16|\nnone|||||||||||\n"
# Account,User,Partition,QOS,DefaultQOS,MaxWall,MaxTRES,MaxJobs,MaxSubmit,GrpTRES,...
MINE = ("small|alice||normal,short|normal||cpu=1,mem=1000M||||||\n"
        "physics|alice||normal,short,gpu,big|normal||||||||\n"
        "frozen|alice||normal|normal|||0|||||\n")
GROUPS = "physics|||normal||||||cpu=32,mem=100G|||\nsmall|||normal|||||||||\n"


def reader(job: str = "", squeue: str = "", enforce: str = ENFORCE):
    """A Reader answering as the test cluster does (argv -> stdout)."""
    def read(argv: list[str]) -> str:
        cmd = " ".join(argv)
        if cmd == "scontrol show config":
            return enforce
        if cmd.startswith("scontrol show job"):
            return job
        if cmd.startswith("squeue"):
            return squeue
        if "show qos" in cmd:
            return QOS
        if "show assoc" in cmd:
            return GROUPS if cmd.endswith("user=") else MINE
        if "show user" in cmd:
            return "physics\n"
        return ""
    return read


def limits() -> slurm_limits.SiteLimits:
    found = slurm_limits.read_limits(reader(), user="alice")
    assert found is not None
    return found


def measure(minutes: int = 30, cpu: int = 1, mem: int = 512, gpus: int = 1) -> Request:
    keys = {"time": "slurm.runtime_min", "cpu": "slurm.cpus_per_task", "mem": "slurm.mem_mb"}
    return Request(minutes, {"cpu": cpu, "mem": mem, "node": 1, "gres/gpu": gpus}, keys)


def test_parse_tres_and_qos():
    assert slurm_limits.parse_tres("cpu=4,mem=16G,gres/gpu:a100=2,node=1,billing=4") == {
        "cpu": 4, "mem": 16384, "gres/gpu:a100": 2, "node": 1, "billing": 4}
    assert slurm_limits.parse_tres("mem=1000M,mem2=x") == {"mem": 1000}
    qos = slurm_limits.parse_qos(QOS)
    assert qos["short"].max_wall == 45 and qos["normal"].max_wall is None
    assert qos["gpu"].max_wall == 48 * 60 and qos["gpu"].max_tres == {"cpu": 8, "gres/gpu": 2}
    assert qos["gpu"].max_tres_pu == {"gres/gpu": 4} and qos["gpu"].max_jobs == 2
    assert qos["gpu"].grp_tres == {"cpu": 64, "mem": 512 * 1024}
    assert qos["big"].min_tres == {"cpu": 16}


def test_read_limits_finds_the_users_associations_and_default_account():
    lim = limits()
    assert lim.limits_enforced and lim.default_account == "physics"
    assert lim.user_assoc("small").limits.max_tres == {"cpu": 1, "mem": 1000}
    assert [a.limits.grp_tres for a in lim.account_assocs("physics")] == [
        {"cpu": 32, "mem": 100 * 1024}]
    assert lim.qos_of(lim.user_assoc("physics"), "") == "normal"
    assert slurm_limits.read_limits(reader(enforce="AccountingStorageEnforce = none\n")) is None
    assert slurm_limits.read_limits(lambda argv: "") is None, "no controller: nothing known"


@pytest.mark.parametrize("req,account,qos,expected", [
    (measure(60), "", "short",
     "QOS short allows 45 min a job (MaxWall); the measure jobs ask 60 (slurm.runtime_min); "
     "fix: slurm.runtime_min: 45 or less"),
    (measure(mem=2000), "small", "",
     "association alice/small allows 1000 MB a job (MaxTRES); the measure jobs ask 2000 "
     "(slurm.mem_mb); fix: slurm.mem_mb: 1000 or less"),
    (measure(cpu=12), "", "gpu",
     "QOS gpu allows 8 CPU(s) a job (MaxTRES); the measure jobs ask 12 (slurm.cpus_per_task)"),
    (measure(gpus=3), "", "gpu", "QOS gpu allows 2 gpu a job (MaxTRES); the measure jobs ask 3"),
    (measure(cpu=40), "", "", "association account physics allows 32 CPU(s) the group "
     "(all jobs) (GrpTRES)"),
    (measure(), "", "big", "QOS big needs at least 16 CPU(s) a job (MinTRES)"),
    (measure(), "frozen", "", "association alice/frozen allows no job at all (MaxJobs=0)"),
    (measure(), "", "none", "QOS 'none' is not allowed for account physics (InvalidQOS"),
    (measure(), "chem", "", "slurm.account: 'chem' is not an account of user alice "
     "(InvalidAccount: sbatch refuses the jobs); fix: one of frozen, physics, small"),
])
def test_a_request_over_a_limit_is_named(req, account, qos, expected):
    found = slurm_limits.request_problems(req, "the measure jobs ask", limits(), account, qos)
    assert any(expected in p for p in found), found


def test_a_request_within_the_limits_passes():
    lim = limits()
    assert slurm_limits.request_problems(measure(45), "x", lim, "", "short") == []
    assert slurm_limits.request_problems(measure(cpu=8, gpus=2), "x", lim, "", "gpu") == []
    # only what slurmctld enforces counts: a QOS's access without `qos`, limits without
    # `limits` (or `safe`)
    lim.enforce = {"associations", "limits"}
    assert slurm_limits.request_problems(measure(), "x", lim, "", "none") == []
    lim.enforce = {"associations"}
    assert slurm_limits.request_problems(measure(600), "x", lim, "", "short") == []


def test_config_problems_check_the_doctor_only_where_the_measure_jobs_fit():
    slurm = {"runtime_min": 60, "mem_mb": 512, "cpus_per_task": 1, "gpu_model": "a100",
             "account": "", "qos": "short", "doctor": True}
    found = slurm_limits.config_problems(slurm, True, limits())
    assert found == ["QOS short allows 45 min a job (MaxWall); the measure jobs ask 60 "
                     "(slurm.runtime_min); fix: slurm.runtime_min: 45 or less"]
    small = {**slurm, "qos": "", "account": "small", "mem_mb": 900, "cpus_per_task": 1}
    assert slurm_limits.config_problems(small, True, limits()) == []
    assert slurm_limits.checked_what(small, limits()) == "QOS normal and account small"


# -- the watcher -------------------------------------------------------------------------------
def job(qos: str = "normal", account: str = "physics", limit: str = "00:30:00",
        tres: str = "cpu=1,mem=512M,node=1,billing=1,gres/gpu=1") -> str:
    return (f"JobId=42 JobName=cudalab_x UserId=alice(1000) GroupId=alice(1000) "
            f"Priority=1 Nice=0 Account={account} QOS={qos} JobState=PENDING "
            f"Reason=X Dependency=(null) TimeLimit={limit} Partition=gpu TRES={tres} "
            "Comment=rule_measure_wildcards_results_matmul")


@pytest.mark.parametrize("code,scontrol,stuck", [
    ("QOSMaxWallDurationPerJobLimit", job("short", limit="01:00:00"), "allows 45 min a job"),
    ("AssocMaxMemPerJob", job(account="small", tres="cpu=1,mem=2000M,node=1"),
     "association alice/small allows 1000 MB a job (MaxTRES)"),
    # the request alone is over the group's limit: it never runs
    ("AssocGrpCpuLimit", job(tres="cpu=40,mem=1G,node=1"), "allows 32 CPU(s) the group"),
    # the group's other jobs hold the CPUs for now: it runs once they end
    ("AssocGrpCpuLimit", job(tres="cpu=4,mem=1G,node=1"), ""),
    ("QOSGrpCpuLimit", job("gpu", tres="cpu=4,mem=1G,node=1"), ""),
    ("QOSMaxGRESPerUser", job("gpu", tres="cpu=1,node=1,gres/gpu=2"), ""),
    ("QOSMaxGRESPerUser", job("gpu", tres="cpu=1,node=1,gres/gpu=5"), "4 gpu a user"),
    ("QOSMaxJobsPerUserLimit", job("gpu"), ""),
])
def test_the_watcher_tells_a_limit_that_never_clears_from_one_that_may(code, scontrol, stuck):
    said = slurm_limits.never_clears(code, "42", reader(job=scontrol))
    assert (stuck in said) if stuck else said == "", said


def test_the_watcher_cancels_a_job_over_a_qos_limit_and_stops_the_run(tmp_path):
    wd = str(tmp_path)
    squeue = "\n".join([
        f"42|PENDING|QOSMaxWallDurationPerJobLimit|rule_measure_wildcards_results_matmul|{wd}",
        f"43|PENDING|AssocGrpCpuLimit|rule_measure_wildcards_results_sobel|{wd}",
        "44|PENDING|QOSMaxWallDurationPerJobLimit|rule_measure|/elsewhere",
    ])
    jobs = {"42": job("short", limit="01:00:00"), "43": job(tres="cpu=4,node=1")}

    def read(argv: list[str]) -> str:
        if argv[:3] == ["scontrol", "show", "job"]:
            return jobs[argv[-1]]
        return reader(squeue=squeue)(argv)

    lines, cancelled, stopped = [], [], []
    watch = pending.PendingWatch(wd, emit=lines.append, stop_run=lambda: stopped.append(1),
                                 read=read, cancel=lambda j: cancelled.append(j) or True)
    watch.poll()
    watch.poll()  # each job is reported once
    assert cancelled == ["42"] and stopped == [1], lines
    assert lines[0].startswith("cudalab: cancelled Slurm job 42 "
                               "(rule_measure_wildcards_results_matmul): PENDING with reason "
                               "QOSMaxWallDurationPerJobLimit, which never clears: QOS short "
                               "allows 45 min a job (MaxWall); the job asks 60"), lines
    assert "job 43" in lines[1] and "waits until other jobs under that limit end" in lines[1]
    assert len(lines) == 2 and watch.cancelled == [lines[0]]


def test_without_readable_limits_only_a_per_job_reason_is_final():
    blind = reader(job=job("short", limit="01:00:00"), enforce="")
    assert "over a per-job limit of its QOS" in slurm_limits.never_clears(
        "QOSMaxWallDurationPerJobLimit", "42", blind)
    assert slurm_limits.never_clears("AssocGrpCpuLimit", "42", blind) == ""
    assert slurm_limits.never_clears("QOSMaxWallDurationPerJobLimit", "42",
                                     reader(job="")) == "", "no such job: nothing said"


def test_site_lists_the_users_accounts_and_qos_with_their_limits():
    lines = slurm_limits.summary_lines(limits())
    assert lines[0] == ("account small: QOS normal, short (default normal); limits: "
                        "MaxTRES cpu=1,mem=1000M a job"), lines
    assert lines[1].startswith("account physics (your default): QOS normal, short, gpu, big")
    assert "QOS short: MaxWall 45 min a job" in lines
    assert ("QOS gpu: MaxWall 2880 min a job, MaxTRES cpu=8,gres/gpu=2 a job, MaxTRESPerUser "
            "gres/gpu=4, MaxJobs 2, GrpTRES cpu=64,mem=524288M") in lines, lines
    assert "QOS normal: none" in lines
