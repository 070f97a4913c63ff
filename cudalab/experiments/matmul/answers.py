"""The teacher's answers to the matmul lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num

FLOAT = 4  # bytes


def _f32(run: Run, variant: str) -> pd.DataFrame:
    d = run.ok()
    d = d[d["variant"].astype(str) == variant].dropna(subset=["time_median_s"])
    if "p_dtype" in d:
        d = d[d["p_dtype"].isna() | (d["p_dtype"].astype(str) == "float32")]
    return d


def _at_largest(d: pd.DataFrame) -> pd.DataFrame:
    m = pd.to_numeric(d.get("p_m"), errors="coerce")
    return d[m == m.max()] if len(d) else d


def _same_tile(a: pd.Series, b: pd.DataFrame) -> pd.Series | None:
    keys = [k for k in ("p_m", "p_n", "p_k", "p_rt", "p_bt", "p_bk") if k in b]
    hit = b[(b[keys].astype(float) == a[keys].astype(float)).all(axis=1)]
    return None if hit.empty else hit.iloc[0]


def double_buffering(run: Run) -> Answer:
    dbuf = _at_largest(_f32(run, "dbuf"))
    single = _f32(run, "vec4")
    if dbuf.empty:
        return not_measured("the double-buffered kernel (dbuf)",
                            "run matmul with the dbuf variant and vec4_tiles")
    best = dbuf.loc[pd.to_numeric(dbuf["gflops"]).idxmax()]
    twin = _same_tile(best, single)
    tile = (f"rt {fmt.integer(best['p_rt'])}, bt {fmt.integer(best['p_bt'])}, "
            f"bk {fmt.integer(best['p_bk'])}")
    text = ("It overlaps the global-memory loads of the next k-tile with the arithmetic on "
            "the current one: while the threads compute from one pair of A and B tiles in "
            "shared memory, the loads for the next pair are already in flight into the other "
            "pair. Both tiles must be resident at once, "
            "one being read and one being written, hence twice the shared memory.")
    work = [f"dbuf ({tile}): {cite(best, 'm_smem_bytes', fmt.nbytes)}, "
            f"{cite(best, 'gflops', fmt.flop_rate)}"]
    numbers = {"dbuf_smem": num(best["m_smem_bytes"])}
    if twin is not None and have(twin.get("m_smem_bytes")):
        share = num(best["m_smem_bytes"]) / num(twin["m_smem_bytes"])
        gain = num(best["gflops"]) / num(twin["gflops"])
        numbers |= {"smem_ratio": share, "gain": gain}
        work += [f"the same tile single-buffered, vec4: {cite(twin, 'm_smem_bytes', fmt.nbytes)}"
                 f"; {fmt.nbytes(best['m_smem_bytes'])} / {fmt.nbytes(twin['m_smem_bytes'])} = "
                 f"{fmt.ratio(share)}",
                 f"{fmt.flop_rate(best['gflops'])} / {cite(twin, 'gflops', fmt.flop_rate)} = "
                 f"{fmt.ratio(gain)}"]
        text += (f" This run: {fmt.nbytes(best['m_smem_bytes'])} against "
                 f"{fmt.nbytes(twin['m_smem_bytes'])} for the same tile single-buffered "
                 f"({fmt.ratio(share)}), for {fmt.ratio(gain)} the speed at "
                 f"{fmt.integer(best['p_m'])}³.")
    return Answer(text, work, numbers)


def loads_per_element(run: Run) -> Answer:
    naive = _at_largest(_f32(run, "naive"))
    tiled = _f32(run, "tiled")
    if naive.empty or tiled.empty:
        return not_measured("the naive and tiled kernels", "run matmul with naive and tiled")
    n = naive.iloc[0]
    t = tiled[pd.to_numeric(tiled["p_m"]) == num(n["p_m"])]
    k = num(n["p_k"])
    work = [f"{cite(n, 'p_k', fmt.integer)}: naive reads a row of A and a column of B per "
            f"output: 2 × {fmt.integer(k)} = {fmt.integer(2 * k)} loads"]
    numbers = {"naive_loads": 2 * k}
    parts = []
    for _, r in t.sort_values("p_tile").iterrows():
        tile = num(r["p_tile"])
        numbers[f"tiled_loads_{int(tile)}"] = 2 * k / tile
        speed = num(n["time_median_s"]) / num(r["time_median_s"])
        numbers[f"speedup_{int(tile)}"] = speed
        work.append(f"tile {fmt.integer(tile)}: 2 × {fmt.integer(k)} / {fmt.integer(tile)} = "
                    f"{fmt.integer(2 * k / tile)} loads ({fmt.ratio(tile)} fewer); "
                    f"{cite(n, 'time_median_s', fmt.seconds)} / "
                    f"{cite(r, 'time_median_s', fmt.seconds)} = {fmt.ratio(speed)}")
        parts.append(f"tile {fmt.integer(tile)}: {fmt.integer(2 * k / tile)} "
                     f"({fmt.ratio(speed)} the naive kernel's speed)")
    total = 2 * num(n["p_m"]) * num(n["p_n"]) * k * FLOAT
    rate = total / num(n["time_median_s"]) / 1e9
    numbers["naive_load_gbps"] = rate
    work.append(f"naive's loads: 2 × {fmt.integer(n['p_m'])} × {fmt.integer(n['p_n'])} × "
                f"{fmt.integer(k)} × 4 B = {fmt.nbytes(total)} in "
                f"{fmt.seconds(n['time_median_s'])} = {fmt.bandwidth(rate)}")
    text = (f"Naive: 2K = {fmt.integer(2 * k)} loads per output at K = {fmt.integer(k)}. "
            f"Tiled: each thread loads one element of A and one of B per tile step, K / TILE "
            f"steps, so 2K / TILE: {'; '.join(parts)}. The time falls far less than the loads "
            f"because the naive kernel's re-reads are cache hits: it requests "
            f"{fmt.bandwidth(rate)}")
    l2, kind = run.ceilings.bandwidth("l2")
    if have(l2):
        text += f", more than the {kind} L2 ceiling ({fmt.bandwidth(l2)}), so L1 serves most"
        work.append(f"{kind} L2 ceiling {fmt.bandwidth(l2)}")
    return Answer(text + ".", work, numbers)


def padding(run: Run) -> Answer:
    conflict = _at_largest(_f32(run, "tiled_conflict"))
    padded = _f32(run, "tiled_padded")
    if conflict.empty or padded.empty:
        return not_measured("the conflicting and the padded tiled kernels",
                            "run matmul with tiled_conflict and tiled_padded")
    work, numbers, parts = [], {}, []
    for _, c in conflict.sort_values("p_tile").iterrows():
        p = padded[(pd.to_numeric(padded["p_m"]) == num(c["p_m"]))
                   & (pd.to_numeric(padded["p_tile"]) == num(c["p_tile"]))]
        if p.empty:
            continue
        p = p.iloc[0]
        tile = int(num(c["p_tile"]))
        gain = num(c["time_median_s"]) / num(p["time_median_s"])
        numbers[f"gain_{tile}"] = gain
        work.append(f"tile {tile}: {cite(c, 'm_smem_bytes', fmt.integer)} B → "
                    f"{cite(p, 'm_smem_bytes', fmt.integer)} B (one float per row: "
                    f"{tile} × 4 B = {tile * FLOAT} B more); "
                    f"{cite(c, 'time_median_s', fmt.seconds)} / "
                    f"{cite(p, 'time_median_s', fmt.seconds)} = {fmt.ratio(gain)}")
        if str(c.get("m_ncu_status")) == "ok" and have(c.get("m_ncu_smem_bank_conflicts"),
                                                        p.get("m_ncu_smem_bank_conflicts")):
            work.append(f"bank conflicts {cite(c, 'm_ncu_smem_bank_conflicts', fmt.integer)} → "
                        f"{cite(p, 'm_ncu_smem_bank_conflicts', fmt.integer)}")
        parts.append(f"tile {tile}: {fmt.ratio(gain)}")
    if not parts:
        return not_measured("padded and conflicting tiles of the same size",
                            "run matmul with tiled_conflict and tiled_padded")
    return Answer("Shared memory is 32 banks of 4-byte words, word w in bank w mod 32. The "
                  "conflicting kernel stores B transposed in a TILE × TILE array, and a warp "
                  "reads one column: word tx·TILE + k, so at TILE = 32 all 32 threads hit bank "
                  "k mod 32, the same one, and the read is served one thread at a time. With "
                  "one float of padding a row is TILE + 1 words long: word tx·(TILE + 1) + k is "
                  "in bank (tx + k) mod 32 at TILE = 32, 32 different banks, one pass. The "
                  f"padded kernel is faster by {', '.join(parts)} at "
                  f"{fmt.integer(conflict['p_m'].iloc[0])}³.", work, numbers)
