"""Dense tensor-core peaks per precision: SMs x clock x the per-SM rate of each compute
capability. Pure functions, no GPU.

Rates are dense multiply-add throughput in FLOP per clock per SM (an FMA is two flops),
with FP32 accumulation for FP16 and BF16 inputs; sparsity (2:4) doubles them and is not
counted.

  cc    FP16/BF16  TF32  FP64 (tensor)  chips
  8.0   2048       1024  128            A100 (GA100)
  8.6   1024        512  -              A40, RTX A6000 (GA10x)
  8.9   1024        512  -              L40S, RTX 6000 Ada (AD10x)
  9.0   4096       2048  256            H100, H200 (GH100)

On GeForce boards of 8.6 and 8.9 (RTX 30xx, 40xx) FP32 accumulation and TF32 run at half
the rates above (their datasheets' "FP16 with FP32 accumulate"): pass geforce=True.
Compute capabilities 8.6 and 8.9 have no FP64 tensor cores; a precision a chip lacks has
no peak (NaN).

NVIDIA's H100 SXM datasheet gives FP64 tensor 67 TFLOP/s = 132 SMs x 256 x 1.98 GHz, but
FP16 989.4 and TF32 494.7 TFLOP/s, which are 132 x 4096 (2048) x 1.83 GHz: its tensor
figures for 16-bit and TF32 inputs are stated at a 1.83 GHz clock, lower than the 1.98 GHz
boost clock the driver reports. At the driver's clock these functions give 1070 and 535;
pass the datasheet clock to reproduce the datasheet.
"""

from __future__ import annotations

import math
from typing import Any

PRECISIONS = ("fp16", "bf16", "tf32", "fp64")

# FLOP per clock per SM, dense; a precision absent from a row has no tensor-core path.
RATES: dict[str, dict[str, int]] = {
    "8.0": {"fp16": 2048, "bf16": 2048, "tf32": 1024, "fp64": 128},
    "8.6": {"fp16": 1024, "bf16": 1024, "tf32": 512},
    "8.9": {"fp16": 1024, "bf16": 1024, "tf32": 512},
    "9.0": {"fp16": 4096, "bf16": 4096, "tf32": 2048, "fp64": 256},
}
# Capabilities whose GeForce boards halve FP32 accumulation and TF32.
GEFORCE_HALVED = ("8.6", "8.9")


def cc_key(cc: Any) -> str:
    """'9.0' from '9.0', (9, 0), 9.0 or 'sm_90'."""
    if isinstance(cc, (tuple, list)):
        return f"{int(cc[0])}.{int(cc[1])}"
    s = str(cc).strip().lower().removeprefix("sm_").removeprefix("compute_").rstrip("af")
    if "." not in s and s.isdigit() and len(s) >= 2:
        s = f"{s[:-1]}.{s[-1]}"
    return s


def flops_per_clock_per_sm(cc: Any, precision: str, geforce: bool = False) -> float:
    """Dense tensor-core FLOP per clock per SM of `precision` (NaN: no tensor path known)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    rate = RATES.get(cc_key(cc), {}).get(precision)
    if rate is None:
        return float("nan")
    halved = geforce and cc_key(cc) in GEFORCE_HALVED and precision != "fp64"
    return rate / 2 if halved else float(rate)


def tensor_peak_gflops(cc: Any, precision: str, sm_count: int, sm_clock_khz: float,
                       geforce: bool = False) -> float:
    """Dense tensor-core peak of `precision` in GFLOP/s: rate x SMs x clock (the driver's
    CLOCK_RATE attribute is in kHz)."""
    rate = flops_per_clock_per_sm(cc, precision, geforce)
    if not (sm_count > 0 and sm_clock_khz > 0) or math.isnan(rate):
        return float("nan")
    return rate * int(sm_count) * float(sm_clock_khz) * 1e3 / 1e9


def tensor_peaks(cc: Any, sm_count: int, sm_clock_khz: float,
                 geforce: bool = False) -> dict[str, float]:
    """{'peak_fp16_tensor_gflops': ..., 'peak_bf16_tensor_gflops', 'peak_tf32_...',
    'peak_fp64_tensor_gflops'}: NaN for a precision this capability has no tensor path for."""
    return {f"peak_{p}_tensor_gflops": tensor_peak_gflops(cc, p, sm_count, sm_clock_khz, geforce)
            for p in PRECISIONS}


def is_geforce(gpu_name: str) -> bool:
    """Whether a device name is a GeForce board (halved FP32 accumulation on 8.6 / 8.9)."""
    return "geforce" in gpu_name.lower()
