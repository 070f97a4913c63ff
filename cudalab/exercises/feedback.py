"""A verdict as the student reads it: what failed and where, the kernel's resources and
occupancy, the time, and the lesson's hint for the next step."""

from __future__ import annotations

from typing import Any

from cudalab import fmt
from cudalab.exercises.catalog import EXERCISES
from cudalab.safe_text import printable

MAX_DIAGNOSTICS = 10

HEADLINE = {
    "ok": "✔ correct",
    "wrong": "✘ wrong result",
    "compile_error": "✘ does not compile",
    "slot_error": "✘ compiles, but does not fit the slot",
    "rejected": "✘ not accepted",
    "crashed": "✘ crashed",
    "timeout": "✘ did not finish (killed)",
    "memory_error": "✘ invalid memory access",
    "gamed": "✘ right outputs, impossible time",
    "compiled": "· compiled, not judged",
}


def size_label(kind: str, size: list[int]) -> str:
    """The size of a case as the exercise names it."""
    if kind == "matmul":
        m, k, n = size
        return f"{m}×{k} · {k}×{n}"
    if kind == "transpose":
        return f"{size[0]} rows × {size[1]} cols"
    if kind == "vector_add":
        return f"n = {fmt.group(size[0])}, {size[1]} threads a block"
    return f"n = {fmt.group(size[0])}"


def element(kind: str, index: list[int]) -> str:
    if kind == "reduction":
        return "*out"
    name = {"vector_add": "c", "matmul": "C", "transpose": "out"}[kind]
    return name + "".join(f"[{i}]" for i in index)


def wrong_lines(kind: str, check: dict[str, Any], size: list[int], when: str) -> list[str]:
    """The failed check of one size: first wrong element, its expected value, the error."""
    out = [f"  {when} at {size_label(kind, size)}:"]
    w = check.get("first_wrong")
    if w:
        got = "NaN: never written" if w["got"] != w["got"] else f"{w['got']:.9g}"
        out.append(f"    first wrong element {element(kind, w['index'])} = {got}, expected "
                   f"{w['expected']:.9g}")
        if kind != "reduction":
            out.append(f"    {fmt.group(w['wrong'])} element(s) wrong, "
                       f"{fmt.group(w['unwritten'])} never written")
    out.append(f"    {check['metric']} = {fmt.error(check['error'])} (allowed: "
               f"{fmt.error(check['tolerance'])})" + (f"; {check['detail']}"
                                                      if check.get("detail") else ""))
    return out


def failing_check(verdict: dict[str, Any], kind: str) -> list[str]:
    for c in verdict.get("checks", []):
        if not c["check"]["passed"]:
            return wrong_lines(kind, c["check"], c["size"], "the first launch is wrong")
        if not c["timed_check"]["passed"]:
            return wrong_lines(kind, c["timed_check"], c["size"],
                               f"correct once, wrong after {c['launches']} timed launches "
                               "(fresh output each time: no caching, no skipped work)")
    return []


def static_lines(build: dict[str, Any]) -> list[str]:
    u = build.get("usage") or {}
    if "registers" not in u:
        return []
    spills = u.get("spill_stores", 0) + u.get("spill_loads", 0)
    line = (f"Static analysis ({build.get('arch', '?')}): {u['registers']} registers, "
            f"{fmt.nbytes(u.get('smem_static', 0))} static shared memory, "
            + (f"{spills} bytes of spills" if spills else "no spills"))
    if "occupancy" in u:
        line += (f"; occupancy {fmt.percent(u['occupancy'], fraction=True)} at "
                 f"{u['threads']} threads a block (limited by {u['limiter']})")
    return [line]


def timing_lines(verdict: dict[str, Any], kind: str) -> list[str]:
    t = verdict.get("timing")
    if not t:
        return []
    rate = (f"{fmt.flop_rate(t['gflops'])}" if "gflops" in t
            else f"{fmt.bandwidth(t['gbps'])}" if "gbps" in t else "")
    out = [f"Time: {fmt.seconds(t['median_s'])} at {size_label(kind, t['size'])}"
           + (f" ({rate})" if rate else "") + f", median of {len(t['trials_s'])} trials, "
           "each on fresh inputs"]
    if t.get("suspect"):
        out.append("  ! the GPU was busy longer than the timed launches: timed by the "
                   "wall clock instead")
    return out


def render(verdict: dict[str, Any]) -> str:
    """The feedback text of a verdict."""
    ex = EXERCISES.get(verdict.get("exercise", ""))
    kind = ex.kind if ex else ""
    status = verdict.get("status", "?")
    # every text the submission controls (its file name, nvcc's messages quoting it, its
    # source lines) with control characters escaped: no forged line, no terminal escape
    head = f"{printable(verdict.get('file', '?'))}: " + (f"exercise {ex.name} ({ex.title})"
                                                          if ex else "")
    lines = [head, printable(HEADLINE.get(status, status))
             + (f": {printable(verdict['message'])}" if verdict.get("message")
                and status != "ok" else "")]
    build = verdict.get("build") or {}
    diags = [d for d in build.get("diagnostics", []) if d["severity"] != "remark"]
    for d in sorted(diags, key=lambda d: d["severity"] != "error")[:MAX_DIAGNOSTICS]:
        where = f"{d['file']}:{d['line']}" if d["line"] else d["file"]
        lines.append(printable(f"  {where}: {d['severity']}: {d['message']}"))
        if d.get("source"):
            lines.append(f"      {printable(d['source'], keep_tabs=True)}")
    if status == "wrong":
        lines += failing_check(verdict, kind)
    if status == "ok":
        n = len(verdict.get("checks", []))
        lines[-1] += (f" on {n} checks (sizes that are no tile multiple included), each "
                      "launch's output checked, the timed ones too")
    lines += [f"  {printable(s)}" for s in verdict.get("sanitizer", [])]
    if verdict.get("memcheck"):
        m = verdict["memcheck"]
        lines.append(printable(f"memcheck: {m['status']}"
                               + (f": {m['message']}" if m["message"] else "")))
    lines += static_lines(build) + timing_lines(verdict, kind)
    if ex and status in ("ok", "wrong", "compiled"):
        lines.append(f"Next step: {ex.hint}")
    return "\n".join(lines)
