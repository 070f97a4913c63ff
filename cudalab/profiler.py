"""Opt-in Nsight Compute (ncu) counters behind each GPU point (config `profile.ncu`).

After a job's timing walk the runner calls profile_job(): TWO child processes per job,

    ncu --target-processes all --profile-from-start off --csv --page raw --metrics <list>
        python -m cudalab.profiler <experiment> --config <json> --points <ids> --runs N ...

each walks the job's ok GPU points again, in grid order, with the harness in profile mode
(harness.Profiler): each point's first Harness.measure() runs fn as warm-up, then opens
the profiler range (cuProfilerStart) and, N times, launches the MARKER kernel with grid =
point index + 1 blocks and runs fn once; it synchronises and closes the range
(cuProfilerStop). No timing is ever taken under the profiler: the child's numbers are
thrown away.

  the time pass     TIME_METRICS only: the kernel's duration alone, one pass, so ncu runs
                    every kernel once, as launched, with nothing saved or restored around it
                    and no other counter collected; N = TIME_RUNS launches, the median is
                    m_ncu_time_us. This is the duration the harness's queued times are
                    checked against. Seen on an H100: collecting the SM clock in the same
                    pass lengthened every kernel by 0.1-0.26 us (an empty kernel 1.92 ->
                    2.02 us, vector add of 50 000 floats 2.30 -> 2.50 us), enough to put the
                    2-5 us kernels outside the 0.5 us agreement; the clock moved to the
                    counters pass.
  the counters pass profile.metrics plus the SM clock (m_ncu_clock_mhz): many passes per
                    kernel (kernel replay saves and restores device memory between them,
                    which leaves an L2-resident working set partly cold and the GPU idle):
                    the counters, never the time (its duration is kept as
                    m_ncu_replay_time_us, for information). Seen on an H100: the replayed
                    duration of a 16 MiB latency chain read 1.86x the harness's time, the
                    time pass's 0.99x.

A kernel that times itself (Experiment.own_timer: the latency chase's ns per load) reports
its own reading from the time pass's child too (m_ncu_own_timer): where it ran at another
speed there than in the timed run (where a 1 KiB chain's eight cache lines lie sets their
latency: seen on an H100, 130-150 ns per load over 24 allocations of one process,
scripts/bench_l2_placement.py), the report tells that apart from a timing that disagrees
(timing_report.ncu_agreement).

The parent reads ncu's CSV: rows in launch order, a marker row starts a point, the kernel
rows up to the next marker are that point's (several: the longest is "the kernel", and the
times are summed). The counters go into each point's raw record as `metrics` ncu_* (table
columns m_ncu_*) with `ncu_status` 'ok' or 'not profiled: <reason>'; the timings are never
touched, and a profiling failure (no ncu, counters not permitted, a time-out, a crash, a
point missing from the CSV) never stops the run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudalab.ncu_csv import (
    CLOCK_METRIC,
    MARKER_KERNEL,
    TIME_METRIC,
    KernelRow,
    group_by_marker,
    group_runs,
    main_kernel,
    parse_raw_csv,
    point_counters,
    requested,
    time_pass_values,
)
from cudalab.resources import IMPORT_ROOT

MARKER_SOURCE = f'extern "C" __global__ void {MARKER_KERNEL}(void) {{}}\n'
TIME_METRICS = [TIME_METRIC]  # the time pass: the duration alone (one pass, no replay)
TIME_RUNS = 5  # profiled launches of each point in the time pass (the median is kept)

OWN_TIMER_FILE = "own_timer.json"  # the child's {point_id: own reading}, beside --report
NO_KERNEL = ("not profiled: no kernel ran in the profiled run (copies and host work have no "
             "kernel counters)")
PERM_REASON = ("not profiled: ERR_NVGPUCTRPERM (GPU performance counters not permitted for "
               "this user: see https://developer.nvidia.com/ERR_NVGPUCTRPERM)")


# -- the parent: one ncu run per job -------------------------------------------------------
@dataclass
class NcuRun:
    """What one ncu run left: its output (the CSV, ==PROF== / ==ERROR== lines), the child's
    output, the child's per-point report, the exit code (None: killed) and its duration;
    own: the own timer's reading of each point whose kernel times itself (in the child)."""

    log_text: str
    child_text: str
    report: dict[str, str]
    rc: int | None
    timed_out: bool
    seconds: float
    command: list[str] = field(default_factory=list)
    own: dict[str, float] = field(default_factory=dict)


def metric_list(metrics: list[str]) -> list[str]:
    """The configured metrics plus the kernel duration, which picks a point's kernel, and
    the SM clock the counters were read at."""
    return [*metrics, *(m for m in (TIME_METRIC, CLOCK_METRIC) if m not in metrics)]


def ncu_version(ncu: str) -> str:
    """'2025.3.1.0' from `ncu --version` ('' when it does not answer)."""
    try:
        p = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"Version\s+(\S+)", p.stdout + p.stderr)
    return m.group(1) if m else ""


def ncu_command(ncu: str, metrics: list[str], log_file: Path, child: list[str],
                cold_l2: bool) -> list[str]:
    """The ncu command line around the child. --clock-control none: by default ncu locks
    the GPU's clocks to base while it profiles; this project never changes the card's
    clocks, and the counters then belong to the clocks the timings ran at.
    --cache-control none: the harness times hot (the L2 keeps what the warm-up left), so ncu
    must not flush the caches between its passes either; only where the timings flush the
    L2 before every sample (measurement.cold_l2) does ncu flush too (all). Kernel replay
    saves and restores device memory between the passes of one kernel."""
    return [ncu, "--target-processes", "all", "--profile-from-start", "off", "--csv",
            "--page", "raw", "--print-units", "base", "--metrics", ",".join(metrics),
            "--replay-mode", "kernel", "--cache-control", "all" if cold_l2 else "none",
            "--clock-control", "none", "--log-file", str(log_file), *child]


def child_command(name: str, config_path: Path, point_ids: list[str], seed: int,
                  report: Path, runs: int = 1) -> list[str]:
    return [sys.executable, "-m", "cudalab.profiler", name, "--config", str(config_path),
            "--points", ",".join(point_ids), "--seed", str(seed), "--report", str(report),
            "--runs", str(runs)]


def run_ncu(cmd: list[str], out_dir: Path, timeout_s: float) -> NcuRun:
    """Run ncu (its own process group, so a time-out kills the child too) and collect what
    it left in out_dir: ncu.log (--log-file), child.log, report.json, own_timer.json."""
    # the child (python -m cudalab.profiler) must import this same copy of cudalab
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(IMPORT_ROOT), os.environ.get("PYTHONPATH")]))}
    t0 = time.time()
    rc: int | None = None
    with open(out_dir / "child.log", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:  # timed out, or the job itself is stopping (Ctrl-C)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    timed_out = rc is None
    report = _read_json(out_dir / "report.json")
    own = {k: float(v) for k, v in _read_json(out_dir / OWN_TIMER_FILE).items()
           if isinstance(v, (int, float))}
    return NcuRun(_read_text(out_dir / "ncu.log"), _read_text(out_dir / "child.log"),
                  report, rc, timed_out, time.time() - t0, own=own)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def job_failure(run: NcuRun, timeout_s: float) -> str:
    """Why the run as a whole went wrong ('' if it did not): this is the reason of every
    point missing from its CSV."""
    text = run.log_text + "\n" + run.child_text
    if "ERR_NVGPUCTRPERM" in text:
        return PERM_REASON
    if run.timed_out:
        return f"not profiled: ncu timed out after {timeout_s:g} s (profile.timeout_s)"
    if run.rc:
        # ncu's own error first; "the application returned an error code" says less than
        # the child's last line (its exception)
        errors = [ln.strip() for ln in text.splitlines() if ln.startswith("==ERROR==")
                  and "application returned an error code" not in ln]
        tail = [ln.strip() for ln in run.child_text.splitlines() if ln.strip()][-1:]
        why = (errors or tail or [""])[0]
        return f"not profiled: ncu exited with code {run.rc}" + (f": {why}" if why else "")
    return ""


def point_status(kernels: list[KernelRow] | None, child: str, job_reason: str) -> str:
    """'ok' or 'not profiled: <reason>' for one point: kernels is None when its marker is
    not in the CSV; child is what the profiling child said of it."""
    if job_reason == PERM_REASON:
        return job_reason  # ncu may print rows of zeros; none of them is a counter
    if kernels:
        return "ok"
    if kernels is not None:
        return NO_KERNEL
    if child.startswith(("failed", "skipped")):
        return f"not profiled: {child.replace(':', ' in the profiling run:', 1)}"
    return job_reason or "not profiled: no result for this point in ncu's CSV"


def needs_profile(rec: dict[str, Any] | None, metrics: list[str]) -> bool:
    """An ok, timed GPU record whose counters are missing, failed, of another metric set or
    without the time pass (a record reused from the cache keeps its earlier profile; a
    point found to launch no kernel is not profiled again). `rec` as results.read_record
    gives it: with its counters file merged in."""
    if not rec or rec.get("status") != "ok" or not rec.get("timing"):
        return False
    prof = rec.get("profile") or {}
    return not (prof.get("status") in ("ok", NO_KERNEL) and prof.get("metrics") == metrics
                and prof.get("time_metrics") == TIME_METRICS)


@dataclass
class Pass:
    """One ncu run over the job's points: its metrics, launches per point, folder."""

    metrics: list[str]
    runs: int
    out_dir: Path


def profile_job(config: dict[str, Any], name: str, points: list[Any], raw_dir: Path,
                out_dir: Path, seed: int) -> dict[str, Any]:
    """Profile the job's ok GPU points that lack counters (the time pass, then the counters
    pass: one ncu run each) and write the counters (or why there are none) into their raw
    records. Returns the manifest's `profile` entry; its "line" is the job log's one line."""
    from cudalab import results

    prof = config["profile"]
    metrics = metric_list(prof["metrics"])
    todo = [(p, raw_dir / f"{p.point_id}.json") for p in points if p.gpu]
    todo = [(p, path) for p, path in todo if needs_profile(results.read_record(path), metrics)]
    entry: dict[str, Any] = {"tool": "ncu", "metrics": metrics, "points": len(todo)}
    if not todo:
        return entry | {"status": "nothing to profile",
                        "line": "ncu: nothing to profile (no ok GPU point lacks counters)"}
    ncu = shutil.which("ncu")
    info = {"tool": "ncu", "metrics": metrics, "time_metrics": TIME_METRICS,
            "time_runs": TIME_RUNS}
    if ncu is None:
        reason = "not profiled: ncu not found on PATH"
        for _, path in todo:
            write_counters(path, {"ncu_time_status": reason}, reason, info)
        return entry | {"status": reason, "profiled": 0, "line": f"ncu: {len(todo)} GPU "
                        f"point(s) {reason} (install Nsight Compute or load its module)"}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, default=str))
    ids = [p.point_id for p, _ in todo]
    cfg_path = out_dir / "config.json"
    time_run = _run_pass(ncu, Pass(TIME_METRICS, TIME_RUNS, out_dir / "time"), name,
                         ids, seed, config, cfg_path)
    time_status = _time_statuses(ids, time_run, prof["timeout_s"])
    # the counters pass skips what the time pass saw launch no kernel (copies, host work),
    # and everything when counters are not permitted or the time pass (the shorter one)
    # already ran out of time: those points keep the time pass's reason
    hopeless = time_run.timed_out or job_failure(time_run, prof["timeout_s"]) == PERM_REASON
    counted = [] if hopeless else [i for i in ids if time_status[i][0] != NO_KERNEL]
    count_run = (_run_pass(ncu, Pass(metrics, 1, out_dir), name, counted, seed,
                           config, cfg_path) if counted else None)
    info |= {"version": ncu_version(ncu), "log": str(out_dir / "ncu.log")}
    statuses = _write_points(todo, time_status, counted, count_run, prof["timeout_s"], info)
    runs = {"time": time_run, "counters": count_run}
    return entry | _summary(statuses, runs, info) | {
        "command": count_run.command if count_run else [], "time_command": time_run.command}


def _run_pass(ncu: str, ps: Pass, name: str, ids: list[str], seed: int,
              config: dict[str, Any], config_path: Path) -> NcuRun:
    ps.out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("ncu.log", "report.json", OWN_TIMER_FILE):
        (ps.out_dir / stale).unlink(missing_ok=True)
    child = child_command(name, config_path.resolve(), ids, seed,
                          (ps.out_dir / "report.json").resolve(), ps.runs)
    cmd = ncu_command(ncu, ps.metrics, (ps.out_dir / "ncu.log").resolve(), child,
                      config["measurement"]["cold_l2"])
    run = run_ncu(cmd, ps.out_dir, config["profile"]["timeout_s"])
    run.command = cmd
    return run


def _time_statuses(ids: list[str], run: NcuRun, timeout_s: float
                   ) -> dict[str, tuple[str, dict[str, Any]]]:
    """Point id -> (status, time-pass metrics) from the time pass."""
    groups = group_runs(parse_raw_csv(run.log_text), len(ids))
    reason = job_failure(run, timeout_s)
    out = {}
    for i, pid in enumerate(ids):
        runs = groups.get(i)
        flat = None if runs is None else [k for r in runs for k in r]
        status = point_status(flat, run.report.get(pid, ""), reason)
        values = time_pass_values(runs) if status == "ok" and runs else {}
        if status == "ok" and pid in run.own:
            values["ncu_own_timer"] = run.own[pid]
        out[pid] = (status, values)
    return out


def _write_points(todo: list[tuple[Any, Path]], time_status: dict[str, tuple[str, dict]],
                  counted: list[str], count_run: NcuRun | None, timeout_s: float,
                  info: dict[str, Any]) -> list[str]:
    """Each point's counters (counters pass) and duration (time pass) into its record;
    returns the counters' statuses (a point without a kernel: the time pass's)."""
    groups = group_by_marker(parse_raw_csv(count_run.log_text), len(counted)) \
        if count_run else {}
    job_reason = job_failure(count_run, timeout_s) if count_run else ""
    index = {pid: i for i, pid in enumerate(counted)}
    statuses = []
    for point, path in todo:
        t_status, timed = time_status[point.point_id]
        ran: list[KernelRow] = []
        if point.point_id in index and count_run is not None:
            kernels = groups.get(index[point.point_id])
            status = point_status(kernels, count_run.report.get(point.point_id, ""),
                                  job_reason)
            ran = kernels if status == "ok" and kernels else []
        else:
            status = t_status  # no kernel ran: there was nothing to count
        extra = {"kernels": [k.name for k in ran],
                 "values": requested(main_kernel(ran).values, info["metrics"]) if ran else {}}
        counters = point_counters(ran, info["metrics"]) if ran else {}
        write_counters(path, counters | timed | {"ncu_time_status": t_status}, status,
                       info | extra)
        statuses.append(status)
    return statuses


def write_counters(path: Path, counters: dict[str, Any], status: str,
                   info: dict[str, Any]) -> None:
    """Write a point's ncu_* metrics and ncu_status into its own counters file
    (results.counters_path: profile/<experiment>/<point>.json beside raw/), atomically.
    The raw record, timing and all, is never written again: the counters file names the
    record's cache key, and results.read_record merges the two while the key matches."""
    from cudalab import results

    rec = results.read_json(path)
    if rec is None or rec.get("schema_version") != results.SCHEMA_VERSION:
        return
    results.write_json_atomic(results.counters_path(path), {
        "schema_version": results.SCHEMA_VERSION, "point_id": rec.get("point_id"),
        "cache_key": rec.get("cache_key"),
        "metrics": counters | {"ncu_status": status},
        "profile": info | {"status": "ok" if status == "ok" else status}})


def _summary(statuses: list[str], runs: dict[str, NcuRun | None], info: dict[str, Any]
             ) -> dict[str, Any]:
    ok = statuses.count("ok")
    bad = [st for st in statuses if st != "ok"]
    common = max(set(bad), key=bad.count) if bad else ""
    secs = {k: r.seconds if r else 0.0 for k, r in runs.items()}
    seconds = sum(secs.values())
    line = (f"ncu: {ok} of {len(statuses)} GPU point(s) profiled in {seconds:.1f} s"
            f" (time pass {secs['time']:.1f} s, counters pass "
            + (f"{secs['counters']:.1f} s)" if runs["counters"] else "skipped: no kernel)")
            + (f"; {len(bad)} {common}" + (" (and other reasons)" if len(set(bad)) > 1 else "")
               if bad else "")
            + f" (ncu {info['version'] or 'version unknown'}; output {info['log']})")
    return {"status": "ok" if not bad else common, "profiled": ok,
            "seconds": round(seconds, 3),
            "rc": runs["counters"].rc if runs["counters"] else None,
            "time_rc": runs["time"].rc if runs["time"] else None, "version": info["version"],
            "log": info["log"], "line": line}


# -- the child: the job's points again, under ncu ------------------------------------------
def _libcuda() -> Any:
    """The driver library pycuda already loaded (cuProfilerStart/Stop are driver API)."""
    return ctypes.CDLL("libcuda.so.1")


class NcuRange:
    """harness.Profiler for the child: the first measure() of point `point_index` opens
    the profiler range and launches the marker with point_index + 1 blocks; before each
    further run of fn (`runs` in all) mark() launches it again, so every run's kernels
    are told apart; end() waits for the GPU and closes the range. Later measure() calls
    of the same point run unprofiled."""

    def __init__(self, start: Callable[[], int], stop: Callable[[], int],
                 marker: Callable[[int], None], sync: Callable[[], None],
                 runs: int = 1) -> None:
        self._start, self._stop, self._marker, self._sync = start, stop, marker, sync
        self.runs = runs
        self.point_index = -1
        self._opened = -1

    @classmethod
    def for_session(cls, gpu: Any, runs: int = 1) -> NcuRange:
        from pycuda.compiler import SourceModule

        func = SourceModule(MARKER_SOURCE, no_extern_c=True).get_function(MARKER_KERNEL)
        lib = _libcuda()
        return cls(lib.cuProfilerStart, lib.cuProfilerStop,
                   lambda blocks: func(block=(1, 1, 1), grid=(blocks, 1)), gpu.synchronize,
                   runs)

    def begin(self) -> bool:
        if self.point_index < 0 or self._opened == self.point_index:
            return False
        self._opened = self.point_index
        _driver_ok(self._start(), "cuProfilerStart")
        self.mark()
        return True

    def mark(self) -> None:
        self._marker(self.point_index + 1)

    def end(self) -> None:
        self._sync()
        _driver_ok(self._stop(), "cuProfilerStop")


def _driver_ok(code: int, call: str) -> None:
    if code != 0:
        raise RuntimeError(f"{call} failed (CUresult {code})")


def child_main(argv: list[str] | None = None) -> int:
    """`python -m cudalab.profiler EXPERIMENT --config JSON --points ID,ID --seed N --report
    JSON`: measure those points in profile mode, in that order. Writes {point_id: 'ok' |
    'failed: ...' | 'skipped: ...'} to --report after each point, and where the experiment's
    kernel times itself (Experiment.own_timer) {point_id: its reading} to own_timer.json
    beside it; prints only to stderr."""
    import numpy as np

    from cudalab.experiments import REGISTRY
    from cudalab.experiments.base import RunContext, Skipped
    from cudalab.gpu import open_session
    from cudalab.gpu_errors import gpu_error_kind
    from cudalab.harness import Harness, Settings
    from cudalab.results import write_json_atomic

    ap = argparse.ArgumentParser(prog="python -m cudalab.profiler")
    ap.add_argument("experiment")
    for opt in ("--config", "--points", "--report"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args(argv)
    config = json.loads(Path(a.config).read_text())
    exp = REGISTRY[a.experiment]
    grid = {p.point_id: p for p in exp.grid(config)}
    gpu = open_session(config["gpu_index"])
    rng = NcuRange.for_session(gpu, a.runs)
    ctx = RunContext(gpu, Harness(Settings.from_config(config["measurement"]), profiler=rng),
                     np.random.default_rng(a.seed), config, config["experiments"][a.experiment])
    exp.prepare(ctx)
    report: dict[str, str] = {}
    own: dict[str, float] = {}
    own_path = Path(a.report).with_name(OWN_TIMER_FILE)
    for i, pid in enumerate(a.points.split(",")):
        rng.point_index = i
        try:
            res = exp.measure(ctx, grid[pid])
            report[pid] = "ok"
            reading = res.metrics.get(exp.own_timer) if exp.own_timer else None
            if isinstance(reading, (int, float)) and math.isfinite(reading):
                own[pid] = float(reading)
                write_json_atomic(own_path, own)
        except Skipped as exc:
            report[pid] = f"skipped: {exc}"
        except Exception as exc:  # noqa: BLE001 - the parent names it for the point
            report[pid] = f"failed: {gpu_error_kind(exc)}: {exc}"
        print(f"profiled {pid}: {report[pid]}", file=sys.stderr, flush=True)
        write_json_atomic(Path(a.report), report)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
