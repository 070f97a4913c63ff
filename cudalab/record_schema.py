"""What a raw record must hold to be read: the keys the results table and `cudalab compare`
take from it, each with its type and range (docs/results-schema.md, "Raw records").

A record from another folder (a baseline, a reference, a copied run) is untrusted: a list
where a mapping belongs, a text where a number belongs or a negative time would crash the
comparison or turn into a ratio of -264.7 called "faster". record_problem() says what is
wrong with one, so the reader names it and leaves it out.
"""

from __future__ import annotations

import math
from typing import Any

SCHEMA_VERSION = 1
# not_measured: a GPU point of a run on a machine without a GPU (its reason says what was
# looked for); a rerun on a GPU machine measures it. Like every status but ok, never a speed.
STATUSES = ("ok", "wrong", "failed", "skipped", "not_measured")
MAX_ID_CHARS = 512
MAX_SAMPLES = 1_000_000
# Mappings a record may hold (or leave null): what the readers .get() from.
MAPPINGS = ("params", "provenance", "timing", "work", "check", "metrics", "extra", "floor",
            "launch", "profile")
# (mapping, key) -> kind of the value where it is there and not null:
#   int: a whole number >= 0; num: a number (NaN allowed: "not measured");
#   time: a finite number > 0; spread: >= 0 or NaN; bool; text; map
FIELDS: dict[tuple[str, str], str] = {
    ("timing", "n"): "int", ("timing", "batch"): "int", ("timing", "n_throttled"): "int",
    ("timing", "median"): "time", ("timing", "min"): "time", ("timing", "mean"): "time",
    ("timing", "iqr"): "spread", ("timing", "cv"): "spread",
    ("timing", "trial_spread"): "spread", ("timing", "timer"): "text",
    ("timing", "stop_reason"): "text", ("timing", "timing_note"): "text",
    ("timing", "harness"): "map",
    ("floor", "floor_s"): "spread",
    ("launch", "blocks"): "int", ("launch", "threads_per_block"): "int",
    ("work", "flops"): "num", ("work", "bytes"): "num", ("work", "working_set"): "num",
    ("work", "peak_mem_gbps"): "num", ("work", "peak_fp32_gflops"): "num",
    ("work", "l2_bytes"): "num",
    ("check", "error"): "num", ("check", "tolerance"): "num", ("check", "passed"): "bool",
    ("check", "metric"): "text",
    ("provenance", "gpu_name"): "text", ("provenance", "gpu_uuid"): "text",
    ("provenance", "sm_count"): "int", ("provenance", "cpu_threads"): "int",
    ("provenance", "git_dirty"): "bool",
}
TOP_FIELDS = {"t_start": "num", "t_end": "num", "cached": "bool", "reason": "text",
              "job_id": "text"}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def value_problem(v: Any, kind: str) -> str:
    """Why a value is not of its kind ('' if it is)."""
    if kind == "map":
        return "" if isinstance(v, dict) else f"a JSON {type(v).__name__}, not a mapping"
    if kind == "text":
        return "" if isinstance(v, str) else f"a JSON {type(v).__name__}, not text"
    if kind == "bool":
        return "" if isinstance(v, bool) else f"{_short(v)}, not true or false"
    if not _is_number(v):
        return f"{_short(v)}, not a number"
    if kind == "int":
        return "" if isinstance(v, int) and v >= 0 else f"{_short(v)}, not a whole number >= 0"
    if kind == "time":
        return "" if math.isfinite(v) and v > 0 else f"{_short(v)}, not a time > 0"
    if kind == "spread":
        return "" if math.isnan(v) or (math.isfinite(v) and v >= 0) else \
            f"{_short(v)}, not >= 0"
    return ""


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _identity_problem(rec: dict[str, Any]) -> str:
    for key in ("experiment", "variant", "point_id"):
        v = rec.get(key)
        if not isinstance(v, str) or not v or len(v) > MAX_ID_CHARS or not v.isprintable():
            return (f"{key} is {_short(v)}: allowed is printable text of 1 to {MAX_ID_CHARS} "
                    "characters")
    if rec.get("status") not in STATUSES:
        return f"status is {_short(rec.get('status'))}; allowed: {', '.join(STATUSES)}"
    return ""


def samples_problem(samples: Any) -> str:
    """Why timing.samples_s is not a list of times ('' if it is; an untimed point, static
    analysis say, has none)."""
    if not isinstance(samples, list) or len(samples) > MAX_SAMPLES:
        return f"timing.samples_s is {_short(samples)}: allowed is a list of at most " \
               f"{MAX_SAMPLES} times"
    for i, s in enumerate(samples):
        if why := value_problem(s, "time"):
            return f"timing.samples_s[{i}] is {why}"
    return ""


def record_problem(rec: Any) -> str:
    """Why a parsed raw record cannot be read ('' if it can)."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not a record (a mapping)"
    if rec.get("schema_version") != SCHEMA_VERSION:
        return f"schema_version {_short(rec.get('schema_version'))}, not {SCHEMA_VERSION}"
    if why := _identity_problem(rec):
        return why
    for key in MAPPINGS:
        if rec.get(key) is not None and (why := value_problem(rec[key], "map")):
            return f"{key} is {why}"
    for key, kind in TOP_FIELDS.items():
        if rec.get(key) is not None and (why := value_problem(rec[key], kind)):
            return f"{key} is {why}"
    for (parent, key), kind in FIELDS.items():
        v = (rec.get(parent) or {}).get(key)
        if v is not None and (why := value_problem(v, kind)):
            return f"{parent}.{key} is {why}"
    gpu = (rec.get("provenance") or {}).get("gpu_name") or ""
    if not gpu.isprintable() or len(gpu) > MAX_ID_CHARS:
        return f"provenance.gpu_name is {_short(gpu)}: not printable text"
    samples = (rec.get("timing") or {}).get("samples_s")
    return "" if samples is None else samples_problem(samples)
