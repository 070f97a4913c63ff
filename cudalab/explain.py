"""Explanations computed from this run's data, shown under each experiment's caption, and a
check of the captions' claims against the same data.

Each experiment's folder holds its lesson (Experiment.explanations and Experiment.claims,
written in its lesson module); this module runs them on the run's annotated table
(roofline.annotate) with the run's ceilings. A claim is a phrase of the caption with a
predicate over the data; one this run contradicts is shown as a warning under the caption.
Each phrase must occur in its caption (a test keeps the claims and the captions in step).
"""

from __future__ import annotations

import pandas as pd

from cudalab import roofline
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import NOT_MEASURED, not_measured_evidence
from cudalab.experiments.lesson import ClaimResult


def explain(name: str, df: pd.DataFrame) -> list[str]:
    """The sentences of one experiment's lessons on this run's data. df: the whole table
    (its ceilings and L2 size), or the experiment's rows."""
    full = roofline.annotate(df)
    c = roofline.ceilings_of(full)
    sub = full[full["experiment"] == name]
    if sub.empty or name not in REGISTRY:
        return []
    return [s for f in REGISTRY[name].explanations if (s := f(sub, c))]


def check_caption(name: str, caption: str, df: pd.DataFrame) -> list[ClaimResult]:
    """Every claim of this experiment that its caption still makes, checked on this run's
    data."""
    full = roofline.annotate(df)
    c = roofline.ceilings_of(full)
    sub = full[full["experiment"] == name]
    out: list[ClaimResult] = []
    if sub.empty or name not in REGISTRY:
        return out
    # points a GPU-less run left out: a claim none of them can judge is "not measured",
    # never "not supported", and a claim without enough data says which were left out
    nm = sub[sub["status"].astype(str) == NOT_MEASURED]
    unmeasured = not_measured_evidence(nm) if len(nm) else ""
    for claim in REGISTRY[name].claims:
        if claim.phrase not in caption:
            continue
        if len(nm) == len(sub):
            out.append(ClaimResult(claim.phrase, None, unmeasured))
            continue
        ok, evidence = claim.check(sub, c)
        if ok is None and unmeasured:
            evidence = f"{unmeasured}; {evidence}"
        out.append(ClaimResult(claim.phrase, None if ok is None else bool(ok), evidence))
    return out
