"""Compiling a kernel file for static analysis and reading what ptxas reports, one build
per (file, compile variant, target), through the user's build cache and on every core.

One nvcc per target: nvcc runs its front end (cicc, 96 % of a build: 11 s of 11.7 s for
matmul_pipeline.cu) once per virtual architecture even when one command names several
-gencode targets, and the heavy files branch on __CUDA_ARCH__, so neither a multi-target
command nor one PTX for every target would save the front end without changing what is
analysed. The builds a job needs run in parallel instead, the longest (as the cache's
timings know them) first, and a build seen before is read from the cache.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cudalab import build_cache, toolkit
from cudalab.experiments import base
from cudalab.experiments.static_analysis.archs import visible_gpu_archs
from cudalab.ptxas_info import nvcc_options, parse_maxntid, parse_ptxas
from cudalab.resources import CUDA_DIR

# One build's CPU seconds when the cache has no timing for it: the default grid's mean on
# this project's 2-core machine (34 builds for sm_90 in 71 s of nvcc CPU time; most take
# 0.2-0.8 s, matmul/matmul_pipeline.cu's 4-24 s).
DEFAULT_BUILD_S = 2.0
# A build the cache already holds: reading its entry and writing the point's record.
HIT_S = 0.02

Need = tuple[str, str, str]  # (file in cuda/, flags, arch)
# timeout_s limits a build's CPU time (each process of it), not its wall time: at idle
# priority on a busy host a build may wait long for a core without being at fault (on four
# H200s with every core taken, a 20 s build was killed at 300 s of wall). The wall clock
# only stops a build that waits this many times its CPU limit.
WALL_FACTOR = 10


class CompileError(base.CompileFailure):
    """nvcc is missing, cannot target an architecture, or failed (the runner reports
    'nvcc failed: ...')."""


def run_in_background() -> None:
    """In nvcc's child process: take a core only when no other process wants it. A local
    run puts this job beside the timed ones; on an H200 its nvcc runs delayed the numpy
    reference's BLAS threads to the scheduler's 4 ms tick (160x240x320 took 4.00 ms, 18x
    the H100's 222 us). SCHED_IDLE where Linux has it, else the lowest nice."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def compile_report(nvcc: str, path: Path, flags: str, arch: str, timeout_s: int = 300,
                   background: bool = True) -> dict[str, dict[str, int]]:
    """Compile one file for one target; ptxas' resource usage per kernel, plus the block
    size its __launch_bounds__ allow (max_threads; 0 = none), read from the PTX that the
    same nvcc run keeps. background: nvcc at the idle priority (False: the calling thread
    already runs there, as Builder's workers do)."""
    return timed_report(nvcc, path, flags, arch, timeout_s, background)[0]


def _child_limits(timeout_s: float, background: bool):
    """What nvcc's child process sets before it runs: the CPU limit its processes (cicc,
    ptxas) each inherit, and idle priority where asked."""
    def pre() -> None:
        cpu = math.ceil(timeout_s)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        if background:
            run_in_background()
    return pre


def run_child(cmd: list[str], timeout_s: float, background: bool) -> tuple[int, str, float]:
    """Run cmd: (exit code, stdout and stderr, CPU seconds it and its children used). The
    CPU time, unlike the wall time, does not depend on how busy the machine was, so the
    plan can scale it to the load it sees (os.wait4 gives it; subprocess.run does not).
    Each of its processes may use timeout_s of CPU; the whole WALL_FACTOR times that of
    wall time (subprocess.TimeoutExpired)."""
    with tempfile.TemporaryFile("w+") as log:
        # its own process group: a timeout stops nvcc's cicc and ptxas too
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True,
                                preexec_fn=_child_limits(timeout_s, background))
        deadline = time.monotonic() + timeout_s * WALL_FACTOR
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                raise subprocess.TimeoutExpired(cmd, timeout_s * WALL_FACTOR)
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        return proc.returncode, log.read(), usage.ru_utime + usage.ru_stime


def timed_report(nvcc: str, path: Path, flags: str, arch: str, timeout_s: int = 300,
                 background: bool = True) -> tuple[dict[str, dict[str, int]], float]:
    """compile_report and the CPU seconds its nvcc took."""
    with tempfile.TemporaryDirectory(prefix="cudalab-sa-") as tmp:
        cmd = [nvcc, "-cubin", *nvcc_options(flags, arch), "-I", str(CUDA_DIR),
               "-keep", "-keep-dir", tmp, str(path), "-o", str(Path(tmp) / "k.cubin")]
        try:
            code, text, cpu_s = run_child(cmd, timeout_s, background)
        except subprocess.TimeoutExpired as exc:
            raise CompileError(f"nvcc took longer than {exc.timeout:g} s of wall time: "
                               f"{' '.join(cmd)}") from exc
        except OSError as exc:
            raise CompileError(f"nvcc could not start ({exc}): {' '.join(cmd)}") from exc
        ptx = "".join(f.read_text() for f in Path(tmp).glob("*.ptx"))
    if code != 0 and (code in (-signal.SIGXCPU, -signal.SIGKILL) or "CPU time limit" in text
                      or cpu_s >= 0.9 * timeout_s):
        raise CompileError(f"nvcc used more than {timeout_s} s of CPU time (timeout_s) on "
                           f"{path.name} for {arch}: {' '.join(cmd)}")
    if code != 0:
        if "Unsupported gpu architecture" in text or "unsupported gpu architecture" in text:
            version, _ = toolkit.toolkit_version(nvcc)
            named = "nvcc" + (f" {'.'.join(map(str, version))}" if version else "")
            raise CompileError(f"{named} cannot compile for {arch} "
                               f"(it supports {', '.join(toolkit.archs_of(nvcc)) or '?'})")
        tail = "\n".join(text.strip().splitlines()[-8:])
        raise CompileError(f"nvcc failed on {path.name} {flags!r} for {arch}:\n{tail}")
    report = parse_ptxas(text)
    if not report:
        raise CompileError(f"no ptxas resource report in nvcc's output for {path.name} "
                           f"({arch}): {text.strip()[:300]!r}")
    bounds = parse_maxntid(ptx)
    for name, usage in report.items():
        usage["max_threads"] = bounds.get(name, 0)
    return report, cpu_s


# At most this many nvcc at once: a cicc of matmul_pipeline.cu holds a few hundred MB, and a
# default grid has 34 builds, so more would not shorten the job (its longest build does).
MAX_WORKERS = 16


def workers() -> int:
    """How many nvcc may run at once: every core this process may use, up to MAX_WORKERS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


class Builder:
    """The builds of one job: each (file, flags, arch) at most once, read from the build
    cache or compiled, on every core (a failure is kept and raised for each point that
    needs it)."""

    def __init__(self, nvcc: str, timeout_s: int, cache: build_cache.BuildCache,
                 cuda_dir: Path = CUDA_DIR) -> None:
        self.nvcc, self.timeout_s, self.cache, self.cuda_dir = nvcc, timeout_s, cache, cuda_dir
        self.toolkit = build_cache.toolkit_id(nvcc)
        self.done: dict[Need, build_cache.Build | CompileError] = {}
        self._sources: dict[str, bytes] = {}

    def key(self, need: Need) -> str:
        file, flags, arch = need
        if file not in self._sources:
            self._sources[file] = build_cache.source_bytes(self.cuda_dir / file, [self.cuda_dir])
        return build_cache.build_key(self._sources[file], nvcc_options(flags, arch), arch,
                                     self.toolkit)

    def build(self, need: Need) -> build_cache.Build:
        """The build of `need` (compiled now unless prefetched or cached); CompileError if
        nvcc failed on it."""
        if need not in self.done:
            self.prefetch([need])
        got = self.done[need]
        if isinstance(got, CompileError):
            raise got
        return got

    def prefetch(self, needs: Iterable[Need]) -> None:
        """Build every need not yet built: cache hits first, then nvcc on every core, the
        longest builds first (by the cache's timings) so that one long build does not
        start last."""
        todo = []
        for need in dict.fromkeys(needs):
            if need in self.done:
                continue
            key = self.key(need)
            hit = self.cache.get(key)
            if hit is not None:
                self.done[need] = hit
            else:
                todo.append((need, key))
        if not todo:
            return
        timings = self.cache.measured_seconds() if len(todo) > 1 else {}
        todo.sort(key=lambda t: -timings.get(t[0], DEFAULT_BUILD_S))
        # Beside a GPU, timed jobs may run: each worker thread then takes the idle priority,
        # and so do the nvcc it starts. Without one nothing here is timed on the GPU, and the
        # idle priority would stall the builds behind any other load on the machine.
        idle = run_in_background if visible_gpu_archs() else None
        with ThreadPoolExecutor(min(workers(), len(todo)), initializer=idle) as pool:
            for (need, _), got in zip(todo, pool.map(lambda t: self._compile(*t), todo)):
                self.done[need] = got

    def _compile(self, need: Need, key: str) -> build_cache.Build | CompileError:
        file, flags, arch = need
        try:
            report, cpu_s = timed_report(self.nvcc, self.cuda_dir / file, flags, arch,
                                         self.timeout_s, background=False)
        except CompileError as exc:
            return exc
        built = build_cache.Build(report, cpu_s, False, key)
        self.cache.put(key, built, file=file, flags=flags, arch=arch, nvcc=self.nvcc)
        return built
