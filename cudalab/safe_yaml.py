"""Read a YAML config with limits that hold before anything is expanded or printed.

PyYAML's SafeLoader runs no code, but a small file can still stall every later step: a
1 KB "billion laughs" of nested aliases is a few shared objects to PyYAML and billions of
values to anything that walks, copies or prints it (the schema validator, an error
message, json.dumps), and a deeply nested file overflows the composer's recursion. So a
config is read in three passes, each bounded by the one before:

1. the raw text: at most MAX_BYTES;
2. the event stream (PyYAML's parser is a loop, not a recursion): nesting depth at most
   MAX_DEPTH, checked before the recursive composer runs;
3. the node graph (aliases still shared): the number of values it would have once every
   alias is expanded, at most MAX_VALUES, and no alias that contains itself.

Only then are the Python objects built. Mapping keys given twice are refused too (PyYAML
lets the last one win in silence).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from cudalab.fmt import group

# A real config is a few hundred values and a few KB; these leave room for long grids and
# keep reading one under a second.
MAX_BYTES = 262_144
MAX_DEPTH = 24
MAX_VALUES = 100_000


class YamlLimitError(ValueError):
    """The text is not a config cudalab will read; the message is one line."""


# libyaml's parser (PyYAML's C extension, in its wheels) reads a long list about 20x faster
# than the pure-Python one, which stays as the fallback.
_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(_BASE):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses a key given twice in one mapping (`min_samples: 5` then
    `min_samples: 50` would otherwise run with 50)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` may repeat keys on purpose
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable: SafeLoader's own error says so
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {first + 1}, "
                    f"again on line {key_node.start_mark.line + 1}); give each key once",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


# YAML 1.1 (PyYAML) reads 1e-6 (no dot) as the string '1e-6', and Python's json.dumps writes
# small floats that way (results/config.json): read them as numbers, as YAML 1.2 and JSON do.
# add_implicit_resolver copies the resolver table for this class; SafeLoader is unchanged.
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _without_base_60(loader: type) -> None:
    """YAML 1.1 reads 2:00:00 as the base-60 integer 7200 (and 1:30.5 as 90.5): a duration
    written for Slurm would silently become 7200 minutes. As in YAML 1.2, such text stays a
    string, which the config check then names (with the number the user probably meant)."""
    not_base_60 = "(?!.*:)"  # no number cudalab reads has a colon
    loader.yaml_implicit_resolvers = {
        first: [(tag, re.compile(not_base_60 + rx.pattern, rx.flags)
                 if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") else rx)
                for tag, rx in resolvers]
        for first, resolvers in loader.yaml_implicit_resolvers.items()}


_without_base_60(UniqueKeyLoader)


def load(text: str) -> Any:
    """The document of `text`, within the limits above. Raises YamlLimitError for a limit,
    yaml.YAMLError for text that is not YAML (the caller words both)."""
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES:
        raise YamlLimitError(f"the file is {group(size)} bytes; a config may have at most "
                             f"{group(MAX_BYTES)}")
    _check_depth(text)
    loader = UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_depth(text: str) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=UniqueKeyLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlLimitError(
                    f"line {event.start_mark.line + 1}: lists and mappings are nested more "
                    f"than {MAX_DEPTH} deep; a config needs a few levels at most")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def _check_expansion(root: yaml.Node) -> None:
    """Count the values the document would have with every alias expanded, without
    expanding it: a node's count is computed once and reused wherever an alias points."""
    counts: dict[int, int] = {}
    open_: set[int] = set()
    # Iterative post-order walk (the graph may be as deep as MAX_DEPTH only, but aliases
    # can make a node reachable from itself).
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            counts[key] = 1 + sum(counts[id(c)] for c in _children(node))
            if counts[key] > MAX_VALUES:
                raise YamlLimitError(
                    f"line {node.start_mark.line + 1}: this value (with its aliases, *name, "
                    f"expanded) holds more than {group(MAX_VALUES)} values; a config needs far "
                    f"fewer: make the grid smaller")
            continue
        if key in counts:
            continue
        if key in open_:
            raise YamlLimitError(f"line {node.start_mark.line + 1}: an alias (*name) refers "
                                 f"to the list or mapping that contains it")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in counts)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
