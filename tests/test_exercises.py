"""Student exercises without a GPU: reading and vetting submissions, compiling (where nvcc
is installed), the slots' host side, feedback, the leaderboard, the watchdog."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from cudalab.exercises import build, catalog, classroom, feedback, guard, sandbox, slots
from cudalab.exercises.source import (
    SubmissionError,
    course_source,
    forbidden,
    read_submission,
    valid_name,
)
from cudalab.experiments.base import Point
from cudalab.experiments.matmul.build import launch_geometry

needs_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not installed")
EXERCISES = list(catalog.EXERCISES.values())


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_every_exercise_has_a_starter_that_names_it(ex):
    sub = read_submission(catalog.EXERCISE_DIR / ex.starter)
    assert sub.exercise is ex
    assert "TODO" in sub.text and ex.kernel in sub.text


@needs_nvcc
@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_starters_and_the_course_kernels_compile_into_the_slot(ex):
    b = build.compile_submission((catalog.EXERCISE_DIR / ex.starter).read_text(), ex,
                                 ex.starter)
    assert b.ok, (b.problem, b.diagnostics)
    assert b.usage["threads"] == slots.block_threads(ex, ex.class_size)
    assert b.usage["global_stores"] == 0  # the starter never writes its output: it fails
    for k in ex.course:
        b = build.compile_submission(course_source(ex, k), ex, "course.cu")
        assert b.ok, (k.label, b.problem, b.diagnostics)
        assert b.usage["global_stores"] > 0, k.label
        assert b.usage["registers"] > 0 and 0 < b.usage["occupancy"] <= 1


@pytest.mark.parametrize("text", [
    '#include "/work/cuda/matmul/matmul.cu"', '  #  include <stdio.h>', '#/**/include "x.cu"',
    '#\\\ninclude "x.cu"', "#embed \"secret\"", '#line 1 "other.cu"',
    "#if __has_include(\"../alice.cu\")\n#endif", "#include_next <x>",
    '%:include "/work/cuda/matmul/matmul.cu"', '\f#\finclude "x.cu"', '\v#\vinclude "x.cu"',
    'int x;\r#include "x.cu"', '??=include "x.cu"'])
def test_directives_that_read_other_files_are_refused(text, tmp_path):
    assert forbidden(text)
    f = tmp_path / "alice.cu"
    f.write_text("// cudalab-exercise: vector_add\n" + text + "\n")
    with pytest.raises(SubmissionError, match="not allowed"):
        read_submission(f)


@needs_nvcc
@pytest.mark.parametrize("line", [
    '%:include "{matmul}"', '#include "/etc/hostname"', '#include "{matmul}"',
    '#include "nowhere.cu"'])
def test_the_compiler_may_open_no_file_but_cuda_and_system_headers(line):
    # past the directive check (or spelled in a way it misses): what nvcc -M says the
    # preprocessor opens decides, however the directive is spelled
    ex = catalog.get("vector_add")
    starter = (catalog.EXERCISE_DIR / ex.starter).read_text()
    text = line.format(matmul=catalog.CUDA_DIR / "matmul/matmul.cu") + "\n" + starter
    b = build.compile_submission(text, ex, "alice.cu")
    assert b.refused and not b.ok and not b.cubin, b
    assert "alice.cu" in b.refused
    ok = build.compile_submission("#include <cstdio>\n#include <cuda_fp16.h>\n" + starter, ex)
    assert ok.ok and not ok.refused, ok


def test_include_in_a_comment_or_a_string_is_fine():
    assert forbidden('// #include "x"\n/* #include <y> */\nconst char* s = "#include";') == []


@pytest.mark.parametrize("name,ok", [("alice", True), ("a-b_9", True), ("-rf", False),
                                     ("a b", False), ("$(id)", False), ("a;b", False),
                                     ("é", False), ("x" * 65, False), ("", False)])
def test_student_names_follow_a_strict_pattern(name, ok):
    assert valid_name(name) is ok


def test_a_submission_of_another_exercise_or_none_is_refused(tmp_path):
    f = tmp_path / "bob.cu"
    f.write_text("// cudalab-exercise: transpose\n")
    with pytest.raises(SubmissionError, match="for exercise 'transpose'"):
        read_submission(f, "vector_add")
    f.write_text("__global__ void k() {}\n")
    with pytest.raises(SubmissionError, match="which exercise"):
        read_submission(f)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(SubmissionError, match="UTF-8"):
        read_submission(f)


def test_discover_a_class_folder(tmp_path):
    starter = (catalog.EXERCISE_DIR / "vector_add.cu").read_text()
    (tmp_path / "alice.cu").write_text(starter)
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "mine.cu").write_text(starter)
    (tmp_path / "carol").mkdir()
    for n in ("a.cu", "b.cu"):
        (tmp_path / "carol" / n).write_text(starter)
    (tmp_path / "bad name.cu").write_text(starter)
    (tmp_path / "$(rm -rf x).cu").write_text(starter)
    (tmp_path / "link.cu").symlink_to(tmp_path / "alice.cu")
    (tmp_path / "README.md").write_text("not a submission")
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "again.cu").write_text(starter)
    subs, rejected = classroom.discover(tmp_path)
    assert set(subs) == {"alice", "bob"}  # alice/ comes first: alice.cu is the second
    assert subs["bob"] == tmp_path / "bob" / "mine.cu"
    why = {r["name"]: r["why"] for r in rejected}
    assert set(why) == {"carol", "bad name.cu", "$(rm -rf x).cu", "link.cu", "alice.cu"}
    assert "symbolic link" in why["link.cu"] and "second submission" in why["alice.cu"]


def test_nvcc_diagnostics_are_read_with_file_and_line():
    log = ('alice.cu(5): error: expected a ";"\n'
           'alice.cu(4): warning #177-D: variable "i" was declared but never referenced\n'
           "ptxas error   : Entry function 'k' uses too much shared data\n"
           "1 error detected in the compilation of \"alice.cu\".\n")
    text = "l1\nl2\nl3\n  int i = 0\n  c[i] = a[i]\n"
    d = build.parse_diagnostics(log, text)
    assert [(x.file, x.line, x.severity) for x in d] == [
        ("alice.cu", 5, "error"), ("alice.cu", 4, "warning"), ("ptxas", 0, "error")]
    assert d[0].source == "c[i] = a[i]"


def test_the_signature_is_read_back_from_the_ptx():
    ex = catalog.get("vector_add")
    ptx = (".visible .entry vector_add(\n\t.param .u64 .ptr .align 1 vector_add_param_0,\n"
           "\t.param .u64 vector_add_param_1,\n\t.param .u64 vector_add_param_2,\n"
           "\t.param .u32 vector_add_param_3\n)\n{")
    assert build.ptx_params(ptx, "vector_add") == ["u64", "u64", "u64", "u32"]
    assert build.signature_problem(ex, ptx, "") == ""
    assert "takes (u64, u32)" in build.signature_problem(
        ex, ".entry vector_add(.param .u64 a, .param .u32 n)", "")
    assert "no kernel called vector_add" in build.signature_problem(ex, "", "")


@needs_nvcc
def test_compile_errors_and_slot_errors_name_what_is_wrong():
    ex = catalog.get("vector_add")
    b = build.compile_submission("// x\nextern \"C\" __global__ void vector_add(const float* a,"
                                 " const float* b, float* c, int n) { c[0] = q; }\n", ex,
                                 "alice.cu")
    assert not b.ok and not b.compiled
    assert (b.diagnostics[0].file, b.diagnostics[0].line) == ("alice.cu", 2)
    assert "q" in b.diagnostics[0].message
    b = build.compile_submission("__global__ void vector_add(const float* a, const float* b,"
                                 " float* c, int n) {}\n", ex, "alice.cu")
    assert b.compiled and not b.ok and "extern \"C\"" in b.problem
    b = build.compile_submission("extern \"C\" __global__ void __launch_bounds__(128) "
                                 "vector_add(const float* a, const float* b, float* c, int n)"
                                 " {}\n", ex, "alice.cu")
    assert "__launch_bounds__(128)" in b.problem


def test_the_grid_rules_are_the_experiments_own():
    tiled = catalog.get("tiled_matmul")
    assert slots.geometry(tiled, (100, 7, 33)) == launch_geometry(
        Point("matmul", "tiled", {"m": 100, "k": 7, "n": 33, "tile": 16}))
    assert slots.geometry(catalog.get("register_matmul"), (65, 1, 129)) == ((3, 2), (16, 16, 1))
    assert slots.geometry(catalog.get("vector_add"), (1000, 256)) == ((4, 1), (256, 1, 1))
    assert slots.geometry(catalog.get("transpose"), (33, 65)) == ((3, 2), (32, 8, 1))
    assert slots.geometry(catalog.get("reduction"), (1025,)) == ((3, 1), (256, 1, 1))


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_a_case_passes_its_reference_and_fails_the_poisoned_output(ex):
    rng = np.random.default_rng(1)
    case = slots.make_case(ex, rng, ex.check_sizes[1])
    right = case.expected.astype(case.out.dtype).reshape(case.out.shape)
    assert case.check(right, 1).passed
    bad = np.full_like(case.out, np.nan if case.fill else 0)
    assert not case.check(bad, 1).passed
    w = slots.first_wrong(bad, case.expected, 10 * slots.tolerance(ex))
    assert w is not None and w["index"] == [0] * len(w["index"])


def test_fresh_inputs_every_case():
    ex = catalog.get("vector_add")
    rng = np.random.default_rng(0)
    a, b = slots.make_case(ex, rng, (100, 32)), slots.make_case(ex, rng, (100, 32))
    assert not np.array_equal(a.inputs[0], b.inputs[0])


def test_a_reduction_that_skips_the_timed_launches_fails():
    ex = catalog.get("reduction")
    case = slots.make_case(ex, np.random.default_rng(2), (100_003,))
    once = np.float32(case.expected[0])
    assert case.check(np.array([once * 50], np.float32), 50).passed
    assert not case.check(np.array([once], np.float32), 50).passed  # did nothing after 1
    assert not case.check(np.array([once * 25], np.float32), 50).passed  # every other one


def test_first_wrong_element_and_its_expected_value():
    exp = np.arange(12, dtype=np.float64).reshape(3, 4)
    out = exp.astype(np.float32)
    out[1, 2] = 99
    w = slots.first_wrong(out, exp, 1e-5)
    assert w["index"] == [1, 2] and w["got"] == 99 and w["expected"] == 6
    assert w["wrong"] == 1 and w["unwritten"] == 0
    assert slots.first_wrong(exp, exp, 1e-5) is None


def _verdict(status, **kw):
    return {"student": kw.pop("student", "alice"), "exercise": "tiled_matmul",
            "file": "alice.cu", "status": status, **kw}


def test_feedback_of_a_wrong_result_names_the_element_and_the_hint():
    check = {"passed": False, "error": math.inf, "tolerance": 1e-4, "metric": "rel_fro",
             "detail": "unwritten (NaN) elements",
             "first_wrong": {"index": [0, 0], "got": math.nan, "expected": 1.5,
                             "unwritten": 15, "wrong": 15}}
    ok = dict(check, passed=True, first_wrong=None)
    text = feedback.render(_verdict("wrong", checks=[
        {"size": [5, 7, 3], "check": check, "timed_check": ok, "launches": 1}]))
    assert "C[0][0] = NaN: never written, expected 1.5" in text
    assert "5×7 · 7×3" in text and "Next step:" in text
    text = feedback.render(_verdict("wrong", checks=[
        {"size": [5, 7, 3], "check": ok, "timed_check": check, "launches": 8}]))
    assert "wrong after 8 timed launches" in text


def test_feedback_of_a_compile_error_and_a_timeout():
    d = {"file": "alice.cu", "line": 7, "severity": "error", "message": "expected a \";\"",
         "source": "int i = 0"}
    text = feedback.render(_verdict("compile_error", build={"diagnostics": [d]}))
    assert "alice.cu:7: error: expected" in text and "int i = 0" in text
    assert "killed" in feedback.render(_verdict("timeout", message="no answer"))


def _timed(name, t, baseline="", status="ok", regs=32):
    return {"student": name, "status": status, "baseline": baseline,
            "timing": {"median_s": t, "gflops": 1.0 / t, "size": [64, 64, 64],
                       "trials_s": [t] * 3} if status == "ok" else {},
            "build": {"usage": {"registers": regs, "occupancy": 0.5, "threads": 256,
                                 "limiter": "registers"}}}


def test_leaderboard_ranks_correct_students_by_time_beside_the_baselines():
    rows = classroom.leaderboard(
        [_timed("slow", 2e-3), _timed("fast", 1e-3), _timed("broken", 0, status="wrong"),
         _timed("hang", 0, status="timeout")],
        [_timed("course: tiled", 1.5e-3, "course"), _timed("cuBLAS SGEMM", 5e-4, "cublas")])
    names = [r["name"] for r in rows]
    assert names[:4] == ["cuBLAS SGEMM", "fast", "course: tiled", "slow"]
    assert names[4:] == ["broken", "hang"]
    by = {r["name"]: r for r in rows}
    assert by["fast"]["rank"] == 1 and by["slow"]["rank"] == 2
    assert by["cuBLAS SGEMM"]["rank"] is None and by["broken"]["rank"] is None
    assert by["fast"]["pct_cublas"] == pytest.approx(50)
    assert by["slow"]["vs_course"] == pytest.approx(0.75)


def test_class_report_pages_and_anonymous_view(tmp_path):
    verdicts = [_timed("alice", 1e-3), _timed("bob", 0, status="crashed")]
    index = classroom.write_report(verdicts, [_timed("course: tiled", 2e-3, "course")],
                                   [{"name": "x y.cu", "why": "file name not allowed"}],
                                   "tiled_matmul", tmp_path, salt="s")
    html = index.read_text()
    assert 'href="students/alice.html"' in html and "x y.cu" in html
    anon = (tmp_path / "anonymous.html").read_text()
    assert "alice" not in anon and "bob" not in anon
    assert classroom.alias("alice", "s") in anon
    assert (tmp_path / "students" / "bob.html").exists()
    assert "alice" in (tmp_path / "leaderboard.csv").read_text()


def test_entries_refused_before_planning_are_rows_of_the_leaderboard_csv(tmp_path):
    import csv

    classroom.write_report([_timed("alice", 1e-3)], [],
                           [{"name": "alice.cu", "why": "a second submission of alice"}],
                           "tiled_matmul", tmp_path)
    rows = list(csv.DictReader((tmp_path / "leaderboard.csv").open()))
    refused = [r for r in rows if r["refused"] == "True"]
    assert [(r["name"], r["status"], r["message"]) for r in refused] == [
        ("alice.cu", "rejected", "a second submission of alice")]
    assert [r["status"] for r in rows if r["name"] == "alice" and r["refused"] != "True"] \
        == ["ok"]


def test_guard_flags_work_outside_the_timed_events():
    honest = [(1e-3, 1.05e-3, 2e-5, 10)] * 5
    assert not guard.guard_summary(honest)["suspect"]
    escaped = [(1e-3, 6e-3, 2e-5, 10)] * 5  # 5 ms of work the events did not see
    s = guard.guard_summary(escaped)
    assert s["suspect"] and s["wall_s"] > 5 * s["event_s"]


def test_the_watchdog_kills_a_child_that_stops_answering():
    code = (f"import time\nprint('{guard.HEARTBEAT}', flush=True)\n"
            "print('hello', flush=True)\ntime.sleep(60)")
    rc, lines, _err, killed = sandbox.watch([sys.executable, "-c", code], 0.5)
    assert killed and rc != 0 and lines == ["hello"]
    rc, _lines, _err, killed = sandbox.watch([sys.executable, "-c", "pass"], 5)
    assert rc == 0 and not killed


class _Mem:
    def __init__(self, n):
        self.a = np.zeros(n, np.uint8)

    def free(self):
        pass


class _Cuda:
    """Device memory as numpy bytes: enough for the judge's poison, copy and check logic."""

    def mem_alloc(self, n):
        return _Mem(n)

    def memcpy_htod(self, d, h):
        d.a[:] = np.frombuffer(np.ascontiguousarray(h).tobytes(), np.uint8)

    def memcpy_dtoh(self, h, d):
        h.view(np.uint8).reshape(-1)[:] = d.a

    def memset_d32(self, d, word, n):
        d.a.view(np.uint32)[:n] = word


class _Gpu:
    cuda = _Cuda()

    def synchronize(self):
        pass

    def event_timer(self):
        from cudalab.harness import WallTimer

        return WallTimer()


def _host_fill(buf, n, dtype, seed, centred):
    """The device's input generator, on the mock's memory."""
    from cudalab.exercises import fresh

    buf.a.view(dtype)[:n] = fresh.values(np.arange(n), seed, centred).astype(dtype)


class _VectorAdd:
    """vector_add on the host; `cheat` picks how it games the timing."""

    def __init__(self, cheat=""):
        self.cheat, self.calls, self.seen, self.hits = cheat, 0, set(), 0
        self.cache = {}

    def prepared_call(self, grid, block, a, b, c, n):
        self.calls += 1
        av, bv, cv = (x.a.view(np.float32) for x in (a, b, c))
        if self.cheat == "stops after the check" and self.calls > 2:
            return
        if self.cheat == "skips when the output looks right" and cv[0] == av[0] + bv[0]:
            return
        if self.cheat == "caches per input buffer" and id(a) in self.seen:
            return
        if self.cheat == "a cache that is never wrong":
            key = (id(a), id(b), float(av[0]), float(av[-1]), float(bv[0]), float(bv[-1]))
            if key in self.cache:  # the stored answer: a copy, not the work
                self.hits += 1
                cv[:] = self.cache[key]
                return
            self.cache[key] = av + bv
        self.seen.add(id(a))
        cv[:] = av + bv


@pytest.mark.parametrize("cheat", ["", "stops after the check", "caches per input buffer"])
def test_the_timed_launches_are_checked_so_skipping_work_fails(cheat, capsys):
    from cudalab.exercises import judge
    from cudalab.experiments.base import RunContext
    from cudalab.harness import Harness

    ctx = RunContext(_Gpu(), Harness(judge.MODES["check"][1]), np.random.default_rng(0),
                     {}, {})
    verdict = judge.run_cases(ctx, catalog.get("vector_add"), _VectorAdd(cheat), "check",
                              filler=_host_fill)
    assert verdict["status"] == ("ok" if not cheat else "wrong")
    if cheat:
        assert verdict["checks"][-1]["check"]["passed"]  # right the first time
        assert not verdict["checks"][-1]["timed_check"]["passed"]
    assert guard.HEARTBEAT in capsys.readouterr().out


def test_a_kernel_that_skips_a_right_looking_output_must_do_the_work(capsys):
    from cudalab.exercises import judge
    from cudalab.experiments.base import RunContext
    from cudalab.harness import Harness

    kernel = _VectorAdd("skips when the output looks right")
    ctx = RunContext(_Gpu(), Harness(judge.MODES["check"][1]), np.random.default_rng(0),
                     {}, {})
    assert judge.run_cases(ctx, catalog.get("vector_add"), kernel, "check",
                           filler=_host_fill)["status"] == "ok"
    # the output is poisoned before every sample: it never looks right, so every launch
    # computes (a skip would leave NaN and fail the check of that sample)
    capsys.readouterr()


def _run(kernel, gpu=None, mode="check"):
    from cudalab.exercises import judge
    from cudalab.experiments.base import RunContext
    from cudalab.harness import Harness

    ctx = RunContext(gpu or _Gpu(), Harness(judge.MODES[mode][1]), np.random.default_rng(0),
                     {}, {})
    return judge.run_cases(ctx, catalog.get("vector_add"), kernel, mode, filler=_host_fill)


def test_a_cache_that_is_never_wrong_never_hits_on_fresh_inputs(capsys):
    # keyed on the input buffers and a few sampled values, it would copy a stored answer
    # whenever an input set came back; every timed sample has content never seen before
    kernel = _VectorAdd("a cache that is never wrong")
    v = _run(kernel)
    assert v["status"] == "ok"
    # each size's untimed warm-up repeats the first check's inputs; no timed sample does
    sizes = len(v["checks"]) + len(v["timing"]["trials_s"])
    timed = sum(c["launches"] for c in v["checks"]) + sum(
        g["samples"] for g in v["timing"]["guard"])
    assert timed >= 10 and kernel.hits <= sizes
    capsys.readouterr()


class _SlowGpu(_Gpu):
    """A GPU whose driver reports a 1 kHz SM clock: no kernel can be as fast as measured."""

    ATTRS = {"MEMORY_CLOCK_RATE": 1, "GLOBAL_MEMORY_BUS_WIDTH": 8, "L2_CACHE_SIZE": 1,
             "COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0,
             "MULTIPROCESSOR_COUNT": 1, "CLOCK_RATE": 1}

    def attr(self, name):
        return self.ATTRS[name]


def test_a_time_faster_than_the_hardware_allows_is_gamed(capsys):
    v = _run(_VectorAdd(), _SlowGpu())
    assert v["status"] == "gamed" and v["timing"]["implausible"]
    assert v["timing"]["median_s"] < v["timing"]["floor_s"]
    assert "faster than this GPU" in v["message"]
    assert "at peak DRAM bandwidth" in v["message"]  # vector add: the bytes' bound is longer
    assert _run(_VectorAdd())["timing"]["floor_s"] == 0.0  # no peaks reported: no floor
    capsys.readouterr()


@needs_nvcc
def test_the_host_makes_the_same_inputs_as_the_device_generator(tmp_path):
    # the generator's own source, compiled for the host: its floats must match bit for bit
    import subprocess

    from cudalab.exercises import fresh

    main = ("#include <cstdio>\nint main() { for (unsigned s = 0; s < 3; ++s) for (unsigned i "
            "= 0; i < 5000; i += 7) for (int c = 0; c < 2; ++c) { float v = cudalab_value(i, "
            "s * 2654435761u + 1, c); unsigned u; memcpy(&u, &v, 4); printf(\"%u\\n\", u); } }")
    (tmp_path / "gen.cu").write_text(fresh.SOURCE.replace("extern", "#include <cstring>\n"
                                                          "extern", 1) + main)
    subprocess.run([build.find_nvcc(), "gen.cu", "-o", "gen"], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300)
    got = [int(x) for x in subprocess.run(["./gen"], cwd=tmp_path, capture_output=True,
                                          text=True, check=True).stdout.split()]
    want = [int(fresh.values(np.array([i]), (s * 2654435761 + 1) & 0xFFFFFFFF,
                             bool(c)).view(np.uint32)[0])
            for s in range(3) for i in range(0, 5000, 7) for c in range(2)]
    assert got == want


def _fresh_output(ex, case, seed):
    """The right output of `case`'s size for the inputs made from `seed`."""
    from cudalab.exercises import fresh

    ins = [fresh.values(np.arange(a.size), s, fresh.centred(ex)).astype(a.dtype).reshape(
        a.shape) for a, s in zip(case.inputs, fresh.input_seeds(seed, len(case.inputs)))]
    if ex.kind == "vector_add":
        return ins[0] + ins[1]
    if ex.kind == "transpose":
        return ins[0].reshape(case.size).T.copy()
    if ex.kind == "reduction":
        return np.array([np.sum(ins[0], dtype=np.float64)], np.float32)
    return (ins[0].astype(np.float64) @ ins[1]).astype(case.out.dtype)


@pytest.mark.parametrize("name,size", [("vector_add", (50_000, 256)), ("transpose", (33, 65)),
                                       ("reduction", (100_003,)), ("dgemm", (100, 70, 90)),
                                       ("tiled_matmul", (257, 129, 65))])
def test_a_timed_output_is_checked_against_the_inputs_it_read(name, size):
    from cudalab.exercises import fresh

    ex, rng = catalog.get(name), np.random.default_rng(1)
    case = slots.make_case(ex, rng, size)
    out = _fresh_output(ex, case, 12345)
    c, wrong = fresh.check(ex, case, 12345, out, 1, rng)
    assert c.passed and wrong is None, c
    assert not fresh.check(ex, case, 999, out, 1, rng)[0].passed  # other inputs' answer
    if ex.kind != "reduction":
        bad = out.copy()
        bad.reshape(-1)[-1] = np.nan  # one element never written
        assert not fresh.check(ex, case, 12345, bad, 1, rng)[0].passed


def _fake_sanitizer(tmp_path, log: str, stdout: str, status: str, rc: int = 0) -> str:
    """A compute-sanitizer stand-in: writes `log` to its --log-file, prints `stdout` (the
    kernel's printf), writes the judge's verdict and exits with `rc`."""
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(
        f"#!{sys.executable}\nimport json, sys\na = sys.argv\n"
        f"open(a[a.index('--log-file') + 1], 'w').write({log!r})\nprint({stdout!r})\n"
        f"json.dump({{'status': {status!r}}}, open(a[a.index('--out') + 1], 'w'))\n"
        f"sys.exit({rc})\n")
    tool.chmod(0o755)
    return str(tool)


INVALID = "========= Invalid __global__ write of size 4 bytes\n=========     at vector_add+0x70"


@pytest.mark.parametrize("log,stdout,status,rc,want", [
    ("========= ERROR SUMMARY: 0 errors\n", INVALID, "ok", 0, "ok"),  # a printf look-alike
    (INVALID + "\n========= ERROR SUMMARY: 1 error\n", "", "ok", 97, "memory_error"),
    ("========= Program hit CUDA_ERROR_LAUNCH_FAILED (error 719)\n"
     "========= ERROR SUMMARY: 1 error\n", "", "crashed", 97, "crashed"),  # a __trap
], ids=["spoofed-stdout", "invalid-write", "trap"])
def test_memchecks_verdict_comes_from_its_log_file_only(log, stdout, status, rc, want,
                                                        tmp_path, monkeypatch):
    tool = _fake_sanitizer(tmp_path, log, stdout, status, rc)
    monkeypatch.setattr(sandbox, "find_sanitizer", lambda: tool)
    v = sandbox.run_judge(catalog.get("vector_add"), b"", sanitize=True)
    assert v["status"] == want, v
    if want == "memory_error":
        assert "Invalid __global__ write" in v["message"]


@pytest.mark.parametrize("plain,checked,want", [
    ("ok", "memory_error", "memory_error"), ("wrong", "memory_error", "memory_error"),
    ("ok", "ok", "ok"), ("crashed", "crashed", "crashed"), ("wrong", "ok", "wrong"),
    ("timeout", None, "timeout")])
def test_sanitize_adds_memcheck_to_the_judgement(plain, checked, want, monkeypatch):
    from cudalab.exercises import pipeline

    calls = []

    def run_judge(ex, cubin, mode, seed, timeout, sanitize=False, sandbox="optional"):
        calls.append(sanitize)
        if sanitize:
            return {"status": checked, "message": "memcheck's"}
        return {"status": plain, "message": "plain", "timing": {"median_s": 1e-3}}

    monkeypatch.setattr(pipeline, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(pipeline.build, "compile_submission",
                        lambda *a, **k: build.Build(True, "sm_90", "a.cu", b"x", compiled=True))
    monkeypatch.setattr(pipeline.sandbox, "run_judge", run_judge)
    v = pipeline.judge_text("", catalog.get("vector_add"), "a.cu", mode="class",
                            sanitize=True)
    assert v["status"] == want
    assert calls == ([False] if plain == "timeout" else [False, True])
    if want == plain:  # the plain judgement stands, with its timing
        assert v["timing"] == {"median_s": 1e-3} and v["message"] == "plain"
    else:
        assert v["unsanitized"]["status"] == plain
