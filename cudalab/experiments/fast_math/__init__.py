"""Fast math: one math-heavy kernel built precise, with --use_fast_math, and with explicit
intrinsics; time and accuracy against a float64 reference of the same arithmetic.

Each output is y = (1/N) sum_k f(x * (1 - k/4096)), k < N = `iterations`, with
f(t) = (1.5 + sin t) exp(-t^2/2) + sqrt(2 + t^2) / (2 + cos t), for x in [-pi, pi]
(see cuda/fast_math/fast_math.cu). Parameters of a point: n (elements), iterations, block.

Accuracy. The error bounds below are derived from the CUDA Programming Guide's tables
(maximum ulp error of the standard functions; error bounds of the intrinsics, which hold
for arguments in [-pi, pi] for __sinf/__cosf and grow with |x| for __expf), propagated
through f term by term (both terms are positive, so relative errors do not amplify), plus
2 ulp for the compensated sum and 2 ulp for the final scaling. `guide_bound()` spells the
arithmetic out. Worst cases: precise 24 u = 1.4e-6, fast 38 u = 2.3e-6 (u = 2^-24).
The default tolerances are twice these (the Guide's bounds come from extensive but not
exhaustive tests): precise 3e-6, fast_math and intrinsics 5e-6.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments import base
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.fast_math.lesson import LESSON

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

VARIANTS = ["precise", "fast_math", "intrinsics"]
FAST = ["fast_math", "intrinsics"]
U = 2.0**-24  # unit roundoff of float32 (half an ulp of 1)
STEP = 2.0**-12  # t_k = x * (1 - k * STEP), exact scale factors (cuda/fast_math/fast_math.cu)
X_MAX = float(np.nextafter(np.float32(np.pi), np.float32(0)))  # largest float32 < pi
REL_FLOOR = 0.1  # relative errors divide by max(|ref|, REL_FLOOR); f >= 0.47, so unused
# Arithmetic per evaluation of f (sin, cos, exp and sqrt counted as one each): the scale
# factor and t (3), the exponent (2), 1.5 + sin, the product, 2 + t^2, 2 + cos, the
# division, the sum of the terms (6) and the compensated sum (4): 15 + 4 functions.
FLOPS_PER_EVAL = 19

_pos_int_list = {"type": "array", "minItems": 1, "uniqueItems": True}


class FastMath(Experiment):
    name = "fast_math"
    kernel_files = ("fast_math/fast_math.cu",)
    order = 80
    lesson = LESSON
    roofline = True
    schema = block_schema({
            "sizes": {
                **_pos_int_list,
                "items": {"type": "integer", "minimum": 1, "maximum": 1 << 28},
                "default": [1 << 20, 1 << 24],
                "description": "numbers of float32 inputs (2^24 fills any current GPU)",
            },
            "iterations": {
                **_pos_int_list,
                "items": {"type": "integer", "minimum": 1, "maximum": 256},
                "default": [1, 16, 64, 256],
                "description": "evaluations of f per element: at 1 memory traffic is the "
                "largest share of the time, with many the kernel is compute-bound",
            },
            "variants": {
                **_pos_int_list,
                "items": {"enum": VARIANTS},
                "default": VARIANTS,
            },
            "block": {
                "enum": [64, 128, 256, 512, 1024], "default": 256,
                "description": "threads per block",
            },
            "check_samples": {
                "type": "integer", "minimum": 1, "maximum": 1 << 24, "default": 1 << 17,
                "description": "outputs compared with the float64 reference (a fixed random "
                "subset when n is larger; every output is checked to be finite)",
            },
            "tolerance_precise": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 3e-6,
                "description": "largest max relative error of the precise build that passes "
                "(2x the bound derived from the Guide's ulp tables: 1.4e-6)",
            },
            "tolerance_fast": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 5e-6,
                "description": "largest max relative error of fast_math and intrinsics that "
                "passes (2x the bound derived from the Guide's intrinsic bounds: 2.3e-6)",
            },
        })
    smoke = {"sizes": [1000, 65536], "iterations": [1, 7], "check_samples": 4096}

    def check_config(self, block: dict[str, Any]) -> list[str]:
        if block["tolerance_fast"] < block["tolerance_precise"]:
            return [f"tolerance_fast: {block['tolerance_fast']} is below tolerance_precise "
                    f"({block['tolerance_precise']}); the fast builds cannot be held to a "
                    "tighter bound than the precise one"]
        return []

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        variants = [v for v in VARIANTS if v in block["variants"]]  # precise first
        return [
            Point(self.name, v, {"n": n, "iterations": it, "block": block["block"]})
            for n in sorted(block["sizes"])
            for it in sorted(block["iterations"])
            for v in variants
        ]

    def gpu_bytes(self, point: Point) -> int:
        return 2 * 4 * point.params["n"]  # x and y, float32

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        return _compile(ctx, point.variant)

    def _inputs(self, ctx: RunContext, n: int) -> dict[str, Any]:
        """Inputs, sampled check indices and per-iteration references and precise times
        of one size (one size in memory at a time: points are ordered by size)."""
        def make() -> dict[str, Any]:
            x = inputs(ctx.rng, n)
            m = ctx.block["check_samples"]
            idx = None if n <= m else np.sort(ctx.rng.choice(n, size=m, replace=False))
            return {"n": n, "x": x, "idx": idx, "ref": {}, "precise_s": {}}

        return ctx.cache.one_per_slot("fast_math", ("fast_math", n), make)

    def measure(self, ctx: RunContext, point: Point) -> Result:
        gpu = ctx.gpu
        cuda = gpu.cuda
        p = point.params
        n, it, bs = p["n"], p["iterations"], p["block"]
        c = self._inputs(ctx, n)
        x, idx = c["x"], c["idx"]
        if it not in c["ref"]:
            c["ref"][it] = reference(x if idx is None else x[idx], it)
        ref = c["ref"][it]
        kernel = self.kernel_for(ctx, point)
        y = np.empty(n, np.float32)
        x_d, y_d = cuda.mem_alloc(x.nbytes), cuda.mem_alloc(y.nbytes)
        try:
            cuda.memcpy_htod(x_d, x)
            launch = _launcher(kernel, x_d, y_d, n, it, bs)
            tol = ctx.block["tolerance_precise" if point.variant == "precise"
                            else "tolerance_fast"]
            seen: dict[str, Any] = {}

            def check(y: np.ndarray) -> Check:
                seen["nonfinite"] = nonfinite = int(n - np.count_nonzero(np.isfinite(y)))
                max_abs, max_rel = errors(y if idx is None else y[idx], ref)
                if nonfinite:
                    max_rel = max_abs = math.inf
                seen["max_abs"], seen["max_rel"] = max_abs, max_rel
                detail = (f"{nonfinite} outputs not finite (unwritten?)" if nonfinite else
                          f"{len(ref)} of {n} outputs checked; max abs err {max_abs:.3g}")
                return Check(max_rel, tol, "max_rel_err", detail)

            check_result, timing = self.verify_then_time(
                ctx, launch, check, output=(y_d, y), asynchronous=True, check_each_trial=True)
            t = timing.stats()["median"]
            if point.variant == "precise":
                c["precise_s"][it] = t
            elif it not in c["precise_s"]:
                # the precise point was reused from an earlier job: time it again here
                pre = _launcher(_compile(ctx, "precise"), x_d, y_d, n, it, bs)
                c["precise_s"][it] = ctx.harness.measure(
                    pre, gpu.event_timer(), asynchronous=True).stats()["median"]
        finally:
            ctx.cache.retire(x_d, y_d)  # freed after the point's trials: each lands anew
        max_abs, max_rel, nonfinite = seen["max_abs"], seen["max_rel"], seen["nonfinite"]
        metrics = {
            "max_abs_err": float(max_abs), "max_rel_err": float(max_rel),
            "kernel_s": t, "precise_s": c["precise_s"][it],
            "speedup": c["precise_s"][it] / t, "checked": int(len(ref)),
            "nonfinite": nonfinite,
        }
        return Result(timing, float(FLOPS_PER_EVAL) * n * it, 8.0 * n, check_result, metrics,
                      kernel=kernel, extra={"guide_bound": guide_bound(point.variant)})

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        d = self.ok(df).copy()
        if d.empty:
            return d
        return d[d["p_n"] == d["p_n"].max()].sort_values(["p_iterations", "variant"])

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        if name != "time_error":
            raise KeyError(name)
        d = self._frame(df)
        if d.empty:
            return None
        d = d.assign(time_ms=d["time_median_s"] * 1e3,
                     iterations=d["p_iterations"].astype(int).astype(str))
        order = [str(i) for i in sorted(d["p_iterations"].astype(int).unique())]
        hue_order = [v for v in VARIANTS if v in set(d["variant"])]
        fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.8))
        sns.barplot(data=d, x="iterations", y="time_ms", hue="variant", order=order,
                    hue_order=hue_order, ax=ax_t)
        ax_t.set_yscale("log")
        ax_t.set(xlabel="evaluations of f per element (iterations)",
                 ylabel="kernel time (ms, log scale)",
                 title=f"Time per build, n = {int(d['p_n'].iloc[0]):,} elements")
        sns.barplot(data=d, x="iterations", y="error", hue="variant", order=order,
                    hue_order=hue_order, ax=ax_e)
        ax_e.set_yscale("log")
        tols = d.groupby(d["variant"] == "precise")["tolerance"].max()
        for is_precise, tol in tols.items():
            if pd.notna(tol):
                ax_e.axhline(tol, ls="--" if is_precise else ":", lw=1.2, color="0.3",
                             label=f"tolerance, {'precise' if is_precise else 'fast builds'}"
                             f" ({tol:.0e})")
        top = max(d["error"].max(), tols.max()) if tols.notna().any() else d["error"].max()
        ax_e.set_ylim(top=top * 4)
        ax_e.set(xlabel="evaluations of f per element (iterations)",
                 ylabel="max relative error vs float64 (log scale)",
                 title="Accuracy per build (lines: tolerances)")
        ax_t.legend(title="build", fontsize=8)
        ax_e.legend(title="build", fontsize=8, loc="upper left", ncols=2)
        fig.tight_layout()
        return fig



# -- the pieces the tests check ----------------------------------------------------------
def inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """n float32 values uniform in [-pi, pi] (strictly inside: the intrinsics' range)."""
    x = base.uniform_f32(rng, n, -X_MAX, X_MAX)
    return np.clip(x, -np.float32(X_MAX), np.float32(X_MAX))


def f64(t: np.ndarray) -> np.ndarray:
    t = np.asarray(t, dtype=np.float64)
    return (1.5 + np.sin(t)) * np.exp(-0.5 * t * t) + np.sqrt(2.0 + t * t) / (2.0 + np.cos(t))


def reference(x: np.ndarray, iterations: int) -> np.ndarray:
    """The kernel's arithmetic in float64: t_k is the float32 product x * (1 - k/4096),
    rounded exactly as the kernel rounds it; f, the sum and the mean are float64."""
    x = np.asarray(x, dtype=np.float32)
    acc = np.zeros(x.shape, np.float64)
    for k in range(iterations):
        t = x * np.float32(1.0 - k * STEP)  # float32 * float32 -> float32, rounded (IEEE)
        acc += f64(t)
    return acc / iterations


def errors(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max |out - ref|, max |out - ref| / max(|ref|, REL_FLOOR)); inf if anything is not
    finite."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if o.size == 0:
        return 0.0, 0.0
    if not np.all(np.isfinite(o)):
        return math.inf, math.inf
    diff = np.abs(o - r)
    return float(diff.max()), float((diff / np.maximum(np.abs(r), REL_FLOOR)).max())


def guide_bound(variant: str) -> float:
    """Worst-case relative error of one output, from the CUDA Programming Guide's error
    tables, for |t| <= pi, in float32 (u = 2^-24; k ulp of v is at most 2k u |v|).

    term 1 = (1.5 + sin t) * exp(-t^2/2):   1.5 + sin t >= 0.5, |t^2/2| <= pi^2/2
    term 2 = sqrt(2 + t^2) / (2 + cos t):    2 + t^2 >= 2, 2 + cos t >= 1
    """
    arg = math.pi**2 / 2  # largest |exponent|
    if variant == "precise":
        sin_abs = 2 * 2 * U  # sinf: 2 ulp, |sin| <= 1
        exp_rel = 2 * 2 * U  # expf: 2 ulp
        sqrt_rel = U  # IEEE square root: correctly rounded
        cos_abs = 2 * 2 * U  # cosf: 2 ulp
        div_rel = U  # IEEE division
    elif variant in FAST:
        sin_abs = 2**-21.41  # __sinf on [-pi, pi]
        exp_rel = (2 + math.floor(1.173 * arg)) * 2 * U  # __expf: 2 + floor(1.173 |x|) ulp
        # sqrtf under -prec-sqrt=false: 1 ulp; a * rsqrtf(a): 2 ulp + the product
        sqrt_rel = 2 * U if variant == "fast_math" else 2 * 2 * U + U
        cos_abs = 2**-21.19  # __cosf on [-pi, pi]
        div_rel = 2 * 2 * U  # x/y under -prec-div=false and __fdividef: 2 ulp
    else:
        raise KeyError(variant)
    # term 1: sin error relative to 1.5 + sin t (>= 0.5), the add, the exponent's own
    # rounding (relative u on |arg|, times |arg| through exp), exp, the product
    t1 = sin_abs / 0.5 + U + arg * U + exp_rel + U
    # term 2: 2 + t^2 (two roundings, halved by the square root), the root, cos relative
    # to 2 + cos t (>= 1) and that add, the division
    t2 = (2 * U) / 2 + sqrt_rel + (cos_abs / 1.0 + U) + div_rel
    f = max(t1, t2) + U  # positive terms: the sum keeps the larger relative error
    return f + 2 * U + 2 * U  # compensated sum; 1/N rounded and the final product


def _compile(ctx: RunContext, variant: str) -> Any:
    if variant == "precise":
        return ctx.gpu.compile("fast_math/fast_math.cu")
    if variant == "fast_math":
        return ctx.gpu.compile("fast_math/fast_math.cu", options=["--use_fast_math"])
    return ctx.gpu.compile("fast_math/fast_math.cu", {"USE_INTRINSICS": 1})


def _launcher(kernel: Any, x_d: Any, y_d: Any, n: int, iterations: int, block: int):
    func = kernel.function("fast_math_kernel")
    func.prepare("PPiif")
    grid = ((n + block - 1) // block, 1)
    inv = float(np.float32(1.0 / iterations))

    def launch() -> None:
        func.prepared_call(grid, (block, 1, 1), x_d, y_d, n, iterations, inv)

    return launch
