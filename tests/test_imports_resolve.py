"""Every `from cudalab.x import y` in the package and its tools names something that exists.

Imports inside functions (kept there so a GPU-less machine never loads pycuda or NVML) run
only where their code path runs: a name renamed or moved elsewhere breaks them on the GPU
machine alone. An interconnect job failed every point that way once (`NvmlClockObserver`
had moved from telemetry to nvml_clocks). This test resolves each such name here, on any
machine.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.joinpath("cudalab").rglob("*.py"), *ROOT.joinpath("tools").rglob("*.py"),
                  *ROOT.joinpath("scripts").rglob("*.py")])


def _cudalab_imports() -> list[tuple[str, int, str, str]]:
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] == "cudalab":
                found += [(str(path.relative_to(ROOT)), node.lineno, node.module, a.name)
                          for a in node.names if a.name != "*"]
    return found


IMPORTS = _cudalab_imports()


def test_the_scan_sees_the_function_local_imports():
    assert len(IMPORTS) > 200
    assert any(m == "cudalab.nvml_clocks" and n == "NvmlClockObserver"
               for _, _, m, n in IMPORTS)


@pytest.mark.parametrize("module", sorted({m for _, _, m, _ in IMPORTS}))
def test_every_imported_name_exists(module):
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "cudalab":
            raise
        pytest.skip(f"{module} needs {exc.name}, not installed here")
    missing = [f"{where}:{line} imports {name}" for where, line, m, name in IMPORTS
               if m == module and not hasattr(mod, name)
               and importlib.util.find_spec(f"{module}.{name}") is None]
    assert not missing, f"{module} has no such name: " + "; ".join(missing)
