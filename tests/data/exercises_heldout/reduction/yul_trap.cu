// cudalab-exercise: reduction
// Crashes without touching a bad address: a device-side trap (a leftover "can't happen"
// guard) fires whenever n is no multiple of 2 * BLOCK.
#ifndef BLOCK
#define BLOCK 256
#endif

extern "C" __global__ void sum_reduce(const float* __restrict__ x, float* out, int n)
{
    if (n % (2 * BLOCK) != 0) __trap();
    __shared__ float s[BLOCK];
    unsigned int tid = threadIdx.x;
    size_t i = (size_t)blockIdx.x * 2 * BLOCK + tid;
    s[tid] = x[i] + x[i + BLOCK];
    __syncthreads();
    for (unsigned int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (tid < stride) s[tid] += s[tid + stride];
        __syncthreads();
    }
    if (tid == 0) atomicAdd(out, s[0]);
}
