// Vector addition c[i] = a[i] + b[i], float32: the first CUDA kernel of the course.
// One thread per element; the grid is ceil(n / blockDim.x) blocks, so the last block may
// have threads past the end: the bounds check keeps them from touching memory.
// Every element moves 12 bytes (two 4-byte loads, one 4-byte store) for 1 flop, so the
// kernel is limited by memory bandwidth once n is large enough to fill the chip.

extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}
