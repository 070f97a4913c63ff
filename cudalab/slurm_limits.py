"""QOS and association limits (from `sacctmgr`), and whether a request can ever run under them.

sinfo says what a node has; Slurm's accounting adds limits per QOS and per association
(user + account [+ partition]): MaxWall and MaxTRES per job, MaxTRESPerUser, MaxJobs, Grp
limits shared by a group. A job over a per-job limit is accepted by sbatch and PENDS for ever
(QOSMaxWallDurationPerJobLimit, AssocMaxCpuPerJobLimit, ...); one over a Grp or per-user
limit pends until other jobs end, unless the request alone exceeds the limit. Two users:
`cudalab plan` (and the workflow's start-up check) refuses what can never fit, naming the
limit; the pending watcher (cudalab/pending.py) asks `never_clears` about a limit reason.

Every Slurm command goes through a `Reader` (argv -> stdout, '' where it fails), the seam
the unit tests feed with saved sacctmgr/scontrol text. Limits are only applied where
slurmctld enforces them (AccountingStorageEnforce has `limits` or `safe`; a QOS's access
with `qos`).
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from cudalab.slurm_units import parse_time, parse_tres

Reader = Callable[[list[str]], str]
QOS_FORMAT = ("Name,MaxWall,MaxTRES,MaxTRESPU,MaxJobsPU,MaxSubmitPU,GrpTRES,GrpJobs,"
              "GrpSubmit,GrpWall,MinTRES")
ASSOC_FORMAT = ("Account,User,Partition,QOS,DefaultQOS,MaxWall,MaxTRES,MaxJobs,MaxSubmit,"
                "GrpTRES,GrpJobs,GrpSubmit,GrpWall")


def run_cmd(argv: list[str]) -> str:
    """stdout of a Slurm command ('' where it is missing, fails or hangs)."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout if p.returncode == 0 else ""


def _count(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


@dataclass
class Limits:
    """The limits of one QOS or association (None / {}: no limit)."""

    label: str  # "QOS short", "association root/small"
    max_wall: int | None = None  # minutes a job
    max_tres: dict[str, int] = field(default_factory=dict)  # a job
    max_tres_pu: dict[str, int] = field(default_factory=dict)  # all jobs of one user
    max_jobs: int | None = None  # running jobs of one user
    max_submit: int | None = None
    grp_tres: dict[str, int] = field(default_factory=dict)  # all jobs of the group
    grp_jobs: int | None = None
    grp_submit: int | None = None
    grp_wall: int | None = None
    min_tres: dict[str, int] = field(default_factory=dict)


@dataclass
class Assoc:
    account: str
    user: str
    partition: str
    qos: list[str]
    default_qos: str
    limits: Limits


def parse_qos(text: str) -> dict[str, Limits]:
    """QOS name -> limits, from `sacctmgr -nP show qos format=QOS_FORMAT`."""
    out = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 11 or not f[0]:
            continue
        out[f[0]] = Limits(f"QOS {f[0]}", parse_time(f[1]) if f[1] else None,
                           parse_tres(f[2]), parse_tres(f[3]), _count(f[4]), _count(f[5]),
                           parse_tres(f[6]), _count(f[7]), _count(f[8]),
                           parse_time(f[9]) if f[9] else None, parse_tres(f[10]))
    return out


def parse_assoc(text: str) -> list[Assoc]:
    """Associations from `sacctmgr -nP show assoc format=ASSOC_FORMAT`."""
    out = []
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 13 or not f[0]:
            continue
        who = f"{f[1]}/{f[0]}" if f[1] else f"account {f[0]}"
        where = f" on partition {f[2]}" if f[2] else ""
        limits = Limits(f"association {who}{where}", parse_time(f[5]) if f[5] else None,
                        parse_tres(f[6]), {}, _count(f[7]), _count(f[8]), parse_tres(f[9]),
                        _count(f[10]), _count(f[11]), parse_time(f[12]) if f[12] else None)
        out.append(Assoc(f[0], f[1], f[2], [q for q in f[3].split(",") if q], f[4], limits))
    return out


@dataclass
class SiteLimits:
    """What accounting says about this user: enforced flags, QOSs, associations."""

    enforce: set[str]
    qos: dict[str, Limits]
    assocs: list[Assoc]  # the user's own, and their accounts' (user '')
    user: str
    default_account: str

    @property
    def limits_enforced(self) -> bool:
        return bool(self.enforce & {"limits", "safe"})

    def user_assoc(self, account: str, partition: str = "") -> Assoc | None:
        mine = [a for a in self.assocs if a.user == self.user and a.account == account]
        return next((a for a in mine if a.partition == partition), None) or next(
            (a for a in mine if not a.partition), None)

    def account_assocs(self, account: str) -> list[Assoc]:
        return [a for a in self.assocs if a.account == account and not a.user]

    def qos_of(self, assoc: Assoc | None, asked: str) -> str:
        """The QOS a job gets: the one asked, else the association's default, else its
        only QOS, else `normal` (Slurm's own order)."""
        if asked:
            return asked
        if assoc and assoc.default_qos:
            return assoc.default_qos
        if assoc and len(assoc.qos) == 1:
            return assoc.qos[0]
        return "normal"


def read_limits(read: Reader = run_cmd, user: str = "") -> SiteLimits | None:
    """This user's limits (None where accounting does not answer: no slurmdbd)."""
    user = user or getpass.getuser()
    config = read(["scontrol", "show", "config"])
    m = re.search(r"^AccountingStorageEnforce\s*=\s*(\S*)", config, re.M)
    enforce = {x for x in (m[1] if m else "").lower().split(",") if x and x != "none"}
    if not enforce:
        return None  # nothing is enforced (or no controller): no limit applies
    mine = parse_assoc(read(["sacctmgr", "-nP", "show", "assoc", f"format={ASSOC_FORMAT}",
                             "where", f"user={user}"]))
    if not mine:
        return None
    accounts = sorted({a.account for a in mine})
    groups = parse_assoc(read(["sacctmgr", "-nP", "show", "assoc", f"format={ASSOC_FORMAT}",
                               "where", f"account={','.join(accounts)}", "user="]))
    qos = parse_qos(read(["sacctmgr", "-nP", "show", "qos", f"format={QOS_FORMAT}"]))
    default = read(["sacctmgr", "-nP", "show", "user", user, "format=DefaultAccount"])
    return SiteLimits(enforce, qos, mine + [a for a in groups if not a.user], user,
                      default.strip().splitlines()[0] if default.strip() else "")


# -- a request against the limits --------------------------------------------------------------
@dataclass
class Request:
    """What one job asks for, and the config keys that set it."""

    minutes: int
    tres: dict[str, int]  # cpu, mem (MB), node, gres/gpu[:model]
    keys: dict[str, str] = field(default_factory=dict)  # 'time'/'cpu'/'mem' -> config key


_TRES_WORDS = {"cpu": "CPU(s)", "mem": "MB", "node": "node(s)", "billing": "billing units"}


def _amount(tres: str, n: int) -> str:
    if tres.startswith("gres/"):
        return f"{n} {tres.removeprefix('gres/')}"
    return f"{n} {_TRES_WORDS.get(tres, tres)}"


def _tres_over(asked: dict[str, int], limit: dict[str, int]) -> list[tuple[str, int, int]]:
    return [(k, limit[k], asked[k]) for k in limit if k in asked and asked[k] > limit[k]]


def over_limits(req: Request, lim: Limits, who: str) -> list[str]:
    """What in the request alone exceeds these limits, each with the limit, the ask, the
    config key and the fix; `who` says who asks: 'the measure jobs ask'."""
    def ask(k: str, asked: int, most: int) -> str:
        if k not in req.keys:
            return f"{who} {asked}; fix: another slurm.qos / slurm.account"
        return f"{who} {asked} ({req.keys[k]}); fix: {req.keys[k]}: {most} or less"

    out = []
    # (GrpWall is the group's running total, not a job's: not compared with one request)
    if lim.max_wall is not None and req.minutes > lim.max_wall:
        out.append(f"{lim.label} allows {lim.max_wall} min a job (MaxWall); "
                   + ask("time", req.minutes, lim.max_wall))
    for name, limit, scope in (("MaxTRES", lim.max_tres, "a job"),
                               ("MaxTRESPerUser", lim.max_tres_pu, "a user (all jobs)"),
                               ("GrpTRES", lim.grp_tres, "the group (all jobs)")):
        for k, most, asked in _tres_over(req.tres, limit):
            out.append(f"{lim.label} allows {_amount(k, most)} {scope} ({name}); "
                       + ask(k, asked, most))
    for k, least, asked in ((k, v, req.tres.get(k, 0)) for k, v in lim.min_tres.items()):
        if asked < least:
            out.append(f"{lim.label} needs at least {_amount(k, least)} a job (MinTRES); "
                       f"{who} {asked}; fix: another slurm.qos")
    for name, n in (("MaxJobs", lim.max_jobs), ("MaxSubmit", lim.max_submit),
                    ("GrpJobs", lim.grp_jobs), ("GrpSubmit", lim.grp_submit)):
        if n == 0:
            out.append(f"{lim.label} allows no job at all ({name}=0); fix: another "
                       "slurm.qos / slurm.account")
    return out


def request_problems(req: Request, who: str, limits: SiteLimits, account: str, qos: str,
                     partition: str = "") -> list[str]:
    """Why this request can never run under this user's limits ([]: it can)."""
    account = account or limits.default_account
    assoc = limits.user_assoc(account, partition)
    if assoc is None:
        have = sorted({a.account for a in limits.assocs if a.user == limits.user})
        return [f"slurm.account: {account!r} is not an account of user {limits.user} "
                f"(InvalidAccount: sbatch refuses the jobs); fix: one of {', '.join(have)}"]
    name = limits.qos_of(assoc, qos)
    if "qos" in limits.enforce and assoc.qos and name not in assoc.qos:
        return [f"QOS {name!r} is not allowed for account {account} (InvalidQOS: sbatch "
                f"refuses the jobs); fix: one of {', '.join(assoc.qos)}, or ''"]
    if not limits.limits_enforced:
        return []
    scopes = [limits.qos[name]] if name in limits.qos else []
    scopes += [assoc.limits] + [a.limits for a in limits.account_assocs(account)]
    return [p for lim in scopes for p in over_limits(req, lim, who)]


# -- a PENDING reason --------------------------------------------------------------------------
_LIMIT_REASON = re.compile(r"(QOS|Assoc)(Grp|Max|Min)\w+")


def is_limit_reason(code: str) -> bool:
    return bool(_LIMIT_REASON.fullmatch(code))


def always_stuck(code: str) -> bool:
    """A per-job or minimum limit: the request itself is over it, whatever else runs."""
    return "PerJob" in code or code.startswith("QOSMin")


def parse_job(text: str) -> dict[str, str]:
    """`scontrol show job -o <id>` -> its key=value fields."""
    return dict(m.groups() for m in re.finditer(r"(\w+(?:/\w+)?)=(\S*)", text))


def job_request(job: dict[str, str]) -> Request:
    tres = parse_tres(job.get("ReqTRES") or job.get("TRES", ""))
    keys = {"time": "slurm.runtime_min", "cpu": "slurm.cpus_per_task", "mem": "slurm.mem_mb"}
    return Request(parse_time(job.get("TimeLimit", "")) or 0, tres, keys)


def never_clears(code: str, job_id: str, read: Reader = run_cmd,
                 limits: SiteLimits | None = None) -> str:
    """For a QOS/association limit reason: '' where it may clear (other jobs end), else
    the limit that the job's request alone exceeds, in words."""
    job = parse_job(read(["scontrol", "show", "job", "-o", job_id]))
    if not job:
        return ""
    user = job.get("UserId", "").split("(")[0]
    limits = limits or read_limits(read, user)
    scope = "QOS" if code.startswith("QOS") else "association"
    per_job = (f"the job's request is over a per-job limit of its {scope} (sacctmgr show "
               "qos / show assoc user=$USER)")
    if limits is None:
        return per_job if always_stuck(code) else ""
    req = job_request(job)
    found = [p for p in request_problems(req, "the job asks", limits,
                                         job.get("Account", ""), job.get("QOS", ""),
                                         job.get("Partition", ""))
             if p.startswith(scope) or p.startswith(("slurm.account", "QOS '"))]
    if found:
        return "; ".join(found)
    return per_job if always_stuck(code) else ""


# -- a config's jobs -----------------------------------------------------------------------
def config_requests(slurm: dict, gpu: bool) -> list[tuple[str, Request]]:
    """(who asks, request) of the measure jobs and the doctor job (slurm_request's sizes)."""
    keys = {"time": "slurm.runtime_min", "cpu": "slurm.cpus_per_task", "mem": "slurm.mem_mb"}
    gres = {"gres/gpu": 1} if gpu else {}
    if gpu and slurm.get("gpu_model"):
        gres[f"gres/gpu:{slurm['gpu_model']}"] = 1
    measure = Request(slurm["runtime_min"], {"cpu": slurm["cpus_per_task"],
                                             "mem": slurm["mem_mb"], "node": 1, **gres}, keys)
    doctor = Request(min(10, slurm["runtime_min"]),
                     {"cpu": 1, "mem": min(4000, slurm["mem_mb"]), "node": 1, **gres}, keys)
    out = [("the measure jobs ask", measure)]
    return out + ([("the doctor job asks", doctor)] if slurm.get("doctor", True) else [])


def config_problems(slurm: dict, gpu: bool, limits: SiteLimits, partition: str = "") -> list[str]:
    """What in a `slurm:` block can never run under this user's QOS and association limits
    (the doctor's smaller request only where the measure jobs' passes)."""
    for who, req in config_requests(slurm, gpu):
        found = request_problems(req, who, limits, slurm.get("account", ""),
                                 slurm.get("qos", ""), partition)
        if found:
            return found
    return []


def checked_what(slurm: dict, limits: SiteLimits) -> str:
    """'QOS normal and account root' (the limits a check used)."""
    account = slurm.get("account") or limits.default_account
    return (f"QOS {limits.qos_of(limits.user_assoc(account), slurm.get('qos', ''))} and "
            f"account {account}")


# -- `cudalab site` ------------------------------------------------------------------------
def describe(lim: Limits) -> str:
    """'MaxWall 45 min a job, MaxTRES cpu=1,mem=1000M a job' ('none' without limits)."""
    def tres(d: dict[str, int]) -> str:
        return ",".join(f"{k}={v}M" if k == "mem" else f"{k}={v}" for k, v in d.items())

    parts = [f"MaxWall {lim.max_wall} min a job" if lim.max_wall is not None else "",
             f"MaxTRES {tres(lim.max_tres)} a job" if lim.max_tres else "",
             f"MaxTRESPerUser {tres(lim.max_tres_pu)}" if lim.max_tres_pu else "",
             f"MaxJobs {lim.max_jobs}" if lim.max_jobs is not None else "",
             f"GrpTRES {tres(lim.grp_tres)}" if lim.grp_tres else "",
             f"GrpJobs {lim.grp_jobs}" if lim.grp_jobs is not None else "",
             f"MinTRES {tres(lim.min_tres)} a job" if lim.min_tres else ""]
    return ", ".join(x for x in parts if x) or "none"


def summary_lines(limits: SiteLimits) -> list[str]:
    """The user's accounts and QOSs with their limits, for `cudalab site`."""
    mine = [a for a in limits.assocs if a.user == limits.user]
    lines = []
    for a in mine:
        default = " (your default)" if a.account == limits.default_account else ""
        where = f" on partition {a.partition}" if a.partition else ""
        lines.append(f"account {a.account}{default}{where}: QOS {', '.join(a.qos) or '-'}"
                     f" (default {limits.qos_of(a, '')}); limits: {describe(a.limits)}")
    for name in sorted({q for a in mine for q in a.qos}):
        if name in limits.qos:
            lines.append(f"QOS {name}: {describe(limits.qos[name])}")
    if not limits.limits_enforced:
        lines.append("(AccountingStorageEnforce does not include limits: none applies)")
    return lines
