"""`cudalab doctor`: can this node (a login node, a laptop, a Slurm job) run the grid?

One short check, printed as a table, each failing line with what to do: host, the Slurm
allocation, environment modules, nvcc, the driver and the CUDA version it supports,
pycuda, a one-line kernel compiled and run, free GPU memory, nvidia-smi, ncu and counter
permission. The CUDA checks run in a child Python (`probe`) with the modules' environment,
so a crashing driver or a missing library is a table line, never a traceback here.

Under Slurm the workflow runs it first as one job with the measure jobs' request and
modules (workflow/rules/doctor.smk); no measure job is submitted when it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"
# `module` is a shell function: take it from the environment (Lmod's BASH_ENV or an exported
# function), else from the usual init scripts of Lmod / Environment Modules.
_MODULE_INIT = """
type module >/dev/null 2>&1 || for f in "${LMOD_PKG:-}/init/bash" "${MODULESHOME:-}/init/bash" \\
    /usr/share/lmod/lmod/init/bash /usr/share/modules/init/bash; do
  [ -r "$f" ] && . "$f" >/dev/null 2>&1 && break; done
type module >/dev/null 2>&1 || { echo "no module command on this node (no Lmod or \
Environment Modules init script found)" >&2; exit 127; }
"""
_KERNEL = "__global__ void add1(float *x) { x[threadIdx.x] += 1.0f; }"


@dataclass
class Check:
    name: str
    status: str  # ok | warn | FAIL | info
    value: str
    fix: str = ""


def _run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """(returncode, stdout + stderr); 127 when the program is missing, 124 on time-out."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError as exc:
        return 127, str(exc)
    except subprocess.TimeoutExpired:
        return 124, f"no answer in {timeout:.0f} s"
    return p.returncode, (p.stdout + p.stderr).strip()


def _short(text: str, n: int = 300) -> str:
    one = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return one if len(one) <= n else one[: n - 1] + "…"


# -- modules -----------------------------------------------------------------------------------
def _loaded(env: dict[str, str]) -> list[str]:
    return [m for m in env.get("LOADEDMODULES", "").split(":") if m]


def _is_loaded(m: str, env: dict[str, str]) -> bool:
    return any(x == m or x.startswith(m.rstrip("/") + "/") for x in _loaded(env))


def check_modules(modules: list[str], env: dict[str, str]) -> tuple[list[Check], dict[str, str]]:
    """One line per module; returns the environment with every loadable module loaded (a
    job started with --sdm env-modules has them already; a plain shell gets them here)."""
    in_job = bool(env.get("SLURM_JOB_ID"))
    tried: dict[str, tuple[bool, str]] = {}  # (loads, what `module load` said) if not loaded
    for m in modules:
        if not _is_loaded(m, env):
            rc, out = _run(["bash", "-c", _MODULE_INIT + 'module load "$1"', "_", m], env)
            tried[m] = (rc == 0 and "error" not in out.lower(), out)
    broken = [m for m, (ok, _) in tried.items() if not ok]
    checks = []
    for m in modules:
        ok, out = tried.get(m, (True, ""))
        if m not in tried:
            checks.append(Check(f"module {m}", OK, "loaded in this job (LOADEDMODULES)"))
        elif not ok:
            checks.append(Check(f"module {m}", FAIL, f"`module load {m}` failed: {_short(out)}",
                                "fix slurm.modules in config.yaml (`module avail`, "
                                "`module spider NAME` list what exists on the compute node)"))
        elif in_job and broken:  # `module load a b` loads none of them when one fails
            checks.append(Check(f"module {m}", INFO, "loadable, but not loaded in this job: "
                                f"the job's `module load` of the list stopped at "
                                f"{', '.join(broken)}", "nothing to do here once "
                                f"{', '.join(broken)} is fixed in slurm.modules"))
        elif in_job:
            checks.append(Check(f"module {m}", FAIL, "loadable but not loaded in this job",
                                "run with --sdm env-modules (profiles/slurm sets "
                                "software-deployment-method: env-modules)"))
        else:
            checks.append(Check(f"module {m}", INFO, "loadable; loaded for the checks below "
                                "(jobs load it with --sdm env-modules)"))
    loadable = [m for m, c in zip(modules, checks) if c.status != FAIL]
    missing = [m for m in loadable if m not in _loaded(env)]
    if missing:
        rc, out = _run(["bash", "-c", _MODULE_INIT + 'module load "$@" >&2 && env -0', "_",
                        *missing], env)
        if rc == 0:
            env = dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)
    return checks, env


# -- the interpreter ---------------------------------------------------------------------------
_PYTHON_PROBE = """
import json, sys
r = {"version": sys.version.split()[0]}
try:
    import cudalab, jsonschema, numpy, pandas, yaml
    r["cudalab"] = cudalab.__path__[0]
except Exception as exc:
    r["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(r))
"""


def check_python(env: dict[str, str]) -> Check:
    """The interpreter every job runs (the one that runs Snakemake, by path: this one),
    tried with the modules' environment: a Python module may set PYTHONPATH or PYTHONHOME
    that breaks it, and a `python` it puts first on PATH is not what the jobs use."""
    rc, out = _run([sys.executable, "-c", _PYTHON_PROBE], env)
    try:
        r = json.loads(out.splitlines()[-1]) if out else {}
    except json.JSONDecodeError:
        r = {"error": f"exit code {rc}: {_short(out)}"}
    on_path = shutil.which("python3", path=env.get("PATH", "")) or ""
    other = (f"; `python3` first on PATH is {on_path}, which the jobs do not use"
             if on_path and os.path.realpath(on_path) != os.path.realpath(sys.executable) else "")
    if "cudalab" not in r:
        return Check("Python (the jobs')", FAIL,
                     f"{sys.executable} cannot import cudalab and its packages here: "
                     f"{_short(r.get('error', 'no answer'), 200)}{other}",
                     "run Snakemake from the environment where `pip install -e .` was done; "
                     "a module in slurm.modules that sets PYTHONPATH or PYTHONHOME breaks it")
    return Check("Python (the jobs')", OK, f"{sys.executable} (Python {r['version']}), "
                 f"cudalab from {r['cudalab']}{other}")


# -- programs ----------------------------------------------------------------------------------
def _version(text: str) -> str:
    m = re.search(r"release (\d+\.\d+)", text) or re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else "?"


def check_nvcc(env: dict[str, str], required: bool) -> tuple[Check, str]:
    nvcc = shutil.which("nvcc", path=env.get("PATH", ""))
    if nvcc is None:
        return Check("nvcc", FAIL if required else WARN, "not on PATH",
                     "load the CUDA toolkit's module (slurm.modules: [cuda/...]) or put "
                     "its bin/ on PATH"), ""
    rc, out = _run([nvcc, "--version"], env)
    if rc != 0:
        return Check("nvcc", FAIL, f"{nvcc} --version failed: {_short(out)}",
                     "a broken toolkit or wrapper: load another CUDA module"), ""
    release = _version(out)
    return Check("nvcc", OK, f"{nvcc} (CUDA {release})"), release


# Where a host compiler finds headers without any -I: Debian's nvidia-cuda-toolkit puts cuda.h
# in /usr/include and its nvcc passes no include directory of its own.
DEFAULT_INCLUDE_DIRS: tuple[str, ...] = ("/usr/include",)
_DRYRUN_VAR = re.compile(r"^#\$ (?P<key>INCLUDES|SYSTEM_INCLUDES|TOP)=(?P<value>.*)$")


def nvcc_include_dirs(nvcc: str, env: dict[str, str]) -> tuple[list[Path], str]:
    """The include directories nvcc compiles with, and its toolkit root (TOP), as nvcc
    itself reports them (`--dryrun` prints its variables): right for a wrapper script, a
    /usr/local/cuda symlink, a module's toolkit and Debian's layout alike, where guessing
    from nvcc's own path is not. ([], '') where nvcc does not answer."""
    rc, out = _run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], env)
    dirs: list[Path] = []
    top = ""
    for line in out.splitlines():
        m = _DRYRUN_VAR.match(line.strip())
        if not m:
            continue
        if m["key"] == "TOP":
            top = os.path.normpath(m["value"].strip().strip('"'))
            continue
        try:
            words = shlex.split(m["value"])
        except ValueError:
            continue
        for i, w in enumerate(words):
            if w.startswith("-I") and len(w) > 2:
                dirs.append(Path(w[2:]))
            elif w in ("-I", "-isystem") and i + 1 < len(words):
                dirs.append(Path(words[i + 1]))
    if top and not dirs:  # an nvcc that prints TOP only: the toolkit's own include/
        dirs.append(Path(top) / "include")
    return list(dict.fromkeys(Path(os.path.normpath(d)) for d in dirs)), top


def check_cuda_h(env: dict[str, str], required: bool, pycuda_ok: bool = False) -> Check:
    """nvcc's toolkit has cuda.h (pycuda's build and every kernel need it); where pycuda is
    not installed yet, also whether its build will find it without CUDA_ROOT."""
    nvcc = shutil.which("nvcc", path=env.get("PATH", ""))
    if nvcc is None:
        return Check("cuda.h", INFO, "not checked (no nvcc)")
    dirs, top = nvcc_include_dirs(nvcc, env)
    looked = [*dirs, *(Path(d) for d in DEFAULT_INCLUDE_DIRS if Path(d) not in dirs)]
    found = next((d / "cuda.h" for d in looked if (d / "cuda.h").is_file()), None)
    if found is None:
        where = ", ".join(str(d) for d in looked) or "nowhere (nvcc --dryrun named no directory)"
        return Check("cuda.h", FAIL if required else WARN,
                     f"nvcc's toolkit ({top or nvcc}) has no cuda.h; looked in {where}",
                     "install the toolkit's headers (Debian: apt install nvidia-cuda-dev; "
                     "NVIDIA's installer: the full toolkit) or load a complete CUDA module: "
                     "pycuda does not build and no kernel compiles without it")
    # pycuda's build looks in $CUDA_ROOT/include, CUDA_ROOT defaulting to nvcc's directory/..
    # as found on PATH (a wrapper in /usr/local/bin gives /usr/local)
    guess = Path(os.path.normpath(Path(os.path.abspath(nvcc)).parent / ".." / "include"))
    if pycuda_ok or env.get("CUDA_ROOT") or env.get("CUDA_INC_DIR") \
            or (guess / "cuda.h").is_file():
        return Check("cuda.h", OK, str(found))
    root = top if top and (Path(top) / "include" / "cuda.h").is_file() else ""
    fix = (f"export CUDA_ROOT={root} before pip install -e '.[gpu]'" if root else
           f"export CUDA_INC_DIR={found.parent} before pip install -e '.[gpu]'")
    return Check("cuda.h", WARN, f"{found}; but pycuda's build looks in {guess} "
                 "(nvcc's directory/../include) and will not find it", fix)


_LIBCUDA_PROBE = """
import ctypes, ctypes.util, json
r = {"find_library": ctypes.util.find_library("cuda") or ""}
try:
    ctypes.CDLL(LIB)
    with open("/proc/self/maps") as f:
        r["path"] = next((l.split()[-1] for l in f if "/libcuda.so" in l), LIB)
except OSError as exc:
    r["error"] = str(exc)
print(json.dumps(r))
"""


CPU_ONLY = ("with no usable GPU at all: plain `snakemake` (without --profile slurm) measures "
            "the CPU points, runs the static analysis and writes the report, the GPU points "
            "recorded not_measured (README: Without a GPU)")


def gpu_fix(env: dict[str, str]) -> str:
    """What to do where no GPU is usable, by where this runs: outside Slurm, in a job that
    holds no GPU, or in one that holds a GPU the node cannot use (asking for --gpus again
    would not help there)."""
    if not env.get("SLURM_JOB_ID"):
        return ("run on a GPU node (a Slurm job: snakemake --profile slurm), or give a "
                f"container the GPU (docker --gpus all); {CPU_ONLY}")
    node = env.get("SLURMD_NODENAME") or "this node"
    given = next((env[k] for k in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES",
                                   "SLURM_GPUS_ON_NODE") if env.get(k)), "")
    if given:
        return (f"this Slurm job holds GPU {given}, but {node} cannot use it (no driver or "
                f"device): ask the cluster's admins (the NVIDIA driver on {node}, gres.conf), "
                "or send the jobs to nodes whose GPUs work (slurm.gpu_model, partition or "
                f"constraint; `cudalab site` lists them); {CPU_ONLY}")
    return ("this Slurm job holds no GPU: set slurm.gpu_model (or partition / constraint) to "
            f"GPUs `cudalab site` lists; {CPU_ONLY}")


def check_libcuda(env: dict[str, str], need_gpu: bool, lib: str = "libcuda.so.1") -> Check:
    """The driver's user-space library, as pycuda loads it: libcuda.so.1, in a child Python
    with the modules' environment (a broken library is a table line here, not a crash)."""
    rc, out = _run([sys.executable, "-c", f"LIB = {lib!r}\n" + _LIBCUDA_PROBE], env)
    try:
        r = json.loads(out.splitlines()[-1]) if out else {}
    except json.JSONDecodeError:
        r = {"error": f"probe crashed (rc {rc}): {_short(out)}"}
    return libcuda_verdict(r, need_gpu, lib, env)


def libcuda_verdict(r: dict[str, str], need_gpu: bool, lib: str = "libcuda.so.1",
                    env: dict[str, str] | None = None) -> Check:
    """The libcuda line from the probe's answer: path (loaded from), error, find_library."""
    bad = FAIL if need_gpu else INFO
    if "path" not in r:
        why = r.get("error") or "not found"
        return Check("libcuda", bad, f"{lib} cannot be loaded: {_short(why, 200)}"
                     + (f" (the linker knows {r['find_library']})" if r.get("find_library")
                        else ""),
                     "the NVIDIA driver's library is missing here (Debian: libcuda1): "
                     + gpu_fix(dict(os.environ) if env is None else env) if need_gpu else
                     "not needed by this config")
    if "/stubs/" in r["path"]:
        return Check("libcuda", bad, f"{r['path']} is the toolkit's link stub, not the "
                     "driver: it fails every call",
                     "take the toolkit's lib/stubs out of LD_LIBRARY_PATH" if need_gpu else
                     "not needed by this config")
    return Check("libcuda", OK, r["path"])


def check_driver_vs_nvcc(nvcc_release: str, driver_cuda: str) -> Check:
    """The driver runs cubins of its own CUDA major and older (minor version compatibility);
    a newer major's toolkit builds code this driver cannot load."""
    if not nvcc_release or not driver_cuda:
        return Check("driver runs nvcc's code", INFO, "not checked (nvcc or driver unknown)")
    n, d = (tuple(int(x) for x in v.split(".")[:2]) for v in (nvcc_release, driver_cuda))
    if n[0] > d[0]:
        return Check("driver runs nvcc's code", FAIL,
                     f"nvcc is CUDA {nvcc_release}, the driver supports up to {driver_cuda}",
                     f"load a CUDA {d[0]}.x toolkit module, or ask the admins for a newer driver")
    if n > d:
        return Check("driver runs nvcc's code", WARN,
                     f"nvcc CUDA {nvcc_release} > driver's {driver_cuda}: works for cubins "
                     "(minor version compatibility), not for PTX JIT",
                     f"prefer a CUDA <= {driver_cuda} module")
    return Check("driver runs nvcc's code", OK,
                 f"nvcc CUDA {nvcc_release} <= driver's CUDA {driver_cuda}")


def check_nvidia_smi(env: dict[str, str]) -> tuple[Check, str]:
    """nvidia-smi's line and the CUDA version the driver supports ('' if unknown)."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH", ""))
    if smi is None:
        return Check("nvidia-smi", WARN, "not found",
                     "no NVIDIA driver on this node, or not on PATH (telemetry is off "
                     "without it)"), ""
    rc, out = _run([smi], env, timeout=30)
    m = re.search(r"Driver Version:\s*([\d.]+)\s+CUDA Version:\s*([\d.]+)", out)
    if rc != 0 or m is None:
        return Check("nvidia-smi", WARN, f"{smi} failed: {_short(out)}",
                     "the driver does not answer: ask the admins (node not healthy?)"), ""
    return Check("nvidia-smi", OK, f"{smi}: driver {m.group(1)}, CUDA {m.group(2)}"), m.group(2)


# -- the CUDA probe (child process) ------------------------------------------------------------
def probe(gpu_index: int = 0, kernel_only: bool = False) -> dict[str, Any]:
    """Run in a child Python: pycuda, the driver, the GPUs, one kernel. Every stage's error
    is recorded as text; prints one JSON line (unless kernel_only, for ncu)."""
    r: dict[str, Any] = {}
    try:
        import pycuda
        import pycuda.driver as cuda

        r["pycuda"] = pycuda.VERSION_TEXT
        r["built_cuda"] = ".".join(map(str, cuda.get_version()))
        cuda.init()
        d = cuda.get_driver_version()
        r["driver_cuda"] = f"{d // 1000}.{(d % 1000) // 10}"
        r["gpus"] = [cuda.Device(i).name() for i in range(cuda.Device.count())]
        if gpu_index >= len(r["gpus"]):
            raise RuntimeError(f"gpu_index {gpu_index} but {len(r['gpus'])} GPU(s) visible")
        ctx = cuda.Device(gpu_index).retain_primary_context()
        ctx.push()
        try:
            r["free_mb"], r["total_mb"] = (v // 2**20 for v in cuda.mem_get_info())
            r["kernel"] = _run_kernel(cuda)
        finally:
            ctx.pop()
    except Exception as exc:  # noqa: BLE001 - every failure is a table line, not a traceback
        r["error"] = f"{type(exc).__name__}: {_short(str(exc), 400)}"
    if not kernel_only:
        print(json.dumps(r))
    return r


def _run_kernel(cuda: Any) -> str:
    import numpy as np
    from pycuda.compiler import SourceModule

    x = np.arange(32, dtype=np.float32)
    buf = cuda.to_device(x)
    SourceModule(_KERNEL).get_function("add1")(buf, block=(32, 1, 1), grid=(1, 1))
    got = cuda.from_device_like(buf, x)
    return "ok" if np.array_equal(got, x + 1) else f"wrong result {got[:4]}"


def _probe_cmd(gpu_index: int, kernel_only: bool = False) -> list[str]:
    code = f"from cudalab.doctor import probe; probe({gpu_index}, {kernel_only})"
    return [sys.executable, "-c", code]


def _child_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                               env.get("PYTHONPATH")]))}


def check_cuda(env: dict[str, str], gpu_index: int, need_gpu: bool) -> tuple[list[Check], dict]:
    """pycuda, the driver's CUDA, the GPUs, free memory and one kernel, from the probe."""
    rc, out = _run(_probe_cmd(gpu_index), _child_env(env), timeout=120)
    lines = out.splitlines()
    try:
        r = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        r = {"error": f"probe crashed (rc {rc}): {_short(out)}"}
    bad = FAIL if need_gpu else INFO
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    cvd_txt = "unset" if cvd is None else repr(cvd)
    checks = []
    if "pycuda" not in r:
        checks.append(Check("pycuda", bad, r.get("error", "not importable"),
                            "pip install -e '.[gpu]' in the Python the jobs use (pycuda builds "
                            "against the toolkit: load the CUDA module first)"))
        devs = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
        checks.append(Check("GPU(s)", bad if not devs else INFO,
                            f"device files {', '.join(devs)}; CUDA_VISIBLE_DEVICES is {cvd_txt}"
                            if devs else "no GPU here (no /dev/nvidia<N> device files)",
                            gpu_fix(env) if not devs else ""))
        return checks, r
    checks.append(Check("pycuda", OK, f"{r['pycuda']}, built against CUDA {r['built_cuda']}"))
    if "gpus" not in r:
        checks.append(Check("GPU(s)", bad, f"no GPU here: {r.get('error', '')}; "
                            f"CUDA_VISIBLE_DEVICES is {cvd_txt}",
                            gpu_fix(env) if need_gpu else "not needed by this config"))
        return checks, r
    checks.append(Check("driver", OK, f"supports CUDA {r['driver_cuda']}"))
    if not r["gpus"]:
        checks.append(Check("GPU(s)", bad, f"no GPU visible; CUDA_VISIBLE_DEVICES is {cvd_txt}",
                            gpu_fix(env) if need_gpu else "not needed by this config"))
        return checks, r
    checks.append(Check("GPU(s)", OK, f"{len(r['gpus'])}: {', '.join(r['gpus'])}; "
                        f"CUDA_VISIBLE_DEVICES is {cvd_txt}; gpu_index {gpu_index}"))
    if "kernel" not in r:
        checks.append(Check("kernel compiled and run", bad, r.get("error", "?"),
                            "nvcc must be on PATH and build for this GPU (see the nvcc and "
                            "driver lines)"))
        return checks, r
    checks.append(Check("free GPU memory", OK if r["free_mb"] > r["total_mb"] // 2 else WARN,
                        f"{r['free_mb']} of {r['total_mb']} MiB",
                        "" if r["free_mb"] > r["total_mb"] // 2 else
                        "another process holds the GPU: timings will be disturbed"))
    status = OK if r["kernel"] == "ok" else bad
    checks.append(Check("kernel compiled and run", status, f"add1<<<1, 32>>>: {r['kernel']}"))
    return checks, r


def check_ncu(env: dict[str, str], gpu_index: int, have_gpu: bool) -> Check:
    """Nsight Compute: found? which version? may it read the counters (profile.ncu)?"""
    ncu = shutil.which("ncu", path=env.get("PATH", ""))
    if ncu is None:
        return Check("ncu (Nsight Compute)", INFO, "not found (optional: hardware counters)",
                     "load a module with Nsight Compute to profile")
    rc, out = _run([ncu, "--version"], env)
    m = re.search(r"Version\s+(\S+)", out)
    where = f"{ncu} ({m.group(1) if m and rc == 0 else 'version unknown'})"
    if not have_gpu:
        return Check("ncu (Nsight Compute)", INFO, f"{where}; counters not tried (no GPU)")
    cmd = [ncu, "--target-processes", "all", "--metrics", "sm__cycles_elapsed.sum",
           *_probe_cmd(gpu_index, kernel_only=True)]
    rc, out = _run(cmd, _child_env(env), timeout=180)
    if "ERR_NVGPUCTRPERM" in out:
        return Check("ncu (Nsight Compute)", WARN, f"{where}: counters not permitted "
                     "(ERR_NVGPUCTRPERM)", "ask the admins to allow profiling "
                     "(NVreg_RestrictProfilingToAdminUsers=0); timings do not need it")
    if rc == 0 and "sm__cycles_elapsed.sum" in out:
        return Check("ncu (Nsight Compute)", OK, f"{where}: counters permitted")
    return Check("ncu (Nsight Compute)", WARN, f"{where} failed (rc {rc}): {_short(out, 200)}",
                 "profiling unavailable; timings do not need it")


def check_slurm(env: dict[str, str]) -> Check:
    from cudalab.provenance import slurm_context

    ctx = slurm_context()
    if not ctx["slurm_job_id"]:
        return Check("Slurm allocation", INFO, "not in a Slurm job")
    rc, out = _run(["scontrol", "show", "job", "-o", ctx["slurm_job_id"]], env, timeout=20)
    gres = re.search(r"TresPerJob=(\S+)", out) or re.search(r"TresPerNode=(\S+)", out)
    return Check("Slurm allocation", OK,
                 f"job {ctx['slurm_job_id']} on {ctx['slurm_node']} (partition "
                 f"{ctx['slurm_partition'] or '?'}), CUDA_VISIBLE_DEVICES "
                 f"{ctx['cuda_visible_devices'] or 'unset'}, gres "
                 f"{gres.group(1) if gres else 'none'}")


def run_checks(modules: list[str], need_gpu: bool, need_nvcc: bool,
               gpu_index: int = 0) -> list[Check]:
    env = dict(os.environ)
    checks = [Check("host", INFO, socket.gethostname()), check_slurm(env)]
    mod_checks, env = check_modules(modules, env)
    checks += [*mod_checks, check_python(env)]
    nvcc, release = check_nvcc(env, need_nvcc or need_gpu)
    smi, smi_cuda = check_nvidia_smi(env)
    cuda, r = check_cuda(env, gpu_index, need_gpu)
    headers = check_cuda_h(env, need_nvcc or need_gpu, pycuda_ok="pycuda" in r)
    checks += [nvcc, headers, check_driver_vs_nvcc(release, r.get("driver_cuda") or smi_cuda),
               smi, check_libcuda(env, need_gpu), *cuda,
               check_ncu(env, gpu_index, bool(r.get("gpus")))]
    return checks


# -- output ------------------------------------------------------------------------------------
def verdict(checks: list[Check], need_gpu: bool) -> str:
    bad = [c.name for c in checks if c.status == FAIL]
    if bad:
        return f"cudalab doctor: FAILED ({', '.join(bad)}): the grid would not run here"
    what = "GPU experiments can run" if need_gpu else "this config needs no GPU; it can run"
    return f"cudalab doctor: ok: {what} here"


def text_lines(checks: list[Check]) -> list[str]:
    w = max(len(c.name) for c in checks)
    out = []
    for c in checks:
        out.append(f"{c.status:4s}  {c.name.ljust(w)}  {c.value}")
        if c.fix and c.status in (FAIL, WARN):
            out.append(f"{'':4s}  {'':{w}}  -> {c.fix}")
    return out


def markdown(checks: list[Check], title: str) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    rows = [f"| {c.status} | {cell(c.name)} | {cell(c.value)} | "
            f"{cell(c.fix) if c.status in (FAIL, WARN) else ''} |" for c in checks]
    return "\n".join([f"{title}\n", "| status | check | value | what to do |",
                      "| --- | --- | --- | --- |", *rows, ""])


def write(checks: list[Check], need_gpu: bool, json_path: str | None, md_path: str | None) -> None:
    line = verdict(checks, need_gpu)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(
            {"ok": not line.startswith("cudalab doctor: FAILED"), "verdict": line,
             "need_gpu": need_gpu, "checks": [asdict(c) for c in checks]}, indent=1) + "\n")
    if md_path:
        Path(md_path).parent.mkdir(parents=True, exist_ok=True)
        Path(md_path).write_text(markdown(checks, line))


def _gpu_config(cfg: Any, registry: dict[str, Any]) -> dict[str, Any]:
    """A config of the first experiment whose default grid runs on the GPU."""
    for name, exp in registry.items():
        config = cfg.validate({"experiments": {name: {}}})
        if any(p.gpu for p in exp.grid(config)):
            return config
    return cfg.validate({"experiments": {next(iter(registry)): {}}})


def cmd_doctor(a: argparse.Namespace) -> int:
    from cudalab import config as cfg
    from cudalab.experiments import REGISTRY
    from cudalab.site import needs_gpu

    config = _gpu_config(cfg, REGISTRY)  # no config given: as for an experiment on the GPU
    if a.config and Path(a.config).is_file():
        try:
            config = cfg.load(a.config)
        except cfg.ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    modules = a.modules if a.modules is not None else config["slurm"]["modules"]
    need_gpu = needs_gpu(config) if a.need_gpu is None else a.need_gpu == "yes"
    need_nvcc = (need_gpu or any(REGISTRY[e].needs_nvcc
                                 for e in cfg.enabled_experiments(config))
                 if a.need_nvcc is None else a.need_nvcc == "yes")
    gpu_index = config["gpu_index"] if a.gpu_index is None else a.gpu_index
    checks = run_checks(modules, need_gpu, need_nvcc, gpu_index)
    print("\n".join(text_lines(checks)))
    print(verdict(checks, need_gpu))
    write(checks, need_gpu, a.json, a.md)
    failed = any(c.status == FAIL for c in checks)
    bad_modules = [c.name for c in checks if c.status == FAIL and c.name.startswith("module ")]
    if bad_modules and a.require_modules:  # with --sdm env-modules, locally too
        print(f"cudalab doctor: {', '.join(bad_modules)} not loaded: the jobs would run "
              "without it (fix slurm.modules)")
        return 1
    if failed and a.gate == "slurm" and not os.environ.get("SLURM_JOB_ID"):
        print("cudalab doctor: not a Slurm job, so the run goes on (each measure job reports "
              "what it cannot do)")
        return 0
    return 1 if failed else 0


def add_parser(sub: Any) -> None:
    s = sub.add_parser("doctor", help="check this node (or Slurm job) before a run")
    s.add_argument("--config", default="config.yaml",
                   help="its slurm.modules, gpu_index and experiments (default config.yaml; "
                   "'' = none: a GPU experiment)")
    s.add_argument("--modules", nargs="*", help="modules to check (default: slurm.modules)")
    s.add_argument("--need-gpu", choices=["yes", "no"],
                   help="whether a missing GPU is a failure (default: from the config)")
    s.add_argument("--need-nvcc", choices=["yes", "no"],
                   help="whether a missing nvcc is a failure (default: from the config)")
    s.add_argument("--gpu-index", type=int, help="the GPU to try (default: gpu_index)")
    s.add_argument("--gate", choices=["always", "slurm"], default="always",
                   help="exit 1 on a failed check always, or only inside a Slurm job (the "
                   "workflow's doctor rule: a local run goes on without a GPU)")
    s.add_argument("--require-modules", action="store_true",
                   help="exit 1 when a module is not loaded, also outside Slurm (the "
                   "workflow's doctor rule under --sdm env-modules)")
    s.add_argument("--json", help="also write the table as JSON here")
    s.add_argument("--md", help="also write the table as markdown here")
    s.set_defaults(fn=cmd_doctor)

