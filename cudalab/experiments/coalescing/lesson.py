"""The coalescing lesson: its claims (each a predicate over this run's table with its
threshold and the data change that turns it over) and its facts (sentences computed from the
table). Every number in a sentence comes from the table; the only constants are the named
thresholds below."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.coalescing import answers
from cudalab.experiments.flip import to_gbps, turn
from cudalab.experiments.lesson import (
    LARGE_FRACTION,
    Claim,
    Judgement,
    Lesson,
    TryThis,
    all_correct,
    col,
    judged,
    ncu,
    no_data,
    ok,
    one_wrong,
    pct_range,
    ref,
    slower,
    with_value,
)
from cudalab.experiments.questions import Question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

# No offset loses more than this share of the best offset's GB/s. Were the extra sector a
# misaligned warp touches fetched from DRAM, the copy would move 9 sectors where it asks for
# 8 (5 read + 4 written against 4 + 4) and lose 1/9: below that, a cache served it.
FLAT_LOSS = 0.1
# Coalesced reads at least this much faster than the largest stride (a sector per element:
# 8x the read traffic at stride 8 and beyond).
STRIDE_GAIN = 2.0
# Stride 2 loses at least this share against stride 1 (1.5x the DRAM traffic: 8 sectors read
# and 4 written where 4 + 4 are asked for; less than 1/3 where the coalesced copy itself is
# not bandwidth-bound).
STRIDE2_LOSS = 0.1
# Stride 2 moves at least this many times the DRAM bytes of stride 1 (1.5x in theory).
STRIDE2_TRAFFIC = 1.4
# A misaligned offset moves at most this share more DRAM bytes than offset 0.
OFFSET_TRAFFIC = 0.05
# From stride 16 (64 bytes) on every element has its own DRAM fetch: the largest stride keeps
# more than this share of stride 16's GB/s.
FLAT_FROM_STRIDE = 16
STRIDE_FLAT_SHARE = 0.75
TRANSPOSE_GAIN = 1.5  # tiled (padded where run) vs naive transpose, at the largest size
PADDING_GAIN = 1.1  # padded vs unpadded tile
CONFLICTS_GAIN = 10.0  # unpadded vs padded tile: shared-memory bank conflicts (ncu)
MEMCPY_SHARE = 0.9  # the best copy kernel against cudaMemcpy of the same bytes
MISALIGNED = 8  # offsets that are not a multiple of 8 floats start a warp mid-sector
TILE = 32  # transpose tile edge (coalescing.cu)
TRANSPOSES = ("transpose_naive", "transpose_tiled", "transpose_padded")


# -- rows --------------------------------------------------------------------------------------
def _gpu(d: pd.DataFrame) -> pd.DataFrame:
    return ok(d).dropna(subset=["gbps"])


def _at(d: pd.DataFrame, variant: str, value: int | None = None) -> pd.DataFrame:
    """The rows of a variant (at p_<variant> == value, where given)."""
    sub = d[d["variant"] == variant]
    return sub if value is None else sub[col(sub, f"p_{variant}") == value]


def gbps_at(d: pd.DataFrame, variant: str, value: int | None = None) -> float:
    sub = _at(_gpu(d), variant, value)
    return float(sub["gbps"].iloc[0]) if len(sub) else math.nan


def memcpy_gbps_at(d: pd.DataFrame, n: int | None = None, size: int | None = None) -> float:
    """GB/s of the memcpy row of copies of n floats, or of a size x size transpose."""
    c, value = ("p_n", n) if n is not None else ("p_size", size)
    sub = _gpu(d)
    sub = sub[(sub["variant"] == "memcpy") & (col(sub, c) == value)]
    return float(sub["gbps"].iloc[0]) if len(sub) else math.nan


Mask = Callable[[pd.DataFrame], pd.Series]


def _variant(*names: str) -> Mask:
    return lambda d: d["variant"].isin(names)


def _point(variant: str, value: int | None) -> Mask:
    return lambda d: (d["variant"] == variant) & (col(d, f"p_{variant}") == value)


# -- facts -------------------------------------------------------------------------------------
def coalescing_vs_ceiling(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Each access pattern's bandwidth as a share of the copy ceiling."""
    d = _gpu(d)
    dram, what = ref(c)
    if d.empty or not math.isfinite(dram):
        return None
    parts = []
    for v, g in d.groupby("variant", sort=True):
        g = g[g["memory_level"] != "l2"] if (g["memory_level"] != "l2").any() else g
        lo, hi = 100 * g["gbps"].min() / dram, 100 * g["gbps"].max() / dram
        parts.append(f"{v} {fmt.percent(hi)}" if len(g) == 1 or round(lo) == round(hi)
                     else f"{v} {pct_range(lo, hi)}")
    return f"Against the {what} (DRAM-resident points): " + ", ".join(parts) + "."


def coalescing_transpose_l2(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Every point above the DRAM ceiling (transposes and copies alike): L2-resident, each
    named with its working set."""
    tr = ok(d)
    dram, what = ref(c)
    if tr.empty or not math.isfinite(dram):
        return None
    above = tr[col(tr, "gbps") > dram]
    if above.empty:
        return None

    def at(r: pd.Series) -> str:
        size, n = col(r.to_frame().T, "p_size").iloc[0], col(r.to_frame().T, "p_n").iloc[0]
        return (f"{int(size)}²" if math.isfinite(size) else
                f"n = {fmt.integer(n)}" if math.isfinite(n) else str(r["point_id"]))

    parts = [f"{r['variant']} at {at(r)} ({fmt.bandwidth(r['gbps'])}, working "
             f"set {fmt.nbytes(r['working_set_bytes'])}"
             + (", L2-resident" if r["memory_level"] == "l2" else "") + ")"
             for _, r in above.iterrows()]
    l2 = f"the {fmt.nbytes(c.l2_bytes)} L2" if math.isfinite(c.l2_bytes) else "L2"
    return (f"Above the {what}: " + "; ".join(parts) + f". Such a matrix fits {l2} and the "
            "run did not flush it, so this is L2 bandwidth, not DRAM: compare it with the L2 "
            "ceiling, not with the DRAM peak.")


def coalescing_dram_traffic(d: pd.DataFrame, c: Ceilings) -> str | None:
    """DRAM bytes per element (the profiler's count) at a few strides, against the 8 the
    kernel asks for: what each stride really costs."""
    st = ok(d[d["variant"] == "stride"]).assign(dram=lambda x: ncu(x, "m_ncu_dram_bytes"))
    st = st.dropna(subset=["dram"])
    if st.empty:
        return None
    st = st.assign(s=col(st, "p_stride")).sort_values("s")
    shown = st[st["s"].isin({1, 2, 8, FLAT_FROM_STRIDE, st["s"].max()})]
    parts = [f"stride {fmt.integer(r['s'])}: {fmt.sig(r['dram'] / r['p_n'])} B"
             for _, r in shown.iterrows()]
    return ("DRAM traffic per element, as the profiler counted it (the kernel asks for 8 "
            "bytes: 4 read, 4 written): " + ", ".join(parts) + ".")


# -- claims ------------------------------------------------------------------------------------
def _offset_flat(d: pd.DataFrame, c: Ceilings) -> Judgement:
    off = _at(_gpu(d), "offset")
    if len(off) < 2:
        return no_data("fewer than two offsets in this run")
    lo, hi = off["gbps"].min(), off["gbps"].max()
    worst = off.loc[off["gbps"].idxmin()]
    return judged(lo >= (1 - FLAT_LOSS) * hi,
                  f"offsets {fmt.span(lo, hi, fmt.bandwidth)}: the worst, offset "
                  f"{fmt.integer(worst['p_offset'])}, loses {fmt.percent(100 * (1 - lo / hi))}")


def _best_offset(d: pd.DataFrame) -> float:
    return float(_at(_gpu(d), "offset")["gbps"].max())


_flip_offset_flat = turn(
    _offset_flat,
    lambda d: to_gbps(d, _point("offset", 1), 0.7 * _best_offset(d)),
    lambda d: to_gbps(d, _variant("offset"), _best_offset(d)))


def _coalesced(d: pd.DataFrame) -> tuple[float, str]:
    """GB/s of the coalesced reference: offset 0, else the copy, else stride 1."""
    for variant, value, name in (("offset", 0, "offset 0"), ("copy", None, "copy"),
                                 ("stride", 1, "stride 1")):
        g = gbps_at(d, variant, value)
        if math.isfinite(g):
            return g, name
    return math.nan, ""


def _largest_stride(d: pd.DataFrame) -> int | None:
    s = col(_at(_gpu(d), "stride"), "p_stride")
    return int(s.max()) if s.notna().any() and s.max() > 1 else None


def _stride_gain(d: pd.DataFrame, c: Ceilings) -> Judgement:
    base, name = _coalesced(d)
    smax = _largest_stride(d)
    if smax is None or not math.isfinite(base):
        return no_data("no coalesced copy and stride above 1 both in this run")
    g = gbps_at(d, "stride", smax)
    return judged(base >= STRIDE_GAIN * g,
                  f"{name} {fmt.bandwidth(base)} vs stride {smax} {fmt.bandwidth(g)} "
                  f"({fmt.ratio(base / g)})")


def _at_largest_stride(d: pd.DataFrame, share: float) -> pd.DataFrame:
    return to_gbps(d, _point("stride", _largest_stride(d)), share * _coalesced(d)[0])


_flip_stride_gain = turn(_stride_gain, lambda d: _at_largest_stride(d, 0.8),
                         lambda d: _at_largest_stride(d, 0.2))


def _stride2(d: pd.DataFrame, c: Ceilings) -> Judgement:
    s1, s2 = gbps_at(d, "stride", 1), gbps_at(d, "stride", 2)
    if not (math.isfinite(s1) and math.isfinite(s2)):
        return no_data("strides 1 and 2 not both in this run")
    return judged(s2 <= (1 - STRIDE2_LOSS) * s1,
                  f"stride 2 {fmt.bandwidth(s2)} vs stride 1 {fmt.bandwidth(s1)} "
                  f"({fmt.percent(100 * s2 / s1)})")


def _stride2_at(d: pd.DataFrame, share: float) -> pd.DataFrame:
    return to_gbps(d, _point("stride", 2), share * gbps_at(d, "stride", 1))


_flip_stride2 = turn(_stride2, lambda d: _stride2_at(d, 0.98), lambda d: _stride2_at(d, 0.7))


def _counter(d: pd.DataFrame, column: str) -> pd.Series:
    """A profiler counter per row (NaN where the point was not profiled)."""
    v = col(d, column)
    if "m_ncu_status" in d.columns:
        v = v.where(d["m_ncu_status"].astype(str) == "ok")
    return v


def _dram_at(d: pd.DataFrame, variant: str, value: int) -> float:
    sub = ok(d)
    v = _counter(sub, "m_ncu_dram_bytes")[(sub["variant"] == variant)
                                          & (col(sub, f"p_{variant}") == value)].dropna()
    return float(v.iloc[0]) if len(v) else math.nan


def _stride2_traffic(d: pd.DataFrame, c: Ceilings) -> Judgement:
    b1, b2 = _dram_at(d, "stride", 1), _dram_at(d, "stride", 2)
    if not (math.isfinite(b1) and math.isfinite(b2)) or b1 <= 0:
        return no_data("strides 1 and 2 not both profiled (DRAM bytes) in this run")
    return judged(b2 >= STRIDE2_TRAFFIC * b1,
                  f"DRAM bytes: stride 2 {fmt.nbytes(b2)} vs stride 1 {fmt.nbytes(b1)} "
                  f"({fmt.ratio(b2 / b1)})")


def _dram_of(mask: Mask) -> Callable[[pd.DataFrame, float], pd.DataFrame]:
    """The DRAM bytes of the rows in mask(d) set to a value (a flip)."""
    return lambda d, nbytes: with_value(d, mask, "m_ncu_dram_bytes", nbytes)


_flip_stride2_traffic = turn(
    _stride2_traffic,
    lambda d: _dram_of(_point("stride", 2))(d, _dram_at(d, "stride", 1)),
    lambda d: _dram_of(_point("stride", 2))(d, 1.5 * _dram_at(d, "stride", 1)))


def _misaligned(d: pd.DataFrame) -> pd.Series:
    o = col(d, "p_offset")
    return (d["variant"] == "offset") & (o % MISALIGNED != 0)


def _offset_traffic(d: pd.DataFrame, c: Ceilings) -> Judgement:
    b0 = _dram_at(d, "offset", 0)
    sub = ok(d)
    mis = _counter(sub, "m_ncu_dram_bytes")[_misaligned(sub)].dropna()
    if not math.isfinite(b0) or b0 <= 0 or mis.empty:
        return no_data("offset 0 and a misaligned offset not both profiled (DRAM bytes) "
                       "in this run")
    worst = sub.loc[mis.idxmax()]
    return judged(mis.max() <= (1 + OFFSET_TRAFFIC) * b0,
                  f"DRAM bytes: offset {fmt.integer(worst['p_offset'])} (the most of "
                  f"{len(mis)} misaligned offsets) {fmt.nbytes(mis.max())} vs offset 0 "
                  f"{fmt.nbytes(b0)} ({fmt.ratio(mis.max() / b0)})")


_flip_offset_traffic = turn(
    _offset_traffic,
    lambda d: _dram_of(_point("offset", 1))(d, 1.2 * _dram_at(d, "offset", 0)),
    lambda d: _dram_of(_misaligned)(d, _dram_at(d, "offset", 0)))


def _strides_from(d: pd.DataFrame, lo: int) -> pd.DataFrame:
    st = _at(_gpu(d), "stride")
    return st[col(st, "p_stride") >= lo]


def _stride_flat(d: pd.DataFrame, c: Ceilings) -> Judgement:
    far = _strides_from(d, FLAT_FROM_STRIDE)
    base = gbps_at(d, "stride", FLAT_FROM_STRIDE)
    if len(far) < 2 or not math.isfinite(base):
        return no_data(f"stride {FLAT_FROM_STRIDE} and a larger one not both in this run")
    worst = far.loc[far["gbps"].idxmin()]
    return judged(worst["gbps"] > STRIDE_FLAT_SHARE * base,
                  f"stride {FLAT_FROM_STRIDE} {fmt.bandwidth(base)}, the slowest beyond it "
                  f"(stride {fmt.integer(worst['p_stride'])}) {fmt.bandwidth(worst['gbps'])} "
                  f"({fmt.percent(100 * worst['gbps'] / base)})")


def _beyond_flat(d: pd.DataFrame) -> pd.Series:
    return (d["variant"] == "stride") & (col(d, "p_stride") > FLAT_FROM_STRIDE)


_flip_stride_flat = turn(
    _stride_flat,
    lambda d: to_gbps(d, _point("stride", _largest_stride(d)),
                      0.5 * gbps_at(d, "stride", FLAT_FROM_STRIDE)),
    lambda d: to_gbps(d, _beyond_flat, gbps_at(d, "stride", FLAT_FROM_STRIDE)))


def _transposes(d: pd.DataFrame, size: float) -> pd.Series:
    tr = _gpu(d)
    tr = tr[tr["variant"].isin(TRANSPOSES) & (col(tr, "p_size") == size)]
    return tr.set_index("variant")["gbps"]


def _largest_size(d: pd.DataFrame) -> float:
    return float(col(_gpu(d)[_gpu(d)["variant"].isin(TRANSPOSES)], "p_size").max())


def _tiled_gain(d: pd.DataFrame, c: Ceilings) -> Judgement:
    size = _largest_size(d)
    at = _transposes(d, size) if math.isfinite(size) else pd.Series(dtype=float)
    tiled = "transpose_padded" if "transpose_padded" in at else "transpose_tiled"
    if "transpose_naive" not in at or tiled not in at:
        return no_data("the naive and a tiled transpose not both in this run")
    r = at[tiled] / at["transpose_naive"]
    return judged(r >= TRANSPOSE_GAIN,
                  f"{tiled} {fmt.bandwidth(at[tiled])} vs transpose_naive "
                  f"{fmt.bandwidth(at['transpose_naive'])} ({fmt.ratio(r)}) at "
                  f"{fmt.integer(size)}²")


def _naive_at(d: pd.DataFrame, share: float) -> pd.DataFrame:
    size = _largest_size(d)
    at = _transposes(d, size)
    tiled = at.get("transpose_padded", at.get("transpose_tiled"))
    return to_gbps(d, lambda x: (x["variant"] == "transpose_naive")
                   & (col(x, "p_size") == size), share * tiled)


_flip_tiled_gain = turn(_tiled_gain, lambda d: _naive_at(d, 0.9), lambda d: _naive_at(d, 0.3))


def _padding_at(d: pd.DataFrame, sizes: list[float]) -> Judgement:
    parts, holds = [], True
    for size in sizes:
        at = _transposes(d, size)
        if "transpose_padded" not in at or "transpose_tiled" not in at:
            continue
        r = at["transpose_padded"] / at["transpose_tiled"]
        holds &= bool(r > PADDING_GAIN)
        parts.append(f"{fmt.integer(size)}²: {fmt.bandwidth(at['transpose_padded'])} vs "
                     f"{fmt.bandwidth(at['transpose_tiled'])} ({fmt.ratio(r)})")
    if not parts:
        return no_data("the padded and unpadded tiles not both in this run at these sizes")
    return judged(holds, "padded vs unpadded tile at " + "; ".join(parts))


def _padding(d: pd.DataFrame, c: Ceilings) -> Judgement:
    size = _largest_size(d)
    return _padding_at(d, [size] if math.isfinite(size) else [])


def _unaligned_sizes(d: pd.DataFrame) -> list[float]:
    sizes = col(_gpu(d)[_gpu(d)["variant"].isin(TRANSPOSES)], "p_size").dropna().unique()
    return sorted(s for s in sizes if s % TILE)


def _padding_unaligned(d: pd.DataFrame, c: Ceilings) -> Judgement:
    return _padding_at(d, _unaligned_sizes(d))


def _tiled_to(d: pd.DataFrame, sizes: list[float], share: float) -> pd.DataFrame:
    for size in sizes:
        padded = _transposes(d, size).get("transpose_padded")
        if padded is not None:
            d = to_gbps(d, lambda x, s=size: (x["variant"] == "transpose_tiled")
                        & (col(x, "p_size") == s), share * padded)
    return d


_flip_padding = turn(_padding, lambda d: _tiled_to(d, [_largest_size(d)], 1.0),
                     lambda d: _tiled_to(d, [_largest_size(d)], 0.6))
_flip_padding_unaligned = turn(
    _padding_unaligned, lambda d: _tiled_to(d, _unaligned_sizes(d)[:1], 1.0),
    lambda d: _tiled_to(d, _unaligned_sizes(d), 0.6))


def _conflicts_at(d: pd.DataFrame, variant: str, size: float) -> float:
    sub = ok(d)
    v = _counter(sub, "m_ncu_smem_bank_conflicts")[(sub["variant"] == variant)
                                                  & (col(sub, "p_size") == size)].dropna()
    return float(v.iloc[0]) if len(v) else math.nan


def _conflicts(d: pd.DataFrame, c: Ceilings) -> Judgement:
    size = _largest_size(d)
    tiled = _conflicts_at(d, "transpose_tiled", size)
    padded = _conflicts_at(d, "transpose_padded", size)
    if not (math.isfinite(tiled) and math.isfinite(padded)):
        return no_data("the padded and unpadded tiles not both profiled (bank conflicts) in "
                       "this run")
    r = tiled / max(padded, 1.0)
    return judged(r >= CONFLICTS_GAIN,
                  f"shared-memory bank conflicts at {fmt.integer(size)}²: unpadded "
                  f"{fmt.integer(tiled)}, padded {fmt.integer(padded)} ({fmt.ratio(r)})")


def _conflicts_to(d: pd.DataFrame, factor: float) -> pd.DataFrame:
    size = _largest_size(d)
    padded = max(_conflicts_at(d, "transpose_padded", size), 1.0)
    return with_value(d, lambda x: (x["variant"] == "transpose_tiled")
                      & (col(x, "p_size") == size), "m_ncu_smem_bank_conflicts",
                      factor * padded)


_flip_conflicts = turn(_conflicts, lambda d: _conflicts_to(d, 1.0),
                       lambda d: _conflicts_to(d, 100.0))


def _best_copy(d: pd.DataFrame) -> tuple[pd.Series | None, float]:
    """The faster of copy and copy_vec4, and cudaMemcpy of the same n floats."""
    copies = _gpu(d)[_gpu(d)["variant"].isin(["copy", "copy_vec4"])]
    if copies.empty:
        return None, math.nan
    best = copies.loc[copies["gbps"].idxmax()]
    return best, memcpy_gbps_at(d, n=int(best["p_n"]))


def _memcpy_share(d: pd.DataFrame, c: Ceilings) -> Judgement:
    best, memcpy = _best_copy(d)
    if best is None or not math.isfinite(memcpy):
        return no_data("no copy kernel and cudaMemcpy of the same bytes both in this run")
    share = best["gbps"] / memcpy
    return judged(share >= MEMCPY_SHARE,
                  f"{best['variant']} {fmt.bandwidth(best['gbps'])} = "
                  f"{fmt.percent(100 * share)} of cudaMemcpy {fmt.bandwidth(memcpy)} at "
                  f"n = {fmt.integer(best['p_n'])} floats")


def _copies_at(d: pd.DataFrame, share: float) -> pd.DataFrame:
    _, memcpy = _best_copy(d)
    return to_gbps(d, _variant("copy", "copy_vec4"), share * memcpy)


_flip_memcpy_share = turn(_memcpy_share, lambda d: _copies_at(d, 0.8),
                          lambda d: _copies_at(d, 0.95))


def _copy_share(d: pd.DataFrame, c: Ceilings) -> Judgement:
    dram, what = ref(c)
    copy = gbps_at(d, "copy")
    if not (math.isfinite(copy) and math.isfinite(dram)):
        return no_data("no coalesced copy, or no DRAM ceiling, in this run")
    return judged(copy >= LARGE_FRACTION * dram,
                  f"copy {fmt.bandwidth(copy)} = {fmt.percent(100 * copy / dram)} of the "
                  f"{what}")


_flip_copy_share = turn(_copy_share, lambda d: slower(d, _variant("copy"), 3.0),
                        lambda d: slower(d, _variant("copy"), 0.5))


EXPLANATIONS = (coalescing_vs_ceiling, coalescing_transpose_l2, coalescing_dram_traffic)
CLAIMS = (
    Claim("every GPU result matches numpy bit for bit",
          all_correct("points correct"), one_wrong, "correct"),
    Claim(f"the offset curve is almost flat: no offset loses more than {FLAT_LOSS:.0%} "
          "against the best (an extra sector per warp fetched from DRAM would cost 1/9)",
          _offset_flat, _flip_offset_flat, "offset_flat"),
    Claim("a misaligned copy moves no more DRAM bytes than the aligned one (offset 0), "
          f"within {OFFSET_TRAFFIC:.0%}: the extra sector each warp touches is also its "
          "neighbour's, and the L2 serves it (the profiler's DRAM bytes)",
          _offset_traffic, _flip_offset_traffic, "offset_no_extra_dram"),
    Claim(f"coalesced reads are at least {STRIDE_GAIN:g}x faster than the largest stride",
          _stride_gain, _flip_stride_gain, "stride_slow"),
    Claim(f"stride 2 already loses at least {STRIDE2_LOSS:.0%} of the GB/s of stride 1",
          _stride2, _flip_stride2, "stride2_loses"),
    Claim(f"stride 2 moves at least {STRIDE2_TRAFFIC:g}x the DRAM bytes of stride 1: every "
          "sector is read and half of it used (1.5x in theory: 8 sectors read and 4 written "
          "where 4 + 4 are asked for; the profiler's DRAM bytes)",
          _stride2_traffic, _flip_stride2_traffic, "stride2_traffic"),
    Claim(f"the shared-memory tiled transpose is at least {TRANSPOSE_GAIN:g}x faster than "
          "the naive one (whose writes are strided) at the largest size", _tiled_gain,
          _flip_tiled_gain, "tiled_beats_naive"),
    Claim(f"the padded tile is more than {PADDING_GAIN:g}x faster than the unpadded one at "
          "the largest size (its column reads conflict in shared memory)", _padding,
          _flip_padding, "padding_pays"),
    Claim(f"the unpadded tile has at least {CONFLICTS_GAIN:g}x the shared-memory bank "
          "conflicts of the padded one at the largest size (the profiler's count)",
          _conflicts, _flip_conflicts, "padding_removes_conflicts"),
    Claim(f"the best copy kernel reaches at least {MEMCPY_SHARE:.0%} of cudaMemcpy device "
          "to device of the same bytes", _memcpy_share, _flip_memcpy_share,
          "copy_near_memcpy"),
    Claim(f"the coalesced copy (one float per thread) reaches at least {LARGE_FRACTION:.0%} "
          "of the DRAM ceiling (measured where the run measured it, else theoretical)",
          _copy_share, _flip_copy_share, "copy_near_bandwidth"),
)
TRY_THIS = [
    TryThis("measurement.cold_l2: true", "little changes for the copies (each array is far "
            "larger than the L2), which shows their numbers are DRAM traffic; the transposes "
            "small enough to fit the L2 lose GB/s"),
    TryThis("coalescing.strides: [1, 2, 4, 8, 16, 32, 64]", "once every element needs a DRAM "
            "fetch of its own (a 32-byte sector, or two where DRAM fetches sectors in pairs: "
            "the profiler's DRAM bytes per element above tell which), a larger stride costs "
            "no more: the curve stays flat at its worst",
            Claim(f"from stride {FLAT_FROM_STRIDE} (64 bytes) on, every stride keeps more "
                  f"than {STRIDE_FLAT_SHARE:.0%} of the GB/s of stride {FLAT_FROM_STRIDE}",
                  _stride_flat, _flip_stride_flat, "stride_flat_at_worst")),
    TryThis("coalescing.transpose_sizes: [1024, 1025]", "an edge no tile divides: the last "
            "tiles are partly idle and rows no longer start on a 128-byte line, so compare "
            "each size with its neighbour that 32 divides; the padded tile still beats the "
            "unpadded one",
            Claim(f"at every edge that 32 does not divide, the padded tile is more than "
                  f"{PADDING_GAIN:g}x faster than the unpadded one", _padding_unaligned,
                  _flip_padding_unaligned, "padding_pays_unaligned")),
]

LESSON = Lesson(
    title="Coalescing: access patterns of global memory, and matrix transpose",
    caption=(
        "A warp's 32 loads are served in 32-byte sectors: when neighbouring threads read "
        "neighbouring floats, 4 sectors (128 bytes) serve the whole warp and every byte is "
        "used. GB/s here counts only the bytes the kernel asks for (8 per element), so it "
        "drops when the hardware must move more than that. Look for: the offset curve "
        "almost flat (a shifted start makes each warp touch one more sector, but its "
        "neighbour reads that sector too and a cache serves the second read); the stride "
        "curve falling steeply as each warp touches more sectors while using 4 bytes of "
        "each, then flat at its worst once every element needs a DRAM fetch of its own; "
        "and, for the transpose, the shared-memory tile beating the naive kernel (whose "
        "writes are strided), with the padded tile (32 x 33) faster than the unpadded one "
        "(whose column reads hit the same shared-memory bank 32 times). cudaMemcpy of the "
        "same bytes is the ceiling a copy is compared with: a good copy kernel (float4 "
        "accesses) comes close to it, and m_pct_of_memcpy says how far each access pattern "
        "stays below it. Where the run profiled the kernels, the DRAM bytes and bank "
        "conflicts they counted show why. The claims below judge each of these on this run."
    ),
    figures={
        "offset": "Effective bandwidth of a[i] = b[(i + offset) % n] against the offset; "
        "solid: the coalesced copy, dashed: theoretical DRAM bandwidth.",
        "stride": "Effective bandwidth of a[i] = b[(i * stride) % n] against the stride, with "
        "the 32-byte sectors one warp's read touches.",
        "transpose": "Matrix transpose bandwidth by matrix size: naive, shared-memory tile, "
        "and tile padded against bank conflicts, beside cudaMemcpy of the same bytes.",
    },
    print_figure=("offset", None),  # on paper: the course's offset copy
    print_pages=0.88,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "A warp reads 32 consecutive floats: how many 32-byte sectors is that, and how many "
            "at stride 2 and stride 32?",
            answers.sectors),
        Question(
            "What does an offset of 1 cost on this GPU, and where does the extra sector each "
            "warp touches come from?",
            answers.offset_one),
        Question(
            "In the naive transpose, is it the reads or the writes that are not coalesced, and "
            "how does the shared tile fix that?",
            answers.transpose),
    ],
    sources={
        "33": "the padded tile's row: 32 floats + 1 of padding (cuda/coalescing/coalescing.cu)",
    },
)
