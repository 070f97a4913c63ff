"""The teacher's answers to the occupancy lesson's questions, computed from the run."""

from __future__ import annotations

import math

import pandas as pd

from cudalab import fmt
from cudalab.devicespec import spec
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num, pick

THREADS = 256  # the question's block size
LIMITS = {"warps": "m_blocks_by_warps", "blocks": "m_blocks_by_blocks",
          "registers": "m_blocks_by_registers", "shared memory": "m_blocks_by_shared_memory"}


def register_limit(run: Run) -> Answer:
    r, dev = pick(run.rows, "vec_mul_regs", block_size=THREADS), run.device()
    if r is None or dev is None or not have(r.get("m_num_regs")):
        return not_measured(f"vec_mul_regs at {THREADS} threads with its register count, or "
                            "the device's limits", "run occupancy and device_query on a GPU")
    s = spec(str(r.get("compute_capability") or dev["m_cc"]))
    regs, per_sm = int(num(r["m_num_regs"])), num(dev["m_regs_per_sm"])
    warps = math.ceil(THREADS / s.warp_size)
    per_warp = math.ceil(regs * s.warp_size / s.reg_alloc_unit) * s.reg_alloc_unit
    parts = s.warp_alloc_granularity
    warps_by_regs = int(per_sm // parts // per_warp) * parts
    blocks = warps_by_regs // warps
    by = {k: num(r.get(c)) for k, c in LIMITS.items()}
    limiter = min((v, k) for k, v in by.items() if have(v))[1]
    work = [f"{cite(r, 'm_num_regs', fmt.integer)} registers per thread × {s.warp_size} = "
            f"{fmt.integer(regs * s.warp_size)} per warp, allocated in units of "
            f"{s.reg_alloc_unit}: {fmt.integer(per_warp)}",
            f"{cite(dev, 'm_regs_per_sm', fmt.integer)} in {parts} sub-partitions: "
            f"{fmt.integer(per_sm // parts)} / {fmt.integer(per_warp)} = "
            f"{fmt.integer(per_sm // parts // per_warp)} warps each, {fmt.integer(warps_by_regs)}"
            f" per SM; {THREADS} threads = {warps} warps per block → "
            f"{fmt.integer(warps_by_regs)} / {warps} = {fmt.integer(blocks)} blocks",
            "the row's limits (blocks per SM): " + ", ".join(
                f"{k} {fmt.integer(v)}" for k, v in by.items() if have(v)),
            f"occupancy = {fmt.integer(blocks)} × {warps} / "
            f"{fmt.integer(dev['m_max_warps_per_sm'])} = "
            f"{fmt.percent(100 * blocks * warps / num(dev['m_max_warps_per_sm']))}; "
            f"{cite(r, 'm_occupancy_theory', fmt.sig)}"]
    return Answer(f"The {limiter}. vec_mul_regs uses {regs} registers per thread: a "
                  f"{THREADS}-thread block needs {warps} × {fmt.integer(per_warp)} = "
                  f"{fmt.integer(warps * per_warp)} registers, and the register file holds "
                  f"{fmt.integer(blocks)} such blocks ({fmt.integer(blocks * warps)} warps, "
                  f"{fmt.percent(100 * blocks * warps / num(dev['m_max_warps_per_sm']))}), "
                  f"where warps alone would allow {fmt.integer(by['warps'])} blocks.", work,
                  {"regs": regs, "blocks_by_registers": blocks,
                   "occupancy_pct": 100 * blocks * warps / num(dev["m_max_warps_per_sm"])})


def useless_occupancy(run: Run) -> Answer:
    d = run.ok()
    v = d[d["variant"].astype(str) == "vec_mul"].dropna(subset=["gbps", "m_occupancy_theory"])
    if len(v) < 2:
        return not_measured("vec_mul over several block sizes",
                            "run occupancy with vec_mul over block_sizes")
    occ = pd.to_numeric(v["m_occupancy_theory"])
    best = v.loc[v["gbps"].idxmax()]
    full = v[occ == occ.max()]
    top = full.loc[full["gbps"].idxmax()]
    dram, kind = run.ceilings.bandwidth("dram")
    work = [f"fastest vec_mul point: {cite(best, 'gbps', fmt.bandwidth)} at "
            f"{cite(best, 'm_occupancy_theory', fmt.sig)}",
            f"fastest at the highest occupancy: {cite(top, 'gbps', fmt.bandwidth)} at "
            f"{cite(top, 'm_occupancy_theory', fmt.sig)}"]
    numbers = {"best_gbps": num(best["gbps"]), "best_occupancy": num(best["m_occupancy_theory"]),
               "full_gbps": num(top["gbps"])}
    text = (f"When something other than resident warps limits the kernel. vec_mul is fastest "
            f"at {fmt.percent(100 * num(best['m_occupancy_theory']))} occupancy "
            f"({fmt.bandwidth(best['gbps'])}, {fmt.integer(best['p_block_size'])} threads); "
            f"at {fmt.percent(100 * occ.max())} it reaches {fmt.bandwidth(top['gbps'])}")
    if have(dram):
        numbers["best_pct_dram"] = pct = 100 * num(best["gbps"]) / dram
        work.append(f"{fmt.bandwidth(best['gbps'])} / {kind} DRAM ceiling "
                    f"{fmt.bandwidth(dram)} = {fmt.percent(pct)}")
        text += (f". Its best is {fmt.percent(pct)} of the DRAM ceiling: once enough loads are "
                 "in flight to cover the memory latency (the latency lesson's bandwidth × "
                 "latency), the bus is the limit, and more warps only queue for it. The same "
                 "holds for a compute-bound kernel at its FLOP roof, and where a few warps "
                 "with many independent instructions each already keep the units busy")
    return Answer(text + ".", work, numbers)


def zig_zag(run: Run) -> Answer:
    d = run.ok()
    v = d[d["variant"].astype(str) == "vec_mul"].dropna(subset=["m_occupancy_theory"])
    v = v.assign(t=pd.to_numeric(v["p_block_size"])).sort_values("t")
    if len(v) < 2:
        return not_measured("vec_mul over several block sizes",
                            "run occupancy with block_sizes in steps of 32")
    occ = pd.to_numeric(v["m_occupancy_theory"]).to_numpy()
    i = int((occ[:-1] - occ[1:]).argmax())  # the largest drop from one size to the next
    a, b = v.iloc[i], v.iloc[i + 1]
    work = [f"{cite(x, 'p_block_size', fmt.integer)} threads = "
            f"{math.ceil(num(x['t']) / 32)} warps; {cite(x, 'm_blocks_theory', fmt.integer)}; "
            f"{cite(x, 'm_warps_theory', fmt.integer)}; {cite(x, 'm_occupancy_theory', fmt.sig)}"
            f"; {cite(x, 'gbps', fmt.bandwidth)}" for x in (a, b)]
    return Answer(f"An SM holds whole blocks only: blocks per SM = floor(warps per SM / warps "
                  "per block) (or the register or block limit), and what is left over stays "
                  f"empty. From {fmt.integer(a['t'])} to {fmt.integer(b['t'])} threads the "
                  f"blocks that fit fall from {fmt.integer(a['m_blocks_theory'])} to "
                  f"{fmt.integer(b['m_blocks_theory'])}, so the active warps fall from "
                  f"{fmt.integer(a['m_warps_theory'])} to {fmt.integer(b['m_warps_theory'])} "
                  f"and occupancy from {fmt.percent(100 * num(a['m_occupancy_theory']))} to "
                  f"{fmt.percent(100 * num(b['m_occupancy_theory']))}, although the block "
                  "grew by one warp. Sizes that divide the SM's warps exactly fill it; the "
                  "others leave a remainder, hence the saw-tooth.", work,
                  {"drop_from": num(a["m_occupancy_theory"]),
                   "drop_to": num(b["m_occupancy_theory"])})
