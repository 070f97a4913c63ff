"""The teacher's answers to the static_analysis lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import NOT_MEASURED, Answer, Run, cite, have, not_measured, num

ARCHS = ("sm_75", "sm_90")
TENSOR_CORE = "tc_"  # the tensor-core kernels' names
NO_BUILDS = ("no ptxas report (static_analysis did not run)",
             "run static_analysis (nvcc only, no GPU needed)")


def _builds(run: Run) -> pd.DataFrame:
    d = run.ok().dropna(subset=["m_registers"])
    return d.assign(key=d["variant"].astype(str) + " " + d.get(
        "p_flags", pd.Series("", index=d.index)).fillna("").astype(str))


def registers_by_arch(run: Run) -> Answer:
    d = _builds(run)
    a, b = (d[d["p_arch"].astype(str) == arch].set_index("key") for arch in ARCHS)
    both = a.index.intersection(b.index)
    if both.empty:
        return not_measured(f"builds of the same kernels for {ARCHS[0]} and {ARCHS[1]}",
                            f"run static_analysis with archs: [{ARCHS[0]}, {ARCHS[1]}]")
    ra, rb = (pd.to_numeric(x.loc[both, "m_registers"]) for x in (a, b))
    diff = (rb - ra)
    changed = diff[diff != 0]
    # the example leaves out tensor-core kernels: sm_75 lacks TF32 and BF16 tensor cores, so
    # its build of them is another program, not another translation of the same one
    comparable = changed[[not k.startswith(TENSOR_CORE) for k in changed.index]]
    work = [f"{len(both)} kernels built for both: {len(changed)} differ in m_registers"]
    numbers = {"kernels": len(both), "differ": len(changed)}
    text = (f"{len(changed)} of the {len(both)} kernels built for both {ARCHS[0]} and "
            f"{ARCHS[1]} get a different register count. ")
    if len(comparable):
        k = comparable.abs().idxmax()
        numbers |= {"largest_sm75": num(ra[k]), "largest_sm90": num(rb[k])}
        work.append("largest change outside the tensor-core kernels: "
                    f"{cite(a.loc[k], 'm_registers', fmt.integer, f'{k.strip()} {ARCHS[0]}')}"
                    f" → {cite(b.loc[k], 'm_registers', fmt.integer, ARCHS[1])}")
        text += (f"The largest change (tensor-core kernels aside): {k.strip()}, "
                 f"{fmt.integer(ra[k])} registers on {ARCHS[0]} and {fmt.integer(rb[k])} on "
                 f"{ARCHS[1]}. ")
    text += ("The PTX is the same, but ptxas translates it into a different machine code for "
             "each architecture: another instruction set, other latencies to schedule "
             "around, and a register allocator tuned per architecture, which trades "
             "registers against instruction count and latency hiding differently.")
    return Answer(text, work, numbers)


def _latency_cycles(run: Run) -> dict[str, float]:
    """Cycles per dependent global load of the latency lesson: L1-, L2- and DRAM-sized."""
    d = run.ok("latency")
    d = d[d["variant"].astype(str) == "global"].dropna(subset=["m_cycles_per_load"])
    if d.empty:
        return {}
    ws, cyc = pd.to_numeric(d["p_working_set"]), pd.to_numeric(d["m_cycles_per_load"])
    return {"L1": float(cyc[ws == ws.min()].iloc[0]), "DRAM": float(cyc[ws == ws.max()].iloc[0])}


def spills(run: Run) -> Answer:
    d = _builds(run)
    s = pd.to_numeric(d.get("m_spill_stores"), errors="coerce")
    if d.empty:
        return not_measured(*NO_BUILDS)
    spilled = d[s > 0]
    text = ("A spilled value lives in local memory: per-thread memory that is physically "
            "device DRAM, cached in L1 and L2 like global memory. Each spill is a store and "
            "each reload a load through the memory pipeline, where a register costs nothing "
            "extra.")
    work, numbers = [], {"spilling_builds": len(spilled)}
    if len(spilled):
        r = spilled.loc[pd.to_numeric(spilled["m_spill_stores"]).idxmax()]
        numbers["spill_bytes"] = num(r["m_spill_stores"])
        name = f"{r['key'].strip()} ({r['p_arch']})"
        work.append(f"{cite(r, 'm_spill_stores', fmt.integer, name)} B, m_spill_loads = "
                    f"{fmt.integer(r['m_spill_loads'])} B, m_stack = "
                    f"{fmt.integer(r['m_stack'])} B")
        text += (f" In this run {len(spilled)} of {len(d)} builds spill, the most "
                 f"{r['variant']} on {r['p_arch']}: {fmt.integer(r['m_spill_stores'])} bytes "
                 "stored and reloaded per thread.")
    else:
        text += " No build of this run spills."
    lat = _latency_cycles(run)
    if lat:
        numbers |= {f"{k}_cycles": v for k, v in lat.items()}
        work.append(f"latency lesson, global chain: smallest working set "
                    f"{fmt.sig(lat['L1'])} cycles (L1), largest {fmt.sig(lat['DRAM'])} "
                    "cycles (DRAM)")
        text += (f" Each reload costs a dependent load's latency: {fmt.sig(lat['L1'])} cycles "
                 f"from L1 on this GPU, up to {fmt.sig(lat['DRAM'])} cycles once evicted to "
                 "DRAM, and it takes L1 space and bandwidth from the kernel's own data.")
    text += (f" The spilling kernel's own time is {NOT_MEASURED.lower()}: time it beside a "
             "build that does not spill.")
    return Answer(text, work, numbers)


def launch_bounds(run: Run) -> Answer:
    d = _builds(run)
    r = d[(d["variant"].astype(str) == "matmul_register")
          & (pd.to_numeric(d.get("m_launch_bounds"), errors="coerce") > 0)]
    dev = run.device()
    if r.empty:
        return not_measured("matmul_register's build with __launch_bounds__",
                            "run static_analysis")
    r = r.loc[pd.to_numeric(r["m_registers"]).idxmax()]
    bound, regs = num(r["m_launch_bounds"]), num(r["m_registers"])
    name = f"{r['key'].strip()} ({r['p_arch']})"
    work = [f"{cite(r, 'm_launch_bounds', fmt.integer, name)}, m_registers = "
            f"{fmt.integer(regs)}"]
    numbers = {"bound": bound, "registers": regs, "block_registers": bound * regs}
    text = (f"It forbids launching the kernel with more than {fmt.integer(bound)} threads per "
            "block: such a launch fails (too many resources requested). In return ptxas "
            f"need not fit the largest block: {fmt.integer(bound)} threads × "
            f"{fmt.integer(regs)} registers = {fmt.integer(bound * regs)} registers per block")
    if dev is not None and have(dev.get("m_regs_per_block"), dev.get("m_max_threads_per_block")):
        per_block, most = num(dev["m_regs_per_block"]), num(dev["m_max_threads_per_block"])
        cap = per_block / most
        numbers["cap_without"] = cap
        work.append(f"without the bound: {cite(dev, 'm_regs_per_block', fmt.integer)} / "
                    f"{cite(dev, 'm_max_threads_per_block', fmt.integer)} = "
                    f"{fmt.integer(cap)} registers per thread at most")
        text += (f", within the {fmt.integer(per_block)} a block may have. Without the bound "
                 f"a {fmt.integer(most)}-thread launch must stay possible, which caps a "
                 f"thread at {fmt.integer(per_block)} / {fmt.integer(most)} = "
                 f"{fmt.integer(cap)} registers")
    return Answer(text + ".", work, numbers)
