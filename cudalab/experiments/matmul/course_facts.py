"""What the matmul rows of the course table show beside another lesson's numbers: facts
computed from the whole run's table (Lesson.course_facts), never a verdict."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import col, ok
from cudalab.experiments.matmul.kernels import COURSE_SIZE

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

# The copies of the course's product run "at the pageable rate" within this factor of the
# transfer lesson's pageable copies of the nearest size, and "well below the pinned rate"
# under this share of its pinned copies.
PAGEABLE_FACTOR = 2.0
PINNED_SHARE = 0.5
ITEM_BYTES = {"float32": 4, "float64": 8}


def _course_copies(t: pd.DataFrame) -> dict[str, tuple[float, float, int]] | None:
    """direction -> (bytes, seconds, copies) of the tiled kernel's end-to-end split at the
    course's product: H2D copies A and B, D2H copies C."""
    mm = ok(t[(t["experiment"] == "matmul") & (t["variant"] == "tiled")])
    m, k, n = COURSE_SIZE
    at = mm[(col(mm, "p_m") == m) & (col(mm, "p_k") == k) & (col(mm, "p_n") == n)
            & col(mm, "m_h2d_s").notna() & col(mm, "m_d2h_s").notna()]
    if at.empty:
        return None
    r = at.iloc[0]
    item = ITEM_BYTES.get(str(r.get("p_dtype") if pd.notna(r.get("p_dtype")) else "float32"), 4)
    return {"h2d": (item * (m * k + k * n), float(r["m_h2d_s"]), 2),
            "d2h": (item * m * n, float(r["m_d2h_s"]), 1)}


def _transfer_at(t: pd.DataFrame, memory: str, direction: str, size: float,
                 ) -> tuple[float, float] | None:
    """(GB/s, size) of the transfer lesson's copy nearest `size` (log scale)."""
    tr = ok(t[(t["experiment"] == "transfer") & (t["variant"] == memory)])
    tr = tr[(tr["p_direction"].astype(str) == direction) & col(tr, "gbps").notna()]
    if tr.empty:
        return None
    sizes = col(tr, "p_size")
    r = tr.loc[(np.log(sizes) - math.log(size)).abs().idxmin()]
    return float(r["gbps"]), float(r["p_size"])


def copies_pageable(t: pd.DataFrame, c: Ceilings) -> str | None:
    """The course product's copy rates beside the transfer lesson's pageable and pinned
    copies of the nearest size: which path sets the copies' time."""
    copies = _course_copies(t)
    if copies is None:
        return None
    parts, pageable_bound = [], True
    for direction, (nbytes, secs, count) in copies.items():
        rate = nbytes / secs / 1e9
        pg = _transfer_at(t, "pageable", direction, nbytes / count)
        pn = _transfer_at(t, "pinned", direction, nbytes / count)
        if pg is None or pn is None or secs <= 0:
            return None
        pageable_bound &= (pg[0] / PAGEABLE_FACTOR <= rate <= PAGEABLE_FACTOR * pg[0]
                           and rate < PINNED_SHARE * pn[0])
        parts.append(f"{direction.upper()} {fmt.bandwidth(rate)} ({fmt.nbytes(nbytes)} in "
                     f"{count} cop{'ies' if count > 1 else 'y'}; the transfer lesson's "
                     f"copies of {fmt.nbytes(pg[1])}: pageable {fmt.bandwidth(pg[0])}, "
                     f"pinned {fmt.bandwidth(pn[0])})")
    said = "The course product's copies, from pageable host memory: " + "; ".join(parts)
    if pageable_bound:
        said += (": they run at the pageable rate, well below the pinned one: the driver's "
                 "staging through a pinned buffer, not the link, sets their time")
    return said + "."


COURSE_FACTS = {"copies_pageable": copies_pageable}
