// Measured ceilings of a GPU: what the chip really reaches, to compare the experiments with
// (cudalab/ceilings.py launches these; the theoretical peaks are in cudalab/devicespec.py).
//
//   copy_f4     float4 grid-stride streaming copy: DRAM bandwidth (a working set many times
//               the L2) or L2 bandwidth (a hot working set within half the L2, copied `reps`
//               times in one launch so launch gaps do not count)
//   smem_read   shared-memory read bandwidth: every thread reads float4s from a tile
//   fma_chains  FP32 throughput: FMA_CHAINS independent x = x * m + c chains per thread
//   fill_iota   a[i] = i (the copy's input, checked on the host)
//
// Compile-time parameters (nvcc -D...):
//   COPY_UNROLL  float4 loads a thread has in flight before it stores them
//   SMEM_THREADS threads per block of smem_read (its launches must use exactly this many)
//   FMA_CHAINS   independent FMA chains per thread (latency hiding inside a thread)
//   FMA_UNROLL   chain steps per loop iteration (loop overhead against FMAs)

#ifndef COPY_UNROLL
#define COPY_UNROLL 4
#endif
#ifndef SMEM_THREADS
#define SMEM_THREADS 256
#endif
#ifndef FMA_CHAINS
#define FMA_CHAINS 8
#endif
#ifndef FMA_UNROLL
#define FMA_UNROLL 16
#endif

// Float4s in the shared tile: 4 per thread (16 KiB at 256 threads). A power of two, so the
// wrap-around of the read index is an AND.
#define SMEM_F4 (4 * SMEM_THREADS)

extern "C" __global__ void fill_iota(unsigned int* __restrict__ a, unsigned long long n)
{
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        a[i] = (unsigned int)i;
}

// out[i] = in[(i + off) % n4] for `reps` passes, off growing by `shift` after each pass, so
// no pass repeats the previous one's stores (nothing for the compiler to drop) and the
// final output is `in` rotated by (reps - 1) * shift float4s. Loads and stores are moves:
// the bits of every element are kept, whatever they mean as floats.
extern "C" __global__ void copy_f4(float4* __restrict__ out, const float4* __restrict__ in,
                                   unsigned long long n4, unsigned int reps,
                                   unsigned long long shift)
{
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long off = 0;
    for (unsigned int r = 0; r < reps; ++r) {
        unsigned long long i = first;
        // COPY_UNROLL independent loads in flight per thread, then their stores
        for (; i + (COPY_UNROLL - 1) * stride < n4; i += COPY_UNROLL * stride) {
            float4 v[COPY_UNROLL];
#pragma unroll
            for (int u = 0; u < COPY_UNROLL; ++u) {
                unsigned long long j = i + u * stride + off;
                v[u] = in[j >= n4 ? j - n4 : j];
            }
#pragma unroll
            for (int u = 0; u < COPY_UNROLL; ++u)
                out[i + u * stride] = v[u];
        }
        for (; i < n4; i += stride) {
            unsigned long long j = i + off;
            out[i] = in[j >= n4 ? j - n4 : j];
        }
        off += shift;
        if (off >= n4)
            off -= n4;
    }
}

// The value at index k of the shared tile: small integers, so every sum a thread makes is
// exact in float32 (below 2^24) and the host can check it exactly.
__device__ __forceinline__ float4 smem_value(unsigned int k)
{
    return make_float4((float)(k & 7u), (float)((k >> 3) & 7u), (float)((k >> 6) & 15u), 1.0f);
}

// Each thread reads 4 float4s per iteration from the tile: a warp reads 32 consecutive
// float4s (512 bytes, no bank conflict). The start moves by 32 float4s every iteration, so
// every read is a new address (no load can be hoisted out of the loop). Result per thread:
// the sum of every component it read.
extern "C" __global__ void __launch_bounds__(SMEM_THREADS)
smem_read(float* __restrict__ out, unsigned int iters)
{
    __shared__ float4 tile[SMEM_F4];
    for (unsigned int k = threadIdx.x; k < SMEM_F4; k += SMEM_THREADS)
        tile[k] = smem_value(k);
    __syncthreads();
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    unsigned int base = threadIdx.x;
    for (unsigned int it = 0; it < iters; ++it) {
#pragma unroll
        for (unsigned int u = 0; u < 4; ++u) {
            float4 v = tile[(base + u * SMEM_THREADS) & (SMEM_F4 - 1)];
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        base = (base + 32) & (SMEM_F4 - 1);
    }
    out[(size_t)blockIdx.x * SMEM_THREADS + threadIdx.x] = acc.x + acc.y + acc.z + acc.w;
}

// FMA_CHAINS independent chains x_k <- x_k * m + c, iters * FMA_UNROLL steps each; the
// chains start at different, thread-dependent values, so none can be merged or folded
// (m and c are kernel arguments). 2 flops per FMA. Result per thread: the chains' sum,
// checked against the closed form x_n = L + m^n (x_0 - L), L = c / (1 - m).
extern "C" __global__ void fma_chains(float* __restrict__ out, float m, float c,
                                      unsigned int iters)
{
    const unsigned int gid = blockIdx.x * blockDim.x + threadIdx.x;
    float x[FMA_CHAINS];
#pragma unroll
    for (int k = 0; k < FMA_CHAINS; ++k)
        x[k] = (float)(gid & 1023u) * 0.015625f + (float)k;
    for (unsigned int it = 0; it < iters; ++it) {
#pragma unroll
        for (int u = 0; u < FMA_UNROLL; ++u) {
#pragma unroll
            for (int k = 0; k < FMA_CHAINS; ++k)
                x[k] = fmaf(x[k], m, c);
        }
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < FMA_CHAINS; ++k)
        s += x[k];
    out[gid] = s;
}
