"""The latency lesson: the plateau of each memory level, its claims (each a predicate over this
run's table with its threshold and the data change that turns it over). Every number in a
sentence comes from the table; the only constants are the named thresholds and the course's
own numbers below."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.flip import turn
from cudalab.experiments.latency import answers
from cudalab.experiments.lesson import (
    Claim,
    Flip,
    Judge,
    Judgement,
    Lesson,
    Mask,
    TryThis,
    all_correct,
    col,
    judged,
    no_data,
    ok,
    one_wrong,
)
from cudalab.experiments.questions import Question
from cudalab.experiments.shared import bytes_label

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

VARIANTS = ["global", "global_cg", "shared", "constant"]
GLOBAL = ("global", "global_cg")
# The course's numbers (cycles per load; the course's slides): ~5 for shared memory and for
# a cached constant read, ~500 for global memory.
COURSE_CYCLES = {"shared": 5.0, "constant": 5.0, "dram": 500.0}
# Shared memory and a cached constant read at least this much faster than DRAM (the course's
# ~5 against ~500 cycles is 100x: a tenth of that still tells the levels apart).
SHARED_VS_DRAM = 10.0
# Each cache level at least this much faster than the next; the L1-bypassing chain and the
# constant chain that outgrows its cache at least this much slower than the cached ones.
LEVEL_STEP = 1.5
# The measured DRAM latency within this factor of the course's ~500 cycles.
COURSE_FACTOR = 2.0
# Every shared chain within this share of the shared level: it has no cache to outgrow.
SHARED_FLAT = 0.1
DRAM_FROM_L2 = 8  # chains at least this many times the L2 are the DRAM level


# -- rows and levels ---------------------------------------------------------------------------
def frame(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows with their working set (ws), cycles and ns per load."""
    d = ok(df)
    if d.empty or "m_cycles_per_load" not in d:
        return d.iloc[0:0].assign(ws=[], cycles=[], ns=[])
    d = d.assign(ws=col(d, "p_working_set"), cycles=col(d, "m_cycles_per_load"),
                 ns=col(d, "m_ns_per_load"))
    return d.dropna(subset=["ws", "cycles"]).sort_values(["variant", "ws"])


def fact(d: pd.DataFrame, column: str) -> float:
    v = col(d, column).dropna()
    return float(v.median()) if len(v) else math.nan


@dataclass(frozen=True)
class Level:
    key: str
    name: str
    where: str  # the variant and working sets the median is over
    cycles: float
    ns: float
    course: float | None


def _level(key: str, name: str, sub: pd.DataFrame, course: float | None) -> Level | None:
    if sub.empty:
        return None
    sizes = sorted(sub["ws"].astype(int).unique())
    span = bytes_label(sizes[0]) + (f" - {bytes_label(sizes[-1])}" if len(sizes) > 1 else "")
    count = f"{len(sizes)} working set" + ("s" if len(sizes) > 1 else "")
    return Level(key, name, f"{sub['variant'].iloc[0]}, {span} ({count})",
                 float(sub["cycles"].median()), float(sub["ns"].median()), course)


def levels(d: pd.DataFrame) -> list[Level]:
    """The plateau of each level: the median latency over the working sets clearly inside
    it. L1: default-caching global chains up to a quarter of the unified L1. L2: L1-bypassing
    chains up to a quarter of the L2 (default-caching ones from 4x the L1 where global_cg
    was not run). DRAM: chains at least 8x the L2 (default caching first). Shared: every
    shared chain. Constant: the smallest constant chain (cached) and the largest."""
    l1, l2 = fact(d, "m_l1_bytes"), fact(d, "m_l2_bytes")
    by = {v: d[d["variant"] == v] for v in VARIANTS}
    out: list[Level | None] = []
    if math.isfinite(l1):
        out.append(_level("l1", "L1 hit", by["global"][by["global"]["ws"] <= l1 / 4], None))
    if math.isfinite(l2):
        cg = by["global_cg"][by["global_cg"]["ws"] <= l2 / 4]
        if cg.empty and math.isfinite(l1):
            g = by["global"]
            cg = g[(g["ws"] >= 4 * l1) & (g["ws"] <= l2 / 4)]
        out.append(_level("l2", "L2 hit", cg, None))
        far = [by[v][by[v]["ws"] >= DRAM_FROM_L2 * l2] for v in GLOBAL]
        out.append(_level("dram", "DRAM (global memory)", far[0] if len(far[0]) else far[1],
                          COURSE_CYCLES["dram"]))
    out.append(_level("shared", "shared memory", by["shared"], COURSE_CYCLES["shared"]))
    const = by["constant"]
    if len(const):
        small, big = const["ws"].min(), const["ws"].max()
        out.append(_level("constant", "constant memory, cached (smallest chain)",
                          const[const["ws"] == small], COURSE_CYCLES["constant"]))
        if big > small:
            out.append(_level("constant_big", "constant memory, largest chain",
                              const[const["ws"] == big], None))
    return [x for x in out if x is not None]


def _levels(d: pd.DataFrame) -> dict[str, Level]:
    return {x.key: x for x in levels(frame(d))}


def _missing(key: str, d: pd.DataFrame) -> Judgement:
    l2 = fact(frame(d), "m_l2_bytes")
    if key == "dram" and math.isfinite(l2):
        return no_data(f"no global chain of at least {DRAM_FROM_L2}x the L2 "
                       f"({bytes_label(DRAM_FROM_L2 * l2)}); raise latency.max_bytes")
    return no_data(f"no {key} level measured in this run")


def _says(x: Level) -> str:
    return f"{x.name}: {fmt.integer(x.cycles)} cycles ({fmt.seconds(x.ns * 1e-9)})"


# -- masks and flips ---------------------------------------------------------------------------
def _of(variants: tuple[str, ...], lo: float = 0, hi: float = math.inf) -> Mask:
    return lambda d: (d["variant"].isin(variants) & (col(d, "p_working_set") >= lo)
                      & (col(d, "p_working_set") <= hi))


def _dram_rows(d: pd.DataFrame) -> pd.Series:
    return _of(GLOBAL, DRAM_FROM_L2 * fact(frame(d), "m_l2_bytes"))(d)


def _cycles_to(d: pd.DataFrame, mask: Mask, cycles: float) -> pd.DataFrame:
    """The rows in mask(d) take `cycles` per load (ns scaled with them)."""
    d = d.copy()
    m = mask(d).to_numpy(dtype=bool)
    now = col(d, "m_cycles_per_load")[m]
    d.loc[m, "m_ns_per_load"] = col(d, "m_ns_per_load")[m] * cycles / now
    d.loc[m, "m_cycles_per_load"] = cycles
    return d


def _level_to(mask: Mask, of: str, factor: float) -> Flip:
    """The rows in mask(d) at `factor` x the `of` level's cycles."""
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        return _cycles_to(d, mask, factor * _levels(d)[of].cycles)

    return flip


def _smallest(variant: str) -> Mask:
    return lambda d: (d["variant"] == variant) & (col(d, "p_working_set") == col(
        d[d["variant"] == variant], "p_working_set").min())


def _largest(variant: str) -> Mask:
    return lambda d: (d["variant"] == variant) & (col(d, "p_working_set") == col(
        d[d["variant"] == variant], "p_working_set").max())


# -- claims ------------------------------------------------------------------------------------
def _faster_than_dram(key: str) -> Judge:
    def judge(d: pd.DataFrame, c: Ceilings) -> Judgement:
        lv = _levels(d)
        for k in (key, "dram"):
            if k not in lv:
                return _missing(k, d)
        fast, dram = lv[key], lv["dram"]
        r = dram.cycles / fast.cycles
        return judged(r >= SHARED_VS_DRAM,
                      f"{_says(fast)}, {_says(dram)}: {fmt.ratio(r)}")

    judge.__name__ = f"_{key}_vs_dram"
    return judge


_shared_vs_dram = _faster_than_dram("shared")
_constant_vs_dram = _faster_than_dram("constant")


def _hierarchy(d: pd.DataFrame, c: Ceilings) -> Judgement:
    lv = _levels(d)
    for k in ("l1", "l2", "dram"):
        if k not in lv:
            return _missing(k, d)
    l1, l2, dram = lv["l1"], lv["l2"], lv["dram"]
    return judged(l2.cycles >= LEVEL_STEP * l1.cycles and dram.cycles >= LEVEL_STEP * l2.cycles,
                  f"L1 {fmt.integer(l1.cycles)}, L2 {fmt.integer(l2.cycles)}, DRAM "
                  f"{fmt.integer(dram.cycles)} cycles ({fmt.ratio(l2.cycles / l1.cycles)}, "
                  f"{fmt.ratio(dram.cycles / l2.cycles)})")


def _dram_course(d: pd.DataFrame, c: Ceilings) -> Judgement:
    dram = _levels(d).get("dram")
    if dram is None:
        return _missing("dram", d)
    course = COURSE_CYCLES["dram"]
    return judged(course / COURSE_FACTOR <= dram.cycles <= course * COURSE_FACTOR,
                  f"DRAM: {fmt.integer(dram.cycles)} cycles = {fmt.seconds(dram.ns * 1e-9)} "
                  f"({dram.where}); the course: ~{fmt.integer(course)} cycles "
                  f"({fmt.ratio(dram.cycles / course)})")


def _dram_cycles(cycles: float) -> Flip:
    return lambda d: _cycles_to(d, _dram_rows, cycles)


def _shared_flat(d: pd.DataFrame, c: Ceilings) -> Judgement:
    sh = frame(d)
    sh = sh[sh["variant"] == "shared"]
    if len(sh) < 2:
        return no_data("fewer than two shared chains in this run")
    mid = sh["cycles"].median()
    worst = sh.loc[(sh["cycles"] - mid).abs().idxmax()]
    return judged(bool(((sh["cycles"] - mid).abs() <= SHARED_FLAT * mid).all()),
                  f"{len(sh)} shared chains, {fmt.span(sh['ws'].min(), sh['ws'].max(), fmt.nbytes)}"
                  f": median {fmt.integer(mid)} cycles; the farthest from it, "
                  f"{fmt.nbytes(worst['ws'])}: {fmt.integer(worst['cycles'])} "
                  f"({fmt.percent(100 * abs(worst['cycles'] - mid) / mid)} off)")


def _shared_flat_hold(d: pd.DataFrame) -> pd.DataFrame:
    return _cycles_to(d, _of(("shared",)), _levels(d)["shared"].cycles)


def _cg_skips_l1(d: pd.DataFrame, c: Ceilings) -> Judgement:
    f = frame(d)
    g, cg = f[f["variant"] == "global"], f[f["variant"] == "global_cg"]
    both = sorted(set(g["ws"]) & set(cg["ws"]))
    if not both:
        return no_data("global and global_cg chains of one working set not both in this run")
    ws = both[0]
    a, b = float(g[g["ws"] == ws]["cycles"].iloc[0]), float(cg[cg["ws"] == ws]["cycles"].iloc[0])
    return judged(b >= LEVEL_STEP * a,
                  f"at {fmt.nbytes(ws)}: global_cg {fmt.integer(b)} cycles, global "
                  f"{fmt.integer(a)} ({fmt.ratio(b / a)})")


def _cg_to(factor: float) -> Flip:
    def flip(d: pd.DataFrame) -> pd.DataFrame:
        f = frame(d)
        g, cg = f[f["variant"] == "global"], f[f["variant"] == "global_cg"]
        ws = min(set(g["ws"]) & set(cg["ws"]))
        return _cycles_to(d, _of(("global_cg",), ws, ws),
                          factor * float(g[g["ws"] == ws]["cycles"].iloc[0]))

    return flip


def _constant_spills(d: pd.DataFrame, c: Ceilings) -> Judgement:
    lv = _levels(d)
    if "constant" not in lv or "constant_big" not in lv:
        return no_data("constant chains of two sizes not both in this run")
    small, big = lv["constant"], lv["constant_big"]
    return judged(big.cycles >= LEVEL_STEP * small.cycles,
                  f"{_says(small)} ({small.where}), {_says(big)} ({big.where}): "
                  f"{fmt.ratio(big.cycles / small.cycles)}")


EXPLANATIONS = ()
CLAIMS = (
    Claim("every chase stops on the node the CPU reaches following the same chain",
          all_correct("chases correct"), one_wrong, "correct"),
    Claim(f"shared memory latency is at least {SHARED_VS_DRAM:g}x lower than DRAM's",
          _shared_vs_dram,
          turn(_shared_vs_dram, _level_to(_of(("shared",)), "dram", 1 / 5),
               _level_to(_of(("shared",)), "dram", 1 / 20)), "shared_vs_dram"),
    Claim(f"each cache level is at least {LEVEL_STEP:g}x faster than the next: L1 < L2 < DRAM",
          _hierarchy, turn(_hierarchy, _level_to(_dram_rows, "l2", 1.2),
                           _level_to(_dram_rows, "l2", 3.0)), "levels_step"),
    Claim(f"the measured DRAM latency is within {COURSE_FACTOR:g}x of the course's "
          f"~{COURSE_CYCLES['dram']:.0f} cycles for global memory "
          f"({COURSE_CYCLES['dram'] / COURSE_FACTOR:.0f}–"
          f"{COURSE_CYCLES['dram'] * COURSE_FACTOR:.0f} cycles)", _dram_course,
          turn(_dram_course, _dram_cycles(4 * COURSE_CYCLES["dram"]),
               _dram_cycles(COURSE_CYCLES["dram"])), "dram_near_course"),
    Claim("a cached constant read (the smallest constant chain) is at least "
          f"{SHARED_VS_DRAM:g}x faster than DRAM", _constant_vs_dram,
          turn(_constant_vs_dram,
               _level_to(_smallest("constant"), "dram", 1 / 5),
               _level_to(_smallest("constant"), "dram", 1 / 20)),
          "constant_vs_dram"),
    Claim(f"shared memory is flat: every shared chain within {SHARED_FLAT:.0%} of their "
          "median (there is no cache to outgrow)", _shared_flat,
          turn(_shared_flat, _level_to(_largest("shared"), "shared", 1.5),
               _shared_flat_hold), "shared_flat"),
    Claim(f"L1-bypassing loads (global_cg) start at the L2 level: at the smallest working set "
          f"at least {LEVEL_STEP:g}x slower than default-caching loads", _cg_skips_l1,
          turn(_cg_skips_l1, _cg_to(1.0), _cg_to(5.0)), "cg_skips_l1"),
    Claim(f"the largest constant chain is at least {LEVEL_STEP:g}x slower than the smallest: "
          "it outgrows the constant cache", _constant_spills,
          turn(_constant_spills,
               _level_to(_largest("constant"), "constant", 1.0),
               _level_to(_largest("constant"), "constant", 3.0)),
          "constant_outgrows_cache"),
)
TRY_THIS = [
    TryThis("measurement.cold_l2: true", "the L2 is flushed before every timed launch: chains "
            "larger than the ones each launch walks whole, untimed, before the clock starts "
            "(8192 nodes: 1 MiB at the default stride) now come from DRAM up to the L2 size; "
            "the smaller ones keep their L1 or L2 latency"),
    TryThis("latency.max_bytes: 2147483648", "two more working sets, 1 and 2 GiB, far past "
            "the L2: if the latency still rises beyond 512 MiB, address translation (TLB "
            "misses on the 2 MiB pages) is what adds to it"),
]

LESSON = Lesson(
    title="Memory latency: pointer chasing through L1, L2, DRAM, shared and constant memory",
    caption=(
        "One thread follows a chain of dependent loads (j = next[j]) through a random cycle "
        "of cache lines: each load needs the previous one's value, so nothing overlaps and "
        "the time per step is the latency of a single load. The kernel counts SM cycles "
        "(clock64) and nanoseconds (%globaltimer) around its own loop, so both are measured. "
        "Look for: steps in the global curve where the chain outgrows L1 (which shares its "
        "storage with shared memory) and then the L2 (dotted lines: their sizes on this "
        "GPU); L1-bypassing loads (global_cg) starting at the L2 level; shared memory flat "
        "and far below DRAM; a constant chain fast while it fits the small constant cache "
        "and slower beyond. The course quotes ~5 cycles for shared and cached constant "
        "memory and ~500 for global memory: the table 'Latency per memory level' sets each "
        "level's number beside the course's, each the median over the working sets clearly "
        "inside that level. Far beyond the L2 nearly every step of a random chain misses "
        "both caches (and, in a chain large enough, the TLB): that is DRAM latency as a "
        "program with random accesses sees it. The claims below judge each of these on this "
        "run."
    ),
    figures={
        "latency": "Latency of one dependent load (cycles, left; ns at the measured SM clock, "
        "right) against the chain's working set (log scale), one line per kind of memory; "
        "dotted: the L1 (unified with shared memory) and L2 sizes; dashed: the course's ~5 "
        "and ~500 cycles.",
    },
    print_figure=("latency", None),  # on paper: every memory's plateau
    print_pages=1.0,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "Why must each load's address depend on the previous load's value to measure "
            "latency, and what would a loop over consecutive addresses measure instead?",
            answers.dependent_addresses),
        Question(
            "How many dependent DRAM loads per thread can a warp have in flight, and how many "
            "warps does an SM need to keep the memory bus busy given this latency?",
            answers.warps_in_flight),
        Question(
            "The course quotes ~5 cycles for shared memory; what does a pointer chase add to the "
            "cost of the access itself?",
            answers.shared_chase),
    ],
    sources={
        "5": "the course's latency of shared memory and of a cached constant read, in "
             "cycles (the course's slides: ~5 cycles)",
        "500": "the course's latency of global memory, in cycles (the course's slides: "
               "~500 cycles)",
        "8192": "WARM_NODES: a chain of at most this many nodes is walked whole, untimed, "
                "at the start of every launch (latency/__init__.py)",
        "512": "the default largest working set, latency.max_bytes = 2^29 bytes (512 MiB)",
    },
)
