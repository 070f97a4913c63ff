"""The teacher's answers to the device_query lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num

NO_DEVICE = ("no device was queried (no GPU)", "run device_query on the GPU")


def dram_peak(run: Run) -> Answer:
    r = run.device()
    if r is None or not have(r.get("m_mem_clock_mhz"), r.get("m_bus_width_bits")):
        return not_measured(*NO_DEVICE)
    clock, bits = num(r["m_mem_clock_mhz"]), num(r["m_bus_width_bits"])
    peak = 2 * clock * 1e6 * bits / 8 / 1e9
    work = [f"{cite(r, 'm_mem_clock_mhz', fmt.integer)} MHz, "
            f"{cite(r, 'm_bus_width_bits', fmt.integer)} bits = {fmt.integer(bits / 8)} B "
            "per transfer",
            f"2 × {fmt.integer(clock)} × 10⁶ /s × {fmt.integer(bits / 8)} B = "
            f"{fmt.bandwidth(peak)}; the row's {cite(r, 'm_peak_mem_gbps', fmt.bandwidth)}"]
    numbers = {"peak_gbps": peak}
    text = (f"2 × {fmt.integer(clock)} MHz × {fmt.integer(bits)} bit / 8 = "
            f"{fmt.bandwidth(peak)}. The factor 2: the memory moves data on both edges of its "
            "clock (double data rate), two transfers per clock cycle.")
    dram = run.ceilings.dram
    if have(dram):
        numbers["measured_share"] = 100 * dram / peak
        work.append(f"measured DRAM ceiling (ceilings step, ceil_dram_gbps) "
                    f"{fmt.bandwidth(dram)} / {fmt.bandwidth(peak)} = "
                    f"{fmt.percent(numbers['measured_share'])}")
        text += (f" The best copy this run measured reaches {fmt.bandwidth(dram)}, "
                 f"{fmt.percent(numbers['measured_share'])} of it: the peak is a bound that "
                 "the DRAM's own overheads (refresh, row switches, read/write turnarounds) "
                 "keep every real copy below.")
    return Answer(text, work, numbers)


def _best_fp32(run: Run) -> pd.Series | None:
    """The fastest point on the FP32 CUDA cores (not tensor cores, not float64)."""
    t = run.table[run.table["status"].astype(str) == "ok"]
    if "roof_name" not in t:
        return None
    t = t[(t["roof_name"].astype(str) == "FP32") & (t["experiment"] != "device_query")]
    g = pd.to_numeric(t["gflops"], errors="coerce")
    return None if g.notna().sum() == 0 else t.loc[g.idxmax()]


def fp32_peak(run: Run) -> Answer:
    r = run.device()
    if r is None or not have(r.get("m_fp32_cores"), r.get("m_sm_clock_mhz")):
        return not_measured(*NO_DEVICE)
    cores, clock = num(r["m_fp32_cores"]), num(r["m_sm_clock_mhz"])
    peak = 2 * cores * clock / 1e3
    work = [f"{cite(r, 'm_fp32_cores', fmt.integer)} "
            f"({cite(r, 'm_sm_count', fmt.integer)} × "
            f"{cite(r, 'm_fp32_cores_per_sm', fmt.integer)}), "
            f"{cite(r, 'm_sm_clock_mhz', fmt.integer)} MHz",
            f"2 × {fmt.integer(cores)} × {fmt.integer(clock)} MHz = {fmt.flop_rate(peak)}; "
            f"the row's {cite(r, 'm_peak_fp32_gflops', fmt.flop_rate)}"]
    numbers = {"peak_gflops": peak}
    text = (f"2 × {fmt.integer(cores)} cores × {fmt.integer(clock)} MHz = "
            f"{fmt.flop_rate(peak)}. The 2: one fused multiply-add (a·b + c) per core per cycle "
            "counts as two floating-point operations. Only a kernel that issues an FMA on "
            "every core in every cycle, with no memory stall, could reach it: a long chain of "
            "independent FMAs on registers.")
    fp32 = run.ceilings.fp32
    if have(fp32):
        numbers["ceiling_share"] = 100 * fp32 / peak
        work.append(f"measured FP32 ceiling (FMA chains, ceil_fp32_gflops) "
                    f"{fmt.flop_rate(fp32)} = {fmt.percent(numbers['ceiling_share'])} of peak")
        text += (f" This run's FMA-chain probe reached {fmt.flop_rate(fp32)} "
                 f"({fmt.percent(numbers['ceiling_share'])}).")
    best = _best_fp32(run)
    if best is not None:
        numbers["best_kernel_share"] = 100 * num(best["gflops"]) / peak
        work.append(f"fastest FP32 CUDA-core point: {best['experiment']} "
                    f"{cite(best, 'gflops', fmt.flop_rate)} = "
                    f"{fmt.percent(numbers['best_kernel_share'])} of peak")
        text += (f" The fastest lesson kernel on the FP32 cores, {best['experiment']} "
                 f"{best['variant']}, reached {fmt.flop_rate(best['gflops'])} "
                 f"({fmt.percent(numbers['best_kernel_share'])}): a large matrix product does "
                 "enough arithmetic per byte loaded to come near.")
    return Answer(text, work, numbers)


def warps_per_sm(run: Run) -> Answer:
    r = run.device()
    if r is None or not have(r.get("m_max_warps_per_sm"), r.get("m_max_threads_per_sm")):
        return not_measured(*NO_DEVICE)
    warps, threads, size = (num(r["m_max_warps_per_sm"]), num(r["m_max_threads_per_sm"]),
                            num(r["m_warp_size"]))
    blocks = num(r["m_max_blocks_per_sm"])
    work = [f"{cite(r, 'm_max_threads_per_sm', fmt.integer)} / "
            f"{cite(r, 'm_warp_size', fmt.integer)} = {fmt.integer(threads / size)} warps; "
            f"{cite(r, 'm_max_warps_per_sm', fmt.integer)}",
            f"{cite(r, 'm_max_blocks_per_sm', fmt.integer)}: 32-thread blocks (1 warp each) "
            f"fill at most {fmt.integer(min(blocks, warps))} of {fmt.integer(warps)} warps = "
            f"{fmt.percent(100 * min(blocks, warps) / warps)}"]
    numbers = {"max_warps": warps, "one_warp_blocks_pct": 100 * min(blocks, warps) / warps}
    text = (f"An SM holds {fmt.integer(warps)} warps ({fmt.integer(threads)} threads). "
            f"Occupancy is active warps / {fmt.integer(warps)}, so no curve of the occupancy "
            f"experiment rises above 100 %; with at most {fmt.integer(blocks)} blocks per SM, "
            f"one-warp blocks stop at {fmt.percent(numbers['one_warp_blocks_pct'])}.")
    occ = run.ok("occupancy")
    w = pd.to_numeric(occ.get("m_warps_theory"), errors="coerce") if len(occ) else None
    if w is not None and w.notna().any():
        numbers["occupancy_max_warps"] = float(w.max())
        work.append(f"occupancy rows, column m_warps_theory: largest {fmt.integer(w.max())} of "
                    f"{len(w.dropna())} points (≤ {fmt.integer(warps)})")
        text += (f" The occupancy experiment's largest count is {fmt.integer(w.max())} active "
                 "warps.")
    return Answer(text, work, numbers)
