"""Load config.yaml, validate it against the JSON schema, fill defaults, expand grids.

The top-level schema lives in workflow/schemas/config.schema.yaml. Each experiment module
declares the schema of its own block (``Experiment.schema``) next to the parameters it
describes; ``full_schema()`` plugs them under ``experiments`` so one validation covers all.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, ValidationError, validators

from cudalab import durations, fmt, safe_io, safe_yaml
from cudalab.keys import key_path, show
from cudalab.resources import CONFIG_SCHEMA as SCHEMA_PATH

MAX_MESSAGES = 30


class ConfigError(ValueError):
    """A config that must not start a run. The message names every bad key path."""


# -- types: an integer is a Python int (not 3.0, not True); a number is finite -------------
def _is_integer(_checker, v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(_checker, v: Any) -> bool:
    # NaN and infinity are no timing target, tolerance or size: reject them everywhere.
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _strict_enum(validator, enums, instance, schema):
    """enum without JSON's 16.0 == 16 == True: a float tile width or a bool would otherwise
    pass and crash (or mean something else) at run time."""
    key = json.dumps(instance, sort_keys=True, default=str)
    if not any(key == json.dumps(e, sort_keys=True) for e in enums):
        yield ValidationError(f"{show(instance)} is not one of {enums!r}")


def _full_pattern(validator, pattern, instance, schema):
    """`pattern` matches the whole string. JSON Schema's search semantics plus Python's `$`
    (which also matches before a final newline) let "cuda/12.4\\n<command>" through a
    pattern written as ^...$; a full match cannot end early."""
    if isinstance(instance, str) and re.fullmatch(pattern, instance) is None:
        yield ValidationError(f"{show(instance)} does not match {pattern!r}")


def _with_defaults(cls):
    """A validator class that also fills in `default` values (jsonschema FAQ recipe), with
    strict integer/number types and a type-strict enum."""
    validate_props = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    checker = cls.TYPE_CHECKER.redefine("integer", _is_integer).redefine("number", _is_number)
    return validators.extend(cls, {"properties": set_defaults, "enum": _strict_enum,
                                   "pattern": _full_pattern},
                             type_checker=checker)


_DefaultingValidator = _with_defaults(Draft202012Validator)


def full_schema() -> dict[str, Any]:
    from cudalab.experiments import REGISTRY

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    exp = schema["properties"]["experiments"]
    exp["properties"] = {name: _grid_axes_unique(e.schema) for name, e in REGISTRY.items()}
    return schema


def _grid_axes_unique(block_schema: dict[str, Any]) -> dict[str, Any]:
    """Every list-valued key of an experiment block is a grid axis: a value listed twice
    would be counted twice by the plan and measured once, so each must be unique (unless
    the axis says `uniqueItems: false`: its points are told apart by position)."""
    block_schema = copy.deepcopy(block_schema)
    for sub in block_schema.get("properties", {}).values():
        if sub.get("type") == "array":
            sub.setdefault("uniqueItems", True)
    return block_schema


def _path(err) -> str:
    return key_path(err.absolute_path)


# YAML turns some unquoted text into other types: a hint where a string was expected.
_QUOTE_HINT = ("; YAML reads unquoted digits as a number (0123 even as octal 83) and "
               "yes/no/on/off as true/false: put the value in quotes, e.g. '0123'")


def _describe(err) -> str:
    """One line per error: key path, the bad value, and what is allowed."""
    where = _path(err)
    s = err.schema
    v = err.validator
    inst = err.instance
    if isinstance(inst, float) and not math.isfinite(inst):
        return f"{where}: {inst} is not allowed; NaN and infinity are never valid here"
    if v == "additionalProperties":
        allowed = sorted(s.get("properties", {}))
        extra = sorted(set(inst) - set(allowed), key=str)
        hints = []
        for k in extra:
            close = difflib.get_close_matches(str(k), allowed, n=1)
            hints.append(show(k) + (f" (did you mean '{close[0]}'?)" if close else ""))
        return f"{where}: unknown key {', '.join(hints)}; allowed keys: {', '.join(allowed)}"
    if v == "enum":
        return f"{where}: {show(inst)} is not allowed; allowed values: {s['enum']}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        why = f" ({s['x-why']})" if "x-why" in s else ""
        return f"{where}: {show(inst)} is out of range; allowed: {_range(s)}{why}"
    if v == "type" and isinstance(inst, str) and s.get("x-unit") in durations.UNIT_WORDS:
        said = durations.hint(inst, s["x-unit"], str(err.absolute_path[-1]))
        if said:
            return f"{where}: {said}"
    if v == "type":
        hint = (_QUOTE_HINT if _wants_string(s["type"])
                and not isinstance(inst, (str, list, dict)) else "")
        return (f"{where}: {show(inst)} has the wrong type; expected "
                f"{_type_words(s['type'])}{hint}")
    if v in ("minItems", "maxItems"):
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        want = f"exactly {lo}" if lo == hi else f"at least {lo}" + (f", at most {hi}" if hi else "")
        return f"{where}: {show(inst)} has {len(inst)} items; needs {want}"
    if v == "uniqueItems":
        return (f"{where}: {_repeated(inst)} listed more than once; each value of a grid "
                f"axis may appear only once")
    if v == "pattern":
        allowed = s.get("x-allowed") or f"text matching {s['pattern']}"
        return f"{where}: {show(inst)} is not allowed; allowed: {allowed}"
    if v == "required":
        missing = [k for k in s["required"] if isinstance(inst, dict) and k not in inst]
        return (f"{where}: missing key {', '.join(repr(k) for k in missing)}"
                + (f" ({s['x-required']})" if "x-required" in s else ""))
    desc = s.get("description")
    message = err.message if len(err.message) <= 160 else err.message[:156] + " ..."
    return f"{where}: {message}" + (f" ({desc})" if desc else "")


def _wants_string(t: str | list[str]) -> bool:
    """A string is expected and a scalar of another type came (a YAML conversion)."""
    return t == "string" or (isinstance(t, list) and "string" in t)


def _type_words(t: str | list[str]) -> str:
    words = {"integer": "an integer (whole number, written without a decimal point)",
             "number": "a finite number", "array": "a list", "object": "a mapping (key: value)",
             "string": "a string", "boolean": "true or false"}
    return " or ".join(words.get(x, x) for x in ([t] if isinstance(t, str) else t))


def _repeated(items: list[Any]) -> str:
    seen: set[str] = set()
    dups: dict[str, Any] = {}
    for x in items:  # one pass: an axis may be long
        key = json.dumps(x, sort_keys=True, default=str)
        if key in seen:
            dups.setdefault(key, x)
        seen.add(key)
    shown = list(dups.values())
    return ", ".join(show(d) for d in shown[:5]) + (" is" if len(shown) == 1 else " are")


def _range(s: dict) -> str:
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    lo_op = ">=" if "minimum" in s else ">"
    hi_op = "<=" if "maximum" in s else "<"
    parts = []
    if lo is not None:
        parts.append(f"{lo_op} {lo}")
    if hi is not None:
        parts.append(f"{hi_op} {hi}")
    return " and ".join(parts) or "see schema"


def validate(config: dict[str, Any], source: str = "config",
             notes: list[str] | None = None) -> dict[str, Any]:
    """Validate and fill defaults in place; raise ConfigError naming every problem.

    One pass: the schema's problems and the cross-field rules (min_samples <= max_samples,
    each experiment's check_config, the installed nvcc, the size guards) are all reported
    together. `notes` (if given) collects what could not be checked here."""
    msgs = schema_problems(config)
    from cudalab import guards

    named = {m.split(": ", 1)[0] for m in msgs}
    msgs += [m for m in guards.cross_field_problems(config, schema_failed=bool(msgs),
                                                    notes=notes)
             # a bad character the schema's pattern already named is one problem, not two
             if not (m.endswith(guards.CONTROL_WORDS) and m.split(": ", 1)[0] in named)]
    msgs = list(dict.fromkeys(msgs))
    if len(msgs) > MAX_MESSAGES:  # a list of 10 000 bad items is one mistake, not a screenful
        msgs = msgs[:MAX_MESSAGES] + [f"... and {len(msgs) - MAX_MESSAGES} more problems of "
                                      f"the same kinds"]
    if msgs:
        raise ConfigError(f"{source} is invalid:\n  - " + "\n  - ".join(msgs))
    return config


def schema_problems(config: dict[str, Any]) -> list[str]:
    """The schema's messages (defaults are filled in on the way)."""
    validator = _DefaultingValidator(full_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in
                                                                   e.absolute_path])
    msgs = []
    for e in errors:
        msgs += [_describe_any_of(e) if _all_types_wrong(e) else _describe(leaf)
                 for leaf in ([e] if _all_types_wrong(e) else _leaves(e))]
    return list(dict.fromkeys(msgs))


def _all_types_wrong(err) -> bool:
    """An anyOf/oneOf where the value fits none of the branches' types (64.0 for a size
    that is an integer or a list of three)."""
    return bool(err.context) and all(
        e.validator == "type" and not e.relative_path for e in err.context)


def _describe_any_of(err) -> str:
    types = list(dict.fromkeys(t for e in err.context for t in (
        [e.schema["type"]] if isinstance(e.schema["type"], str) else e.schema["type"])))
    inst = err.instance
    if isinstance(inst, float) and not math.isfinite(inst):
        return f"{_path(err)}: {inst} is not allowed; NaN and infinity are never valid here"
    hint = _QUOTE_HINT if "string" in types and not isinstance(inst, (str, list, dict)) else ""
    return f"{_path(err)}: {show(inst)} has the wrong type; expected {_type_words(types)}{hint}"


def _leaves(err) -> Iterator:
    """Leaf errors of an anyOf/oneOf, keeping only the branches whose type fits the value
    (a size of -5 is a bad integer, not a bad array)."""
    if not err.context:
        yield err
        return
    branches: dict[int, list] = {}
    for sub in err.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    fitting = [subs for subs in branches.values()
               if not any(e.validator == "type" and not e.relative_path for e in subs)]
    for subs in fitting or list(branches.values()):
        for sub in subs:
            yield from _leaves(sub)


# -- reading a config file ----------------------------------------------------------------
def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict; every way it can be unreadable is a ConfigError
    (missing, a directory, not UTF-8, not YAML, duplicate keys, empty, not a mapping)."""
    path = Path(path)
    if why := safe_io.special_problem(path):  # a FIFO would hang the open; a long name
        raise ConfigError(f"{why}; give the path of a YAML config file")
    try:
        with path.open("rb") as f:  # never more than the limit (a FIFO or /dev/zero ends too)
            blob = f.read(safe_yaml.MAX_BYTES + 1)
        if len(blob) > safe_yaml.MAX_BYTES:
            raise ConfigError(f"{path} is not read: it is larger than "
                              f"{fmt.group(safe_yaml.MAX_BYTES)} bytes, the most a config may have")
        text = blob.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory; give the path of a YAML config file") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied (cannot read it)") from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line} is not UTF-8 text (byte "
                          f"0x{exc.object[exc.start]:02x} at offset {exc.start}); save the "
                          f"file as UTF-8") from None
    try:
        config = safe_yaml.load(text)
    except safe_yaml.YamlLimitError as exc:
        raise ConfigError(f"{path} is not read: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(filter(None, [getattr(exc, "context", None),
                                      getattr(exc, "problem", None)])) or str(exc)
        raise ConfigError(f"{path} is not valid YAML: {where}{what}") from None
    if config is None:
        raise ConfigError(f"{path} is empty; a config needs at least an `experiments:` block "
                          f"(see config.yaml)")
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return config


def load(path: str | Path, notes: list[str] | None = None) -> dict[str, Any]:
    return validate(read_mapping(path), source=str(path), notes=notes)


def from_files(paths: Iterable[str | Path], overrides: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """The config that `snakemake --configfile a.yaml [b.yaml] [--config k=v]` means: the
    given files merged with each other (as Snakemake does) and the overrides on top, but NOT
    merged into the workflow's config.yaml, so it equals `cudalab plan a.yaml`."""
    from snakemake.utils import update_config

    merged: dict[str, Any] = {}
    for p in paths:
        update_config(merged, read_mapping(p))
    update_config(merged, copy.deepcopy(dict(overrides or {})))
    return merged


def enabled_experiments(config: dict[str, Any]) -> list[str]:
    return [n for n, b in config["experiments"].items() if b.get("enabled", True)]


def block_hash(obj: Any) -> str:
    """A stable short hash of any JSON-able value (config blocks, parameters)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
