"""The teacher's answers to the sobel lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import NOT_MEASURED, Answer, Run, cite, have, not_measured, num

READS_PER_OUTPUT = 8  # the kernel reads the eight neighbours; the centre's weight is 0
NO_ROWS = ("sobel's global, shared and constant kernels at one size",
           "run sobel with variants [global, shared, constant]")


def _best(run: Run, variant: str) -> pd.Series | None:
    """The variant's fastest block shape at the largest image."""
    d = run.ok().dropna(subset=["time_median_s"])
    w = pd.to_numeric(d.get("p_width"), errors="coerce")
    d = d[(w == w.max()) & (d["variant"].astype(str) == variant)] if len(d) else d
    return None if d.empty else d.loc[pd.to_numeric(d["time_median_s"]).idxmin()]


def _profiled(r: pd.Series, column: str) -> bool:
    v = r.get(column)
    return str(r.get("m_ncu_status", "")) == "ok" and (
        have(v) or (isinstance(v, str) and v != ""))


def reads_per_pixel(run: Run) -> Answer:
    r = _best(run, "global")
    if r is None:
        return not_measured(*NO_ROWS)
    h, w = num(r["p_height"]), num(r["p_width"])
    loads = READS_PER_OUTPUT * (h - 2) * (w - 2)
    ideal = 2 * h * w  # each input pixel read once, each output written once (1 B each)
    work = [f"{cite(r, 'p_width', fmt.integer)} × {cite(r, 'p_height', fmt.integer)}: "
            f"{READS_PER_OUTPUT} loads per interior output × {fmt.integer((h - 2) * (w - 2))} = "
            f"{fmt.integer(loads)} byte loads",
            f"perfect caches: {fmt.integer(h * w)} B read + {fmt.integer(h * w)} B written = "
            f"{fmt.nbytes(ideal)} from DRAM ({cite(r, 'bytes', fmt.nbytes)})",
            f"{fmt.integer(loads)} B / {cite(r, 'time_median_s', fmt.seconds)} = "
            f"{fmt.bandwidth(loads / num(r['time_median_s']) / 1e9)} of loads served"]
    numbers = {"loads": loads, "ideal_bytes": ideal,
               "load_gbps": loads / num(r["time_median_s"]) / 1e9}
    text = (f"Each interior pixel is read by the {READS_PER_OUTPUT} threads around it (the "
            "kernel skips the centre, whose Sobel weight is 0): "
            f"{fmt.integer(loads)} one-byte loads for the {fmt.integer(w)}² image. With "
            "perfect caches DRAM would see each input pixel once and each output once, "
            f"{fmt.nbytes(ideal)} in all. The kernel was served "
            f"{fmt.bandwidth(numbers['load_gbps'])} of byte loads.")
    if _profiled(r, "m_ncu_dram_bytes"):
        got = num(r["m_ncu_dram_bytes"])
        numbers["dram_over_ideal"] = got / ideal
        work.append(f"{cite(r, 'm_ncu_dram_bytes', fmt.nbytes)} / {fmt.nbytes(ideal)} = "
                    f"{fmt.sig(got / ideal)}")
        text += (f" Profiled, DRAM moved {fmt.nbytes(got)}, {fmt.sig(got / ideal)}× that: the "
                 "caches absorb the re-reads.")
    else:
        text += (f" How many bytes reached DRAM is {NOT_MEASURED.lower()}: profile.ncu would "
                 "give them (m_ncu_dram_bytes).")
    return Answer(text, work, numbers)


def shared_slower(run: Run) -> Answer:
    g, s = _best(run, "global"), _best(run, "shared")
    if g is None or s is None:
        return not_measured(*NO_ROWS)
    ratio = num(g["time_median_s"]) / num(s["time_median_s"])
    work = [f"{cite(g, 'time_median_s', fmt.seconds)} / {cite(s, 'time_median_s', fmt.seconds)}"
            f" = {fmt.ratio(ratio)} (best block shape of each)"]
    numbers = {"shared_speed_vs_global": ratio}
    text = (f"At {fmt.integer(g['p_width'])}² the shared kernel runs at {fmt.ratio(ratio)} the "
            "speed of the global one. The shared kernel does by hand what L1 already does: it "
            "copies a tile with its halo (index arithmetic with a division and a remainder "
            "per cell, a second pass for the halo), waits at __syncthreads for the slowest "
            "warp, and only then computes, while the global kernel's re-reads can hit L1.")
    if _profiled(g, "m_ncu_l1_hit_rate_pct") and _profiled(s, "m_ncu_top_stall"):
        numbers["global_l1_hit_pct"] = num(g["m_ncu_l1_hit_rate_pct"])
        work += [cite(g, "m_ncu_l1_hit_rate_pct", fmt.sig),
                 f"{cite(s, 'm_ncu_top_stall', str)}; {cite(g, 'm_ncu_top_stall', str)}"]
        stalls = str(s["m_ncu_top_stall"])
        text += (f" Profiled: the global kernel's L1 hit rate is "
                 f"{fmt.percent(numbers['global_l1_hit_pct'])}; the shared kernel's top "
                 f"stalls are {stalls}"
                 + (", the barrier among them." if "barrier" in stalls else "."))
    else:
        text += (f" Which of these costs dominates is {NOT_MEASURED.lower()}: profile.ncu "
                 "would give the global kernel's L1 hit rate and the shared kernel's stall "
                 "reasons (barrier).")
    return Answer(text, work, numbers)


def constant_weights(run: Run) -> Answer:
    g, c = _best(run, "global"), _best(run, "constant")
    if g is None or c is None:
        return not_measured(*NO_ROWS)
    ratio = num(g["time_median_s"]) / num(c["time_median_s"])
    work = [f"{cite(g, 'time_median_s', fmt.seconds)} / {cite(c, 'time_median_s', fmt.seconds)}"
            f" = {fmt.ratio(ratio)}"]
    return Answer("At each step every thread of a warp reads the same weight (the same "
                  "address) at the same time: the constant cache serves one address to the "
                  "whole warp in one broadcast, where 32 different addresses would be "
                  "serialised. The 18 weights are tiny and never written by the kernel, the "
                  "case the constant cache is built for. On this run the constant kernel runs "
                  f"at {fmt.ratio(ratio)} the speed of the global kernel, whose weights are "
                  "compiled into its instructions" + (
                      ": constant memory buys weights set at run time, not speed."
                      if ratio <= 1 else
                      ", and the constant cache's broadcast keeps up with it."), work,
                  {"constant_speed_vs_global": ratio})
