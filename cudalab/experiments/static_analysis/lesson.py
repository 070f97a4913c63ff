"""The static-analysis lesson: its claims about what ptxas made of every kernel (each a
predicate over this run's table with its threshold and the data change that turns it over),
and the table of kernels the claims and figures read (frame). Every number in a sentence
comes from the table; the only constants are the named thresholds below."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.base import NOT_MEASURED
from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    Lesson,
    TryThis,
    col,
    judged,
    no_data,
    ok,
    with_value,
)
from cudalab.experiments.questions import Question
from cudalab.experiments.static_analysis import answers

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

TILE_PARAMS = ("rt", "bt", "bk")  # matmul's register tile, as its points name it
# Every kernel can run 256-thread blocks: the block size the course and most kernels use.
CHECK_BLOCK = 256
# Register allocation depends on the target: more than half of the kernels use a different
# register count on different targets (each target has its own ISA and ptxas heuristics).
ARCH_DEPENDENT_SHARE = 0.5
USAGE = ["m_registers", "m_smem_static", "m_spill_stores", "m_spill_loads", "m_barriers"]


def _tile_labels(d: pd.DataFrame) -> list[str]:
    """'rt=2 bt=32 bk=32' for rows of a register tile ('' for the others)."""
    if not set(f"p_{k}" for k in TILE_PARAMS) <= set(d.columns):
        return [""] * len(d)
    vals = d[[f"p_{k}" for k in TILE_PARAMS]].to_numpy()
    return ["" if pd.isna(row).any() else
            " ".join(f"{k}={int(v)}" for k, v in zip(TILE_PARAMS, row)) for row in vals]


def frame(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows, one per kernel and compile variant that changes something, with the
    resource columns as numbers and a label (file:kernel [tile or flags])."""
    d = ok(df).copy()
    if d.empty:
        return d
    d["p_flags"] = d["p_flags"].fillna("").astype(str)
    for c in ("m_registers", "m_smem_static", "m_spill_stores", "m_spill_loads",
              "m_dynamic_smem", "m_barriers", "m_launch_bounds"):
        if c not in d:
            d[c] = 0
        d[c] = pd.to_numeric(d[c], errors="coerce").fillna(0)
    # a compile variant that changes nothing for a kernel (LIVE for vec_mul) is not shown
    # as a separate kernel: keep its first variant, named without flags
    same = d.groupby(["p_file", "variant"])[["p_flags", *USAGE]].apply(
        lambda g: g.groupby("p_flags")[USAGE].apply(lambda x: tuple(x.to_numpy().ravel()))
        .nunique() <= 1)
    d["_same"] = [bool(same.get((f, k), False)) for f, k in zip(d["p_file"], d["variant"])]
    first = d.groupby(["p_file", "variant"])["p_flags"].transform("first")
    d = d[~d["_same"] | (d["p_flags"] == first)].copy()
    tile = _tile_labels(d)
    # the file's own name, without its lesson folder: labels stay short and read as before
    d["label"] = [f"{str(f).rsplit('/', 1)[-1].removesuffix('.cu')}:{k}"
                  + (f" [{t or fl}]" if (t or fl) and not sm else "")
                  for f, k, fl, t, sm in zip(d["p_file"], d["variant"], d["p_flags"], tile,
                                             d["_same"])]
    return d.drop(columns="_same")


# -- claims ----------------------------------------------------------------------------------
def _compiles(d: pd.DataFrame, c: Ceilings) -> Judgement:
    rows = d[d["status"].astype(str) != NOT_MEASURED]
    if rows.empty:
        return no_data("no (file, variant, kernel, arch) row analysed")
    failed = rows[rows["status"].astype(str) == "failed"]
    skipped = rows[rows["status"].astype(str) == "skipped"]
    return judged(failed.empty,
                  f"{len(rows) - len(failed) - len(skipped)}/{len(rows)} (file, variant, "
                  "kernel, arch) rows analysed"
                  + (f", {len(skipped)} skipped (kernel not compiled with those flags: "
                     f"{', '.join(sorted(set(skipped['variant'])))})" if len(skipped) else "")
                  + (f"; first failure {failed.iloc[0]['point_id']}: {failed.iloc[0]['reason']}"
                     if len(failed) else ""))


def _no_spills(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = frame(d)
    if d.empty:
        return no_data("no kernel analysed")
    spills = d[(d["m_spill_stores"] + d["m_spill_loads"]) > 0]
    if spills.empty:
        return judged(True, f"no spills in {fmt.integer(len(d))} rows")
    r = spills.iloc[0]
    return judged(False, f"{len(spills)} rows spill, e.g. {r['label']} on {r['p_arch']}: "
                  f"{fmt.nbytes(r['m_spill_stores'])} stores, "
                  f"{fmt.nbytes(r['m_spill_loads'])} loads")


def _unbounded(d: pd.DataFrame) -> pd.Series:
    """Kernels whose __launch_bounds__ allow CHECK_BLOCK threads (or set none): one that
    asks for smaller blocks (the warp-tiled matmul: 128) is built for them, not refused by
    the hardware."""
    bound = col(d, "m_launch_bounds").fillna(0)
    return (bound == 0) | (bound >= CHECK_BLOCK)


def _launch_256(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = frame(d)
    if d.empty or "m_occupancy_256" not in d:
        return no_data(f"no occupancy at {CHECK_BLOCK} threads in this run")
    b = d[_unbounded(d)]
    o = col(b, "m_occupancy_256")
    if o.notna().sum() == 0:
        return no_data(f"no kernel without smaller __launch_bounds__ than {CHECK_BLOCK}")
    cannot = b[o <= 0]
    low = b.loc[o.idxmin()]
    return judged(cannot.empty,
                  f"{len(b) - len(cannot)}/{len(b)} rows launchable; lowest occupancy at "
                  f"{CHECK_BLOCK} threads: {low['label']} on {low['p_arch']}, "
                  f"{fmt.percent(100 * o.min())} ({low.get('m_limiter_256', '')})"
                  + (f"; cannot launch: {', '.join(cannot['label'] + ' ' + cannot['p_arch'])}"
                     if len(cannot) else ""))


def _per_arch(d: pd.DataFrame, c: Ceilings) -> Judgement:
    d = frame(d)
    if d.empty or d["p_arch"].nunique() < 2:
        return no_data("one target architecture in this run (static_analysis.archs: auto "
                       "analyses this machine's GPU, else sm_90; a list such as [sm_75, sm_90] "
                       "compares two)")
    per = d.groupby("label")["m_registers"].agg(["min", "max"])
    differ = per[per["min"] != per["max"]]
    share = len(differ) / len(per)
    return judged(share > ARCH_DEPENDENT_SHARE,
                  f"{len(differ)}/{len(per)} kernels ({fmt.percent(100 * share)}) use a "
                  f"different register count on {', '.join(sorted(set(d['p_arch'])))}"
                  + (f", e.g. {differ.index[0]}: {fmt.integer(differ.iloc[0]['min'])}–"
                     f"{fmt.integer(differ.iloc[0]['max'])}" if len(differ) else ""))


# -- flips -----------------------------------------------------------------------------------
def _first_kernel(d: pd.DataFrame) -> pd.Series:
    """Every row of the first analysed kernel that may launch CHECK_BLOCK threads."""
    okd = d[(d["status"].astype(str) == "ok") & _unbounded(d)]
    if okd.empty:
        return pd.Series(False, index=d.index)
    first = okd.iloc[0]
    return (d["p_file"] == first["p_file"]) & (d["variant"] == first["variant"])


def _one_failed(d: pd.DataFrame) -> pd.DataFrame:
    return with_value(d, lambda x: pd.Series(x.index == x.index[0], index=x.index),
                      "status", "failed")


def _same_registers(d: pd.DataFrame) -> pd.DataFrame:
    """Every kernel gets one register count on every target."""
    return with_value(d, lambda x: pd.Series(True, index=x.index), "m_registers", 32)


def _turn_spills(d: pd.DataFrame) -> pd.DataFrame:
    """The flip: a run with spills loses them all; one without gets one spilling kernel."""
    spill = ["m_spill_stores", "m_spill_loads"]
    if (d[spill].fillna(0).sum(axis=1) > 0).any():
        d = d.copy()
        d[spill] = d[spill].where(d[spill].isna(), 0)
        return d
    return with_value(d, _first_kernel, "m_spill_stores", 64)


CLAIMS = (
    Claim("nvcc compiles every kernel file for every target and ptxas reports each kernel",
          _compiles, _one_failed, "compiles"),
    Claim("no kernel spills registers to local memory", _no_spills, _turn_spills,
          "no_spills"),
    Claim(f"every kernel can launch {CHECK_BLOCK}-thread blocks on every target (its registers "
          "and static shared memory fit an SM; kernels whose __launch_bounds__ ask for "
          "smaller blocks are left out)", _launch_256,
          lambda d: with_value(d, _first_kernel, "m_occupancy_256", 0.0), "launch_256"),
    Claim(f"register allocation depends on the target architecture: more than "
          f"{fmt.percent(100 * ARCH_DEPENDENT_SHARE)} of the kernels use a different register "
          "count on different targets", _per_arch, _same_registers, "registers_per_arch",
          figure=("registers", 0)),
)
EXPLANATIONS = ()
TRY_THIS = [
    TryThis("static_analysis.archs: [sm_75, sm_90]", "two targets two generations apart "
            "(Turing and Hopper): the registers figure gets two columns, and most kernels "
            "use a different register count on each (so a different occupancy); the claim "
            "on register allocation judges it on those two"),
    TryThis("matmul.register_tiles: [{rt: 2, bt: 32, bk: 32}]", "matmul_register is analysed "
            "once per register tile of the matmul block: with only the 2 x 2 tile, the rows of "
            "the larger tiles, which need the most registers and so reach the lowest "
            "occupancy, leave both figures"),
]

LESSON = Lesson(
    title="Static analysis: registers, shared memory, spills and occupancy per architecture",
    headline="registers_per_arch",  # "it compiles" checks the tool, not a lesson
    caption=(
        "What the compiler makes of each kernel before anything runs: ptxas reports the "
        "registers per thread, static shared memory, stack and spills it chose for every "
        "target architecture, and the occupancy calculator turns registers and shared "
        "memory into the share of warp slots a block size can fill. Look for: kernels whose "
        "register count keeps occupancy below full (the curve steps down as the block "
        "grows, and stops where a block no longer fits the register file), shared-memory "
        "tiles that cap the resident blocks, any spill bytes (registers that did not fit and "
        "went to local memory), and how the same source needs a different number of "
        "registers on each architecture. No GPU is needed: this runs in CI. The claims below "
        "judge each of these on this run."
    ),
    figures={
        "occupancy": "Theoretical occupancy against block size of every kernel (and compile "
        "variant) for the newest analysed architecture, from ptxas' registers and shared "
        "memory (plus dynamic_smem_bytes); each cell gives the occupancy in %, shown every 64 "
        "threads per block (and at 32): results.csv has every multiple of 32.",
        "registers": "Registers per thread of every kernel on every target architecture "
        "(spilling kernels marked).",
        "registers_by_arch": "The same registers, one line per kernel across the targets: a "
        "sloped line is a kernel whose register count (and so occupancy) depends on the "
        "architecture; a cross marks a kernel that spills.",
    },
    print_figure=("registers_by_arch", None),  # the heatmaps are a page tall
    print_pages=0.55,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "Why is the register count of the same kernel different for sm_75 and sm_90?",
            answers.registers_by_arch),
        Question(
            "What does a register spill cost at run time, and where does the spilled value "
            "live?",
            answers.spills),
        Question(
            "__launch_bounds__(NTHREADS) lets matmul_register use more registers: what does it "
            "forbid in return?",
            answers.launch_bounds),
    ],
)
