"""One submission from file to verdict: read and vet it, compile it for the GPU's
architecture (static analysis comes with it), judge it in a child process. The verdict is
one JSON-able dict; its `status` is the first failure met:

  rejected       refused before nvcc (name, size, encoding, #include ...)
  compile_error  nvcc failed (diagnostics with file and line)
  slot_error     it compiled, but the slot's kernel is missing or has another signature,
                 or no block of the slot's size fits an SM
  compiled       compiled, not judged: no GPU here (or --no-gpu), the build and static
                 analysis only
  wrong          a check failed (first wrong element and its expected value), or the
                 kernel has no store to global memory at all (its PTX, no GPU needed)
  crashed        a CUDA error (illegal address ...) or the judge process died
  timeout        no answer from the GPU within the per-launch limit: killed
  memory_error   compute-sanitizer found an invalid access (--sanitize)
  gamed          every check passed, but the time is below what the GPU can do the work in
  ok             every check passed; timed

With sanitize, the judgement is made as without it, and the small grid is run once more
under compute-sanitizer memcheck: an invalid access there wins; otherwise the verdict is
the plain one, with its timing. A plain verdict of 'timeout' is kept without the memcheck
run (the hang would only take SANITIZER_SLOWDOWN times longer to be stopped).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cudalab.exercises import build, sandbox
from cudalab.exercises.catalog import CourseKernel, Exercise
from cudalab.exercises.source import SubmissionError, course_source, read_submission

judge_child = sandbox  # the module: the functions below take a `sandbox` policy argument


def device_arch() -> str | None:
    """sm_XY of the first visible GPU (nvidia-smi), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[:1] if out.returncode == 0 else []
    try:
        major, minor = first[0].strip().split(".")
        return f"sm_{int(major)}{int(minor)}"
    except (IndexError, ValueError):
        return None


def judge_text(text: str, ex: Exercise, name: str, *, student: str = "", mode: str = "check",
               arch: str | None = None, gpu: bool = True, seed: int = 0,
               launch_timeout_s: float = 10.0, sanitize: bool = False,
               sandbox: str = "optional") -> dict[str, Any]:
    """Compile `text` for the slot, then judge it on the GPU (unless gpu is False); both
    in a sandbox as `sandbox` says (required|optional|off, cudalab.jail.use)."""
    here = device_arch() if gpu else None
    b = build.compile_submission(text, ex, name, arch or here or build.DEFAULT_ARCH,
                                 sandbox=sandbox)
    record: dict[str, Any] = {"student": student, "exercise": ex.name, "file": name,
                              "build": b.as_dict()}
    if b.refused:
        return record | {"status": "rejected", "message": b.refused}
    if not b.ok:
        status = "slot_error" if b.compiled else "compile_error"
        return record | {"status": status, "message": b.problem or "nvcc failed"}
    if b.usage.get("global_stores") == 0:
        return record | {"status": "wrong", "message": never_written(ex)}
    if not gpu or here is None:
        why = "--no-gpu" if not gpu else "nvidia-smi finds none"
        return record | {"status": "compiled", "message": f"no GPU here ({why})"}
    if arch and arch != here:
        return record | {"status": "compiled", "message": f"built for {arch}, this GPU is "
                         f"{here}"}
    verdict = judge_child.run_judge(ex, b.cubin, mode, seed, launch_timeout_s,
                                    sandbox=sandbox)
    if verdict.get("status") == "no_gpu":  # nvidia-smi sees one, but pycuda or the driver not
        return record | {"status": "compiled", "message": f"no GPU here ({verdict['message']})"}
    if sanitize:
        verdict = with_memcheck(verdict, lambda: judge_child.run_judge(
            ex, b.cubin, mode, seed, launch_timeout_s, sanitize=True, sandbox=sandbox))
    return record | verdict


def never_written(ex: Exercise) -> str:
    """Why a kernel without a single global store fails before any launch."""
    return (f"{ex.kernel} never writes its output: its PTX has no store to global memory "
            "(st.global, atom/red.global or a generic st), so no launch could fill it")


def with_memcheck(plain: dict[str, Any], memcheck: Callable[[], dict[str, Any]]
                  ) -> dict[str, Any]:
    """The plain verdict and memcheck's combined: a memory error wins (the plain verdict
    kept beside it), else the plain verdict with memcheck's outcome noted."""
    if plain.get("status") == "timeout":
        return plain | {"memcheck": {"status": "not_run", "message": "the kernel hung "
                                     "without the tool: memcheck was not run"}}
    checked = memcheck()
    if checked.get("status") == "memory_error":
        return checked | {"unsanitized": {k: plain[k] for k in ("status", "message")
                                          if k in plain}}
    note = {"status": checked.get("status", "?"), "message": checked.get("message", "")}
    if plain.get("status") == "ok" and checked.get("status") == "ok":
        note["message"] = "compute-sanitizer: no invalid access on the small grid"
    return plain | {"memcheck": note}


def judge_file(path: Path, *, exercise: str | None = None, student: str | None = None,
               **kw: Any) -> dict[str, Any]:
    try:
        sub = read_submission(path, exercise, student)
    except SubmissionError as exc:
        return {"student": student or "", "exercise": exercise or "", "file": path.name,
                "status": "rejected", "message": str(exc)}
    return judge_text(sub.text, sub.exercise, build.display_name(path), student=sub.student,
                      **kw)


def judge_course(ex: Exercise, kernel: CourseKernel, **kw: Any) -> dict[str, Any]:
    """The course's kernel through the very same slot."""
    rec = judge_text(course_source(ex, kernel), ex, "course.cu", student=kernel.label, **kw)
    return rec | {"baseline": "course"}


def judge_cublas(ex: Exercise, *, mode: str = "class", seed: int = 0,
                 launch_timeout_s: float = 10.0, sandbox: str = "optional",
                 **_: Any) -> dict[str, Any]:
    """cuBLAS (through CuPy) on the slot's inputs and checks: the ceiling."""
    if not ex.cublas:
        return {}
    label = "cuBLAS DGEMM" if ex.dtype == "float64" else "cuBLAS SGEMM"
    verdict = judge_child.run_judge(ex, None, mode, seed, launch_timeout_s, cublas=True,
                                    sandbox=sandbox)
    return {"student": label, "exercise": ex.name, "baseline": "cublas"} | verdict
