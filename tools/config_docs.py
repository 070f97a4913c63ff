"""The "Every key" list of docs/config.md, written from the config schemas.

    python tools/config_docs.py          rewrite the list in docs/config.md
    python tools/config_docs.py --check  exit 1 if docs/config.md is not what the schemas say

The list sits between two marker comments; tests/test_docs.py runs --check, so a schema
change without its documentation fails CI.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "config.md"
BEGIN = "<!-- every key: written by tools/config_docs.py from the schemas; do not edit -->"
END = "<!-- end of every key -->"
RANGE_WORDS = [("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
               ("exclusiveMaximum", "<")]
UNIT_WORDS = {"min": "minutes", "s": "seconds", "ms": "milliseconds"}  # a key's x-unit


def esc(text: str) -> str:
    """Markdown-escape outside `code` spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("<", "\\<")
    return "`".join(parts)


def type_words(p: dict[str, Any]) -> str:
    if "enum" in p:
        return "one of " + ", ".join(f"`{v}`" for v in p["enum"])
    t = p.get("type")
    if t is None:
        alts = p.get("anyOf") or p.get("oneOf") or []
        return " or ".join(type_words(x) for x in alts) or "any"
    if t == "array":
        it = p.get("items", {})
        n = f" {p['minItems']}" if p.get("minItems") is not None \
            and p.get("minItems") == p.get("maxItems") else ""
        inner = type_words(it)
        if "oneOf" in it or "anyOf" in it:
            inner = "(" + inner.replace(" or ", ", or ") + ")"
        return f"list of{n} {inner}" if it else "list"
    bounds = " and ".join(f"{w} {p[k]}" for k, w in RANGE_WORDS if k in p)
    unit = UNIT_WORDS.get(p.get("x-unit", ""), "")
    return f"{t} {bounds}".strip() + (f" {unit}" if unit else "")


def is_long(p: dict[str, Any]) -> bool:
    return isinstance(p.get("default"), list) and len(json.dumps(p["default"])) > 90


def key_line(key: str, p: dict[str, Any], item: bool) -> str:
    if item:
        default = None
    elif "default" not in p:
        default = "no default"
    elif is_long(p):
        default = f"default: {len(p['default'])} entries (see below)"
    else:
        default = f"default `{json.dumps(p['default'], ensure_ascii=False)}`"
    meta = ", ".join(x for x in [type_words(p), default] if x)
    desc = " ".join(str(p.get("description", "")).split())
    it = p.get("items", {})
    if it.get("description"):
        desc += ("; " if desc else "") + "each entry: " + " ".join(it["description"].split())
    allowed = p.get("x-allowed") or it.get("x-allowed")
    if allowed:
        desc += ((" " if desc.endswith(".") else ". ") if desc else "") + f"Allowed: {allowed}"
    return f"* **`{key}`** ({meta})" + (f": {esc(desc)}" if desc else "")


def walk(props: dict[str, Any], prefix: str, item: bool = False) -> list[str]:
    out = []
    for k, p in props.items():
        out.append(key_line(prefix + k, p, item))
        if p.get("type") == "object" and "properties" in p:
            out += walk(p["properties"], prefix + k + ".", item)
        it = p.get("items", {})
        if it.get("type") == "object" and "properties" in it:
            out += walk(it["properties"], prefix + k + "[].", True)
    return out


def long_defaults(props: dict[str, Any], prefix: str) -> list[tuple[str, list[Any]]]:
    out = []
    for k, p in props.items():
        if is_long(p):
            out.append((prefix + k, p["default"]))
        if p.get("type") == "object" and "properties" in p:
            out += long_defaults(p["properties"], prefix + k + ".")
    return out


def section(title: str, props: dict[str, Any], prefix: str, desc: str | None = None
            ) -> list[str]:
    out = ["", f"### {title}", ""]
    if desc:
        out += [esc(" ".join(desc.split())), ""]
    out += walk(props, prefix)
    for key, d in long_defaults(props, prefix):
        if all(isinstance(x, int) for x in d):
            out += ["", f"Default of `{key}`: `{json.dumps(d)}`."]
        else:
            flow = False if all(isinstance(x, str) for x in d) else None
            out += ["", f"Default of `{key}`:", "", "```yaml",
                    yaml.safe_dump(d, default_flow_style=flow, sort_keys=False,
                                   width=100).rstrip(), "```"]
    return out


def every_key(lessons: set[str] | None = None) -> str:
    """The list; lessons: only these lessons' blocks (None: every lesson)."""
    from cudalab.config import full_schema

    props = full_schema()["properties"]
    order = list(yaml.safe_load((ROOT / "config.yaml").read_text())["experiments"])
    exps = props["experiments"]["properties"]
    out = section("Top level", {k: v for k, v in props.items() if v.get("type") != "object"},
                  "")
    for k, p in props.items():
        if p.get("type") == "object" and k != "experiments":
            out += section(f"`{k}:`", p["properties"], k + ".", p.get("description"))
    for name in order + sorted(set(exps) - set(order)):
        if lessons is None or name in lessons:
            out += section(f"`experiments.{name}:`", exps[name]["properties"], "")
    return "\n".join(out).strip("\n")


def rewritten(doc: str, lessons: set[str] | None = None) -> str:
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{every_key(lessons)}\n\n{END}{tail}"


def documented_lessons(doc: str) -> set[str]:
    return set(re.findall(r"^### `experiments\.([A-Za-z0-9_]+):`$", doc, flags=re.M))


def undocumented_lessons(doc: str) -> list[str]:
    from cudalab.config import full_schema

    return sorted(set(full_schema()["properties"]["experiments"]["properties"])
                  - documented_lessons(doc))


def main(argv: list[str]) -> int:
    path = Path(argv[argv.index("--doc") + 1]) if "--doc" in argv else DOC  # tests: a copy
    doc = path.read_text()
    new = rewritten(doc)
    if "--check" in argv:
        # a lesson just added (one folder and one config line) is not listed yet: said, not
        # failed; every block that is listed must be what its schema says
        new_ones = undocumented_lessons(doc)
        if rewritten(doc, documented_lessons(doc)) != doc:
            print(f"{path} is not what the schemas say: run python tools/config_docs.py",
                  file=sys.stderr)
            return 1
        if new_ones:
            print(f"{path} does not list the block of {', '.join(new_ones)} yet: run python "
                  "tools/config_docs.py", file=sys.stderr)
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
