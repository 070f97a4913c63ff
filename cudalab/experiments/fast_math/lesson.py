"""The fast_math lesson: its claims (each a predicate over this run's table with its
threshold and the data change that turns it over) and its facts (sentences computed from the
table). Every number in a sentence comes from the table; the only constants are the named
thresholds below."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.fast_math import answers
from cudalab.experiments.lesson import (
    Claim,
    Judgement,
    Lesson,
    TryThis,
    all_correct,
    col,
    judged,
    largest,
    no_data,
    ok,
    one_wrong,
    slower,
    with_value,
)
from cudalab.experiments.questions import Question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

FAST = ("fast_math", "intrinsics")
# On the compute-bound point (largest n, most iterations) every fast build is at least this
# much faster than the precise one: the intrinsics replace tens of instructions per call by
# one or two, so even a GPU with cheap precise functions clears it by far.
FAST_GAIN = 1.2
# "Gains almost nothing": the fastest build under this gain over precise at one iteration,
# the prediction of a purely memory-bound kernel (5 % timing noise on either side).
NOTHING_GAIN = 1.1
# The intrinsics build "lands close to" --use_fast_math: within this factor of its time on
# the compute-bound point (the same intrinsics; -use_fast_math also flushes denormals).
CLOSE = 1.1


def _done(d: pd.DataFrame) -> pd.DataFrame:
    return ok(d).dropna(subset=["time_median_s"])


def _times(d: pd.DataFrame, iterations: float) -> pd.Series:
    """Median time per variant at `iterations`, at the largest n measured there."""
    at = _done(d)
    at = largest(at[col(at, "p_iterations") == iterations], "p_n")
    return at.groupby("variant")["time_median_s"].min()


def _gain(t: pd.Series) -> float | None:
    """The fastest fast build's gain over precise (None: precise or no fast build missing)."""
    fast = t.drop("precise", errors="ignore")
    return t["precise"] / fast.min() if "precise" in t and len(fast) else None


def _n(d: pd.DataFrame) -> str:
    return fmt.integer(col(_done(d), "p_n").max())


# -- facts -----------------------------------------------------------------------------------
def fast_math_ridge(d: pd.DataFrame, c: Ceilings) -> str | None:
    """Where the iteration counts sit against the ridge point, by the FLOPs counted."""
    d = ok(d).dropna(subset=["intensity"])
    dram, _ = c.bandwidth("dram")
    roof, kind = c.flops()
    if d.empty or not (math.isfinite(dram) and math.isfinite(roof)):
        return None
    ridge = roof / dram
    by = d.groupby("p_iterations")["intensity"].max().sort_index()
    left = [int(i) for i, x in by.items() if x < ridge]
    right = [int(i) for i, x in by.items() if x >= ridge]
    s = f"The {kind} ridge point is at {fmt.short(ridge)} FLOP/byte (FP32 roof / DRAM)"
    if left:
        s += (f"; {', '.join(map(str, left))} iteration(s) sit left of it by the FLOPs "
              "counted (each sin, cos, exp and square root as one FLOP, although a precise "
              "one takes many instructions: cheaper math can still gain there)")
    if right:
        s += (f"; {', '.join(map(str, right))} iterations right of it (compute-bound: "
              "where the fast variants can win)")
    return s + "."


# -- claims ----------------------------------------------------------------------------------
def _fast_gain(d: pd.DataFrame, c: Ceilings) -> Judgement:
    done = _done(d)
    if done.empty:
        return no_data("no point measured ok")
    most = col(done, "p_iterations").max()
    t = _times(d, most)
    fast = [v for v in FAST if v in t]
    if not fast:
        return no_data("no fast build at the most iterations")
    # without the precise point, the gain each fast point recorded against its own precise
    # timing (m_speedup)
    top = largest(done[col(done, "p_iterations") == most], "p_n")
    speed = {v: (t["precise"] / t[v] if "precise" in t
                 else col(top[top["variant"] == v], "m_speedup").iloc[0]) for v in fast}
    return judged(all(s >= FAST_GAIN for s in speed.values()),
                  "; ".join(f"{v}: {fmt.ratio(s)}" for v, s in speed.items())
                  + f" at n = {fmt.integer(col(top, 'p_n').max())}, {int(most)} iterations")


def _less_accurate(d: pd.DataFrame, c: Ceilings) -> Judgement:
    err = d.assign(e=col(d, "error")).dropna(subset=["e"]).groupby("variant")["e"].max()
    fast = {v: err[v] for v in FAST if v in err}
    if "precise" not in err or not fast:
        return no_data("the precise build and a fast build not both in this run")
    return judged(all(e > err["precise"] for e in fast.values()),
                  f"largest relative error: precise {fmt.error(err['precise'])}; "
                  + "; ".join(f"{v} {fmt.error(e)}" for v, e in fast.items()))


def _gain_grows(d: pd.DataFrame, c: Ceilings) -> Judgement:
    done = _done(d)
    most = col(done, "p_iterations").max()
    one, many = _gain(_times(d, 1)), _gain(_times(d, most))
    if one is None:
        return no_data("no 1-iteration points of precise and a fast build")
    if many is None or most <= 1:
        return no_data("no points at more than 1 iteration to compare with")
    return judged(one < many, f"the fastest build gains {fmt.ratio(one)} over precise at "
                  f"1 iteration and {fmt.ratio(many)} at {int(most)} iterations")


def _one_iteration(d: pd.DataFrame, c: Ceilings) -> Judgement:
    t = _times(d, 1)
    g = _gain(t)
    if g is None:
        return no_data("no 1-iteration points of precise and a fast build")
    best = t.drop("precise").idxmin()
    return judged(g < NOTHING_GAIN,
                  f"at 1 iteration, n = {_n(d[col(d, 'p_iterations') == 1])}: precise "
                  f"{fmt.seconds(t['precise'])}, {best} {fmt.seconds(t[best])}: "
                  f"{fmt.ratio(g)}")


def _intrinsics_close(d: pd.DataFrame, c: Ceilings) -> Judgement:
    done = _done(d)
    most = col(done, "p_iterations").max()
    t = _times(d, most)
    if not set(FAST) <= set(t.index):
        return no_data("fast_math and intrinsics not both at the most iterations")
    r = t["intrinsics"] / t["fast_math"]
    return judged(1 / CLOSE <= r <= CLOSE,
                  f"intrinsics {fmt.seconds(t['intrinsics'])} vs fast_math "
                  f"{fmt.seconds(t['fast_math'])} ({fmt.ratio(r)}) at n = "
                  f"{_n(done[col(done, 'p_iterations') == most])}, {int(most)} iterations")


def _fast_at(iterations: int | None):  # noqa: ANN202 - a mask for a flip
    def mask(d: pd.DataFrame) -> pd.Series:
        it = col(d, "p_iterations")
        at = it == (it.max() if iterations is None else iterations)
        return d["variant"].isin(FAST) & at
    return mask


def _precise_at_one(d: pd.DataFrame) -> pd.Series:
    return (d["variant"] == "precise") & (col(d, "p_iterations") == 1)


EXPLANATIONS = (fast_math_ridge,)
CLAIMS = (
    Claim("every build stays within its stated error bound (precise: tolerance_precise, "
          "fast_math and intrinsics: tolerance_fast)",
          all_correct("points within bound"), one_wrong, "correct"),
    Claim(f"fast math is at least {FAST_GAIN:g}x faster than the precise build on the "
          "compute-bound kernel (largest n and iterations)", _fast_gain,
          lambda d: slower(d, lambda x: x["variant"] == "precise", 1 / 2.2), "fast_gain"),
    Claim("the fast builds are less accurate than the precise build (largest relative "
          "error over all points)", _less_accurate,
          lambda d: with_value(d, lambda x: x["variant"] == "precise", "error", 1e-3),
          "less_accurate"),
    Claim("the fast builds gain less over precise at 1 iteration than at the most "
          "iterations (the memory traffic, the same for every build, is a larger share of "
          "the time)", _gain_grows, lambda d: slower(d, _fast_at(1), 1 / 3),
          "smaller_gain_at_one"),
)
TRY_THIS = [
    TryThis("fast_math.iterations: [1]", "one evaluation of f per element: is the kernel "
            "now memory-bound, so that fast math gains almost nothing? Judged here: where "
            "the gain stays well above 1, the precise functions' instructions still cost "
            "time beside the memory traffic (the roofline counts each sin, cos, exp and "
            "square root as one FLOP; a precise one takes many instructions)",
            Claim(f"at 1 iteration (largest n) the fastest build gains under "
                  f"{NOTHING_GAIN:g}x over precise: the kernel is memory-bound and cheaper "
                  "math saves nothing", _one_iteration,
                  lambda d: slower(d, _precise_at_one, 1 / 1.45), "one_iteration_no_gain")),
    TryThis("fast_math.variants: [precise, intrinsics]", "only the hand-written __sinf / "
            "__expf build beside the precise one: it lands close to -use_fast_math, which "
            "swaps the same intrinsics in for you; compare their times and errors",
            Claim(f"the intrinsics build takes within {CLOSE:g}x the time of the "
                  "--use_fast_math build on the compute-bound kernel (largest n and "
                  "iterations)", _intrinsics_close,
                  lambda d: slower(d, lambda x: x["variant"] == "intrinsics", 1.3),
                  "intrinsics_like_fast_math")),
]

LESSON = Lesson(
    title="Fast math: --use_fast_math and intrinsics against IEEE-accurate functions",
    caption=(
        "The same kernel (sin, cos, exp, a square root and a division, evaluated `iterations` "
        "times per element) is built three ways: precise (IEEE division and square root, "
        "sinf/cosf/expf within 2 ulp), with --use_fast_math (every one of them replaced by a "
        "hardware approximation, denormals flushed) and precise but with intrinsics "
        "(__sinf, __cosf, __expf, __fdividef, rsqrtf) written into the source. Look for: the "
        "fast variants clearly faster once the kernel is compute-bound (many iterations) "
        "and a smaller gain at 1 iteration, where the memory traffic, the same for every "
        "build, is a larger share of the time; their error larger than the precise build's "
        "but still within the bounds the CUDA Programming Guide gives for these functions "
        "on [-pi, pi] (tolerance lines). Outside [-pi, pi] __sinf and __cosf have no such "
        "bound: that is why the inputs are kept there. The claims below judge each of these "
        "on this run."
    ),
    figures={
        "time_error": "Kernel time (left) and largest relative error against the float64 "
        "reference (right) of each build, against the number of evaluations per element, "
        "at the largest size. Dashed (precise) and dotted (fast builds) lines: the "
        "tolerances.",
    },
    print_figure=("time_error", None),  # on paper: time and error side by side
    print_pages=0.72,  # its share of the A4 handout
    claims=CLAIMS,
    explanations=EXPLANATIONS,
    try_this=TRY_THIS,
    questions=[
        Question(
            "Why does -use_fast_math gain more when the iteration count is large than at one "
            "iteration? What does the kernel spend its time on in each case?",
            answers.iterations),
        Question(
            "__sinf is accurate for small arguments: what happens to its error for |x| of "
            "thousands?",
            answers.large_arguments),
        Question(
            "Name a computation where the fast builds' relative error (right panel of the "
            "figure) is fine, and one where it is not.",
            answers.where_fine),
    ],
)
