"""The issue's done-when items, run as the ordinary user `alice` against the independent
site cluster (site-cluster.sh), from a fresh clone of the branch, with the card's command
(`snakemake --profile slurm`, the shipped profile unchanged; its status command is the
plugin's default, sacct, as on a site with accounting).

    python checks.py OUT_DIR NAME [NAME ...]     names: plan qos_forced resume oom class
                                                 fail_keep_going fail_fast

Each run's console goes to OUT_DIR/<name>.console.txt; one summary line per check to
OUT_DIR/summary.txt (and stdout). Times come from sacct (job End) and this machine's clock.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml

CLONE = Path(os.environ.get("CLONE", Path.home() / "cudalab"))  # the card's project root
RUNS = Path.home() / "runs"
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: ([^)]+)\)")
CORRECT = """// cudalab-exercise: vector_add
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }
"""


def config(name: str, slurm: dict, **extra) -> Path:
    """A small CPU grid and the site's slurm: block (its module, its GPU type)."""
    d = RUNS / name
    if d.exists():
        subprocess.run(["rm", "-rf", str(d)], check=True)
    d.mkdir(parents=True)
    cfg = {"run_name": f"indep-{name}",
           "measurement": {"warmup": 1, "min_samples": 3, "max_samples": 20, "budget_s": 0.05},
           "telemetry": {"nvidia_smi": False, "nvml": False},
           "experiments": {"matmul": {"sizes": [[16, 24, 32], 64, 100], "variants": ["cpu"]}},
           "slurm": {"runtime_min": 10, "mem_mb": 512, "cpus_per_task": 1,
                     "gpu_model": "a100", "modules": ["cuda/13.0"], **slurm}}
    cfg.update(extra)
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def snakemake(cfg: Path, *extra: str, targets: tuple[str, ...] = (),
              limit_s: int = 400) -> list[str]:
    """The card's command (targets first: --configfile takes every word after it)."""
    return ["timeout", "-s", "INT", "-k", "30", str(limit_s), "snakemake", *targets,
            "--profile", "slurm", "--directory", str(cfg.parent), "--configfile", str(cfg),
            *extra]


def run(cmd: list[str], out: Path) -> tuple[int, str, float]:
    """(rc, console, exit time)."""
    p = subprocess.run(cmd, cwd=CLONE, capture_output=True, text=True)
    t = time.time()
    text = p.stdout + p.stderr
    out.write_text(f"$ {' '.join(cmd)}\n{text}\n[rc {p.returncode}, exit {stamp(t)}]\n")
    return p.returncode, text, t


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-4]


def sacct(job_ids: list[str]) -> dict[str, dict[str, str]]:
    if not job_ids:
        return {}
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o",
                          "JobID,State,End,ReqMem,Comment,SubmitLine"],
                         capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split("|")
        rows[f[0]] = {"state": f[1], "end": f[2], "reqmem": f[3], "comment": f[4],
                      "submit": f[5]}
    return rows


def end_time(row: dict[str, str]) -> float:
    return datetime.fromisoformat(row["end"]).timestamp()


def said_at(text: str, pattern: str, ref: float) -> float | None:
    m = re.search(pattern + r" failed at (\d\d:\d\d:\d\d)", text)
    if not m:
        return None
    day = datetime.fromtimestamp(ref).date()
    return datetime.combine(day, datetime.strptime(m.group(1), "%H:%M:%S").time()).timestamp()


def jobs_of(text: str) -> dict[str, str]:
    """Slurm job id -> the log path (rule and wildcards)."""
    return {jid: log for jid, log in SUBMITTED.findall(text)}


def check_plan(out: Path) -> str:
    qos = config("plan_qos", {"qos": "q45", "runtime_min": 60})
    rc1, t1, _ = run(["cudalab", "plan", str(qos)], out / "plan_qos.console.txt")
    acct = config("plan_assoc", {"account": "teaching", "mem_mb": 2000})
    rc2, t2, _ = run(["cudalab", "plan", str(acct)], out / "plan_assoc.console.txt")
    lines = [x for x in (t1 + t2).splitlines() if "QOS" in x or "account" in x.lower()]
    return f"plan: q45+60 min rc {rc1}, teaching+2000 MB rc {rc2}: " + " | ".join(lines[:4])


def check_qos_forced(out: Path) -> str:
    cfg = config("qos_forced", {"qos": "q45", "runtime_min": 45})
    t0 = time.time()
    rc, text, t = run(snakemake(cfg, "--set-resources", "measure:runtime=60"),
                      out / "qos_forced.console.txt")
    m = re.search(r"cudalab: cancelled Slurm job (\d+) .*", text)
    left = subprocess.run(["squeue", "--me", "-h"], capture_output=True, text=True).stdout
    return (f"qos_forced: rc {rc}, {t - t0:.0f} s from start to exit; "
            f"{m.group(0)[:260] if m else 'NO CANCEL LINE'}; "
            f"queue after: {left.strip() or 'empty'}")


def check_resume(out: Path) -> str:
    cfg = config("resume", {"gpu_model": "", "gpu_models": ["a100", "l40s"]})
    cmd = snakemake(cfg, "--jobs", "1")
    proc = subprocess.Popen(cmd, cwd=CLONE, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if re.search(r"Finished jobid: \d+ \(Rule: measure\)", line):
            break
    t_sig = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    rest = proc.communicate(timeout=120)[0]
    stop_s = time.monotonic() - t_sig
    first = "".join(lines) + rest
    (out / "resume_first.console.txt").write_text(f"$ {' '.join(cmd)}\n{first}\n"
                                                 f"[rc {proc.returncode}, {stop_s:.1f} s "
                                                 "after SIGINT]\n")
    done = [m for m in ("a100", "l40s")
            if (cfg.parent / "results/gpu" / m / "raw/matmul/_manifest.json").exists()]
    rc, again, _ = run(cmd, out / "resume_again.console.txt")
    subs = jobs_of(again)
    resubmitted = [log for log in subs.values() if any(f"_{m}" in log for m in done)]
    kept = re.search(r"cudalab: stopped by you.*", first)
    line = re.search(r"cudalab: submitting.*", again)
    return (f"resume: stop {stop_s:.1f} s after SIGINT, finished before: {done}; "
            f"{kept.group(0)[:120] if kept else 'NO STOPPED LINE'}; rerun rc {rc}, "
            f"{len(subs)} submitted, {len(resubmitted)} of finished models "
            f"({line.group(0)[:150] if line else 'NO SUBMIT LINE'})")


def check_oom(out: Path) -> str:
    cfg = config("oom", {"mem_mb": 256, "doctor": False},
                 experiments={"matmul": {"sizes": [6144], "variants": ["cpu"],
                                         "cpu_max_size": 6144}})
    rc, text, _ = run(snakemake(cfg, targets=("results/results.csv",)),
                          out / "oom.console.txt")
    m = re.search(r"cudalab: measure.* failed at .*", text)
    row = sacct(list(jobs_of(text)))
    return (f"oom: rc {rc}; {m.group(0)[:300] if m else 'NO FAILED LINE'}; sacct: "
            + ", ".join(f"{k} {v['state']} ReqMem {v['reqmem']}" for k, v in row.items()))


def check_class(out: Path) -> str:
    cfg = config("class", {})
    subs = cfg.parent / "subs"
    subs.mkdir()
    for s in ("alice", "bob"):
        (subs / f"{s}.cu").write_text(CORRECT)
    c = yaml.safe_load(cfg.read_text())
    c["exercises"] = {"submissions": str(subs), "exercise": "vector_add", "sandbox": "optional"}
    cfg.write_text(yaml.safe_dump(c))
    rc, text, _ = run(snakemake(cfg, targets=("exercises",)), out / "class.console.txt")
    lines = [x for x in text.splitlines() if "leaderboard" in x or "class run" in x]
    return f"class: rc {rc}; " + " | ".join(x[:200] for x in lines[:3])


def _fail_config(name: str) -> Path:
    return config(name, {"doctor": False},
                  experiments={"matmul": {"sizes": [1024], "variants": ["cpu"]},
                               "vector_add": {"sizes": [50000], "threads": [256]}},
                  measurement={"warmup": 1, "min_samples": 1000, "max_samples": 1000,
                               "budget_s": 60})


def check_fail(out: Path, fail_fast: bool) -> str:
    name = "fail_fast" if fail_fast else "fail_keep_going"
    cfg = _fail_config(name)
    extra: list[str] = []
    if fail_fast:
        prof = RUNS / "fail-fast-profile"
        prof.mkdir(exist_ok=True)
        (prof / "config.yaml").write_text("keep-going: false\n")
        extra += ["--profile", str(prof), "--workflow-profile", "none"]
    rc, text, t_exit = run(snakemake(cfg, *extra, targets=("results/results.csv",)),
                             out / f"{name}.console.txt")
    rows = sacct(list(jobs_of(text)))
    by = {("vector_add" if "vector_add" in log else "matmul"): jid
          for jid, log in jobs_of(text).items()}
    va, mm = rows.get(by.get("vector_add", ""), {}), rows.get(by.get("matmul", ""), {})
    if not va or not mm:
        return f"{name}: rc {rc}; jobs not found: {by} {rows}"
    failed = end_time(va)
    said = said_at(text, r"cudalab: measure \(results_vector_add\)", failed)
    cause = f"cause printed {said - failed:.0f} s after the failure" if said else "NO CAUSE LINE"
    last = max(failed, end_time(mm))
    stop = re.search(r"cudalab: stopped after a failure.*", text)
    return (f"{name}: rc {rc}; vector_add {va['state']} at {va['end'][11:]}, matmul "
            f"{mm['state']} at {mm['end'][11:]}; {cause}; exit {stamp(t_exit)}: "
            f"{t_exit - failed:.1f} s after the failure, {t_exit - last:.1f} s after the "
            f"last job ended; {stop.group(0)[:110] if stop else 'no stop line'}; comment "
            f"{va['comment'] or '(none)'}; SubmitLine {va['submit'][:60]}")


CHECKS = {"plan": check_plan, "qos_forced": check_qos_forced, "resume": check_resume,
          "oom": check_oom, "class": check_class,
          "fail_keep_going": lambda out: check_fail(out, False),
          "fail_fast": lambda out: check_fail(out, True)}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:]:
        t0 = time.time()
        try:
            line = CHECKS[name](out)
        except Exception as exc:  # noqa: BLE001 - record and go on with the next check
            line = f"{name}: ERROR {type(exc).__name__}: {exc}"
        line = f"[{stamp(t0)}, {time.time() - t0:.0f} s] {line}"
        print(line, flush=True)
        with open(out / "summary.txt", "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
