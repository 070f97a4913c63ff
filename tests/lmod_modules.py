"""A modulefile of the tests' own for Debian's Lmod (tests/test_site.py, tests/slurm)."""

from __future__ import annotations

import shutil
from pathlib import Path

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def write_module(root: Path, name: str) -> Path:
    """A modulefile of our own (Lua, for Lmod) that puts a marked nvcc first on PATH."""
    bindir = root / f"marked-{name.replace('/', '-')}" / "bin"
    bindir.mkdir(parents=True)
    real = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    nvcc = bindir / "nvcc"
    nvcc.write_text(f'#!/bin/sh\n# cudalab test: marked nvcc of module {name}\n'
                    f'exec {real} "$@"\n')
    nvcc.chmod(0o755)
    mf = root / "modulefiles" / f"{name}.lua"
    mf.parent.mkdir(parents=True, exist_ok=True)
    mf.write_text(f'prepend_path("PATH", "{bindir}")\nsetenv("CUDALAB_TEST_MODULE", "{name}")\n')
    return nvcc


def write_python_module(root: Path, name: str) -> Path:
    """A modulefile that puts a `python` / `python3` of its own first on PATH, as a site's
    Python module does: one without cudalab's packages (it fails whatever it is asked).
    The jobs must not use it: they run the interpreter that runs Snakemake, by path."""
    bindir = root / f"marked-{name.replace('/', '-')}" / "bin"
    bindir.mkdir(parents=True)
    for exe in ("python", "python3"):
        p = bindir / exe
        p.write_text(f"#!/bin/sh\necho 'cudalab test: the {name} module's {exe} was run' >&2\n"
                     "exit 97\n")
        p.chmod(0o755)
    mf = root / "modulefiles" / f"{name}.lua"
    mf.parent.mkdir(parents=True, exist_ok=True)
    mf.write_text(f'prepend_path("PATH", "{bindir}")\n')
    return bindir / "python3"
