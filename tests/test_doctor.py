"""The doctor's toolkit checks: nvcc's toolkit has cuda.h (asked of nvcc itself, through a
wrapper or a symlink, in NVIDIA's and Debian's layouts), and libcuda loads where a GPU is
expected."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from cudalab import doctor

TARGET = "targets/x86_64-linux/include"


def fake_nvcc(bindir: Path, top: Path, includes: list[Path] | None) -> Path:
    """An nvcc that answers --version and --dryrun (on stderr, as the real one does) for a
    toolkit at `top` whose include directories are `includes` (None: prints TOP only)."""
    bindir.mkdir(parents=True, exist_ok=True)
    inc = "" if includes is None else (
        "echo '#$ INCLUDES=" + " ".join(f'"-I{d}"' for d in includes) + "  ' >&2")
    nvcc = bindir / "nvcc"
    nvcc.write_text(f"""#!/bin/sh
case "$*" in
  *--version*) echo "Cuda compilation tools, release 12.4, V12.4.131";;
  *--dryrun*) echo '#$ _HERE_={top}/bin' >&2; echo '#$ TOP={top}/bin/..' >&2; {inc};;
  *) exit 1;;
esac
""")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return nvcc


def env_with(bindir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_ROOT", "CUDA_INC_DIR")}
    return env | {"PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}"}


@pytest.fixture
def no_system_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's /usr/include stands in for an empty folder (this machine's may hold a
    cuda.h)."""
    d = tmp_path / "sys-include"
    d.mkdir()
    monkeypatch.setattr(doctor, "DEFAULT_INCLUDE_DIRS", (str(d),))
    return d


def test_a_toolkit_without_cuda_h_fails(tmp_path: Path, no_system_headers: Path) -> None:
    top = tmp_path / "cuda-12.4"
    (top / TARGET).mkdir(parents=True)  # headers of a runtime-only install: no cuda.h
    fake_nvcc(top / "bin", top, [top / "bin" / ".." / TARGET])
    env = env_with(top / "bin")
    c, release = doctor.check_nvcc(env, required=True)
    assert c.status == doctor.OK and release == "12.4"  # what the doctor called "ok" before
    h = doctor.check_cuda_h(env, required=True)
    assert h.status == doctor.FAIL and h.name == "cuda.h"
    assert "has no cuda.h" in h.value and str(top / TARGET) in h.value
    assert "nvidia-cuda-dev" in h.fix
    assert doctor.check_cuda_h(env, required=False).status == doctor.WARN


def test_cuda_h_found_through_a_wrapper_and_a_symlink(tmp_path: Path,
                                                      no_system_headers: Path) -> None:
    """/usr/local/bin/nvcc (a wrapper script) and /usr/local/cuda (a symlink) give no
    toolkit root by their own path: nvcc --dryrun does."""
    real = tmp_path / "cuda-12.4"
    (real / TARGET).mkdir(parents=True)
    (real / TARGET / "cuda.h").write_text("/* cuda.h */\n")
    (tmp_path / "cuda").symlink_to(real)
    link = tmp_path / "cuda"
    fake_nvcc(real / "bin", link, [link / "bin" / ".." / TARGET])
    wrapper_bin = tmp_path / "local-bin"
    wrapper_bin.mkdir()
    (wrapper_bin / "nvcc").write_text(f'#!/bin/sh\nexec {real / "bin" / "nvcc"} "$@"\n')
    (wrapper_bin / "nvcc").chmod(0o755)
    env = env_with(wrapper_bin)
    dirs, top = doctor.nvcc_include_dirs(str(wrapper_bin / "nvcc"), env)
    assert dirs == [link / TARGET] and top == str(link)
    # pycuda's build would look in local-bin/../include: a warning with the way out
    h = doctor.check_cuda_h(env, required=True)
    assert h.status == doctor.WARN and str(link / TARGET / "cuda.h") in h.value
    assert h.fix == f"export CUDA_INC_DIR={link / TARGET} before pip install -e '.[gpu]'"
    (real / "include").symlink_to(real / TARGET)  # NVIDIA's installer links include/ too
    assert doctor.check_cuda_h(env, True).fix == \
        f"export CUDA_ROOT={link} before pip install -e '.[gpu]'"
    # once pycuda is installed, or CUDA_ROOT is set, nothing is left to say
    assert doctor.check_cuda_h(env, True, pycuda_ok=True).status == doctor.OK
    assert doctor.check_cuda_h(env | {"CUDA_ROOT": str(link)}, True).status == doctor.OK
    # called through the toolkit's own bin/, pycuda finds it by itself
    assert doctor.check_cuda_h(env_with(link / "bin"), True).status == doctor.OK


def test_debians_layout_headers_in_usr_include(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's nvidia-cuda-toolkit: nvcc in /usr/bin names no include directory, cuda.h is
    in /usr/include (the host compiler's default)."""
    usr = tmp_path / "usr"
    (usr / "include").mkdir(parents=True)
    fake_nvcc(usr / "bin", usr / "lib" / "nvidia-cuda-toolkit", [])
    monkeypatch.setattr(doctor, "DEFAULT_INCLUDE_DIRS", (str(usr / "include"),))
    env = env_with(usr / "bin")
    assert doctor.check_cuda_h(env, required=True).status == doctor.FAIL  # no nvidia-cuda-dev
    (usr / "include" / "cuda.h").write_text("/* cuda.h */\n")
    h = doctor.check_cuda_h(env, required=True)
    assert h.status == doctor.OK and h.value == str(usr / "include" / "cuda.h")


def test_an_nvcc_that_names_only_its_root(tmp_path: Path, no_system_headers: Path) -> None:
    top = tmp_path / "cuda"
    (top / "include").mkdir(parents=True)
    fake_nvcc(top / "bin", top, None)
    dirs, _ = doctor.nvcc_include_dirs(str(top / "bin" / "nvcc"), env_with(top / "bin"))
    assert dirs == [top / "include"]


def test_no_nvcc_no_verdict_on_cuda_h(tmp_path: Path) -> None:
    c = doctor.check_cuda_h({"PATH": str(tmp_path)}, required=True)
    assert c.status == doctor.INFO


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_the_real_nvcc_names_a_directory_with_cuda_h() -> None:
    env = dict(os.environ)
    dirs, top = doctor.nvcc_include_dirs(shutil.which("nvcc"), env)
    assert dirs and top
    h = doctor.check_cuda_h(env, required=True)
    assert h.status in (doctor.OK, doctor.WARN), h
    assert h.value.split(";")[0].endswith("cuda.h") and Path(h.value.split(";")[0]).is_file()


# -- libcuda ----------------------------------------------------------------------------------
def test_libcuda_missing_fails_only_where_a_gpu_is_expected() -> None:
    env = dict(os.environ)
    c = doctor.check_libcuda(env, need_gpu=True, lib="libcuda-not-here.so.1")
    assert c.status == doctor.FAIL and "cannot be loaded" in c.value and "driver" in c.fix
    assert doctor.check_libcuda(env, need_gpu=False, lib="libcuda-not-here.so.1").status \
        == doctor.INFO


def test_libcuda_loadable_is_ok() -> None:
    """Any library the loader finds stands in for the driver's (this machine has none)."""
    c = doctor.check_libcuda(dict(os.environ), need_gpu=True, lib="libc.so.6")
    assert c.status == doctor.OK, c


def test_the_toolkits_stub_is_not_the_driver() -> None:
    stub = "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so"
    c = doctor.libcuda_verdict({"path": stub, "find_library": "libcuda.so.1"}, need_gpu=True)
    assert c.status == doctor.FAIL and "stub" in c.value and "LD_LIBRARY_PATH" in c.fix
    ok = doctor.libcuda_verdict({"path": "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}, True)
    assert ok.status == doctor.OK


def test_the_doctor_table_has_both_lines(no_system_headers: Path) -> None:
    checks = doctor.run_checks([], need_gpu=True, need_nvcc=True)
    names = [c.name for c in checks]
    assert "cuda.h" in names and "libcuda" in names
    assert names.index("nvcc") < names.index("cuda.h")


def test_the_jobs_python_is_checked_with_the_modules_environment(tmp_path):
    """The doctor tries the interpreter the jobs run (its own): a `python3` a module puts
    first on PATH is named as unused; a PYTHONPATH that breaks cudalab's imports fails."""
    import os
    import sys

    from cudalab import doctor

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\nexit 97\n")
    (fake / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    c = doctor.check_python(env)
    assert c.status == doctor.OK and c.value.startswith(f"{sys.executable} (Python ")
    assert f"`python3` first on PATH is {fake / 'python3'}, which the jobs do not use" in c.value
    broken = tmp_path / "site"
    broken.mkdir()
    (broken / "jsonschema.py").write_text("raise ImportError('a module set PYTHONPATH')\n")
    c = doctor.check_python({**env, "PYTHONPATH": str(broken)})
    assert c.status == doctor.FAIL and "a module set PYTHONPATH" in c.value
    assert "PYTHONPATH or PYTHONHOME" in c.fix


# -- advice by where the doctor runs -----------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("SLURM") and k != "CUDA_VISIBLE_DEVICES"}
    return {**base, **extra}


def test_in_a_job_that_holds_a_gpu_the_advice_is_not_to_ask_for_one() -> None:
    held = doctor.gpu_fix(_env(SLURM_JOB_ID="7", SLURMD_NODENAME="gpu03",
                               CUDA_VISIBLE_DEVICES="0"))
    assert "--gpus" not in held and "holds GPU 0" in held and "gpu03" in held
    assert "admins" in held and "slurm.gpu_model" in held
    assert "plain `snakemake` (without --profile slurm)" in held, "the CPU-only report"
    none = doctor.gpu_fix(_env(SLURM_JOB_ID="7"))
    assert "holds no GPU" in none and "slurm.gpu_model" in none
    outside = doctor.gpu_fix(_env())
    assert "snakemake --profile slurm" in outside and "without --profile slurm" in outside
    c = doctor.check_libcuda(_env(SLURM_JOB_ID="7", CUDA_VISIBLE_DEVICES="0"), need_gpu=True,
                             lib="libcuda-not-here.so.1")
    assert c.status == doctor.FAIL and "--gpus" not in c.fix and "holds GPU 0" in c.fix


@pytest.mark.skipif(not Path("/usr/share/lmod/lmod/init/bash").is_file(),
                    reason="Debian's Lmod not installed (apt-get install lmod)")
def test_one_broken_module_is_named_and_the_good_one_gets_no_wrong_advice(tmp_path) -> None:
    """In a job whose `module load good broken` failed (Lmod loads none of them), the good
    module is loadable but not loaded: the fix is the broken one, not --sdm env-modules."""
    from lmod_modules import write_module

    write_module(tmp_path, "cudatest/1.0")
    env = _env(SLURM_JOB_ID="7", MODULEPATH=str(tmp_path / "modulefiles"), LOADEDMODULES="")
    checks, _ = doctor.check_modules(["cudatest/1.0", "nosuch/9.9"], env)
    good, bad = checks
    assert bad.status == doctor.FAIL and "nosuch/9.9" in bad.value, bad
    assert good.status == doctor.INFO and "stopped at nosuch/9.9" in good.value, good
    assert "env-modules" not in good.fix, good
    alone, _ = doctor.check_modules(["cudatest/1.0"], env)  # no broken one: --sdm is the fix
    assert alone[0].status == doctor.FAIL and "--sdm env-modules" in alone[0].fix
