"""Helpers of the untrusted-input tests: a deadline that turns a hang into a failure, the
cudalab command line in a child process with a memory cap (a read of /dev/zero ends in a
MemoryError there, not in the test machine's swap), and a comparable result folder."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"


class Hung(AssertionError):
    """The code under test did not return within its deadline."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail (Hung) when the block runs longer than `seconds`: SIGALRM interrupts a blocking
    system call such as the open of a FIFO, and the handler's exception ends it."""
    def fire(signum, frame):
        raise Hung(f"still running after {seconds} s: it hangs")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _cap_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def cudalab(*args: str, cwd: Path | None = None, timeout: float = 120,
            memory: int = 6 * 1024 ** 3) -> subprocess.CompletedProcess:
    """`cudalab ARGS` in a child with at most `memory` bytes of address space."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "cudalab.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd or ROOT, env=env,
                          preexec_fn=lambda: _cap_memory(memory))


def make_run(dest: Path, experiments: tuple[str, ...] = ("vector_add",)) -> Path:
    """A result folder holding the H100 reference's raw records of some experiments."""
    for e in experiments:
        shutil.copytree(REFERENCE / "raw" / e, dest / "raw" / e)
    return dest
