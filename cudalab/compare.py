"""The comparison's verdict: this run against a baseline (an earlier run, another GPU,
reports/reference/<gpu>/), point by point, with noise-aware verdicts, and the comparison
table as the figures step writes it. Reading the folders is cudalab.result_folders; the
command's text is cudalab.compare_text; the report's section is cudalab.compare_report;
choosing k is cudalab.compare_calibration.

A result folder is a run's `results/` or a `reports/reference/<gpu>/`: its raw records
(raw/<experiment>/[<gpu model>/]<point>.json, every sample kept) are read when present,
else its results.csv. A folder holding several GPUs (a Slurm GPU-model sweep) is split
into one run per GPU. Points are matched by (experiment, point_id): the point id is made
of the variant and every parameter, so points of different GPUs match and the GPU is what
is compared.

Verdict rule (in the manner of nvbench's compare script): with r = this time / baseline
time and each side's noise s = IQR / 1.349 / median of its samples (a robust relative
standard deviation), the combined noise is sqrt(s_base^2 + s_this^2) and the bar is
max(threshold, combined noise). r > 1 + bar is "slower", r < 1 / (1 + bar) is "faster",
anything between is "same". A difference must be larger than both the samples' spread and
the minimum relative threshold (default 5 %) to count. Two times taken by different timing
methods (the record's timer: launches queued behind a held stream, plain events, the host
clock) measure different things for a short kernel or copy (a queued time leaves the host's
launch cost out, a plain one has it in), so such a pair gets the verdict "other method" and
no ratio, never "slower" or "faster". A point either side left not measured (a run without a
GPU records its GPU points so, with no timing) gets the verdict "not measured": never slower
or faster, and never a reason for --fail-on-slower.

Between-run noise (docs/noise.md). The samples' spread is the noise within one process; it
cannot see what moves between processes and machines. So a point is timed in trials (3 by
default, its device buffers moved to fresh allocations between them: cudalab.trials), each
GPU job measures its resolution floor (the trial-to-trial spread of an empty and a tiny
kernel, seconds), and every point has a class, from its timer: "kernel" (launches queued
behind a held stream: GPU time), "host-synchronous" (plain events around work the host
issues call by call: pageable copies, multi-stream pipelines) and "host" (the host clock:
CPU references). The bar is

    max(threshold, the samples' combined noise, k x the combined trial spread, the floor)

with each side's trial spread (largest - smallest trial median) / median combined as
sqrt(a^2 + b^2), and the floor the two jobs' combined resolution floor over the shorter
time. A side measured without trials (a record from before trials, or measurement.trials 1)
has neither: the pair is judged with the class floors (CLASS_FLOORS: 0.5 us for a kernel,
which moved by 0.2-0.5 us between processes at 2-5 us; 40 % and 75 % of the time for host
work, which moved by up to 1.3x and 1.7x between two runs of unchanged code), and the
output says how many points were. A kernel whose launch has fewer blocks than the GPU has
SMs (the record's launch.blocks against provenance sm_count) is "small-grid": its one partial
wave runs on a few SMs, so its time follows those SMs' clocks and placement on one machine,
which its trials cannot see; its class floor (SMALL_GRID_FLOOR) always applies. A
host-bound point beyond its bar is "unstable", with the reason, and never gates
--fail-on-slower. The comparison lists every point that is not
"same" grouped by class, each with the term that set its bar. choose_k() (tools/choose_k.py)
picks k from two runs of unchanged code and a planted slowdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cudalab import results, safe_text
from cudalab.result_folders import NOT_MEASURED, POINT_COLS, CompareError, Run

DEFAULT_THRESHOLD = 0.05
# Verdicts of a point, in the order they are counted.
VERDICTS = ("slower", "faster", "unstable", "same", "other method", "not measured", "not ok",
            "untimed", "only baseline", "only this")
# A point's class, from the timer that timed it (what else moves its time between runs).
CLASS_OF_METHOD = {"cuda_event_queued": "kernel", "cuda_event": "host-synchronous",
                   "perf_counter": "host"}
HOST_CLASSES = ("host-synchronous", "host")
CLASS_REASON = {
    "kernel": "GPU kernel time: gates --fail-on-slower",
    "small-grid": "a kernel launching fewer blocks than the GPU has SMs: its partial wave "
                  "runs on a few SMs, whose clocks and placement move it between machines; "
                  "gates --fail-on-slower beyond its class floor",
    "host-synchronous": "host-issued work (pageable copies, streams issued call by call): "
                        "host memory and scheduling move it between runs; never gates",
    "host": "host work (CPU reference: BLAS threads, host memory): moves between runs and "
            "machines; never gates",
}
# The smallest difference a kernel's time can show between two processes: 2-5 us kernels
# moved by 0.2-0.5 us between two runs of unchanged code on H100s.
FLOOR_S = 0.5e-6
# Per class, the floor of a pair that has no trials on some side: (seconds, fraction of the
# shorter time). Kernels: FLOOR_S; host work moved by up to 1.3x (pageable copies, streams)
# and 1.7x (the numpy reference at one BLAS thread) between two runs of unchanged code.
# A small grid's floor: matmul's 128-thread warp tiles with 4 and 6 blocks on the H100's 132
# SMs moved by up to 1.089x between two machines of unchanged code (trials agreeing within
# 1 % on each); the other 50 small-grid points stayed within 1.8 %. docs/noise.md.
SMALL_GRID_FLOOR = 0.10
CLASS_FLOORS = {"kernel": (FLOOR_S, 0.0), "small-grid": (FLOOR_S, SMALL_GRID_FLOOR),
                "host-synchronous": (0.0, 0.40), "host": (0.0, 0.75)}
# Classes whose floor applies whatever the rule: their trials agree on one machine while
# the machines differ, so no trial spread can stand for their between-run noise.
FLOOR_ALWAYS_CLASSES = ("small-grid",)
# How many combined trial spreads a difference must exceed (each side's spread is the range
# of its trial medians over their median). Chosen with tools/choose_k.py: docs/noise.md.
K_TRIALS = 3.0
# Whether the class floors also apply where both sides have trials (they always apply where
# one side has none). Two fresh H100 runs showed why: a pageable copy's or the numpy
# reference's trials agree within one process, yet move 1.1-1.5x to the next machine.
CLASS_FLOORS_ALWAYS = True


@dataclass(frozen=True)
class Rule:
    """The verdict's between-run terms: k and whether the class floors always apply."""

    k: float = K_TRIALS
    class_floors_always: bool = CLASS_FLOORS_ALWAYS


DEFAULT_RULE = Rule()
# The term that set a point's bar, in the order the max takes them.
BAR_TERMS = ("threshold", "samples' noise", "k x trial spread", "resolution floor",
             "class floor")


# -- verdicts ----------------------------------------------------------------------------------
def point_class(method: pd.Series, small_grid: pd.Series | None = None) -> pd.Series:
    """kernel / host-synchronous / host from the timer's name ('' where untimed); a kernel
    is small-grid where `small_grid` says so."""
    cls = method.map(lambda m: CLASS_OF_METHOD.get(m, "kernel" if m else ""))
    if small_grid is not None:
        cls = cls.where(~((cls == "kernel") & small_grid.fillna(False).astype(bool)),
                        "small-grid")
    return cls


def small_grid(m: pd.DataFrame) -> pd.Series:
    """Whether a merged point pair (compare_pair's columns) launched fewer blocks than the
    GPU of either side has SMs: a partial first wave. False where no side recorded both
    (records from before launch.blocks and sm_count, cuBLAS, host work)."""
    blocks = m["blocks"].fillna(m["blocks_base"])
    sms = np.fmax(m["sm_count"], m["sm_count_base"])
    return (blocks < sms).fillna(False).astype(bool)


def bars(m: pd.DataFrame, threshold: float, cls: pd.Series,
         rule: Rule = DEFAULT_RULE) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(bar, the term that set it, whether both sides have trials) of merged point pairs
    (compare_pair's columns: noise, trial_spread, floor_s and median_s, each also _base)."""
    shorter = np.minimum(m["median_s"], m["median_s_base"])
    both = m["trial_spread"].notna() & m["trial_spread_base"].notna()
    spread = np.sqrt(m["trial_spread"] ** 2 + m["trial_spread_base"] ** 2)
    floor = np.sqrt(m["floor_s"] ** 2 + m["floor_s_base"] ** 2) / shorter
    cfloor_s = cls.map(lambda c: CLASS_FLOORS.get(c, (0.0, 0.0))[0])
    cfloor_rel = cls.map(lambda c: CLASS_FLOORS.get(c, (0.0, 0.0))[1])
    # the class floor: where a side has no trials, where asked, for a kernel whose job
    # measured no floor, and always for the classes no trial spread stands for
    use_class = (~both | rule.class_floors_always
                 | (cls.isin(["kernel", "small-grid"]) & floor.isna())
                 | cls.isin(FLOOR_ALWAYS_CLASSES))
    terms = pd.DataFrame({
        "threshold": pd.Series(threshold, index=m.index, dtype=float),
        "samples' noise": np.sqrt(m["noise"].fillna(0) ** 2 + m["noise_base"].fillna(0) ** 2),
        "k x trial spread": (rule.k * spread).where(both, 0.0),
        "resolution floor": floor.where(both, 0.0),
        "class floor": np.maximum(cfloor_s / shorter, cfloor_rel).where(use_class, 0.0),
    })[list(BAR_TERMS)].astype(float).fillna(0.0)
    return terms.max(axis=1), terms.idxmax(axis=1), both


def verdicts(ratio: pd.Series, bar: pd.Series, cls: pd.Series | None = None) -> pd.Series:
    """faster / slower / same for time ratios (this / baseline) against the bar; a
    host-bound point beyond its bar is "unstable"."""
    out = pd.Series(np.where(ratio > 1 + bar, "slower",
                             np.where(ratio < 1 / (1 + bar), "faster", "same")),
                    index=ratio.index)
    if cls is not None:
        out = out.where(~(cls.isin(HOST_CLASSES) & out.isin(["slower", "faster"])),
                        "unstable")
    return out


def compare_pair(base: Run, run: Run, threshold: float = DEFAULT_THRESHOLD,
                 rule: Rule = DEFAULT_RULE) -> pd.DataFrame:
    """One row per point of either side: times, ratio (this / baseline), noise, bar and the
    term that set it, verdict."""
    keys = ["experiment", "point_id"]
    # a column a caller's points lack (a frame built before launch blocks) is empty
    m = base.points.reindex(columns=POINT_COLS).merge(
        run.points.reindex(columns=POINT_COLS), on=keys, how="outer", suffixes=("_base", ""),
        indicator=True)
    m["variant"] = m["variant"].fillna(m["variant_base"])
    ratio = m["median_s"] / m["median_s_base"]
    noise = np.sqrt(m["noise_base"].fillna(0) ** 2 + m["noise"].fillna(0) ** 2)
    method, method_base = m["method"].fillna(""), m["method_base"].fillna("")
    cls = point_class(method.where(method != "", method_base), small_grid(m))
    bar, bar_from, trials_both = bars(m, threshold, cls, rule)
    verdict = verdicts(ratio, bar, cls)
    timed = ratio.notna() & np.isfinite(ratio)
    both_ok = (m["status_base"] == "ok") & (m["status"] == "ok")
    other = timed & (method != "") & (method_base != "") & (method != method_base)
    verdict = verdict.where(~other, "other method")
    timed &= ~other  # no ratio across methods: it would compare different things
    verdict = verdict.where(timed | other, "untimed").where(both_ok, "not ok")
    verdict = verdict.where(m["_merge"] != "left_only", "only baseline")
    verdict = verdict.where(m["_merge"] != "right_only", "only this")
    # last: a point never measured on one side says so, whatever the other side holds
    unmeasured = (m["status_base"] == NOT_MEASURED) | (m["status"] == NOT_MEASURED)
    verdict = verdict.where(~unmeasured, "not measured")
    out = pd.DataFrame({
        "experiment": m["experiment"], "point_id": m["point_id"], "variant": m["variant"],
        "baseline": base.label, "run": run.label, "baseline_gpu": base.gpu, "gpu": run.gpu,
        "baseline_status": m["status_base"], "status": m["status"],
        "baseline_s": m["median_s_base"], "this_s": m["median_s"],
        "ratio": ratio.where(timed), "noise": noise.where(timed), "verdict": verdict,
        "baseline_method": method_base, "method": method, "class": cls,
        "trials": trials_both, "baseline_trial_spread": m["trial_spread_base"],
        "trial_spread": m["trial_spread"], "baseline_floor_s": m["floor_s_base"],
        "floor_s": m["floor_s"], "blocks": m["blocks"].fillna(m["blocks_base"]),
        "sm_count": np.fmax(m["sm_count"], m["sm_count_base"]),
        "bar": bar.where(timed), "bar_from": bar_from.where(timed),
    })
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def compare_runs(base: Run, runs: list[Run], threshold: float = DEFAULT_THRESHOLD,
                 rule: Rule = DEFAULT_RULE) -> pd.DataFrame:
    """Every run against the baseline; a run sharing no point with it is bad input."""
    frames = []
    for run in runs:
        c = compare_pair(base, run, threshold, rule)
        if shares_a_point(c):
            frames.append(c)
            continue
        raise CompareError(
            f"{run.label} shares no grid point with the baseline {base.label} "
            f"(experiments there: {', '.join(sorted(base.points['experiment'].unique()))}; "
            f"here: {', '.join(sorted(run.points['experiment'].unique()))})")
    return pd.concat(frames, ignore_index=True)


def shares_a_point(cmp: pd.DataFrame) -> bool:
    """Whether a comparison matched any point on both sides (measured or not)."""
    return bool((cmp["baseline_status"].notna() & cmp["status"].notna()).any())


def summary(cmp: pd.DataFrame) -> pd.DataFrame:
    """Verdict counts per compared run, plus its largest slowdown."""
    counts = pd.crosstab(cmp["run"], cmp["verdict"]).reindex(columns=VERDICTS, fill_value=0)
    counts = counts.reindex(cmp["run"].unique())
    counts.insert(0, "gpu", cmp.groupby("run", sort=False)["gpu"].first())
    counts["worst_ratio"] = cmp.groupby("run", sort=False)["ratio"].max()
    return counts.reset_index()


def write_comparison(cmp: pd.DataFrame | None, path: Path) -> None:
    """The comparison table, one row per (point, baseline): the figures step writes it once
    and the report renders it; `cudalab compare --csv` writes the same table. None (nothing
    to compare) writes an empty file, so a stale table never outlives its baselines."""
    with results.atomic_path(path) as tmp:
        if cmp is None:
            tmp.write_text("")
        else:  # text cells a spreadsheet would run (a point id "=cmd|...") neutralised
            safe_text.write_frame(cmp, tmp)


def read_comparison(path: Path) -> pd.DataFrame | None:
    """The table write_comparison wrote (None for its empty file): the same columns and
    types (floats exactly, as to_csv writes them in full)."""
    if path.stat().st_size == 0:
        return None
    cmp = pd.read_csv(path, keep_default_na=False, na_values=[""],
                      dtype={**dict.fromkeys(_TEXT_COLUMNS, "str"), "trials": "bool"})
    cmp[list(_EMPTY_IS_TEXT)] = cmp[list(_EMPTY_IS_TEXT)].fillna("")
    return safe_text.uncsv_frame(cmp, _TEXT_COLUMNS)


# the table's text columns (read as text even where every row left one empty); in these an
# empty cell is the text "" (a point without a timer), in the others it is missing (NaN)
_TEXT_COLUMNS = ("experiment", "point_id", "variant", "baseline", "run", "baseline_gpu", "gpu",
                 "baseline_status", "status", "verdict", "baseline_method", "method", "class",
                 "bar_from")


_EMPTY_IS_TEXT = ("baseline_method", "method", "class")


def moved(cmp: pd.DataFrame) -> pd.DataFrame:
    """The timed points that are not 'same' (slower, faster, unstable)."""
    return cmp[cmp["verdict"].isin(["slower", "faster", "unstable"])]
