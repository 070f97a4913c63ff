"""On a GPU: the exercises' checker is real (every starter fails, the course's own kernel in
the slot passes), and broken or gaming submissions get their verdicts without stopping
anything: wrong, crashing, hanging, out of bounds, stateful; then a whole class run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cudalab.exercises import catalog, pipeline
from cudalab.exercises.sandbox import find_sanitizer

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
EXERCISES = list(catalog.EXERCISES.values())
COURSE = [(ex, k) for ex in EXERCISES for k in ex.course]
SIG = "extern \"C\" __global__ void vector_add(const float* a, const float* b, float* c, int n)"


def _vector_add(body: str, tmp_path: Path, name: str = "alice") -> Path:
    f = tmp_path / f"{name}.cu"
    f.write_text(f"// cudalab-exercise: vector_add\n{SIG}\n{{\n"
                 f"    int i = blockIdx.x * blockDim.x + threadIdx.x;\n{body}\n}}\n")
    return f


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_every_starter_fails_the_check(ex):
    # caught before any launch: its PTX has no global store (as without a GPU)
    v = pipeline.judge_file(catalog.EXERCISE_DIR / ex.starter)
    assert v["status"] == "wrong" and "never writes its output" in v["message"], v
    assert v["build"]["usage"]["global_stores"] == 0 and "checks" not in v


@pytest.mark.parametrize("ex,kernel", COURSE, ids=[f"{e.name}-{k.kernel}" for e, k in COURSE])
def test_the_courses_kernel_in_the_slot_passes(ex, kernel):
    v = pipeline.judge_course(ex, kernel)
    assert v["status"] == "ok", v
    assert v["timing"]["median_s"] > 0 and len(v["timing"]["trials_s"]) == 2
    assert not v["timing"]["suspect"], v["timing"]["guard"]
    assert all(c["timed_check"]["passed"] for c in v["checks"])


def test_cublas_is_judged_through_the_slot():
    pytest.importorskip("cupy")
    v = pipeline.judge_cublas(catalog.get("tiled_matmul"), mode="check")
    assert v["status"] == "ok", v


def test_a_wrong_result_names_the_first_wrong_element(tmp_path):
    v = pipeline.judge_file(_vector_add("    if (i < n) c[i] = a[i] - b[i];", tmp_path))
    assert v["status"] == "wrong"
    w = v["checks"][0]["check"]["first_wrong"]
    assert w["index"] == [0] and w["got"] != w["expected"]


def test_a_store_that_never_runs_leaves_the_output_unwritten(tmp_path):
    # a global store in the PTX, so only the launch can tell: every element stays poisoned
    v = pipeline.judge_file(_vector_add("    if (n < 0) c[i] = 0.0f;", tmp_path))
    assert v["status"] == "wrong", v
    w = v["checks"][0]["check"]["first_wrong"]
    assert w["got"] != w["got"] and w["unwritten"] > 0  # NaN: the poison, never written


def test_a_crash_is_judged_and_the_next_submission_runs(tmp_path):
    v = pipeline.judge_file(_vector_add("    ((float*)16)[i] = 1.0f;", tmp_path))
    assert v["status"] == "crashed" and "illegal" in v["message"].lower(), v
    ok = pipeline.judge_file(_vector_add("    if (i < n) c[i] = a[i] + b[i];", tmp_path))
    assert ok["status"] == "ok", ok


def test_a_hang_is_killed_within_the_limit_and_frees_the_gpu(tmp_path):
    t0 = time.monotonic()
    # the store after the loop keeps it from the static "never writes" verdict
    hang = "    for (;;) { if (clock64() < 0) break; }\n    if (i < n) c[i] = a[i] + b[i];"
    v = pipeline.judge_file(_vector_add(hang, tmp_path), launch_timeout_s=3)
    assert v["status"] == "timeout", v
    assert time.monotonic() - t0 < 3 + 60 + 30
    ok = pipeline.judge_file(_vector_add("    if (i < n) c[i] = a[i] + b[i];", tmp_path))
    assert ok["status"] == "ok", ok


def test_a_kernel_that_does_less_work_after_the_check_fails(tmp_path):
    body = ("    __shared__ int skip; if (threadIdx.x == 0) skip = atomicAdd(&calls, 1) "
            "> 4 * gridDim.x; __syncthreads(); if (!skip && i < n) c[i] = a[i] + b[i];")
    f = _vector_add(body, tmp_path)
    f.write_text(f.read_text().replace(SIG, "__device__ int calls;\n" + SIG))
    v = pipeline.judge_file(f)
    assert v["status"] == "wrong", v


@pytest.mark.skipif(find_sanitizer() is None, reason="compute-sanitizer not found")
def test_out_of_bounds_is_found_by_the_sanitizer(tmp_path):
    v = pipeline.judge_file(_vector_add("    c[i] = a[i] + b[i];", tmp_path), sanitize=True)
    assert v["status"] == "memory_error", v
    assert any("Invalid" in line for line in v["sanitizer"])


def test_a_class_run_judges_every_submission(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(_vector_add("    if (i < n) c[i] = a[i] + b[i];", tmp_path, "good"), subs)
    shutil.copy(_vector_add("    if (i < n) c[i] = a[i];", tmp_path, "wrong"), subs)
    shutil.copy(_vector_add("    ((float*)16)[i] = 1.0f;", tmp_path, "crash"), subs)
    shutil.copy(_vector_add("    for (;;) { if (clock64() < 0) break; }\n"  # a store after it:
                            "    if (i < n) c[i] = a[i] + b[i];", tmp_path, "hang"), subs)
    shutil.copy(_vector_add("    c[i] = ;", tmp_path, "broken"), subs)
    c = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    # sandboxed where bwrap runs (tests/gpu/test_sandbox_gpu.py requires it); a GPU machine
    # without it still runs the class
    c["exercises"] = {"submissions": "subs", "exercise": "vector_add", "launch_timeout_s": 3,
                      "sandbox": "optional"}
    (tmp_path / "class.yaml").write_text(yaml.safe_dump(c))
    r = subprocess.run([sys.executable, "-m", "snakemake", "exercises", "-s",
                        str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--cores", "2",
                        "--configfile", "class.yaml"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=900, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "results" / "class" / "vector_add"
    board = (out / "leaderboard.csv").read_text()
    for name, status in (("good", "ok"), ("wrong", "wrong"), ("crash", "crashed"),
                         ("hang", "timeout"), ("broken", "compile_error")):
        assert f",{name},,{status}," in board, board
    assert "course: vector_add,course,ok" in board
    assert (out / "anonymous.html").exists() and (out / "students" / "hang.html").exists()


def test_the_device_generator_makes_what_the_host_computes():
    import numpy as np

    from cudalab import gpu as gpumod
    from cudalab.exercises import fresh

    session = gpumod.open_session()
    fill = fresh.device_filler(session)
    for dtype, n, centred in ((np.float32, 1_000_003, True), (np.float64, 4099, True),
                              (np.float32, 1 << 20, False)):
        buf = session.cuda.mem_alloc(n * np.dtype(dtype).itemsize)
        fill(buf, n, np.dtype(dtype), 987654321, centred)
        got = np.empty(n, dtype)
        session.cuda.memcpy_dtoh(got, buf)
        buf.free()
        want = fresh.values(np.arange(n), 987654321, centred).astype(dtype)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (dtype, n)


def test_a_cache_keyed_on_its_inputs_never_hits_so_it_is_timed_doing_the_work():
    v = pipeline.judge_file(ROOT / "tests" / "data" / "exercises_heldout" / "tiled_matmul"
                            / "kim_cache.cu", mode="class")
    assert v["status"] in ("ok", "gamed"), v
