"""The teacher's answers to the vector_add lesson's questions, computed from the run."""

from __future__ import annotations

import math

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num, pick

VARIANT = "gpu"  # the vector additions (other variants of the folder are probes)
# The question's example: n = 50 000 in blocks of 256 threads.
EXAMPLE_N, EXAMPLE_THREADS = 50000, 256
# Blocks per ns within this share of each other: "the same block rate".
SAME_RATE = 0.25


def _largest(run: Run) -> pd.DataFrame:
    d = run.ok()
    d = d[d["variant"].astype(str) == VARIANT].dropna(subset=["gbps"])  # not a probe's rows
    n = pd.to_numeric(d.get("p_n"), errors="coerce")
    return d[n == n.max()] if len(d) else d


def bytes_per_element(run: Run) -> Answer:
    big = _largest(run)
    if big.empty:
        return not_measured("no vector_add point was timed",
                            "run vector_add on a GPU (experiments.vector_add)")
    r = big.loc[big["gbps"].idxmax()]
    n, b, f = num(r["p_n"]), num(r["bytes"]), num(r["flops"])
    per, flop = b / n, f / n
    intensity = f / b
    c = run.ceilings
    dram, dkind = c.bandwidth("dram")
    fp32, fkind = c.flops("float32")
    work = [f"{cite(r, 'bytes', fmt.integer)} for {cite(r, 'p_n', fmt.integer)}: "
            f"{fmt.integer(b)} / {fmt.integer(n)} = {fmt.integer(per)} B per element "
            "(read a[i] and b[i], write c[i], 4 B each)",
            f"{cite(r, 'flops', fmt.integer)}: {fmt.integer(flop)} FLOP per element, intensity "
            f"{fmt.sig(f)} / {fmt.sig(b)} = {fmt.sig(intensity)} FLOP/B"]
    numbers = {"bytes_per_element": per, "intensity": intensity, "gbps": num(r["gbps"])}
    text = (f"Each element reads two float32 inputs and writes one output: "
            f"{fmt.integer(per)} B for {fmt.integer(flop)} FLOP (one addition), an intensity "
            f"of {fmt.sig(intensity)} FLOP/B.")
    if have(dram, fp32):
        ridge = fp32 / dram
        numbers |= {"ridge": ridge, "pct_dram": 100 * num(r["gbps"]) / dram,
                    "pct_fp32": 100 * num(r["gflops"]) / fp32}
        work += [f"ridge point = {fkind} FP32 roof / {dkind} DRAM ceiling = "
                 f"{fmt.flop_rate(fp32)} / {fmt.bandwidth(dram)} = {fmt.sig(ridge)} FLOP/B",
                 f"{cite(r, 'gbps', fmt.bandwidth)} = {fmt.percent(numbers['pct_dram'])} of "
                 f"the DRAM ceiling; {cite(r, 'gflops', fmt.flop_rate)} = "
                 f"{fmt.percent(numbers['pct_fp32'])} of the FP32 roof"]
        text += (f" The roofline's ridge is at {fmt.sig(ridge)} FLOP/B, "
                 f"{fmt.sig(ridge / intensity)}× higher, so memory limits it: the best point "
                 f"moves {fmt.bandwidth(r['gbps'])} ({fmt.percent(numbers['pct_dram'])} of the "
                 f"DRAM ceiling) while computing {fmt.flop_rate(r['gflops'])} "
                 f"({fmt.percent(numbers['pct_fp32'])} of the FP32 roof).")
    return Answer(text, work, numbers)


def blocks_of_the_example(run: Run) -> Answer:
    r = pick(run.ok(), VARIANT, n=EXAMPLE_N, threads=EXAMPLE_THREADS)
    if r is None or not have(r.get("m_blocks")):
        return not_measured(f"no vector_add point at n = {fmt.integer(EXAMPLE_N)} with "
                            f"{EXAMPLE_THREADS} threads", "add 50000 to vector_add.sizes and "
                            "256 to vector_add.threads")
    blocks = num(r["m_blocks"])
    idle = blocks * EXAMPLE_THREADS - EXAMPLE_N
    work = [f"{cite(r, 'm_blocks', fmt.integer)} (the grid the run launched; "
            f"ceil({fmt.integer(EXAMPLE_N)} / {EXAMPLE_THREADS}) = "
            f"{math.ceil(EXAMPLE_N / EXAMPLE_THREADS)})",
            f"threads launched = {fmt.integer(blocks)} × {EXAMPLE_THREADS} = "
            f"{fmt.integer(blocks * EXAMPLE_THREADS)}; idle = that − "
            f"{fmt.integer(EXAMPLE_N)} = {fmt.integer(idle)}",
            f"{cite(r, 'time_median_s', fmt.seconds)}, {cite(r, 'gbps', fmt.bandwidth)}"]
    return Answer(f"{fmt.integer(blocks)} blocks; the last one holds "
                  f"{fmt.integer(EXAMPLE_THREADS - idle)} elements, so {fmt.integer(idle)} of "
                  f"its threads fail the bounds check and do nothing. The whole kernel took "
                  f"{fmt.seconds(r['time_median_s'])}.", work,
                  {"blocks": blocks, "idle_threads": idle, "time_s": num(r["time_median_s"])})


def _resident_warps(threads: float, dev: pd.Series) -> float:
    """Warps an SM holds of this block size, by the block and warp limits alone."""
    per_block = math.ceil(threads / num(dev["m_warp_size"]))
    return min(num(dev["m_max_blocks_per_sm"]) * per_block, num(dev["m_max_warps_per_sm"]))


def small_blocks(run: Run) -> Answer:
    big, dev = _largest(run), run.device()
    rows = {int(t): big[pd.to_numeric(big["p_threads"]) == t].iloc[0]
            for t in (32, 64, 128, 256) if (pd.to_numeric(big.get("p_threads")) == t).any()}
    if dev is None or len(rows) < 4 or not have(*(r.get("m_blocks") for r in rows.values())):
        return not_measured("vector_add at 32, 64, 128 and 256 threads per block, or the "
                            "device's block and warp limits (device_query)",
                            "run vector_add with threads [32, 64, 128, 256] and device_query")
    work, numbers = [], {}
    for t, r in rows.items():
        rate = num(r["m_blocks"]) / (num(r["time_median_s"]) * 1e9)
        warps = _resident_warps(t, dev)
        numbers |= {f"blocks_per_ns_{t}": rate, f"warps_{t}": warps, f"gbps_{t}": num(r["gbps"])}
        work.append(f"{t} threads: {cite(r, 'm_blocks', fmt.integer)} / "
                    f"{cite(r, 'time_median_s', fmt.seconds)} = {fmt.sig(rate)} blocks per ns; "
                    f"resident warps per SM = min({fmt.integer(dev['m_max_blocks_per_sm'])} "
                    f"blocks × {math.ceil(t / num(dev['m_warp_size']))} warp(s), "
                    f"{fmt.integer(dev['m_max_warps_per_sm'])}) = {fmt.integer(warps)} "
                    f"(device_query m_max_blocks_per_sm, m_max_warps_per_sm); "
                    f"{cite(r, 'gbps', fmt.bandwidth)}")
    rates = [numbers[f"blocks_per_ns_{t}"] for t in (32, 64, 128)]
    same_rate = max(rates) / min(rates) - 1 <= SAME_RATE
    same_warps = numbers["warps_64"] == numbers["warps_128"]
    text = (f"At n = {fmt.integer(rows[256]['p_n'])}, 32-thread blocks reach "
            f"{fmt.bandwidth(numbers['gbps_32'])} against {fmt.bandwidth(numbers['gbps_256'])} "
            f"for 256 threads. ")
    if same_rate:
        more = num(rows[32]["m_blocks"]) / num(rows[256]["m_blocks"])
        text += (f"32-, 64- and 128-thread blocks all retire about {fmt.sig(min(rates))}–"
                 f"{fmt.sig(max(rates))} blocks per ns GPU-wide: time follows the number of "
                 f"blocks, a fixed cost per block, and 32-thread blocks need "
                 f"{fmt.integer(more)}× the blocks of 256-thread ones for the same work.")
        text += _where_dram_takes_over(numbers, min(rates), run)
    else:
        text += (f"The block rate differs between 32, 64 and 128 threads ({fmt.sig(rates[0])}, "
                 f"{fmt.sig(rates[1])}, {fmt.sig(rates[2])} blocks per ns), so a fixed cost "
                 "per block does not explain it alone on this run.")
    apart = numbers["gbps_128"] / numbers["gbps_64"] - 1 > SAME_RATE
    if same_warps and apart:
        text += (f" Latency hiding is not the cause: 64- and 128-thread blocks both fill "
                 f"{fmt.integer(numbers['warps_64'])} warps per SM, yet reach "
                 f"{fmt.bandwidth(numbers['gbps_64'])} and "
                 f"{fmt.bandwidth(numbers['gbps_128'])}.")
    elif same_warps:
        text += (f" 64- and 128-thread blocks fill the same {fmt.integer(numbers['warps_64'])} "
                 "warps per SM and run at about the same speed: this run cannot tell a cost "
                 "per block from too few warps to hide latency there.")
    numbers["same_block_rate"] = float(same_rate)
    return Answer(text, work, numbers)


def _where_dram_takes_over(numbers: dict[str, float], rate: float, run: Run) -> str:
    """Where 256-thread blocks retire blocks more slowly than small blocks: DRAM limits."""
    dram, kind = run.ceilings.bandwidth("dram")
    r256 = numbers["blocks_per_ns_256"]
    if not have(dram) or r256 >= (1 - SAME_RATE) * rate:
        return ""
    numbers["pct_dram_256"] = pct = 100 * numbers["gbps_256"] / dram
    return (f" At 256 threads the block rate falls to {fmt.sig(r256)} per ns: there the "
            f"kernel moves {fmt.percent(pct)} of the {kind} DRAM ceiling "
            f"({fmt.bandwidth(dram)}), which limits it instead.")
