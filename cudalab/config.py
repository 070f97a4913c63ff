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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config that must not start a run. The message names every bad key path."""


def _with_defaults(cls):
    """A validator class that also fills in `default` values (jsonschema FAQ recipe)."""
    validate_props = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_DefaultingValidator = _with_defaults(Draft202012Validator)


def full_schema() -> dict[str, Any]:
    from cudalab.experiments import REGISTRY

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    exp = schema["properties"]["experiments"]
    exp["properties"] = {name: e.schema for name, e in REGISTRY.items()}
    return schema


def _path(err) -> str:
    parts = []
    for p in err.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (("." if parts else "") + str(p)))
    return "".join(parts) or "(top level)"


def _describe(err) -> str:
    """One line per error: key path, the bad value, and what is allowed."""
    where = _path(err)
    s = err.schema
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(s.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        hints = []
        for k in extra:
            close = difflib.get_close_matches(str(k), allowed, n=1)
            hints.append(f"'{k}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return f"{where}: unknown key {', '.join(hints)}; allowed keys: {', '.join(allowed)}"
    if v == "enum":
        return f"{where}: {err.instance!r} is not allowed; allowed values: {s['enum']}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        rng = _range(s)
        return f"{where}: {err.instance!r} is out of range; allowed: {rng}"
    if v == "type":
        return f"{where}: {err.instance!r} has the wrong type; expected {s['type']}"
    if v in ("minItems", "maxItems"):
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        want = f"exactly {lo}" if lo == hi else f"at least {lo}" + (f", at most {hi}" if hi else "")
        return f"{where}: {err.instance!r} has {len(err.instance)} items; needs {want}"
    if v == "required":
        return f"{where}: {err.message}"
    desc = s.get("description")
    return f"{where}: {err.message}" + (f" ({desc})" if desc else "")


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


def validate(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate and fill defaults in place; raise ConfigError naming every problem."""
    from cudalab.experiments import REGISTRY

    validator = _DefaultingValidator(full_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    # Unwrap anyOf/oneOf so the user sees the leaf error, not "is not valid under any".
    leaves = []
    for e in errors:
        leaves.extend(_leaves(e))
    msgs = list(dict.fromkeys(_describe(e) for e in leaves))
    if not msgs:
        # Cross-field rules that a schema cannot express (e.g. tile*tile <= 1024 threads).
        for name, block in config.get("experiments", {}).items():
            if block.get("enabled", True):
                msgs += [f"experiments.{name}.{m}" for m in REGISTRY[name].check_config(block)]
    if msgs:
        raise ConfigError(f"{source} is invalid:\n  - " + "\n  - ".join(msgs))
    return config


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


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return validate(config, source=str(path))


def enabled_experiments(config: dict[str, Any]) -> list[str]:
    return [n for n, b in config["experiments"].items() if b.get("enabled", True)]


def block_hash(obj: Any) -> str:
    """A stable short hash of any JSON-able value (config blocks, parameters)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
