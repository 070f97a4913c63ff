"""Running the judge (cudalab.exercises.judge) in a child process under a watchdog.

The child prints a heartbeat whenever the GPU has answered (a check's synchronize, a timed
sample). When no heartbeat comes for `launch_timeout_s` (the per-launch wall-clock limit:
a kernel that never returns), the child's whole process group is killed, which destroys its
CUDA context and frees the GPU; the verdict is 'timeout'. A child that dies without writing
its verdict (a segfault, the driver killing it) is 'crashed' with its exit status and the
end of its stderr. With `sanitize`, the child runs under compute-sanitizer's memcheck on
the small grid only, the tool writing its report to a file of its own (never the kernel's
stdout, which a printf can fill with look-alike lines); an invalid access that report names
is 'memory_error' with its first lines. Anything else the tool reports (a __trap, an API
error) leaves the child's own verdict ('crashed' for a trap), as without the tool.

Where a sandbox runs (cudalab.jail, judge_jail), the child runs in it: the GPU, the Python
install and the package read-only, its temporary folder writable, nothing else of the host;
killing it kills its whole PID namespace.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cudalab import jail
from cudalab.exercises.catalog import Exercise
from cudalab.exercises.guard import HEARTBEAT
from cudalab.exercises.judge_jail import judge_jail
from cudalab.resources import IMPORT_ROOT

STARTUP_S = 60.0  # Python, pycuda and a CUDA context before the first heartbeat
SANITIZER_SLOWDOWN = 50  # memcheck runs kernels this much slower, or more
SANITIZER_EXIT = 97
MAX_OUTPUT_LINES = 2000  # of the child's stdout kept (a kernel's printf can fill it)
# memcheck's reports of an invalid access (its other reports: API errors, leaks, a summary)
MEMORY_ERROR = re.compile(r"^=+ (Invalid __\w+__ (read|write|atomic)|Invalid (global|shared|"
                          r"local) |Misaligned|Out-of-range|Address 0x[0-9a-fA-F]+ is "
                          r"(out of bounds|misaligned))")


def find_sanitizer() -> str | None:
    from cudalab.toolkit import find_nvcc

    found = shutil.which("compute-sanitizer")
    nvcc = find_nvcc()
    if found is None and nvcc is not None:
        cand = Path(nvcc).resolve().parent / "compute-sanitizer"
        found = str(cand) if cand.exists() else None
    return found


def judge_command(ex: Exercise, cubin: Path | None, out: Path, mode: str, seed: int,
                  cublas: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "cudalab.exercises.judge", "--exercise", ex.name,
           "--out", str(out), "--mode", mode, "--seed", str(seed)]
    return cmd + (["--cublas"] if cublas else ["--cubin", str(cubin)])


def run_judge(ex: Exercise, cubin: bytes | None, mode: str = "check", seed: int = 0,
              launch_timeout_s: float = 10.0, sanitize: bool = False,
              cublas: bool = False, sandbox: str = "optional") -> dict[str, Any]:
    """The child's verdict (a dict with 'status'), whatever the kernel does. `sandbox`
    (required|optional|off, cudalab.jail.use): whether the child runs in one."""
    from cudalab import results

    boxed = jail.use(sandbox)
    with tempfile.TemporaryDirectory(prefix="cudalab-judge-") as tmp:
        path = None
        if cubin is not None:
            path = Path(tmp) / "kernel.cubin"
            path.write_bytes(cubin)
        out = Path(tmp) / "verdict.json"
        cmd = judge_command(ex, path, out, "sanitize" if sanitize else mode, seed, cublas)
        limit = launch_timeout_s
        log = Path(tmp) / "sanitizer.log"
        if sanitize:
            tool = find_sanitizer()
            if tool is None:
                return {"status": "no_sanitizer", "message": "compute-sanitizer not found "
                        "(it comes with the CUDA toolkit)"}
            cmd = [tool, "--tool", "memcheck", "--log-file", str(log), "--error-exitcode",
                   str(SANITIZER_EXIT), "--print-limit", "5", *cmd]
            limit *= SANITIZER_SLOWDOWN
        tools = [os.path.dirname(os.path.realpath(cmd[0]))] if sanitize else []
        box = judge_jail(Path(tmp), tools=tools) if boxed else None
        rc, _lines, err, timed_out = watch(cmd, limit, box)
        verdict = results.read_json(out)
        report = log.read_text(errors="replace").splitlines() if log.exists() else []
    if timed_out:
        return {"status": "timeout", "message": f"no answer from the GPU for {limit:g} s (the "
                "per-launch limit): the kernel was stopped by killing its process, which "
                "frees the GPU. Look for a loop that never ends or a __syncthreads() that not "
                "every thread of the block reaches."}
    errors = memory_errors(report)
    if errors:
        lines = [ln.strip("= ").rstrip() for ln in report if ln.startswith("=")]
        return {"status": "memory_error", "message": f"compute-sanitizer (memcheck) found "
                f"invalid memory accesses: {errors[0]}", "sanitizer": [r for r in lines
                                                                       if r][:12]}
    if verdict is None:
        why = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
        tail = " | ".join(err.strip().splitlines()[-4:])
        return {"status": "crashed", "message": f"the judge process died ({why})"
                + (f": {tail}" if tail else "")}
    return verdict


def memory_errors(report: list[str]) -> list[str]:
    """The invalid-access lines of a memcheck report (its log file's lines)."""
    return [ln.strip("= ").rstrip() for ln in report if MEMORY_ERROR.match(ln)]


def watch(cmd: list[str], limit: float, box: jail.Jail | None = None
          ) -> tuple[int, list[str], str, bool]:
    """Run cmd in its own process group (in `box` where given); kill the group when no
    heartbeat came for `limit` seconds (STARTUP_S more before the first). (exit status,
    stdout lines that are not heartbeats, stderr, whether it was killed)."""
    pipes: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                             "text": True, "errors": "replace"}
    if box is not None:
        proc = box.popen(cmd, **pipes)
    else:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(IMPORT_ROOT),
                                                          env.get("PYTHONPATH", "")]))
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, **pipes)
    last = [time.monotonic() + STARTUP_S]
    lines: list[str] = []
    err: list[str] = []

    def read_out() -> None:
        for line in proc.stdout:
            if line.strip() == HEARTBEAT:
                last[0] = time.monotonic()
            elif len(lines) < MAX_OUTPUT_LINES:
                lines.append(line.rstrip("\n")[:1000])

    def read_err() -> None:
        for line in proc.stderr:
            if len(err) < MAX_OUTPUT_LINES:
                err.append(line[:1000])

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    timed_out = False
    while proc.poll() is None:
        if time.monotonic() - last[0] > limit:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.05)
    for t in readers:
        t.join(timeout=5)
    return proc.returncode, lines, "".join(err), timed_out
