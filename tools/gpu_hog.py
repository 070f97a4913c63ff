"""A competing load on one GPU for node-acceptance checks (tools/accept_planted.sh): a
process of its own that keeps a busy kernel on the GPU it is given (CUDA_VISIBLE_DEVICES),
so every other context there is time-sliced with it, as on a GPU that a stray job shares.

    CUDA_VISIBLE_DEVICES=GPU-... python tools/gpu_hog.py SECONDS
"""

from __future__ import annotations

import sys
import time

import pycuda.autoinit  # noqa: F401 - the context of the GPU it is given
import pycuda.driver as cuda
from pycuda.compiler import SourceModule

SPIN = SourceModule("""
extern "C" __global__ void spin(float *out, int iters) {
    float x = threadIdx.x;
    for (int i = 0; i < iters; ++i) x = x * 0.999f + 1.0f;
    if (x == -1.0f) out[0] = x;  // never true: keeps the loop
}
""", no_extern_c=True).get_function("spin")


def main(seconds: float) -> None:
    out = cuda.mem_alloc(4)
    t_end = time.time() + seconds
    while time.time() < t_end:
        SPIN(out, __import__("numpy").int32(200000), block=(256, 1, 1), grid=(1056, 1))
        cuda.Context.synchronize()


if __name__ == "__main__":
    main(float(sys.argv[1]))
