"""Can a kernel write global memory at all? Counted in its PTX, so it needs no GPU.

Every slot's output lives in global memory, so a kernel whose PTX (its own body and the
device functions it calls) holds no instruction that may write global memory can never
produce its output: the untouched starter is one. A store counts when it names the global
state space (`st.global`, `red.global`, `atom.global`, a bulk copy into global memory) or
none at all: a generic `st`/`red`/`atom` may reach global memory through a pointer
parameter, so it counts too. Stores to shared, local or parameter space do not. The count
errs on the side of a store: a correct kernel is never refused for lack of one.
"""

from __future__ import annotations

import re

# the state spaces an instruction can name; the first one named is its destination's
_SPACES = {"global", "local", "shared", "param", "const", "tex"}
# a function's header: `.entry NAME(` or `.func (.param ...) NAME(`; the body follows `)`
_HEADER = re.compile(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)\s*\(")
_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([A-Za-z_$%][\w$]*)")
_PREDICATE = re.compile(r"^@!?%\w+\s+")
_BODY_OR_END = re.compile(r"[;{]")


def function_bodies(ptx: str) -> dict[str, str]:
    """name -> body of every defined .entry and .func (prototypes, ending in ';', skipped)."""
    out: dict[str, str] = {}
    for m in _HEADER.finditer(ptx):
        depth, i = 1, m.end()
        while i < len(ptx) and depth:  # the end of the parameter list
            depth += {"(": 1, ")": -1}.get(ptx[i], 0)
            i += 1
        m2 = _BODY_OR_END.search(ptx, i)  # directives (.maxntid ...) may come first
        if m2 is None or m2.group() == ";":
            continue  # a prototype: declared here, defined elsewhere (or not at all)
        start = m2.start()
        depth, j = 1, start + 1
        while j < len(ptx) and depth:  # the body's own braces: scoped blocks nest
            depth += {"{": 1, "}": -1}.get(ptx[j], 0)
            j += 1
        out[m.group(1)] = ptx[start + 1:j - 1]
    return out


def writes_global(opcode: str) -> bool:
    """Whether one PTX opcode (`st.global.f32`, `atom.add.f32` ...) may write global memory."""
    parts = opcode.split(".")
    spaces = [p.split("::")[0] for p in parts[1:] if p.split("::")[0] in _SPACES]
    head = parts[0]
    if head in ("st", "red", "atom", "multimem") or opcode.startswith("wmma.store"):
        return not spaces or spaces[0] == "global"  # no space named: generic, may be global
    if head == "cp":  # bulk copies and reductions name their destination first
        return bool(spaces) and spaces[0] == "global"
    return False


def _opcodes(body: str) -> list[str]:
    out = []
    for line in body.splitlines():
        line = _PREDICATE.sub("", line.split("//", 1)[0].strip())
        if line and not line.startswith((".", "{", "}", "$")):
            out.append(line.split(None, 1)[0].rstrip(";"))
    return out


def global_stores(ptx: str, kernel: str) -> int | None:
    """How many instructions may write global memory in `kernel` and the functions it calls
    (None: the PTX has no entry of that name)."""
    bodies = function_bodies(ptx)
    if kernel not in bodies:
        return None
    seen, todo, count = {kernel}, [kernel], 0
    while todo:
        body = bodies.get(todo.pop(), "")
        count += sum(writes_global(op) for op in _opcodes(body))
        for callee in _CALL.findall(body):
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return count
