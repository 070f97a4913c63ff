"""What a duration written as text (2:00:00, 1-12, 90min, 2h) means, for the message that
refuses it where a config key takes a plain number of minutes or seconds.

cudalab refuses such text rather than parsing it: Slurm reads `2:00` as 2 minutes (M:SS)
while a clock reads it as 2 hours (H:MM), and YAML 1.1 reads unquoted `2:00:00` as the
base-60 number 7200 (safe_yaml keeps it text). A plain number in the key's unit has one
meaning; the message shows that number for what was written.
"""

from __future__ import annotations

import math
import re

from cudalab.keys import show

# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
# (at most 9 digits a part: no time limit needs more, and the arithmetic stays finite)
_CLOCK = re.compile(r"(?:(\d{1,9})-)?(\d{1,9})(?::(\d{1,9}))?(?::(\d{1,9}))?")
_WITH_UNIT = re.compile(r"(\d{1,9}(?:\.\d{1,9})?)\s*"
                        r"(d|days?|h|hours?|hrs?|m|mins?|minutes?|s|secs?|seconds?)", re.I)
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
UNIT_WORDS = {"min": "minutes", "s": "seconds", "ms": "milliseconds"}


def _seconds_with_unit(text: str) -> float | None:
    """'90min' / '2 h' / '1.5h' / '30s' -> seconds (m is minutes); None otherwise."""
    m = _WITH_UNIT.fullmatch(text.strip())
    if not m:
        return None
    unit = m.group(2).lower()
    return float(m.group(1)) * _SECONDS["m" if unit.startswith("m") else unit[0]]


def _clock_meanings(text: str) -> list[tuple[float, str]]:
    """(seconds, how it was read) of each reading of a clock-like duration."""
    m = _CLOCK.fullmatch(text.strip())
    if not m or (m.group(1) is None and m.group(3) is None):
        return []  # a bare number is no duration text
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    if days is not None:  # D-H[:M[:S]]
        form = "D-H" + (":MM" if b is not None else "") + (":SS" if c is not None else "")
        return [(days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0), f"as {form}")]
    if c is not None:
        return [(a * 3600 + b * 60 + c, "as H:MM:SS")]
    return [(a * 60 + b, "as M:SS, as Slurm does"), (a * 3600 + b * 60, "as H:MM, as a clock")]


def hint(text: str, unit: str, key: str) -> str | None:
    """The message part for a duration `text` given to `key` (the last part of its path),
    which takes a number of `unit` (min, s, ms); None if `text` does not read as one."""
    scale = {"min": 60.0, "s": 1.0, "ms": 0.001}[unit]
    with_unit = _seconds_with_unit(text)
    readings = ([(with_unit, "as written")] if with_unit is not None
                else _clock_meanings(text))
    if not readings:
        return None
    shown = [f"{key}: {_number(sec / scale)} ({text} read {how})" for sec, how in readings]
    return (f"{show(text)} is a duration written as text; allowed: a plain number of "
            f"{UNIT_WORDS[unit]} (text such as 2:00:00 has more than one meaning, and YAML "
            f"1.1 reads it unquoted as the base-60 number 7200): write {' or '.join(shown)}")


def _number(x: float) -> str:
    """Whole numbers of the unit are rounded up (a time limit must not shrink)."""
    return str(math.ceil(x - 1e-9)) if abs(x - round(x)) > 1e-9 else str(round(x))
