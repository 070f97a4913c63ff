"""Slurm's text for times, sizes and TRES, as sinfo, sacctmgr, scontrol and sacct print them:
one reader each for cudalab/site.py, slurm_limits.py and slurm_causes.py."""

from __future__ import annotations

import re

_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "P": 1024 ** 3}


def parse_time(text: str) -> int | None:
    """sinfo's %l, sacctmgr's MaxWall, scontrol's TimeLimit ('infinite', '1-00:00:00',
    '2:00:00', '30:00') -> minutes (None = no limit, or not a time: 'Partition_Limit')."""
    text = text.strip().lower()
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", text):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)


def parse_tres(text: str) -> dict[str, int]:
    """'cpu=4,mem=16G,gres/gpu=2,node=1' -> {'cpu': 4, 'mem': 16384, 'gres/gpu': 2, ...}
    (mem in MB)."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        key, _, value = item.strip().partition("=")
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTP]?)", value.strip())
        if not key or not m:
            continue
        number = float(m[1])
        if key == "mem":
            number *= _UNITS[m[2] or "M"]
        out[key] = int(number)
    return out


def mem_mb(text: str) -> int | None:
    """sacct's '256M', '4Gn', '371552K' -> MB (None where empty)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)[nc]?", text.strip())
    return round(float(m[1]) * _UNITS[m[2] or "M"]) if m else None
