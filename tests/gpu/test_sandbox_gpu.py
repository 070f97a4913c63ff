"""On a GPU machine with bubblewrap (pytest -m gpu): the judge child keeps the GPU inside its
sandbox. A real kernel is judged there (correct, hanging, out of bounds under memcheck,
cuBLAS), and the child sees no file of the host beyond what judge_jail binds."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from cudalab import jail
from cudalab.exercises import catalog, pipeline
from cudalab.exercises.judge_jail import judge_jail
from cudalab.exercises.sandbox import find_sanitizer

pytestmark = pytest.mark.gpu
SIG = "extern \"C\" __global__ void vector_add(const float* a, const float* b, float* c, int n)"


@pytest.fixture(autouse=True)
def _sandbox():
    why = jail.probe()
    if why:
        pytest.skip(why)


def _judge(body: str, **kw) -> dict:
    text = (f"// cudalab-exercise: vector_add\n{SIG}\n{{\n"
            f"    int i = blockIdx.x * blockDim.x + threadIdx.x;\n{body}\n}}\n")
    return pipeline.judge_text(text, catalog.get("vector_add"), "alice.cu",
                               sandbox="required", **kw)


def test_a_correct_kernel_is_judged_ok_inside_the_sandbox():
    v = _judge("    if (i < n) c[i] = a[i] + b[i];")
    assert v["status"] == "ok", v
    assert v["timing"]["median_s"] > 0


def test_a_hanging_kernel_is_killed_inside_the_sandbox():
    # the store after the loop: a kernel without one is judged wrong from its PTX, unlaunched
    v = _judge("    for (;;) { if (clock64() < 0) break; }\n    if (i < n) c[i] = a[i] + b[i];",
               launch_timeout_s=3)
    assert v["status"] == "timeout", v
    # the GPU is free again for the next child
    assert _judge("    if (i < n) c[i] = a[i] + b[i];")["status"] == "ok"


@pytest.mark.skipif(find_sanitizer() is None, reason="compute-sanitizer not found")
def test_memcheck_runs_inside_the_sandbox():
    v = _judge("    c[i + 64] = a[i] + b[i];", sanitize=True)
    assert v["status"] == "memory_error", v


def test_cublas_baseline_inside_the_sandbox():
    ex = catalog.get("tiled_matmul")
    v = pipeline.judge_cublas(ex, mode="check", sandbox="required")
    assert v["status"] == "ok", v


def test_the_judges_python_sees_the_gpu_and_not_the_host(tmp_path):
    secret = tmp_path.parent / "planted-secret.txt"
    secret.write_text("top secret")
    work = tmp_path / "work"
    work.mkdir()
    code = ("import pycuda.driver as d; d.init(); print('gpus', d.Device.count());"
            f"\ntry: open({str(secret)!r}).read(); print('LEAK')\n"
            "except OSError: print('blocked')")
    box = judge_jail(work)
    proc = box.popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "blocked" in out and "LEAK" not in out
    assert int(out.split("gpus ")[1].split()[0]) >= 1, out
    assert shutil.which("bwrap")
