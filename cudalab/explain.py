"""The facts of each lesson computed from this run's data, shown under its caption.

Each experiment's folder holds its lesson (Lesson.explanations, in its lesson module);
this module runs them on the run's annotated table (roofline.annotate) with the run's
ceilings. The lesson's claims are judged in cudalab/claims.py.
"""

from __future__ import annotations

import pandas as pd

from cudalab import roofline, run_ceilings
from cudalab.experiments import REGISTRY


def explain(name: str, df: pd.DataFrame) -> list[str]:
    """The sentences of one experiment's lessons on this run's data. df: the whole table
    (its ceilings and L2 size), or the experiment's rows."""
    full = roofline.annotate(df)
    c = run_ceilings.ceilings_of(full)
    sub = full[full["experiment"] == name]
    if sub.empty or name not in REGISTRY:
        return []
    return [s for f in REGISTRY[name].lesson.explanations if (s := f(sub, c))]
