"""What a lesson is made of, for the experiment folders' lesson modules: a caption's
claim (a phrase of the caption and a predicate over the data), the type of an explanation
(rows and ceilings -> a sentence or None), and the small helpers they share.

An explanation gets the experiment's annotated rows (roofline.annotate) and the run's
ceilings and returns a sentence, or None where this run has nothing to say (the variant was
not run, the profiler was off). Profiler counters (m_ncu_*) are used where present and ok.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cudalab import fmt

if TYPE_CHECKING:
    from cudalab.roofline import Ceilings

# Within this share of its best bandwidth a kernel counts as "at full bandwidth".
FULL_BANDWIDTH_SHARE = 0.9
# A "large fraction of peak bandwidth" / "close to the memory bandwidth".
LARGE_FRACTION = 0.6

Explanation = Callable[[pd.DataFrame, "Ceilings"], str | None]
Verdict = tuple[bool | None, str]  # (supported; None: not enough data), evidence


@dataclass(frozen=True)
class Claim:
    """Words of an experiment's caption, verbatim, and the predicate that checks them."""

    phrase: str
    check: Callable[[pd.DataFrame, Ceilings], Verdict]


@dataclass(frozen=True)
class ClaimResult:
    phrase: str
    supported: bool | None
    evidence: str


def ok(d: pd.DataFrame) -> pd.DataFrame:
    """The rows measured ok."""
    return d[d["status"].astype(str) == "ok"]


def col(d: pd.DataFrame, c: str) -> pd.Series:
    """Column c as floats (NaN where absent or not a number)."""
    if c not in d.columns:
        return pd.Series(np.nan, index=d.index, dtype=float)
    return pd.to_numeric(d[c], errors="coerce").astype(float)


def ncu(d: pd.DataFrame, prefix: str) -> pd.Series:
    """The sum of the profiler columns starting with `prefix` per row, NaN where the point
    was not profiled (m_ncu_status other than 'ok') or the columns are absent."""
    cols = [c for c in d.columns if c.startswith(prefix)]
    if not cols:
        return pd.Series(np.nan, index=d.index, dtype=float)
    vals = pd.concat([col(d, c) for c in cols], axis=1)
    out = vals.sum(axis=1, min_count=1)
    if "m_ncu_status" in d.columns:
        out = out.where(d["m_ncu_status"].astype(str) == "ok")
    return out


def pct_range(lo: float, hi: float) -> str:
    """'68–70 %': one unit for both ends."""
    return f"{fmt.percent(lo)[:-2]}–{fmt.percent(hi)}"


def largest(d: pd.DataFrame, column: str = "flops") -> pd.DataFrame:
    """The rows at the largest value of `column` (none where it has no number)."""
    v = col(d, column)
    return d[v == v.max()] if v.notna().any() else d.iloc[:0]


def ref(c: Ceilings, level: str = "dram") -> tuple[float, str]:
    """A memory level's ceiling and how to name it in a sentence."""
    value, kind = c.bandwidth(level)
    return value, f"{kind} {level.upper()} ceiling {fmt.bandwidth(value)}"
