"""The sandbox a submission is compiled in (cudalab.jail): the CUDA toolkit and the host
compiler read-only, the compile's own folder writable, nothing else of the host; and the
compile's limits, with the words a student reads when one stops it."""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

from cudalab import jail

COMPILE_LIMITS = jail.Limits(wall_s=120, cpu_s=240, memory_bytes=4 << 30, processes=64,
                             file_bytes=256 << 20, output_bytes=1 << 20, tmp_bytes=1 << 30)
_OUT_OF_MEMORY = ("out of memory", "std::bad_alloc", "Cannot allocate memory",
                  "virtual memory exhausted", "Memory allocation failure")
_DIED = re.compile(r"died due to signal (\d+)")


@functools.lru_cache(maxsize=8)
def toolkit_root(nvcc: str) -> Path:
    """The toolkit folder of an nvcc (bin/nvcc's parent's parent). A wrapper script (as
    /usr/local/bin/nvcc may be) is asked where its toolkit is (`--dryrun` prints TOP)."""
    real = Path(os.path.realpath(nvcc))
    with real.open("rb") as f:
        if f.read(4) == b"\x7fELF":
            return real.parent.parent
    out = subprocess.run([nvcc, "--dryrun", "-E", "-x", "cu", os.devnull],
                         capture_output=True, text=True, timeout=60)
    for line in out.stderr.splitlines():
        if line.startswith("#$ TOP="):
            return Path(os.path.realpath(line.split("=", 1)[1]))
    raise RuntimeError(f"{nvcc}: cannot tell which CUDA toolkit it runs (no TOP in "
                       "--dryrun's output)")


def host_compiler_roots() -> list[str]:
    """The install folders of the host compiler where it is not the system's (a module's
    gcc under /opt or a software tree): nvcc runs `gcc` from PATH."""
    out = []
    for name in ("gcc", "g++"):
        found = shutil.which(name)
        real = os.path.realpath(found) if found else ""
        if real and not real.startswith("/usr/"):
            out.append(str(Path(real).parent.parent))
    return out


def compile_jail(nvcc: str, work: Path) -> tuple[jail.Jail, str]:
    """The sandbox of a compile in `work`, and the nvcc binary to run in it."""
    root = toolkit_root(nvcc)
    extra = host_compiler_roots()
    ro = jail.readable_roots([root, *extra])
    path = (str(root / "bin"), *(str(Path(r) / "bin") for r in extra))
    return (jail.Jail(ro=ro, rw=(str(work),), path=path, limits=COMPILE_LIMITS,
                      cwd=str(work)),
            str(root / "bin" / "nvcc"))


def run_nvcc(cmd: list[str], cwd: Path, sandboxed: bool) -> jail.Outcome:
    """nvcc's run on a submission: in its sandbox, or (none here) plainly, its process
    group killed at the wall-time limit either way."""
    if not sandboxed:
        return jail.run_plain(cmd, str(cwd), COMPILE_LIMITS)
    box, nvcc = compile_jail(cmd[0], cwd)
    return box.run([nvcc, *cmd[1:]])


def limit_problem(out: jail.Outcome, what: str = "nvcc") -> str:
    """Why a limit stopped the compile, in a student's words, or ''."""
    lim = COMPILE_LIMITS
    if out.stopped == "time":
        return f"{what} took longer than {lim.wall_s:g} s on this file: stopped"
    if out.stopped == "output":
        return f"{what} wrote more than {lim.output_bytes >> 10} KiB of messages: stopped"
    rc = out.returncode
    m = _DIED.search(out.output)  # nvcc's words for a tool a limit stopped
    rc = -int(m.group(1)) if m and rc != 0 else rc
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return f"{what} used more than {lim.cpu_s} s of CPU time on this file: stopped"
    if rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return f"{what} wrote a file larger than {lim.file_bytes >> 20} MiB: stopped"
    if rc != 0 and any(m in out.output for m in _OUT_OF_MEMORY):
        return (f"{what} ran out of its memory limit ({lim.memory_bytes >> 30} GiB) on "
                "this file: stopped")
    return ""
