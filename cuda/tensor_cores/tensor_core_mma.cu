// Tensor cores through PTX: mma.sync.m16n8k16 fed by ldmatrix from shared memory, with the
// tiles of A and B brought in by cp.async, STAGES deep. C[M x N] = A[M x K] * B[K x N],
// row-major, A and B in fp16 (tc_mma_fp16) or bf16 (tc_mma_bf16), FP32 accumulation, C in
// float32.
//
// Compile-time parameters (nvcc -D...); one module per combination:
//   BM BN BK     a block computes a BM x BN tile of C, k-slices BK deep
//   WM WN        each warp a WM x WN sub-tile: (WM/16) x (WN/8) mma tiles of 16 x 8
//   STAGES       shared-memory stages: cp.async keeps STAGES-1 slices in flight while the
//                warps compute on one
// Threads per block: (BM/WM) * (BN/WN) * 32. Dynamic shared memory:
// STAGES * 2 * (BM*(BK+8) + BK*(BN+8)) bytes (over 48 KiB: the launcher raises the limit).
// Rows are padded by 8 elements (16 bytes): the 8 row addresses of one ldmatrix then fall
// on 8 different 4-bank groups (conflict-free) and every cp.async stays 16-byte aligned.
// Blocks are numbered in groups of GROUP_M block rows so that blocks running together
// share tiles of A and B in L2.
// Sizes: M a multiple of BM, N of BN, K of BK (the experiment keeps to those).
// ldmatrix, cp.async and this mma need sm_80; older targets compile an empty body.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#ifndef STAGES
#define STAGES 3
#endif
#define GROUP_M 8
#define NTHREADS ((BM / WM) * (BN / WN) * 32)
#define MI (WM / 16)
#define NI (WN / 8)
#define AS (BK + 8)  // row stride of the A slice, elements
#define BS (BN + 8)  // row stride of the B slice, elements
#define A_STAGE (BM * AS)
#define B_STAGE (BK * BS)

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem)
{
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem)
{
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem)
{
    uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t* b)
{
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One k-slice of A (BM x BK) and B (BK x BN) into a stage, 16 bytes per cp.async.
__device__ __forceinline__ void load_stage(const uint16_t* __restrict__ A,
                                           const uint16_t* __restrict__ B, uint16_t* sA,
                                           uint16_t* sB, int N, int K, int bm0, int bn0, int k0,
                                           int tid)
{
#pragma unroll
    for (int e = tid; e < BM * BK / 8; e += NTHREADS) {
        int r = e / (BK / 8), c = (e % (BK / 8)) * 8;
        cp_async16(sA + r * AS + c, A + (size_t)(bm0 + r) * K + k0 + c);
    }
#pragma unroll
    for (int e = tid; e < BK * BN / 8; e += NTHREADS) {
        int r = e / (BN / 8), c = (e % (BN / 8)) * 8;
        cp_async16(sB + r * BS + c, B + (size_t)(k0 + r) * N + bn0 + c);
    }
}

// The warp's MI x NI mma tiles over one stage: fragments of A by ldmatrix, of B by
// ldmatrix.trans (B is k-major in shared memory, the mma wants it n-major).
template <bool BF16>
__device__ __forceinline__ void compute_stage(float (&acc)[MI][NI][4], const uint16_t* sA,
                                              const uint16_t* sB, int wm0, int wn0, int lane)
{
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        uint32_t a[MI][4], b[NI][2];
#pragma unroll
        for (int i = 0; i < MI; ++i)
            ldmatrix_x4(a[i], sA + (wm0 + i * 16 + lane % 16) * AS + kk + (lane / 16) * 8);
#pragma unroll
        for (int j = 0; j < NI; j += 2) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, sB + (kk + lane % 16) * BS + wn0 + j * 8 + (lane / 16) * 8);
            b[j][0] = r[0];
            b[j][1] = r[1];
            b[j + 1][0] = r[2];
            b[j + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j) mma16816<BF16>(acc[i][j], a[i], b[j]);
    }
}
#endif

template <bool BF16>
__device__ __forceinline__ void mma_gemm(const uint16_t* __restrict__ A,
                                         const uint16_t* __restrict__ B, float* __restrict__ C,
                                         int M, int N, int K)
{
#if __CUDA_ARCH__ >= 800
    extern __shared__ uint4 smem[];
    uint16_t* sA = reinterpret_cast<uint16_t*>(smem);
    uint16_t* sB = sA + STAGES * A_STAGE;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    // grouped block order: GROUP_M block rows sweep the block columns together
    const int grid_m = M / BM, grid_n = N / BN, width = GROUP_M * grid_n;
    const int first_m = (blockIdx.x / width) * GROUP_M;
    const int rows = min(grid_m - first_m, GROUP_M);
    const int bm0 = (first_m + (blockIdx.x % width) % rows) * BM;
    const int bn0 = ((blockIdx.x % width) / rows) * BN;
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;
    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int t = 0; t < 4; ++t) acc[i][j][t] = 0.0f;
    const int KT = K / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(A, B, sA + s * A_STAGE, sB + s * B_STAGE, N, K, bm0, bn0, s * BK, tid);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int kt = 0; kt < KT; ++kt) {
        // slice kt has landed once at most STAGES-2 younger groups are pending
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();  // ... for every thread, and every warp is done with slice kt-1
        const int nk = kt + STAGES - 1;
        if (nk < KT) {
            const int s = nk % STAGES;  // the stage slice kt-1 occupied
            load_stage(A, B, sA + s * A_STAGE, sB + s * B_STAGE, N, K, bm0, bn0, nk * BK, tid);
        }
        asm volatile("cp.async.commit_group;\n" ::);  // empty groups keep the count uniform
        const int s = kt % STAGES;
        compute_stage<BF16>(acc, sA + s * A_STAGE, sB + s * B_STAGE, wm0, wn0, lane);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int r = bm0 + wm0 + i * 16 + lane / 4, c = bn0 + wn0 + j * 8 + (lane % 4) * 2;
            *reinterpret_cast<float2*>(&C[(size_t)r * N + c]) = make_float2(acc[i][j][0], acc[i][j][1]);
            *reinterpret_cast<float2*>(&C[(size_t)(r + 8) * N + c]) =
                make_float2(acc[i][j][2], acc[i][j][3]);
        }
#endif
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
tc_mma_fp16(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B, float* __restrict__ C,
           int M, int N, int K)
{
    mma_gemm<false>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
tc_mma_bf16(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B, float* __restrict__ C,
            int M, int N, int K)
{
    mma_gemm<true>(A, B, C, M, N, K);
}
