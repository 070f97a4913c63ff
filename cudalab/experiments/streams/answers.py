"""The teacher's answers to the streams lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num

BYTES_PER_FLOAT = 4
NO_STREAMS = ("no streams point was timed", "run streams on a GPU (experiments.streams)")


def _best(run: Run) -> pd.Series | None:
    """The most streams at the fewest kernel iterations (the copy-bound case)."""
    d = run.ok()
    d = d[d["variant"].astype(str) == "streams"].dropna(subset=["time_median_s", "m_h2d_s"])
    if d.empty:
        return None
    it = pd.to_numeric(d["p_iterations"])
    d = d[it == it.min()]
    return d.loc[pd.to_numeric(d["p_nstreams"]).idxmax()]


def _stages(r: pd.Series) -> tuple[list[str], float, float]:
    h2d, k, d2h = num(r["m_h2d_s"]), num(r["m_kernel_s"]), num(r["m_d2h_s"])
    work = [f"{cite(r, 'm_h2d_s', fmt.seconds)}, {cite(r, 'm_kernel_s', fmt.seconds)}, "
            f"{cite(r, 'm_d2h_s', fmt.seconds)} (each alone, whole array)"]
    return work, max(h2d, k, d2h), h2d + k + d2h


def ideal_time(run: Run) -> Answer:
    r = _best(run)
    if r is None:
        return not_measured(*NO_STREAMS)
    work, slowest, total = _stages(r)
    one_engine = num(r.get("m_copy_engines")) < 2  # H2D and D2H queue on the same engine
    if one_engine:
        slowest = max(num(r["m_h2d_s"]) + num(r["m_d2h_s"]), num(r["m_kernel_s"]))
    ns, t = num(r["p_nstreams"]), num(r["time_median_s"])
    work += [f"busiest engine = {'max(H2D + D2H, kernel)' if one_engine else 'max(…)'} = "
             f"{fmt.seconds(slowest)}; sum = {fmt.seconds(total)}; "
             f"sum / {fmt.integer(ns)} streams = {fmt.seconds(total / ns)}",
             f"{cite(r, 'time_median_s', fmt.seconds)} = {fmt.ratio(t / slowest)} the slowest "
             f"stage, {fmt.ratio(t / (total / ns))} the sum / streams"]
    engines = ("the copies on the one copy engine, the kernel on the SMs" if one_engine
               else "H2D on a copy engine, the kernel on the SMs, D2H on another copy engine")
    return Answer(f"Each stage runs on its own engine ({engines}), and each engine has to process "
                  "every chunk one after the other. Streams overlap different stages of "
                  "different chunks, never a stage with itself, so the whole can never be "
                  f"shorter than the busiest engine's total: here {fmt.seconds(slowest)}. The "
                  f"sum divided by {fmt.integer(ns)} streams, {fmt.seconds(total / ns)}, would "
                  f"need {fmt.integer(ns)} copies at once on one engine. Measured with "
                  f"{fmt.integer(ns)} streams: {fmt.seconds(t)}, {fmt.ratio(t / slowest)} the "
                  "slowest stage.", work,
                  {"slowest_s": slowest, "sum_over_streams_s": total / ns, "time_s": t})


def pinned_memory(run: Run) -> Answer:
    r = _best(run)
    if r is None:
        return not_measured(*NO_STREAMS)
    rate = num(r["p_n"]) * BYTES_PER_FLOAT / num(r["m_h2d_s"]) / 1e9
    work = [f"{cite(r, 'p_n', fmt.integer)} floats × 4 B / {cite(r, 'm_h2d_s', fmt.seconds)} = "
            f"{fmt.bandwidth(rate)} H2D"]
    numbers = {"h2d_gbps": rate}
    text = ("Pinned (page-locked) memory, allocated with cudaMallocHost / cudaHostAlloc. Only "
            "from pinned memory is cudaMemcpyAsync asynchronous: the copy engine reads the "
            "host pages directly while the CPU goes on queueing the other streams' work. From "
            "pageable memory the driver first stages the bytes through its own pinned buffer "
            "with the CPU, and the call returns only when that is done, so nothing overlaps. "
            f"This run's copies move {fmt.bandwidth(rate)} H2D")
    tr = run.ok("transfer")
    if not tr.empty and "p_direction" in tr:
        h2d = tr[tr["p_direction"].astype(str) == "h2d"]
        for memory in ("pinned", "pageable"):
            m = h2d[h2d["variant"].astype(str) == memory]
            if not m.empty and have(m["gbps"].max()):
                numbers[f"transfer_{memory}_gbps"] = g = float(m["gbps"].max())
                work.append(f"transfer rows {memory} h2d: largest gbps = {fmt.bandwidth(g)}")
        if {"transfer_pinned_gbps", "transfer_pageable_gbps"} <= set(numbers):
            pin, page = numbers["transfer_pinned_gbps"], numbers["transfer_pageable_gbps"]
            near, far = ("pinned", "pageable") if abs(rate - pin) < abs(rate - page) \
                else ("pageable", "pinned")
            text += (f", near the transfer lesson's {near} rate "
                     f"({fmt.bandwidth(numbers[f'transfer_{near}_gbps'])}), not its {far} one "
                     f"({fmt.bandwidth(numbers[f'transfer_{far}_gbps'])})")
    serial = run.ok()[(run.ok()["variant"].astype(str) == "serial")
                      & (run.ok()["p_iterations"] == r["p_iterations"])]
    if not serial.empty:
        s = serial.iloc[0]
        numbers["speedup"] = num(s["time_median_s"]) / num(r["time_median_s"])
        work.append(f"{cite(s, 'time_median_s', fmt.seconds)} / "
                    f"{cite(r, 'time_median_s', fmt.seconds)} = {fmt.ratio(numbers['speedup'])}")
        text += (f"; with them {fmt.integer(r['p_nstreams'])} streams take "
                 f"{fmt.ratio(1 / numbers['speedup'])} of the serial time")
    return Answer(text + ".", work, numbers)


def copy_engines(run: Run) -> Answer:
    r = _best(run)
    if r is None or not have(r.get("m_copy_engines")):
        return not_measured(*NO_STREAMS)
    n = num(r["m_copy_engines"])
    h2d, k, d2h = num(r["m_h2d_s"]), num(r["m_kernel_s"]), num(r["m_d2h_s"])
    now, one = max(h2d, k, d2h), max(h2d + d2h, k)
    t = num(r["time_median_s"])
    work = [cite(r, "m_copy_engines", fmt.integer), *_stages(r)[0],
            f"ideal now = max(H2D, kernel, D2H) = {fmt.seconds(now)}",
            f"ideal with one copy engine = max(H2D + D2H, kernel) = {fmt.seconds(h2d)} + "
            f"{fmt.seconds(d2h)} = {fmt.seconds(one)}",
            f"{cite(r, 'time_median_s', fmt.seconds)}"]
    return Answer(f"{fmt.integer(n)} copy engines (asyncEngineCount). With only one, H2D and "
                  "D2H copies would queue on the same engine and could no longer overlap each "
                  f"other, only the kernel: the best possible time would be "
                  f"max(H2D + D2H, kernel) = {fmt.seconds(one)} instead of {fmt.seconds(now)}, "
                  f"{fmt.ratio(one / now)} longer, and the {fmt.seconds(t)} measured with "
                  f"{fmt.integer(r['p_nstreams'])} streams would be out of reach.", work,
                  {"copy_engines": n, "ideal_one_engine_s": one, "ideal_s": now})
