"""Code health rules the whole package keeps (issue 14): short functions, one definition of
shared constants, no Snakemake internals or script wrappers in the workflow."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cudalab
from cudalab.experiments import REGISTRY

PACKAGE = Path(cudalab.__file__).resolve().parent
ROOT = PACKAGE.parent
MAX_LINES = 80
MAX_MODULE_LINES = 600  # a module that serves several stages is split by stage


def _functions(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_in_the_package_is_longer_than_80_lines():
    long = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
            for p in sorted(PACKAGE.rglob("*.py")) for name, line, n in _functions(p)
            if n > MAX_LINES]
    assert not long, "functions longer than 80 lines: " + "; ".join(long)


def test_no_module_of_the_package_or_its_tools_is_longer_than_600_lines():
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "scripts").rglob("*.py"),
             *(ROOT / "tools").rglob("*.py")]
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in sorted(files)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules longer than 600 lines: " + "; ".join(long)


def test_the_length_check_sees_long_functions(tmp_path):
    src = tmp_path / "long.py"
    src.write_text("def f():\n" + "    x = 1\n" * 85 + "\n\ndef g():\n    return 1\n")
    assert [(name, n) for name, _, n in _functions(src)] == [("f", 86), ("g", 2)]


def test_shared_constants_are_defined_once():
    for const in ("NAN_BITS",):
        where = [p.name for p in PACKAGE.rglob("*.py")
                 if re.search(rf"^{const}\s*=", p.read_text(), re.M)]
        assert where == ["base.py"], f"{const} defined in {where}"


def test_every_experiment_declares_its_check_or_why_none():
    """The runner refuses a timed GPU result without a check unless the experiment says why
    none applies; today every experiment checks every point (none needs a reason)."""
    assert {n: e.no_check_reason for n, e in REGISTRY.items() if e.no_check_reason} == {}


def test_the_workflow_uses_no_snakemake_internals_and_no_script_wrappers():
    rules = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
    text = "\n".join(p.read_text() for p in rules)
    # the DAG object is internal; its settings (targets) are public, as deployment_settings
    assert not re.search(r"workflow\.dag\b", text) and "needrun" not in text
    assert "script:" not in text and "run:" not in text
    # every rule but `all` runs the cudalab CLI through shell:, its output in its log; the
    # ones through {CUDALAB} (the checkout's package) also name the project's conda env
    # target rules (only inputs): `all`, and `exercises` for a class's submissions
    n = len(re.findall(r"^\s*rule(?: \w+)?:", text, re.M)) - len(
        re.findall(r"^rule (?:all|exercises):", text, re.M))
    assert n >= 4, n  # measure, aggregate, figures, report (and the sweep's, the doctor)
    assert text.count("shell:") == n
    # measure and measure_shard share one command (measure_shell, written once): its text
    # counts once for each rule whose shell: is it
    shared = len(re.findall(r"^\s+shell:\s*\n\s+measure_shell\(", text, re.M))
    assert shared == 2 and text.count("def measure_shell(") == 1
    cudalab_calls = len(re.findall(r'["}]\{CUDALAB\} ', text)) + shared - 1
    assert cudalab_calls + text.count('-m cudalab.cli "') == n
    assert len(re.findall(r"> \{log(?::q)?\} 2>&1", text)) + shared - 1 == n
    assert text.count("conda:") == cudalab_calls
    # the rules' old wrappers are gone (scripts/ keeps the benchmarks)
    assert not {"measure.py", "aggregate.py", "figures.py", "report.py"} & {
        p.name for p in (ROOT / "scripts").glob("*.py")}


def test_no_script_or_tool_edits_sys_path():
    """Scripts and tools import the installed cudalab (pip install -e . in a checkout), never
    a path they put in front of it."""
    files = sorted([*(ROOT / "scripts").rglob("*.py"), *(ROOT / "tools").rglob("*.py")])
    assert files
    edits = [str(p.relative_to(ROOT)) for p in files
             if re.search(r"\bsys\.path\s*(\.insert|\.append|\[|\+=|=)", p.read_text())]
    assert not edits, f"scripts that edit sys.path: {edits}"


class _Item:
    """What the grouping reads of a collected test: its file and its markers."""

    def __init__(self, path: Path, *marks: str) -> None:
        self.fspath, self.marks = path, marks

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None


def test_parallel_workers_keep_a_file_together_and_gpu_and_slurm_tests_one_at_a_time():
    """Under `pytest -n auto`, a file's tests share a worker; the real-Slurm tests share one
    (one cluster) and so do the GPU tests wherever they are (two would time kernels on one
    GPU at once)."""
    from worker_groups import worker_group

    tests = ROOT / "tests"
    assert worker_group(_Item(tests / "test_fmt.py")) == "test_fmt.py"
    assert worker_group(_Item(tests / "slurm" / "test_sweep.py", "slurm")) == "slurm"
    assert worker_group(_Item(tests / "slurm" / "test_polling.py", "slurm")) == "slurm"
    assert worker_group(_Item(tests / "gpu" / "test_timing_gpu.py", "gpu")) == "gpu"
    assert worker_group(_Item(tests / "test_exercises_heldout.py", "gpu")) == "gpu"
    assert worker_group(_Item(tests / "test_exercises_heldout.py")) == "test_exercises_heldout.py"
