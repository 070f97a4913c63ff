"""The streams lesson: its claims (each a predicate over this run's table with its threshold
and the data change that turns it over) and its facts (sentences computed from the table).
Every number in a sentence comes from the table; the only constants are the named thresholds
below.

The stages are measured alone, each on the whole array (metrics h2d_s, kernel_s, d2h_s): their
sum is the serial program's time, the slowest of them the best a pipeline can do (ideal_s), so
sum / slowest bounds the speedup any number of streams or copy engines can give."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from cudalab import fmt
from cudalab.experiments.flip import turn
from cudalab.experiments.lesson import (
    Claim,
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
    with_value,
)
from cudalab.experiments.questions import Question
from cudalab.experiments.streams import answers, duplex

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

OPS = ("H2D", "kernel", "D2H")
# The best pipeline's speedup over the serial program reaches at least this share of the
# bound the stages set (sum / slowest), and exceeds the bound by no more than the noise of
# two separate measurements (the serial program, the stages alone).
BOUND_SHARE = 0.75
BOUND_NOISE = 1.05
# One stream has nothing to overlap: at least this share of the serial program's time.
ONE_STREAM_SHARE = 0.95
# In the timeline, two or more streams' operations run at once for at least this share of
# the pipeline's time (k = 4 equal chunks of two equal copies: about 3/5 in theory).
OVERLAP_SHARE = 0.25
# Where the kernel is the slowest stage, the best pipeline takes at most this many times the
# kernel alone: the copies hide behind it (all but the first H2D and the last D2H chunk).
KERNEL_HIDES = 1.2
K80_COPY_ENGINES = 2  # the course's Tesla K80 (deviceQuery: "with 2 copy engine(s)")


# -- rows --------------------------------------------------------------------------------------
def _frame(d: pd.DataFrame) -> pd.DataFrame:
    d = ok(d)
    return d.assign(it=col(d, "p_iterations"), k=col(d, "p_nstreams"),
                    t=col(d, "time_median_s")).dropna(subset=["it", "t"])


def _stage(sub: pd.DataFrame, name: str) -> float:
    v = col(sub, f"m_{name}_s").dropna()
    return float(v.median()) if len(v) else math.nan


def _per_iterations(d: pd.DataFrame) -> list[dict[str, Any]]:
    """Per iteration count: the serial time, the streams times by count, the stages alone."""
    out = []
    for it, sub in _frame(d).groupby("it"):
        ser = sub[sub["variant"] == "serial"]["t"]
        st = sub[sub["variant"] == "streams"].set_index("k")["t"].sort_index()
        out.append({"it": int(it), "serial": float(ser.iloc[0]) if len(ser) else math.nan,
                    "streams": st, **{op: _stage(sub, op) for op in ("h2d", "kernel", "d2h")}})
    return out


def _at_iterations(it: int, variant: str, k_min: int = 1, k_max: int = 1 << 30) -> Mask:
    return lambda d: ((d["variant"] == variant) & (col(d, "p_iterations") == it)
                      & (col(d, "p_nstreams") >= k_min) & (col(d, "p_nstreams") <= k_max))


def _set_time(d: pd.DataFrame, mask: Mask, seconds: float) -> pd.DataFrame:
    """Each row in mask(d) takes `seconds`: its times and GB/s change, not the stages alone
    it carries (m_kernel_s is the kernel stage here, not this point's kernel time)."""
    d = d.copy()
    m = mask(d).to_numpy(dtype=bool)
    if seconds <= 0 or not m.any():
        return d
    factor = seconds / col(d, "time_median_s")[m]
    for c in ("time_median_s", "time_min_s", "time_mean_s"):
        if c in d:
            d.loc[m, c] = col(d, c)[m] * factor
    if "gbps" in d:
        d.loc[m, "gbps"] = col(d, "gbps")[m] / factor
    return d


# -- facts -------------------------------------------------------------------------------------
def streams_copy_engines(d: pd.DataFrame, c: Ceilings) -> str | None:
    """The copy engines this GPU reports, beside the course's K80."""
    n = col(ok(d), "m_copy_engines").dropna()
    if n.empty:
        return None
    return (f"This GPU reports {fmt.integer(n.iloc[0])} asynchronous copy engines "
            f"(cudaDevAttrAsyncEngineCount), the course's Tesla K80 {K80_COPY_ENGINES}: with "
            "two, an H2D and a D2H copy of different chunks run at once beside a kernel, "
            "which is all this pipeline asks for.")


# -- claims ------------------------------------------------------------------------------------
def _beats_serial(d: pd.DataFrame, c: Ceilings) -> Judgement:
    parts, holds = [], True
    for g in _per_iterations(d):
        multi = g["streams"][g["streams"].index >= 2]
        if multi.empty or not math.isfinite(g["serial"]):
            continue
        holds &= bool((multi < g["serial"]).all())
        parts.append(f"{g['it']} iterations: " + ", ".join(
            f"{int(k)} streams {fmt.ratio(g['serial'] / t)}" for k, t in multi.items()))
    if not parts:
        return no_data("the serial program and 2 or more streams not both in this run")
    return judged(holds, "speedup over the serial program: " + "; ".join(parts))


def _beats_fail(d: pd.DataFrame) -> pd.DataFrame:
    for g in _per_iterations(d):
        if len(g["streams"]):
            d = _set_time(d, _at_iterations(g["it"], "serial"), 0.9 * g["streams"].min())
    return d


def _beats_hold(d: pd.DataFrame) -> pd.DataFrame:
    for g in _per_iterations(d):
        d = _set_time(d, _at_iterations(g["it"], "streams", 2), 0.9 * g["serial"])
    return d


def _balance(g: dict[str, Any]) -> tuple[float, float, float] | None:
    """(speedup of the best stream count, the bound sum / slowest of the stages, their
    ratio), or None where a number is missing."""
    stages = [g["h2d"], g["kernel"], g["d2h"]]
    if g["streams"].empty or not all(math.isfinite(x) and x > 0 for x in
                                     [*stages, g["serial"]]):
        return None
    speedup = g["serial"] / g["streams"].min()
    bound = sum(stages) / max(stages)
    return speedup, bound, speedup / bound


def _stage_balance(d: pd.DataFrame, c: Ceilings) -> Judgement:
    parts, holds = [], True
    for g in _per_iterations(d):
        b = _balance(g)
        if b is None:
            continue
        speedup, bound, share = b
        holds &= BOUND_SHARE <= share <= BOUND_NOISE
        parts.append(
            f"{g['it']} iterations: stages alone H2D {fmt.seconds(g['h2d'])}, kernel "
            f"{fmt.seconds(g['kernel'])}, D2H {fmt.seconds(g['d2h'])}: bound "
            f"{fmt.ratio(bound)}; best, {int(g['streams'].idxmin())} streams, "
            f"{fmt.ratio(speedup)} = {fmt.percent(100 * share)} of it")
    if not parts:
        return no_data("the serial program, the streams and the stages alone not all in "
                       "this run")
    return judged(holds, "; ".join(parts))


def _balance_to(d: pd.DataFrame, share: float) -> pd.DataFrame:
    """The stream counts of 2 and more reach `share` of the bound."""
    for g in _per_iterations(d):
        b = _balance(g)
        if b is not None:
            best = g["serial"] / (share * b[1])
            d = _set_time(d, _at_iterations(g["it"], "streams", 2), best)
    return d


def _one_stream(d: pd.DataFrame, c: Ceilings) -> Judgement:
    parts, holds = [], True
    for g in _per_iterations(d):
        if 1 not in g["streams"].index or not math.isfinite(g["serial"]):
            continue
        r = g["streams"][1] / g["serial"]
        holds &= bool(r >= ONE_STREAM_SHARE)
        parts.append(f"{g['it']} iterations: one stream / serial = {fmt.ratio(r)}")
    if not parts:
        return no_data("the serial program and one stream not both in this run")
    return judged(holds, "; ".join(parts))


def _one_stream_to(d: pd.DataFrame, share: float) -> pd.DataFrame:
    for g in _per_iterations(d):
        d = _set_time(d, _at_iterations(g["it"], "streams", 1, 1), share * g["serial"])
    return d


def busy_spans(timeline: list[list[Any]]) -> list[list[Any]]:
    """[[stream, op, ready_ms, run_ms, end_ms], ...]: an event before an operation fires when
    its stream gets there, not when the operation starts, so a copy queued behind another
    stream's copy seems to start early. Assuming each kind of operation runs one at a time in
    issue order (one copy engine per direction; a kernel over a large chunk fills the GPU),
    it runs from max(ready, end of the previous operation of its kind)."""
    last = dict.fromkeys(OPS, 0.0)
    out = []
    for s, op, t0, t1 in sorted(timeline, key=lambda r: (r[0], OPS.index(r[1]))):
        run = min(max(t0, last[op]), t1)
        last[op] = max(last[op], t1)
        out.append([s, op, t0, run, t1])
    return out


def busy(timeline: list[list[Any]]) -> list[tuple[float, float, int]]:
    """(start, end, stream) of every operation while it ran."""
    return [(run, end, s) for s, _, _, run, end in busy_spans(timeline)]


def overlap_share(timeline: list[list[Any]]) -> float:
    """The share of the pipeline's time during which operations of two or more streams
    ran at once."""
    spans = busy(timeline)
    if not spans:
        return math.nan
    edges = sorted({t for a, b, _ in spans for t in (a, b)})
    both = sum(b - a for a, b in zip(edges, edges[1:])
               if len({s for x, y, s in spans if x <= (a + b) / 2 < y}) >= 2)
    total = max(b for _, b, _ in spans) - min(a for a, _, _ in spans)
    return both / total if total > 0 else math.nan


def _timelines(d: pd.DataFrame) -> pd.DataFrame:
    st = _frame(d)
    st = st[st["variant"] == "streams"]
    return st.dropna(subset=["m_timeline"]) if "m_timeline" in st else st.iloc[:0]


def _overlap(d: pd.DataFrame, c: Ceilings) -> Judgement:
    rows = _timelines(d)
    if rows.empty:
        return no_data("no timeline of the streams variant in this run")
    parts, holds = [], True
    for _, r in rows.iterrows():
        share = overlap_share(json.loads(r["m_timeline"]))
        holds &= bool(share >= OVERLAP_SHARE)
        parts.append(f"{int(r['it'])} iterations, {int(r['k'])} streams: "
                     f"{fmt.percent(100 * share)} of the pipeline")
    return judged(holds, "two or more streams busy at once: " + "; ".join(parts))


def serialised(timeline: list[list[Any]]) -> list[list[Any]]:
    """The same operations, each stream starting when the one before has finished."""
    out, shift, end = [], 0.0, 0.0
    for s in sorted({r[0] for r in timeline}):
        ops = [r for r in timeline if r[0] == s]
        shift = end - min(r[2] for r in ops)
        out += [[s, op, t0 + shift, t1 + shift] for _, op, t0, t1 in ops]
        end = max(r[3] for r in out)
    return out


def _timeline_to(d: pd.DataFrame, change) -> pd.DataFrame:  # noqa: ANN001
    for i, r in _timelines(d).iterrows():
        tl = json.dumps(change(json.loads(r["m_timeline"])), separators=(",", ":"))
        d = with_value(d, lambda x, i=i: pd.Series(x.index == i, index=x.index),
                       "m_timeline", tl)
    return d


def _all_at_once(timeline: list[list[Any]]) -> list[list[Any]]:
    """Every stream's operations as if each stream had its own engines."""
    first = {}
    for s, _, t0, _ in timeline:
        first[s] = min(first.get(s, t0), t0)
    return [[s, op, t0 - first[s], t1 - first[s]] for s, op, t0, t1 in timeline]


def _kernel_bound(d: pd.DataFrame) -> list[dict[str, Any]]:
    return [g for g in _per_iterations(d) if len(g["streams"]) and math.isfinite(g["kernel"])
            and g["kernel"] >= max(g["h2d"], g["d2h"])]


def _kernel_hides(d: pd.DataFrame, c: Ceilings) -> Judgement:
    found = _kernel_bound(d)
    if not found:
        return no_data("no iteration count at which the kernel is the slowest stage")
    parts, holds = [], True
    for g in found:
        r = g["streams"].min() / g["kernel"]
        holds &= bool(r <= KERNEL_HIDES)
        parts.append(f"{g['it']} iterations: best {fmt.seconds(g['streams'].min())} "
                     f"({int(g['streams'].idxmin())} streams) = {fmt.ratio(r)} the kernel "
                     f"alone ({fmt.seconds(g['kernel'])}; copies H2D {fmt.seconds(g['h2d'])}, "
                     f"D2H {fmt.seconds(g['d2h'])})")
    return judged(holds, "; ".join(parts))


def _kernel_hides_to(d: pd.DataFrame, factor: float) -> pd.DataFrame:
    for g in _kernel_bound(d):
        d = _set_time(d, _at_iterations(g["it"], "streams", 2), factor * g["kernel"])
    return d


EXPLANATIONS = (streams_copy_engines, duplex.duplex_fact)
# "with enough streams the pipeline gets within 35 % of the ideal" was this claim's twin:
# the serial program takes the sum of the stages, so best / ideal is the share of the bound
# reached; one claim, with the bound's threshold, says it.
CLAIMS = (
    Claim("every GPU result matches the float64 reference",
          all_correct("points correct"), one_wrong, "correct"),
    Claim("with 2 or more streams the pipeline beats the serial program at every iteration "
          "count", _beats_serial, turn(_beats_serial, _beats_fail, _beats_hold),
          "beats_serial"),
    Claim("the balance of the stages sets the speedup: at every iteration count the best "
          f"pipeline reaches at least {BOUND_SHARE:.0%} of the speedup the stages measured "
          "alone allow, (H2D + kernel + D2H) / slowest stage, and beats it by no more than "
          f"{BOUND_NOISE - 1:.0%} (noise)",
          _stage_balance, turn(_stage_balance, lambda d: _balance_to(d, 0.6),
                               lambda d: _balance_to(d, 0.9)), "stage_balance"),
    Claim(f"one stream is no faster than the serial program (nothing to overlap; at least "
          f"{ONE_STREAM_SHARE:.0%} of its time)", _one_stream,
          turn(_one_stream, lambda d: _one_stream_to(d, 0.8),
               lambda d: _one_stream_to(d, 1.0)), "one_stream_no_gain"),
    Claim("in the timeline, operations of two or more streams run at once for at least "
          f"{OVERLAP_SHARE:.0%} of the pipeline's time", _overlap,
          turn(_overlap, lambda d: _timeline_to(d, serialised),
               lambda d: _timeline_to(d, _all_at_once)), "timeline_overlaps"),
    Claim("H2D and D2H copies run together at full duplex: the whole array copied both ways "
          f"at once moves at least {fmt.ratio(duplex.DUPLEX_MIN)} the bytes per second of "
          "the two directions one after the other, (H2D alone + D2H alone) / both at once; "
          "two directions sharing one path would give about 1", duplex.full_duplex,
          turn(duplex.full_duplex, duplex.half_duplex, duplex.duplex_overlap),
          "copies_full_duplex"),
)
TRY_THIS = [
    TryThis("streams.iterations: [500]", "a longer kernel: the kernel becomes the slowest "
            "stage, the copies hide behind it and the speedup of many streams approaches "
            "(H2D + kernel + D2H) / kernel",
            Claim("where the kernel is the slowest stage, the best pipeline takes at most "
                  f"{KERNEL_HIDES}x the kernel alone (the copies hide behind it)",
                  _kernel_hides, turn(_kernel_hides, lambda d: _kernel_hides_to(d, 1.4),
                                      lambda d: _kernel_hides_to(d, 1.05)),
                  "kernel_hides_copies")),
    TryThis("streams.streams: [1, 2, 4]", "2 streams already overlap copy with compute; with "
            "4, H2D, kernel and D2H of different chunks can all run at once"),
    TryThis("streams.n: 1048576", "small chunks: each stage lasts microseconds, launch and "
            "synchronisation costs dominate and the speedup shrinks"),
]

LESSON = Lesson(
    title="CUDA streams: overlapping copies with computation",
    caption=(
        "The serial program copies the whole array to the GPU, runs the map kernel, and "
        "copies the result back: the copy engines and the SMs take turns and each waits for"
        " the others. Split into chunks on k streams, the H2D copy of chunk 2 runs while "
        "the kernel works on chunk 1 and the D2H copy returns chunk 0. The best possible "
        "time is the slowest of the three stages (ideal, dotted), so the serial time over "
        "the slowest stage, (H2D + kernel + D2H) / slowest, bounds the speedup however many"
        " streams or copy engines there are; k equal chunks predict sum / k + (k - 1) / k x"
        " slowest (dashed). That bound assumes H2D and D2H of different chunks run together"
        " at full speed; the duplex points time the whole array's copies both ways at once "
        "against each direction alone, and measure whether they do. Look for: every run "
        "with 2 or more streams beating the serial one, the best of them close to the bound"
        " the stages set (when the copies dominate it stays further where both directions "
        "at once run slower than each alone), one stream being no faster than serial, and "
        "in the timeline the bars of different streams overlapping in time. The "
        "`iterations` knob sets how much math each element gets, i.e. whether the copies or"
        " the kernel are the slowest stage. In the timeline, events mark when a stream "
        "reached an operation and when it finished; faint bars are time an operation was "
        "queued behind the same kind of operation of another stream (one copy engine per "
        "direction), solid bars when it ran. The claims below judge each of these on this "
        "run."
    ),
    figures={
        "pipeline": "Time of the whole H2D -> kernel -> D2H pipeline against the number of "
        "streams, with the serial program, the ideal (slowest stage alone) and the k-chunk "
        "pipeline model.",
        "timeline": "Per-stream timeline of one run (from CUDA events around every "
        "operation): the serial program and the pipeline with `timeline_streams` streams; "
        "faint: queued behind another stream's operation of the same kind.",
    },
    print_figure=("pipeline", None),  # on paper: time against streams
    print_pages=0.85,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "Why is the ideal time the slowest of H2D, kernel and D2H alone, not their sum "
            "divided by the number of streams?",
            answers.ideal_time),
        Question(
            "Which host memory must the copies use for streams to overlap, and why?",
            answers.pinned_memory),
        Question(
            "How many copy engines does this GPU have, and what would change with only one?",
            answers.copy_engines),
    ],
)
