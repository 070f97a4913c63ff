"""Rounding the inputs to a tensor-core precision on the host, and how far a product of
rounded inputs may be from its float64 reference.

Inputs. Every point starts from the same float32 matrices A, B, uniform in [-1, 1). For a
reduced precision they are rounded on the host, to nearest with ties to even: fp16 and bf16
are stored as such (2 bytes), tf32 as float32 whose 13 low mantissa bits are zero. The
device then computes on values its unit represents exactly, whatever rounding it would apply
itself (cuBLAS TF32 may truncate where the WMMA kernel rounds), so one reference serves every
implementation of a precision.

Two errors per point, both ||C - R||_F / ||R||_F:
  check error   R = the float64 product of the ROUNDED inputs: what the kernel must compute.
  input error   R = the float64 product of the unrounded float32 inputs: what choosing the
                precision costs, the lesson's error axis.

The check's tolerance. The precisions have p = 11 (fp16, tf32), 8 (bf16) and 24 (fp32)
significant bits; the product of two inputs has at most 2p <= 22 bits and is exact in FP32
(FP32 x FP32 is exact inside an FMA). What remains is the accumulation: K products summed in
FP32, each addition into a partial sum s_j off by at most one unit of its last place,
|e_j| <= u_acc |s_j| with u_acc = 2^-23 (tensor cores truncate rather than round to
nearest, so a whole ulp, not half). Summing the errors, ||E||_F <= u_acc sum_j ||S_j||_F. The
inputs are independent with zero mean, so the partial sums grow like a random walk,
||S_j||_F ~ sqrt(j / K) ||C||_F, and sum_{j<=K} sqrt(j / K) ~ (2/3) K: the relative error is at
most about (2/3) K u_acc (3.3e-4 at K = 4096) even when every error has the same sign (the
bias of truncation). Blocked or split sums only shorten the chains. A wrong index, a skipped
k-slice or a misread precision errs by 1e-2 to 1, far above.

The input error, for the lesson: rounding x to p bits to nearest errs by at most half an
ulp; for data uniform within a binade the absolute error is uniform over that half ulp and
the significand m uniform on [1, 2), so the relative error has rms (u_in / sqrt 3) *
sqrt(E[1/m^2]) = u_in / sqrt 6, with u_in = 2^-p. A product a b carries the errors of both
(rms u_in / sqrt 3), and over K independent terms the relative Frobenius error of the
product is about u_in / sqrt 3: 2.8e-4 for fp16 and tf32 (the same 10 stored mantissa
bits), 2.3e-3 for bf16 (7 bits); fp32 inputs are not rounded (their error is the
accumulation's alone).
"""

from __future__ import annotations

import math

import numpy as np

# Significant bits (stored mantissa + the implicit one) of each input precision.
SIGNIFICAND_BITS = {"fp32": 24, "tf32": 11, "fp16": 11, "bf16": 8}
PRECISIONS = list(SIGNIFICAND_BITS)
U_ACC = 2.0**-23  # one FP32 ulp relative: an addition on the tensor cores, truncated
ACCUMULATION_FACTOR = 2.0 / 3.0  # sum_{j<=K} sqrt(j/K) / K


def unit_roundoff(precision: str) -> float:
    """u = 2^-p of an input precision (p significant bits): rounding to nearest errs by at
    most u relative (half an ulp of [1, 2) is 2^-p)."""
    return 2.0 ** -SIGNIFICAND_BITS[precision]


def products_exact(precision: str) -> bool:
    """Whether a product of two inputs is exact in FP32 (2p <= 24 bits, or an FMA's exact
    product for fp32 itself)."""
    return 2 * SIGNIFICAND_BITS[precision] <= 24 or precision == "fp32"


def check_tolerance(k: int, u_acc: float = U_ACC) -> float:
    """Largest relative Frobenius error of a K-term FP32-accumulated product against the
    float64 product of the same (rounded) inputs: (2/3) K u_acc (module docstring)."""
    return ACCUMULATION_FACTOR * int(k) * u_acc


def expected_input_error(precision: str) -> float:
    """About how far the product of inputs rounded to `precision` is from the product of
    the unrounded inputs, relative Frobenius: u_in / sqrt 3 (module docstring); 0 for fp32,
    whose inputs are the float32 values themselves."""
    if precision == "fp32":
        return 0.0
    return unit_roundoff(precision) / math.sqrt(3.0)


def round_mantissa(x: np.ndarray, keep_bits: int) -> np.ndarray:
    """float32 x rounded to `keep_bits` stored mantissa bits (of 23), to nearest with ties to
    even, as float32 whose low bits are zero. Finite inputs only (the experiment's are in
    [-1, 1)); a value that rounds past the largest float32 would become inf."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    drop = 23 - keep_bits
    if drop <= 0:
        return x.copy()
    u = x.view(np.uint32)
    half = np.uint32((1 << (drop - 1)) - 1)
    odd = (u >> np.uint32(drop)) & np.uint32(1)
    r = (u + half + odd) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    return r.view(np.float32)


def to_tf32(x: np.ndarray) -> np.ndarray:
    """float32 rounded to tf32 (10 stored mantissa bits), kept as float32."""
    return round_mantissa(x, 10)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16, as the uint16 bit patterns the kernels read."""
    return (round_mantissa(x, 7).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    """The exact float64 values of bf16 bit patterns."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def device_input(x: np.ndarray, precision: str) -> np.ndarray:
    """What the device gets for a float32 input in `precision`: float32 (fp32, tf32 rounded)
    or 16-bit patterns (fp16, bf16)."""
    if precision == "fp32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if precision == "tf32":
        return to_tf32(x)
    if precision == "fp16":
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)
    if precision == "bf16":
        return to_bf16_bits(x)
    raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")


def exact_values(dev: np.ndarray, precision: str) -> np.ndarray:
    """The float64 values the device input `dev` (device_input's result) stands for."""
    if precision == "fp16":
        return dev.view(np.float16).astype(np.float64)
    if precision == "bf16":
        return bf16_bits_to_f64(dev)
    return dev.astype(np.float64)
