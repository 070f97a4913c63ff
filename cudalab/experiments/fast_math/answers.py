"""The teacher's answers to the fast_math lesson's questions, computed from the run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num, pick

FLOAT32_EPS = float(np.finfo(np.float32).eps)  # one unit in the last place at 1.0


def _largest_n(run: Run) -> pd.DataFrame:
    d = run.ok().dropna(subset=["time_median_s"])
    n = pd.to_numeric(d.get("p_n"), errors="coerce")
    return d[n == n.max()] if len(d) else d


def iterations(run: Run) -> Answer:
    d = _largest_n(run)
    it = pd.to_numeric(d.get("p_iterations"), errors="coerce")
    if d.empty or it.nunique() < 2:
        return not_measured("fast_math at one and at many iterations",
                            "run fast_math with iterations [1, 256]")
    lo, hi = it.min(), it.max()
    rows = {(v, i): pick(d, v, iterations=i) for v in ("precise", "fast_math") for i in (lo, hi)}
    if any(r is None for r in rows.values()):
        return not_measured("precise and fast_math at the same sizes",
                            "run fast_math with variants [precise, fast_math]")
    gain = {i: num(rows["precise", i]["time_median_s"]) / num(rows["fast_math", i]["time_median_s"])
            for i in (lo, hi)}
    p_lo, p_hi = rows["precise", lo], rows["precise", hi]
    inten = {i: num(rows["precise", i]["flops"]) / num(rows["precise", i]["bytes"])
             for i in (lo, hi)}
    work = [f"{int(i)} iteration(s): {cite(rows['precise', i], 'time_median_s', fmt.seconds)} / "
            f"{cite(rows['fast_math', i], 'time_median_s', fmt.seconds)} = {fmt.ratio(gain[i])}; "
            f"intensity flops / bytes = {fmt.sig(inten[i])} FLOP/B" for i in (lo, hi)]
    numbers = {"gain_low": gain[lo], "gain_high": gain[hi]}
    text = (f"At n = {fmt.integer(p_lo['p_n'])} the fast build gains {fmt.ratio(gain[lo])} at "
            f"{int(lo)} iteration and {fmt.ratio(gain[hi])} at {int(hi)}. ")
    dram, kind = run.ceilings.bandwidth("dram")
    fp32, _ = run.ceilings.flops()
    if have(dram, fp32):
        ridge = fp32 / dram
        share = 100 * num(p_lo["gbps"]) / dram
        numbers |= {"ridge": ridge, "low_pct_dram": share}
        work.append(f"ridge = {fmt.flop_rate(fp32)} / {fmt.bandwidth(dram)} = {fmt.sig(ridge)} "
                    f"FLOP/B; {cite(p_lo, 'gbps', fmt.bandwidth)} = {fmt.percent(share)} of the "
                    f"{kind} DRAM ceiling")
        text += (f"At {int(lo)} iteration the kernel does {fmt.sig(inten[lo])} FLOP per byte, "
                 f"below the ridge at {fmt.sig(ridge)}: reading x and writing y take much of "
                 f"its time (the precise build moves {fmt.bandwidth(p_lo['gbps'])}, "
                 f"{fmt.percent(share)} of the DRAM ceiling), and faster math only shortens "
                 f"the rest. At {int(hi)} iterations it does {fmt.sig(inten[hi])} FLOP per "
                 "byte: the time is the instructions of sinf and expf, which the fast versions "
                 f"cut ({fmt.flop_rate(p_hi['gflops'])} precise against "
                 f"{fmt.flop_rate(rows['fast_math', hi]['gflops'])} fast).")
    return Answer(text.strip(), work, numbers)


def large_arguments(run: Run) -> Answer:
    d = run.ok()
    r = d[d["variant"].astype(str) == "intrinsics"].dropna(subset=["m_max_abs_err"])
    why = ("this run's inputs are uniform in [-π, π], where __sinf's error is bounded; "
           "nothing here feeds it |x| of thousands")
    would = ("a point whose inputs span |x| up to 10⁴, checked against a float64 sin, which "
             "would show __sinf's absolute error growing with |x| (it reduces the argument "
             "with a short approximation of π, and the reduction's error scales with |x|), "
             "while sinf stays within a few ulp")
    if r.empty:
        return not_measured(why, would)
    one = r.loc[pd.to_numeric(r["p_iterations"]).idxmin()]
    return Answer(f"Not measured in this run: {why}. To measure it: {would}. In range, this "
                  f"run's intrinsics build errs by at most "
                  f"{fmt.error(one['m_max_abs_err'])} (absolute) after "
                  f"{int(num(one['p_iterations']))} iteration.",
                  [cite(one, "m_max_abs_err", fmt.error)],
                  {"in_range_abs_err": num(one["m_max_abs_err"])}, measured=False)


def where_fine(run: Run) -> Answer:
    d = run.ok().dropna(subset=["m_max_rel_err"])
    worst = {v: d[d["variant"].astype(str) == v] for v in ("fast_math", "precise")}
    if any(w.empty for w in worst.values()):
        return not_measured("the precise and fast builds' errors",
                            "run fast_math with variants [precise, fast_math]")
    f = worst["fast_math"].loc[pd.to_numeric(worst["fast_math"]["m_max_rel_err"]).idxmax()]
    p = worst["precise"].loc[pd.to_numeric(worst["precise"]["m_max_rel_err"]).idxmax()]
    ulp_f, ulp_p = num(f["m_max_rel_err"]) / FLOAT32_EPS, num(p["m_max_rel_err"]) / FLOAT32_EPS
    work = [f"largest {cite(f, 'm_max_rel_err', fmt.error)} / float32 ε "
            f"{fmt.error(FLOAT32_EPS)} = {fmt.sig(ulp_f)} ulp",
            f"largest {cite(p, 'm_max_rel_err', fmt.error)} = {fmt.sig(ulp_p)} ulp"]
    return Answer(f"The fast build's largest relative error here is "
                  f"{fmt.error(f['m_max_rel_err'])}, about {fmt.sig(ulp_f)} units in the last "
                  f"place of a float32 (the precise build: {fmt.sig(ulp_p)}). Fine: shading, "
                  "audio or image filters, neural-network activations, Monte Carlo "
                  "simulations, anything whose inputs or statistical noise are far less "
                  "accurate than that. Not fine: long recurrences that feed the result back "
                  "in (the error compounds), differences of nearly equal values (cancellation "
                  "turns a small relative error into a large one), large arguments (see the "
                  "previous question), or results compared at a tolerance near float32's own "
                  "precision.", work, {"fast_ulp": ulp_f, "precise_ulp": ulp_p})
