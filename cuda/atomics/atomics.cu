// Atomics: a shared counter incremented by every thread, and a float sum.
//
// Compile-time parameters (nvcc -D...):
//   BLOCK   threads per block of sum_reduce (a power of two, <= 1024)

#ifndef BLOCK
#define BLOCK 256
#endif

// The race. Every thread reads the counter, adds one and writes it back: three separate
// steps. Two threads that read the same value both write value + 1, so one increment is
// lost; the 32 threads of a warp execute the load together, so a warp adds at most 1.
// `volatile` forces a real load and a real store of the counter for every thread
// (ld.volatile / st.volatile in PTX, served by L2, not a stale L1 copy) and keeps the
// compiler from caching, merging or removing them: the kernel does exactly what the
// source says, the race included. Without it the compiler would still emit load/add/store
// here, but nothing would oblige it to.
extern "C" __global__ void counter_racy(volatile unsigned int* counter)
{
    *counter = *counter + 1;
}

// The fix: atomicAdd performs the read-modify-write as one indivisible operation in L2,
// so no increment is lost whatever the interleaving.
extern "C" __global__ void counter_atomic(unsigned int* counter)
{
    atomicAdd(counter, 1u);
}

// Float sum, version 1: every element is atomically added to one float. Correct (no
// update is lost) but all n additions serialise on one address, and the result is a
// sequential float32 sum in an arbitrary order: its rounding error grows like sqrt(n).
extern "C" __global__ void sum_atomic(const float* __restrict__ x, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        atomicAdd(out, x[i]);
}

// Float sum, version 2: each block sums 2 * BLOCK elements with a shared-memory tree
// (log2(BLOCK) levels, sequential addressing: no bank conflicts, no divergent warps until
// the last five levels), then one atomicAdd per block. n / (2 * BLOCK) atomics instead of
// n, and the tree's rounding error grows like log2(BLOCK).
extern "C" __global__ void sum_reduce(const float* __restrict__ x, float* out, int n)
{
    __shared__ float s[BLOCK];
    unsigned int tid = threadIdx.x;
    unsigned int i = blockIdx.x * (2u * BLOCK) + tid;
    float v = 0.0f;
    if (i < (unsigned int)n)
        v = x[i];
    if (i + BLOCK < (unsigned int)n)
        v += x[i + BLOCK];
    s[tid] = v;
    __syncthreads();
    for (unsigned int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (tid < stride)
            s[tid] += s[tid + stride];
        __syncthreads();
    }
    if (tid == 0)
        atomicAdd(out, s[0]);
}
