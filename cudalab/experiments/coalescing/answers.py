"""The teacher's answers to the coalescing lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num, pick

SECTOR = 32  # bytes the memory system moves at a time
WARP_FLOATS = 32 * 4  # bytes a warp's 32 consecutive floats cover


def _ncu_ok(r: pd.Series, column: str) -> bool:
    return str(r.get("m_ncu_status", "")) == "ok" and have(r.get(column))


def sectors(run: Run) -> Answer:
    d = run.ok()
    rows = {s: pick(d, "stride", stride=s) for s in (1, 2, 32)}
    if any(r is None or not have(r.get("m_read_sectors")) for r in rows.values()):
        return not_measured("the stride copy at strides 1, 2 and 32",
                            "run coalescing with strides [1, 2, 32]")
    work, numbers = [], {}
    for s, r in rows.items():
        span = s * WARP_FLOATS
        numbers[f"sectors_{s}"] = num(r["m_read_sectors"])
        numbers[f"gbps_{s}"] = num(r["gbps"])
        work.append(f"stride {s}: sectors = min(span {fmt.integer(span)} B / {SECTOR} B, one "
                    f"per thread: 32) = {fmt.integer(min(span / SECTOR, 32))}; "
                    f"{cite(r, 'm_read_sectors')}; {cite(r, 'gbps', fmt.bandwidth)}")
    useful = 100 * numbers["sectors_1"] / numbers["sectors_32"]
    speed = 100 * numbers["gbps_32"] / numbers["gbps_1"]
    work.append(f"useful share at stride 32 = {fmt.integer(numbers['sectors_1'])} / "
                f"{fmt.integer(numbers['sectors_32'])} = {fmt.sig(useful)} %; measured speed "
                f"{fmt.bandwidth(numbers['gbps_32'])} / {fmt.bandwidth(numbers['gbps_1'])} = "
                f"{fmt.percent(speed)}")
    numbers |= {"useful_pct_32": useful, "speed_pct_32": speed}
    return Answer(f"32 consecutive floats are 128 B: {fmt.integer(numbers['sectors_1'])} sectors "
                  f"of {SECTOR} B. At stride 2 the warp spans 256 B: "
                  f"{fmt.integer(numbers['sectors_2'])} sectors, half of each unused. At stride "
                  f"32 every thread lands in its own sector: "
                  f"{fmt.integer(numbers['sectors_32'])} sectors for the same 128 useful bytes "
                  f"({fmt.sig(useful)} % of the bytes moved are used). The speeds follow: "
                  f"{fmt.bandwidth(numbers['gbps_1'])}, {fmt.bandwidth(numbers['gbps_2'])} and "
                  f"{fmt.bandwidth(numbers['gbps_32'])}; stride 32 runs at "
                  f"{fmt.percent(speed)} of stride 1.", work, numbers)


def offset_one(run: Run) -> Answer:
    d = run.ok()
    a, b = pick(d, "offset", offset=0), pick(d, "offset", offset=1)
    if a is None or b is None:
        return not_measured("the offset copy at offsets 0 and 1",
                            "run coalescing with offsets [0, 1]")
    slow = num(a["gbps"]) / num(b["gbps"])
    work = [f"{cite(a, 'gbps', fmt.bandwidth)} / {cite(b, 'gbps', fmt.bandwidth)} = "
            f"{fmt.ratio(slow)} (offset 1 takes {fmt.percent(100 * (slow - 1))} longer)",
            f"{cite(a, 'm_read_sectors')}, {cite(b, 'm_read_sectors')}: a warp's 128 B start "
            "4 B into a sector, so they straddle one more"]
    numbers = {"slowdown": slow, "sectors_0": num(a.get("m_read_sectors")),
               "sectors_1": num(b.get("m_read_sectors"))}
    text = (f"On this GPU offset 1 costs {fmt.ratio(slow)} "
            f"({fmt.bandwidth(b['gbps'])} against {fmt.bandwidth(a['gbps'])}). Each warp's "
            f"128 bytes now straddle {fmt.integer(numbers['sectors_1'])} sectors instead of "
            f"{fmt.integer(numbers['sectors_0'])}: the extra one is the sector that the "
            "neighbouring warp reads too. Counted per warp, the requests grow by "
            f"{fmt.ratio(numbers['sectors_1'] / numbers['sectors_0'])}")
    if _ncu_ok(a, "m_ncu_dram_bytes") and _ncu_ok(b, "m_ncu_dram_bytes"):
        extra = num(b["m_ncu_dram_bytes"]) / num(a["m_ncu_dram_bytes"])
        numbers["dram_bytes_ratio"] = extra
        work.append(f"Nsight Compute DRAM bytes: {cite(b, 'm_ncu_dram_bytes', fmt.nbytes)} / "
                    f"{cite(a, 'm_ncu_dram_bytes', fmt.nbytes)} = {fmt.sig(extra, 4)}")
        text += (f", but DRAM moves {fmt.sig(extra, 4)}× the bytes (profiled): the shared "
                 "sector is fetched once and served to the second warp from L2, so only the "
                 "extra requests to L2 cost time.")
    elif slow < numbers["sectors_1"] / numbers["sectors_0"]:
        text += (". Why it costs less than that is not measured in this run: profiling "
                 "(profile.ncu) would give the DRAM bytes of both points; if they are equal, "
                 "L2 serves the shared sector to the second warp.")
    return Answer(text if text.endswith(".") else text + ".", work, numbers)


def _transpose(d: pd.DataFrame, variant: str) -> pd.Series | None:
    t = d[d["variant"].astype(str) == variant].dropna(subset=["gbps"])
    return None if t.empty else t.loc[pd.to_numeric(t["p_size"]).idxmax()]


def transpose(run: Run) -> Answer:
    d = run.ok()
    naive, tiled, padded = (_transpose(d, v) for v in
                            ("transpose_naive", "transpose_tiled", "transpose_padded"))
    if naive is None or tiled is None:
        return not_measured("the naive and tiled transposes",
                            "run coalescing with transpose_naive and transpose_tiled")
    gain = num(tiled["gbps"]) / num(naive["gbps"])
    work = [f"{cite(tiled, 'gbps', fmt.bandwidth)} / {cite(naive, 'gbps', fmt.bandwidth)} = "
            f"{fmt.ratio(gain)}"]
    numbers = {"tiled_over_naive": gain}
    text = ("In the naive kernel consecutive threads read consecutive "
            "elements of a row of the input, coalesced, and write them down a column of the "
            "output, one row apart: every thread of a warp stores to its own sector, so the "
            "writes are not coalesced. The tiled kernel reads a tile into shared memory with "
            "coalesced loads, synchronises, then writes it out by rows of the output, reading "
            "the column from shared memory, where a strided access costs bank cycles instead "
            f"of DRAM sectors. At {fmt.integer(tiled['p_size'])}²: tiled "
            f"{fmt.bandwidth(tiled['gbps'])} against naive {fmt.bandwidth(naive['gbps'])}, "
            f"{fmt.ratio(gain)}")
    if padded is not None:
        numbers["padded_over_tiled"] = p = num(padded["gbps"]) / num(tiled["gbps"])
        work.append(f"{cite(padded, 'gbps', fmt.bandwidth)} / {fmt.bandwidth(tiled['gbps'])} = "
                    f"{fmt.ratio(p)}")
        text += (f"; the padded tile, whose column reads hit 32 different banks, adds "
                 f"{fmt.ratio(p)} ({fmt.bandwidth(padded['gbps'])})")
        if _ncu_ok(tiled, "m_ncu_smem_bank_conflicts") and _ncu_ok(
                padded, "m_ncu_smem_bank_conflicts"):
            numbers["conflicts_tiled"] = num(tiled["m_ncu_smem_bank_conflicts"])
            numbers["conflicts_padded"] = num(padded["m_ncu_smem_bank_conflicts"])
            work.append(f"{cite(tiled, 'm_ncu_smem_bank_conflicts', fmt.integer)}, "
                        f"{cite(padded, 'm_ncu_smem_bank_conflicts', fmt.integer)}")
            text += (f", with {fmt.integer(numbers['conflicts_padded'])} bank conflicts "
                     f"against {fmt.integer(numbers['conflicts_tiled'])} (profiled)")
    return Answer(text + ".", work, numbers)
