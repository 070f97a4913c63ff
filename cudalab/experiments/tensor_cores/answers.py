"""The teacher's answers to the tensor_cores lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import NOT_MEASURED, Answer, Run, cite, not_measured, num

FP16_BITS, FP32_BITS = 11, 24  # significant bits, the implicit one included


def _largest(run: Run, variant: str, precision: str, column: str) -> pd.Series | None:
    d = run.ok()
    d = d[(d["variant"].astype(str) == variant)
          & (d["p_precision"].astype(str) == precision)].dropna(subset=[column])
    if d.empty:
        return None
    m = pd.to_numeric(d["p_m"])
    d = d[m == m.max()]
    return d.loc[pd.to_numeric(d["gflops"]).idxmax()]


def fp16_product(run: Run) -> Answer:
    r = _largest(run, "cublas", "fp16", "m_err_input")
    if r is None:
        return not_measured("a cuBLAS FP16 product with both of its errors",
                            "run tensor_cores with precisions [fp16] and the cublas variant")
    check, inp = num(r["error"]), num(r["m_err_input"])
    work = [f"fp16 keeps {FP16_BITS} significant bits: a product has at most "
            f"2 × {FP16_BITS} = {2 * FP16_BITS} ≤ {FP32_BITS} (FP32's), so it is exact",
            f"{cite(r, 'error', fmt.error)} (against the float64 product of the rounded "
            "inputs: the accumulation's error)",
            f"{cite(r, 'm_err_input', fmt.error)} (against the unrounded float32 inputs: "
            f"rounding them to fp16); ratio {fmt.ratio(inp / check)}"]
    return Answer(f"An fp16 number has {FP16_BITS} significant bits, so the product of two "
                  f"has at most {2 * FP16_BITS}, which fits FP32's {FP32_BITS}: the "
                  "multiplication loses nothing. What is left is the accumulation: K products "
                  "summed in FP32, each addition rounded (the tensor cores truncate). At "
                  f"{fmt.integer(r['p_m'])}³ that error is {fmt.error(check)} in this run, "
                  f"while rounding the float32 inputs to fp16 in the first place costs "
                  f"{fmt.error(inp)}, {fmt.ratio(inp / check)} more: the precision of the "
                  "inputs, not the arithmetic, sets the error.", work,
                  {"accumulation_err": check, "input_err": inp})


def tf32_rate(run: Run) -> Answer:
    tf, hf = (_largest(run, "cublas", p, "gflops") for p in ("tf32", "fp16"))
    if tf is None or hf is None:
        return not_measured("cuBLAS in TF32 and FP16",
                            "run tensor_cores with precisions [tf32, fp16]")
    peak = num(tf["m_peak_precision_gflops"]) / num(hf["m_peak_precision_gflops"])
    got = num(tf["gflops"]) / num(hf["gflops"])
    work = [f"peaks: {cite(tf, 'm_peak_precision_gflops', fmt.flop_rate)} / "
            f"{cite(hf, 'm_peak_precision_gflops', fmt.flop_rate)} = {fmt.sig(peak)}",
            f"measured: {cite(tf, 'gflops', fmt.flop_rate)} / "
            f"{cite(hf, 'gflops', fmt.flop_rate)} = {fmt.sig(got)}"]
    return Answer("The mantissa is not what costs: the operand's container is. A TF32 value "
                  "is held in a 32-bit register (19 bits used), an FP16 value in 16 bits, two "
                  "to a register. The tensor core takes the same registers per instruction, so "
                  "an mma.sync consumes half as many TF32 values (m16n8k8 against m16n8k16 "
                  "for fp16): half the multiply-adds per instruction at the same instruction "
                  f"rate. TF32's peak is {fmt.sig(peak)}× FP16's; cuBLAS at "
                  f"{fmt.integer(tf['p_m'])}³ reaches {fmt.flop_rate(tf['gflops'])} in TF32 "
                  f"and {fmt.flop_rate(hf['gflops'])} in FP16, {fmt.sig(got)}×.", work,
                  {"peak_ratio": peak, "measured_ratio": got})


def stages(run: Run) -> Answer:
    d = run.ok()
    d = d[d["variant"].astype(str) == "mma"].dropna(subset=["gflops", "p_stages"])
    if d.empty:
        return not_measured("the mma.sync kernel", "run tensor_cores with the mma variant")
    m = pd.to_numeric(d["p_m"])
    d = d[m == m.max()]
    best = d.loc[d.groupby(pd.to_numeric(d["p_stages"]))["gflops"].idxmax()]
    work = [f"{int(num(r['p_stages']))} stages: best {cite(r, 'gflops', fmt.flop_rate)}"
            for _, r in best.iterrows()]
    top = best.loc[best["gflops"].idxmax()]
    return Answer("cp.async copies a tile from global to shared memory without passing "
                  "through registers, and the warp does not wait for it: with S stages the "
                  "copies of the next S − 1 k-tiles are in flight while the tensor cores "
                  "multiply the current one, so global-memory latency hides behind the mma "
                  "instructions. mma.sync wants each thread's B fragment as pairs of "
                  "consecutive k of one column; a row-major B keeps consecutive n together, "
                  "so ldmatrix.trans loads 8 × 8 blocks from shared memory and transposes "
                  "them on the way into the registers, with no separate transpose pass. In "
                  f"this run at {fmt.integer(top['p_m'])}³ the best mma.sync tile has "
                  f"{int(num(top['p_stages']))} stages ({fmt.flop_rate(top['gflops'])}). What "
                  f"the overlap saves against no pipelining is {NOT_MEASURED.lower()}: a "
                  "one-stage build of the same kernel would measure it.", work,
                  {f"gflops_stages_{int(num(r['p_stages']))}": num(r["gflops"])
                   for _, r in best.iterrows()})

