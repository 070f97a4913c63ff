"""The teacher's answers to the latency lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num

COURSE_SHARED_CYCLES = 5.0  # the question quotes the course's figure
LOAD_BYTES = 4  # each chain node is read as one 32-bit word
NO_DRAM = ("the global chain with a working set beyond L2 (DRAM latency)",
           "run latency with max_bytes several times the L2 size")


def _dram(run: Run) -> pd.Series | None:
    """The global chain's largest working set: its loads come from DRAM."""
    d = run.ok()
    d = d[d["variant"].astype(str) == "global"].dropna(subset=["m_ns_per_load"])
    if d.empty:
        return None
    r = d.loc[pd.to_numeric(d["p_working_set"]).idxmax()]
    l2 = run.ceilings.l2_bytes
    return r if not have(l2) or num(r["p_working_set"]) > l2 else None


def dependent_addresses(run: Run) -> Answer:
    r = _dram(run)
    if r is None:
        return not_measured(*NO_DRAM)
    ns = num(r["m_ns_per_load"])
    work = [f"{cite(r, 'm_ns_per_load', fmt.sig)} ns, {cite(r, 'm_cycles_per_load', fmt.sig)} "
            f"cycles per load ({cite(r, 'p_working_set', fmt.nbytes)})"]
    numbers = {"latency_ns": ns}
    text = ("If each address depends on the value just loaded, the next load cannot issue "
            "before the previous one has returned, so the time per step is the whole round "
            f"trip: here {fmt.sig(ns)} ns ({fmt.integer(round(num(r['m_cycles_per_load'])))} "
            "cycles) from DRAM. A random cycle through the chain also defeats the "
            "prefetchers. Over consecutive, independent addresses the loads overlap: "
            "thousands are in flight at once, and the loop measures the bandwidth instead")
    dram, kind = run.ceilings.bandwidth("dram")
    if have(dram):
        per = LOAD_BYTES / (dram * 1e9)
        numbers |= {"throughput_ns_per_load": per * 1e9, "latency_over_throughput": ns / 1e9 / per}
        work.append(f"at the {kind} DRAM ceiling {fmt.bandwidth(dram)}, one {LOAD_BYTES}-byte "
                    f"load completes every {LOAD_BYTES} B / {fmt.bandwidth(dram)} = "
                    f"{fmt.sig(per * 1e12)} ps GPU-wide; {fmt.sig(ns)} ns / that = "
                    f"{fmt.integer(round(ns / 1e9 / per))}")
        text += (f": one {LOAD_BYTES}-byte load every {fmt.sig(per * 1e12)} ps GPU-wide at "
                 f"{fmt.bandwidth(dram)}, {fmt.integer(round(ns / 1e9 / per))}× less than one "
                 "latency")
    return Answer(text + ".", work, numbers)


def warps_in_flight(run: Run) -> Answer:
    r, dev = _dram(run), run.device()
    dram, kind = run.ceilings.bandwidth("dram")
    if r is None or dev is None or not have(dram):
        return not_measured(NO_DRAM[0] + ", the device's SM count and a DRAM ceiling",
                            "run latency, device_query and the ceilings step on a GPU")
    ns, sms, warp = num(r["m_ns_per_load"]), num(dev["m_sm_count"]), num(dev["m_warp_size"])
    inflight = dram * 1e9 * ns * 1e-9
    per_sm = inflight / sms
    warps = per_sm / (warp * LOAD_BYTES)
    warps16 = per_sm / (warp * 16)
    limit = num(dev["m_max_warps_per_sm"])
    work = [f"Little's law: bytes in flight = {kind} DRAM ceiling {fmt.bandwidth(dram)} × "
            f"{cite(r, 'm_ns_per_load', fmt.sig)} ns = {fmt.nbytes(inflight)}",
            f"per SM: / {cite(dev, 'm_sm_count', fmt.integer)} = {fmt.nbytes(per_sm)}",
            f"one 4-byte load per thread: a warp has {fmt.integer(warp * LOAD_BYTES)} B in "
            f"flight → {fmt.nbytes(per_sm)} / {fmt.integer(warp * LOAD_BYTES)} B = "
            f"{fmt.sig(warps)} warps per SM (of "
            f"{cite(dev, 'm_max_warps_per_sm', fmt.integer)})",
            f"with 16-byte loads (float4): {fmt.sig(warps16)} warps per SM"]
    text = (f"One per thread: a dependent load waits for the previous one, so a warp has one "
            f"load of {fmt.integer(warp)} threads in flight. To keep DRAM busy the GPU needs "
            f"bandwidth × latency = {fmt.bandwidth(dram)} × {fmt.sig(ns)} ns = "
            f"{fmt.nbytes(inflight)} in flight, {fmt.nbytes(per_sm)} per SM: "
            f"{fmt.sig(warps)} warps each with one 4-byte load per thread, against "
            f"{fmt.integer(limit)} resident at most")
    text += (" — so only near-full occupancy, or several independent loads per thread "
             f"(16-byte loads need {fmt.sig(warps16)} warps), keeps the bus busy."
             if warps <= limit else
             " — more than an SM holds: only several independent loads per thread "
             f"(16-byte loads need {fmt.sig(warps16)} warps) keep the bus busy.")
    return Answer(text, work, {"bytes_in_flight": inflight, "warps_per_sm": warps,
                               "warps_per_sm_16b": warps16})


def shared_chase(run: Run) -> Answer:
    d = run.ok()
    d = d[d["variant"].astype(str) == "shared"].dropna(subset=["m_cycles_per_load"])
    if d.empty:
        return not_measured("the shared-memory chain", "run latency with the shared variant")
    r = d.iloc[0]
    cyc = float(pd.to_numeric(d["m_cycles_per_load"]).median())
    work = [f"shared rows, m_cycles_per_load: median {fmt.sig(cyc)} cycles over "
            f"{len(d)} working sets (e.g. {cite(r, 'm_cycles_per_load', fmt.sig)})",
            f"{fmt.sig(cyc)} / {fmt.sig(COURSE_SHARED_CYCLES)} = "
            f"{fmt.ratio(cyc / COURSE_SHARED_CYCLES)} the course's figure"]
    numbers = {"shared_cycles": cyc, "over_course": cyc / COURSE_SHARED_CYCLES}
    text = (f"The chase measures {fmt.sig(cyc)} cycles per shared load, "
            f"{fmt.ratio(cyc / COURSE_SHARED_CYCLES)} the course's ~5. The chain stores "
            "shared-memory addresses, so the loop does no arithmetic between loads: what it "
            "adds is the wait itself, the load-to-use latency of the whole pipeline (issue, "
            "address, bank access, write-back to the register) that the next dependent load "
            "must sit out. A figure of a few cycles is the cost per access when many "
            "independent accesses are pipelined, a throughput, not a latency")
    c, dev = run.ceilings, run.device()
    if have(c.smem) and dev is not None:
        per_clk = c.smem * 1e9 / (num(dev["m_sm_count"]) * num(dev["m_sm_clock_mhz"]) * 1e6)
        numbers["smem_bytes_per_clock_per_sm"] = per_clk
        work.append(f"measured shared ceiling {fmt.bandwidth(c.smem)} / "
                    f"({fmt.integer(dev['m_sm_count'])} SMs × "
                    f"{fmt.integer(dev['m_sm_clock_mhz'])} MHz) = {fmt.sig(per_clk)} B per "
                    "cycle per SM")
        text += (f": this run's shared-memory ceiling moves {fmt.sig(per_clk)} B per cycle "
                 "per SM, a warp-wide 4-byte access every "
                 f"{fmt.sig(128 / per_clk)} cycles")
    return Answer(text + ".", work, numbers)
