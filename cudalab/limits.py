"""Config values checked against each other: time limits against the Slurm job that must
hold them, keys that cancel each other, and values that are legal but costly (warnings).

Errors (cross_problems) refuse the config, naming every key involved and what is allowed.
Warnings (warnings) never fail: `cudalab validate`, `cudalab plan` and the workflow's start
print them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

# More sbatch jobs than this in one run: a warning (sites cap the jobs a user may queue).
MANY_JOBS = 200
# Metric names of several units, in ncu's unit__counter.rollup form: a `regex:` metric that
# matches names of more than one unit is broad (ncu collects every metric it matches).
_SAMPLE_METRICS = (
    "dram__bytes.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__cycles_elapsed.avg", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sectors.sum", "lts__t_sector_hit_rate.pct", "l1tex__t_requests.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "smsp__inst_executed.sum",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "gpu__time_duration.sum", "launch__registers_per_thread", "pcie__read_bytes.sum",
    "gpc__cycles_elapsed.max",
)


def _slurm_s(config: dict[str, Any]) -> int | None:
    runtime = (config.get("slurm") or {}).get("runtime_min")
    return runtime * 60 if isinstance(runtime, int) and not isinstance(runtime, bool) else None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def cross_problems(config: dict[str, Any]) -> list[str]:
    """Every rule below; each skips values the schema already refused."""
    return [*_judge_hang_limit(config), *_static_analysis_timeout(config),
            *_gpu_model_and_models(config)]


def judge_hang_limit(exercises: dict[str, Any]) -> float:
    """Seconds before a hung submission's judge is stopped: the per-launch limit, times
    memcheck's slowdown when the class runs under compute-sanitizer, after the judge's own
    start-up (Python, pycuda, a CUDA context)."""
    from cudalab.exercises.sandbox import SANITIZER_SLOWDOWN, STARTUP_S

    slow = SANITIZER_SLOWDOWN if exercises.get("sanitize") is True else 1
    return STARTUP_S + float(exercises["launch_timeout_s"]) * slow


def _judge_hang_limit(config: dict[str, Any]) -> list[str]:
    """A class's judge job must outlive its own hang limit: Slurm would otherwise kill a
    hung submission's job, and the student get no verdict (not 'timeout')."""
    from cudalab.exercises.sandbox import SANITIZER_SLOWDOWN, STARTUP_S

    ex, wall = config.get("exercises") or {}, _slurm_s(config)
    if not (isinstance(ex, dict) and ex.get("submissions") and wall
            and _num(ex.get("launch_timeout_s"))):
        return []
    need = judge_hang_limit(ex)
    if need < wall:
        return []
    sanitize = ex.get("sanitize") is True
    how = (f"x {SANITIZER_SLOWDOWN} under memcheck (exercises.sanitize: true) " if sanitize
           else "")
    room = (wall - STARTUP_S) / (SANITIZER_SLOWDOWN if sanitize else 1)
    fix = (f"exercises.launch_timeout_s < {room:g}, or " if room >= 1 else "")
    return [f"exercises.launch_timeout_s: {ex['launch_timeout_s']:g} s per launch {how}"
            f"plus {STARTUP_S:g} s of start-up = {need:g} s before a hung submission is "
            f"stopped, not less than slurm.runtime_min ({wall // 60} min = {wall} s), the "
            f"judge job's wall-clock limit under Slurm: Slurm would kill the job first and "
            f"the student get no verdict; allowed: {fix}slurm.runtime_min >= "
            f"{math.floor(need / 60) + 1}"]


def _static_analysis_timeout(config: dict[str, Any]) -> list[str]:
    block = (config.get("experiments") or {}).get("static_analysis")
    wall = _slurm_s(config)
    if not (isinstance(block, dict) and block.get("enabled", True) is not False and wall):
        return []
    t = block.get("timeout_s")
    if isinstance(t, int) and t >= wall:
        return [f"experiments.static_analysis.timeout_s: {t} s of CPU time for one nvcc run, "
                f"not less than slurm.runtime_min ({wall // 60} min = {wall} s), the whole job's "
                f"wall-clock limit under Slurm; allowed: timeout_s < {wall} s, or raise "
                f"slurm.runtime_min"]
    return []


def _gpu_model_and_models(config: dict[str, Any]) -> list[str]:
    """gpu_model is not used by a sweep (each job asks for its own model): both set means
    the user expects one of them to do something it would not."""
    slurm = config.get("slurm") or {}
    model, models = slurm.get("gpu_model"), slurm.get("gpu_models")
    if isinstance(model, str) and model and isinstance(models, list) and models:
        return [f"slurm.gpu_model: {model!r} would be ignored beside slurm.gpu_models "
                f"{models!r} (a GPU-model sweep: each job asks for its own model); allowed: "
                f"one of them, e.g. gpu_models: [{', '.join(dict.fromkeys([model, *models]))}]"
                f" and gpu_model: ''"]
    return []


# -- warnings --------------------------------------------------------------------------------
def warnings(config: dict[str, Any]) -> list[str]:
    """Legal but costly values of a valid config, each starting with its key path."""
    return [*_broad_metrics(config), *_class_jobs(config)]


def _broad_metrics(config: dict[str, Any]) -> list[str]:
    prof = config.get("profile") or {}
    out = []
    for i, m in enumerate(prof.get("metrics") or []):
        if not (isinstance(m, str) and m.startswith("regex:")):
            continue
        try:
            rx = re.compile(m[len("regex:"):])
        except re.error:
            continue  # refused by guards._profile
        units = sorted({n.split("__")[0] for n in _SAMPLE_METRICS if rx.search(n)})
        if len(units) > 1:
            off = "" if prof.get("ncu") is True else " (profile.ncu is off: not now)"
            out.append(f"profile.metrics[{i}]: {m!r} matches metrics of {len(units)} units "
                       f"({', '.join(units)}) among a sample of names: ncu collects every "
                       f"metric it matches (hundreds for .*), each group of counters a replay "
                       f"of every kernel, so a job can take hours under ncu{off}; name the "
                       f"metrics, or anchor the expression to one unit (regex:^smsp__...)")
    return out


def class_jobs(config: dict[str, Any]) -> tuple[int, int] | None:
    """(submissions judged, entries rejected) of the class folder (read, not written), or
    None without a class run."""
    ex = config.get("exercises") or {}
    if not (isinstance(ex, dict) and isinstance(ex.get("submissions"), str)
            and ex["submissions"]):
        return None
    from cudalab.exercises import classroom

    try:
        subs, rejected = classroom.discover(Path(ex["submissions"]))
    except (OSError, classroom.ClassFolderError):  # the class folder check names it
        return None
    return len(subs), len(rejected)


def class_doctor(config: dict[str, Any]) -> int:
    """The class run's doctor jobs: one (the judges' GPU, first) unless slurm.doctor is off."""
    return 1 if (config.get("slurm") or {}).get("doctor", True) else 0


def _class_jobs(config: dict[str, Any]) -> list[str]:
    found = class_jobs(config)
    if found is None or found[0] + 1 + class_doctor(config) <= MANY_JOBS:
        return []
    doctor = " and its doctor" if class_doctor(config) else ""
    return [f"exercises.submissions: the class run (snakemake exercises) submits "
            f"{found[0] + 1 + class_doctor(config)} sbatch jobs under Slurm (one judge job per "
            f"submission, {found[0]}, the baseline{doctor}), each with a GPU; a site may limit "
            "the jobs a user "
            f"may queue (sacctmgr show qos: MaxSubmitJobs): split the folder, or check first"]
