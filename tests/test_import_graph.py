"""The package's modules import each other without a cycle.

The graph is read with `ast`, so imports inside functions count too: a cycle hidden in a
function still ties two modules together (each needs the other to work, and neither can be
understood or tested alone). Imports under `if TYPE_CHECKING:` never run, but a reader (and
any tool that draws the package) still sees them tie two modules: they must not close a
cycle either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cudalab

PACKAGE_DIR = Path(cudalab.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth; under `if TYPE_CHECKING:` only
    where type_checking is set."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node) and not type_checking:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """cudalab module -> the cudalab modules it imports (`from cudalab import x` names the
    module cudalab.x where x is one, else the package cudalab itself)."""
    files = {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), filename=str(path)),
                             type_checking):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    pkg = mod.split(".") if is_package else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            edges.update(t for t in targets if t in files and t != mod)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_not_even_type_only_imports_close_a_cycle():
    # the lessons name the ceilings type; the roofline takes their declarations as data
    cycle = find_cycle(import_graph(type_checking=True))
    assert cycle is None, "import cycle (type-only imports counted): " + " -> ".join(cycle or [])


def test_the_roofline_never_reads_the_lesson_registry():
    graph = import_graph(type_checking=True)
    for mod in ("cudalab.roofline", "cudalab.run_ceilings", "cudalab.roofline_figure"):
        assert not {m for m in graph[mod] if m.startswith("cudalab.experiments")}, mod


def test_the_graph_sees_imports_inside_functions_and_finds_a_cycle():
    graph = import_graph()
    # runner imports the profiler inside a function: that edge must be in the graph
    assert "cudalab.profiler" in graph["cudalab.runner"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_exercises_reach_a_lesson_only_through_the_kernel_slot_interface():
    """exercises/ imports no module of a lesson's folder (cudalab.experiments.<lesson>...):
    a slot's reference, check, timing and build come through cudalab.kernel_slot, the
    lesson's registry entry (cudalab.experiments) and the framework's build helpers."""
    graph = import_graph(type_checking=True)
    lessons = {m for m in graph if m.startswith("cudalab.experiments.")
               and (PACKAGE_DIR / "experiments" / m.split(".")[2]).is_dir()}
    wired = sorted(f"{mod} -> {dep}" for mod, deps in graph.items()
                   if mod.startswith("cudalab.exercises") for dep in deps & lessons)
    assert lessons and not wired, "exercises importing a lesson's modules: " + "; ".join(wired)
