"""The sandbox the judge child runs in (cudalab.jail): the GPU's device nodes, the driver's
libraries, the Python install, the cudalab package and the CUDA toolkit read-only, and its
own temporary folder writable; nothing else of the host (no home, no project tree, no class
folder, no network).

What it binds is found on the machine it runs on, never listed by hand: /dev/nvidia*
(MIG's nvidia-caps too), the folder of the libcuda this process loads, sys.prefix and its
kin and every site-packages folder on sys.path, the caller's PYTHONPATH folders (where a
cluster module or `pip install --target` put pycuda: seen on the lent GPU machine, where the
judge then found no pycuda and every kernel came back "compiled"), the package's own
folders and the toolkit
of the nvcc found. /sys is bound read-only: the CUDA driver reads the PCI and NUMA
topology there. No address-space limit: a CUDA context reserves far more address space
than it uses; the job's own allocation (Slurm's cgroup) bounds its memory.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cudalab import jail
from cudalab.resources import CUDA_DIR, IMPORT_ROOT, PACKAGE_DIR, SCHEMAS_DIR

# A fork bomb is stopped by the process count, not by the wall clock; RLIMIT_NPROC counts
# threads too, and the CUDA driver, OpenBLAS and CuPy start a thread per core.
JUDGE_LIMITS = jail.Limits(wall_s=float("inf"), cpu_s=7200, memory_bytes=None,
                           processes=2048, file_bytes=1 << 30, output_bytes=1 << 20,
                           tmp_bytes=2 << 30)
PASSED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MPS_PIPE_DIRECTORY",
              "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
TOOLKIT_ENV = ("CUDA_HOME", "CUDA_PATH")  # where CuPy and pycuda look for the toolkit


def devices() -> list[str]:
    """The GPU's device nodes of this machine (none on a machine without the driver)."""
    return sorted(glob.glob("/dev/nvidia*"))


@functools.lru_cache(maxsize=1)
def driver_library_dirs() -> tuple[str, ...]:
    """The folder of the libcuda the dynamic linker finds here (loaded, never initialised),
    read back from this process's memory map; () without a driver."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return ()
    with open("/proc/self/maps") as f:
        paths = {ln.split()[-1] for ln in f if "libcuda.so" in ln and "/" in ln}
    return tuple(sorted({os.path.dirname(p) for p in paths}))


def python_dirs() -> list[str]:
    """The Python install: its prefixes, the interpreter's folder and every site-packages
    folder on sys.path (a user site or a venv outside the prefix too)."""
    site = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return [sys.prefix, sys.base_prefix, sys.exec_prefix,
            os.path.dirname(os.path.realpath(sys.executable)), *site]


def pythonpath_dirs() -> list[str]:
    """The folders of the caller's PYTHONPATH (a cluster module's pycuda, a `pip install
    --target` folder), less any that would show the project itself (the package is bound on
    its own)."""
    project = os.path.realpath(IMPORT_ROOT)
    out = []
    for p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        real = os.path.realpath(p) if p else ""
        if real and os.path.isdir(real) and not (
                real == project or project.startswith(real.rstrip("/") + "/")
                or real.startswith(project + "/")):
            out.append(real)
    return out


def toolkit_dirs() -> list[str]:
    """The CUDA toolkit of the nvcc found (the judge compiles its own fill and hold kernels
    with pycuda and runs compute-sanitizer from it), and those CUDA_HOME or CUDA_PATH
    name."""
    from cudalab.exercises.toolkit_jail import toolkit_root
    from cudalab.toolkit import find_nvcc

    nvcc = find_nvcc()
    named = [os.environ[k] for k in TOOLKIT_ENV if os.path.isdir(os.environ.get(k, ""))]
    return [*([str(toolkit_root(nvcc))] if nvcc else []), *named]


def judge_jail(work: Path, gpu_nodes: list[str] | None = None,
               tools: Sequence[str] = ()) -> jail.Jail:
    """The sandbox of one judge child, writing only into `work`; `tools`: folders of the
    programs it runs the judge under (compute-sanitizer's, where not the toolkit's)."""
    nodes = devices() if gpu_nodes is None else gpu_nodes
    libpath = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    toolkit = toolkit_dirs()
    package = [str(PACKAGE_DIR), str(CUDA_DIR), str(SCHEMAS_DIR)]
    pypath = pythonpath_dirs()
    ro = jail.readable_roots([*python_dirs(), *pypath, *package, *toolkit, *tools,
                              *driver_library_dirs(), *libpath, "/sys"])
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env |= {k: os.environ[k] for k in TOOLKIT_ENV if os.environ.get(k, "") in toolkit}
    env |= {"PYTHONPATH": os.pathsep.join([str(IMPORT_ROOT), *pypath]),
            "PYTHONDONTWRITEBYTECODE": "1"}
    if libpath:
        env["LD_LIBRARY_PATH"] = ":".join(libpath)
    path = [os.path.dirname(sys.executable), *(str(Path(t) / "bin") for t in toolkit)]
    return jail.Jail(ro=ro, rw=(str(work),), dev=tuple(nodes), env=env, path=tuple(path),
                     limits=JUDGE_LIMITS, cwd=str(work))
