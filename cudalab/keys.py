"""How a message names a config key and shows its value: one place for config and guards."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def key_path(parts: Iterable[Any]) -> str:
    """experiments.matmul.sizes[1] from ("experiments", "matmul", "sizes", 1)."""
    out: list[str] = []
    for p in parts:
        out.append(f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p)))
    return "".join(out) or "(top level)"


def show(value: Any, width: int = 60) -> str:
    """repr() of a config value, cut to `width` characters: a message never prints a whole
    (possibly alias-expanded) list."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 4] + " ..."
