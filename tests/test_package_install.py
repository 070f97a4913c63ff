"""A non-editable install runs from any directory: it carries its kernels, report templates
and config schema (cudalab/resources.py), so no job needs the checkout on PYTHONPATH.

The package is built from a copy of only what setup.py and pyproject.toml name (so a file the
build forgets fails here) and installed into a fresh venv that sees this interpreter's
site-packages (its dependencies, setuptools and wheel: no network, no build isolation).
Those are this interpreter's own, also in an ordinary venv: a venv made from a venv would see
the base Python's site-packages only (on Python 3.12 without setuptools), so the nested venv
gets a .pth file naming the folders this interpreter imports its packages from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudalab import kernel_sources, resources

pytestmark = pytest.mark.slow  # a venv and a package build
CHECKOUT = Path(__file__).resolve().parent.parent
# What the build reads besides the LAYOUT folders (pyproject's readme is README.md).
BUILD_FILES = ["pyproject.toml", "setup.py", "README.md"]
INSTALL_BUDGET_S = 300  # a bound against a hung build, not a benchmark (about 10 s idle)

# Run by the venv's interpreter: where the installed package finds what it would compile,
# render and validate against.
PROBE = """
import json, cudalab, cudalab.config, cudalab.gpu, cudalab.report
from cudalab.experiments import static_analysis
print(json.dumps({
    "package": cudalab.__file__,
    "cuda_dir": str(cudalab.gpu.CUDA_DIR),
    "kernels": [str(p) for p in static_analysis.kernel_files([])],
    "shipped": sorted(p.relative_to(cudalab.gpu.CUDA_DIR).as_posix()
                      for p in cudalab.gpu.CUDA_DIR.rglob("*.cu")),
    "static_analysis_cuda_dir": str(static_analysis.CUDA_DIR),
    "templates": str(cudalab.report.TEMPLATES),
    "schema": str(cudalab.config.SCHEMA_PATH),
}))
"""


def _can_build_offline() -> str | None:
    """Why this interpreter cannot build the wheel without isolation, or None."""
    try:
        import setuptools
    except ImportError:
        return "setuptools is not installed"
    major = int(setuptools.__version__.split(".")[0])
    if major < 68:
        return f"setuptools {setuptools.__version__} < 68 (pyproject's build requirement)"
    if major < 71:  # bdist_wheel moved into setuptools in 70.1
        try:
            import wheel  # noqa: F401
        except ImportError:
            return "wheel is not installed"
    return None


def _copy_sources(dest: Path) -> None:
    for name in BUILD_FILES:
        shutil.copy2(CHECKOUT / name, dest / name)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(CHECKOUT / "cudalab", dest / "cudalab", ignore=junk)
    for folder in resources.LAYOUT.values():
        shutil.copytree(CHECKOUT / folder, dest / folder, ignore=junk)


def _under(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding a non-editable install of this checkout; returns its bin folder."""
    if (why := _can_build_offline()) is not None:
        pytest.skip(f"cannot build offline: {why} (pip install -e '.[dev]' brings it)")
    tmp = tmp_path_factory.mktemp("install")
    src, venv = tmp / "src", tmp / "venv"
    src.mkdir()
    _copy_sources(src)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _share_site_packages(venv)
    python = venv / "bin" / "python"
    # this interpreter's pip installs into the venv (--python): the venv needs no pip of its own
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", "--no-build-isolation", "--no-cache-dir", str(src)],
                   check=True, env=_clean_env(), cwd=tmp)
    took = time.monotonic() - t0
    assert took < INSTALL_BUDGET_S, f"venv + install took {took:.0f} s"
    shutil.rmtree(src)  # the installed package must not lean on the sources it was built from
    return venv / "bin"


def _share_site_packages(venv: Path) -> None:
    """The venv imports what this interpreter imports from its site folders (its venv's or
    the system's), after its own site-packages: plain paths in a .pth file, so the .pth files
    in those folders (an editable cudalab among them) are not run there."""
    own = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages"
    dirs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")
            and Path(p).is_dir()]
    (own / "outer_site_packages.pth").write_text("".join(f"{d}\n" for d in dirs))


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH: the venv must import its own copy, not the checkout's. No sinfo: the
    plan is read away from any Slurm (a test cluster may be up, and its nodes too small)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if not (Path(d) / "sinfo").exists())
    return env


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_installed_package_carries_kernels_templates_and_schema(installed: Path, tmp_path):
    venv = installed.parent
    found = json.loads(_run([str(installed / "python"), "-c", PROBE], tmp_path).stdout)
    for key in ("package", "cuda_dir", "static_analysis_cuda_dir", "templates", "schema"):
        assert _under(found[key], venv), f"{key}: {found[key]} is not in the venv"
        assert not _under(found[key], CHECKOUT), f"{key}: {found[key]} is the checkout's"
    assert Path(found["cuda_dir"]).is_dir() and Path(found["templates"]).is_dir()
    # every kernel of the checkout is shipped, and static analysis compiles the shipped copies
    cuda = CHECKOUT / "cuda"
    assert found["shipped"] == sorted(p.relative_to(cuda).as_posix() for p in cuda.rglob("*.cu"))
    built = sorted(p.relative_to(cuda).as_posix() for p in kernel_sources.built_kernels(cuda))
    shipped_dir = Path(found["cuda_dir"])
    assert sorted(Path(k).relative_to(shipped_dir).as_posix() for k in found["kernels"]) == built
    assert all(_under(k, venv) for k in found["kernels"])
    for k in found["kernels"]:
        rel = Path(k).relative_to(shipped_dir)
        assert Path(k).read_bytes() == (cuda / rel).read_bytes()
    templates = sorted(p.name for p in Path(found["templates"]).iterdir())
    assert templates == sorted(p.name for p in (CHECKOUT / "reports" / "templates").iterdir())
    assert Path(found["schema"]).is_file()


def test_installed_entry_point_plans_and_validates_away_from_the_checkout(installed: Path,
                                                                          tmp_path):
    shutil.copy2(CHECKOUT / "config.yaml", tmp_path / "config.yaml")
    cudalab = str(installed / "cudalab")
    _run([cudalab, "validate", "config.yaml"], tmp_path)
    plan = _run([cudalab, "plan", "config.yaml"], tmp_path).stdout
    assert "static_analysis" in plan
    _run([cudalab, "validate"], tmp_path)  # its default: ./config.yaml
