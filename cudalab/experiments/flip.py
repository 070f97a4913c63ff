"""Flips that turn a claim over in either direction: a reference where the claim is seen
gets the change that removes its effect, one where it is not seen the change that adds it
(the mutation test asks every reference that judges a claim to turn it over)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from cudalab.experiments.lesson import Claim, Flip, Judge, Mask, State, col, slower


def turn(judge: Judge, fail: Flip, hold: Flip) -> Flip:
    """A flip that judges the rows first (with the ceilings they carry), then applies
    fail where the claim is seen and hold where it is not."""
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        from cudalab import (  # the rows' own ceilings, as claims.evaluate finds them
            roofline,
            run_ceilings,
        )

        full = roofline.annotate(d)
        state = Claim("", judge).evaluate(full, run_ceilings.ceilings_of(full)).state
        return fail(d) if state is State.SEEN else hold(d)

    return flip


def to_gbps(d: pd.DataFrame, mask: Mask, gbps: float) -> pd.DataFrame:
    """Each row in mask(d) takes the time that gives it `gbps` (times and rates together)."""
    rates = col(d, "gbps")
    for i in d.index[mask(d).to_numpy(dtype=bool)]:
        if rates[i] > 0 and gbps > 0:
            d = slower(d, _row(i), float(rates[i]) / gbps)
    return d


def scaled(d: pd.DataFrame, mask: Mask, column: str, factor: float) -> pd.DataFrame:
    """The rows in mask(d) get `factor` times their value in `column` (a counter)."""
    d = d.copy()
    m = mask(d).to_numpy(dtype=bool)
    d.loc[m, column] = col(d, column)[m] * factor
    return d


def _row(i: object) -> Callable[[pd.DataFrame], pd.Series]:
    return lambda d: pd.Series(d.index == i, index=d.index)
