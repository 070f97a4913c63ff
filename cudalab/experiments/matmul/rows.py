"""The rows a matmul claim reads (ok rows of one dtype, the largest product, the course's
product, each variant's best) and the masks its flips change.
"""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.lesson import col, ok
from cudalab.experiments.matmul.figures import params, size_label, variant_label
from cudalab.experiments.matmul.kernels import COURSE_SIZE


# -- the rows a claim reads ------------------------------------------------------------------
def dtype_of(d: pd.DataFrame) -> pd.Series:
    """The element type of each row (float32 points carry no dtype parameter)."""
    if "p_dtype" not in d:
        return pd.Series("float32", index=d.index, dtype=object)
    return d["p_dtype"].astype(object).where(d["p_dtype"].notna(), "float32").astype(str)


def _rows(d: pd.DataFrame, dtype: str = "float32", cpu: bool = False) -> pd.DataFrame:
    """The ok rows of one dtype with a FLOP rate, GPU only (cpu: the CPU rows), with their
    size and configuration labels."""
    d = ok(d)
    d = d[(dtype_of(d) == dtype) & ((d["variant"] == "cpu") == cpu)]
    d = d[col(d, "gflops").notna()]
    if d.empty:
        return d.assign(size=pd.Series(dtype=object), label=pd.Series(dtype=object))
    return d.assign(size=[size_label(m, k, n) for m, k, n in zip(d["p_m"], d["p_k"], d["p_n"])],
                    label=[variant_label(r) for r in params(d)])


def _largest(d: pd.DataFrame) -> pd.DataFrame:
    """The rows of the product with the most flops."""
    f = col(d, "flops")
    return d[f == f.max()] if f.notna().any() else d.iloc[:0]


def _best(d: pd.DataFrame) -> dict[str, pd.Series]:
    """variant -> its fastest row among d."""
    return {str(v): g.loc[col(g, "gflops").idxmax()] for v, g in d.groupby("variant")}


def _course(d: pd.DataFrame) -> pd.DataFrame:
    m, k, n = COURSE_SIZE
    return d[(col(d, "p_m") == m) & (col(d, "p_k") == k) & (col(d, "p_n") == n)]


def _size(d: pd.DataFrame) -> str:
    m, k, n = (col(d, f"p_{x}").iloc[0] for x in "mkn")
    return f"{int(m)}x{int(k)}.{int(k)}x{int(n)}" if len({m, k, n}) > 1 else f"{int(n)}³"


def _rate(r: pd.Series) -> str:
    return f"{r['label']} {fmt.flop_rate(r['gflops'])}"


def _skipped(d: pd.DataFrame, variant: str) -> str:
    """Why a variant has no ok row (the first recorded reason), or ''."""
    rows = d[(d["variant"] == variant) & (d["status"].astype(str) != "ok")]
    why = rows["reason"].dropna().astype(str) if "reason" in rows else pd.Series(dtype=str)
    why = why[why.str.strip() != ""]
    return f": {why.iloc[0]}" if len(why) else ""


# -- flips -----------------------------------------------------------------------------------
def _is(*variants: str, dtype: str = "float32"):  # noqa: ANN202 - a mask for a flip
    return lambda d: d["variant"].isin(variants) & (dtype_of(d) == dtype)


def _fewer_copies(d: pd.DataFrame) -> pd.DataFrame:
    """The copies take a twentieth of their time: the kernel's share of the GPU time grows."""
    d = d.copy()
    for c in ("m_h2d_s", "m_d2h_s"):
        if c in d:
            d[c] = col(d, c) * 0.05
    return d


def _at_largest(d: pd.DataFrame) -> pd.Series:
    f = col(d, "flops").where(d["variant"] != "cpu")
    return f == f.max()


def _at_course(d: pd.DataFrame) -> pd.Series:
    return pd.Series(d.index.isin(_course(d).index), index=d.index)
