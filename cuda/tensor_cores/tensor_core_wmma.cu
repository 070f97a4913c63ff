// Tensor cores through WMMA (nvcuda::wmma), the first rung: C[M x N] = A[M x K] * B[K x N],
// row-major, FP32 accumulation, C in float32.
//   tc_wmma_fp16   A, B in fp16 (16x16x16 fragments)
//   tc_wmma_bf16   A, B in bf16 (16x16x16 fragments)
//   tc_wmma_tf32   A, B in float32, rounded to tf32 on the fragments (16x16x8 fragments)
// A block of 256 threads (8 warps, 2 along M x 4 along N) computes a 128 x 128 tile of C;
// each warp a 64 x 32 sub-tile = 4 x 2 accumulator fragments. Tiles of A (128 x 32) and B
// (32 x 128) go through shared memory with 16-byte loads, one stage: load, barrier, math,
// barrier. The rows are padded by 16 bytes so the fragment loads spread over the banks.
// Sizes: M and N multiples of 128, K a multiple of 32 (the experiment keeps to those).
// Tensor-core fragments of these types need sm_80; older targets compile an empty body.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

using namespace nvcuda;

#define WB_M 128
#define WB_N 128
#define WB_K 32
#define W_THREADS 256
#define W_WM 64  // warp tile
#define W_WN 32

// fp16 / bf16: 2-byte elements, 8 per 16-byte load; rows padded by 8 elements
template <typename T>
__device__ __forceinline__ void wmma_16bit(const T* __restrict__ A, const T* __restrict__ B,
                                           float* __restrict__ C, int M, int N, int K)
{
#if __CUDA_ARCH__ >= 800
    constexpr int AS = WB_K + 8, BS = WB_N + 8;
    __shared__ __align__(16) T sA[WB_M * AS];
    __shared__ __align__(16) T sB[WB_K * BS];
    const int tid = threadIdx.x, warp = tid / 32;
    const int bm0 = blockIdx.y * WB_M, bn0 = blockIdx.x * WB_N;
    const int wm0 = (warp / 4) * W_WM, wn0 = (warp % 4) * W_WN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < K; k0 += WB_K) {
#pragma unroll
        for (int l = 0; l < 2; ++l) {  // 512 16-byte chunks of A and of B, 2 per thread
            int e = tid + l * W_THREADS;
            int ar = e / (WB_K / 8), ac = (e % (WB_K / 8)) * 8;
            *reinterpret_cast<uint4*>(&sA[ar * AS + ac]) =
                *reinterpret_cast<const uint4*>(&A[(size_t)(bm0 + ar) * K + k0 + ac]);
            int br = e / (WB_N / 8), bc = (e % (WB_N / 8)) * 8;
            *reinterpret_cast<uint4*>(&sB[br * BS + bc]) =
                *reinterpret_cast<const uint4*>(&B[(size_t)(k0 + br) * N + bn0 + bc]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < WB_K; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                wmma::load_matrix_sync(a[i], &sA[(wm0 + i * 16) * AS + kk], AS);
#pragma unroll
            for (int j = 0; j < 2; ++j)
                wmma::load_matrix_sync(b[j], &sB[kk * BS + wn0 + j * 16], BS);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&C[(size_t)(bm0 + wm0 + i * 16) * N + bn0 + wn0 + j * 16],
                                    acc[i][j], N, wmma::mem_row_major);
#endif
}

extern "C" __global__ void __launch_bounds__(W_THREADS)
tc_wmma_fp16(const __half* __restrict__ A, const __half* __restrict__ B, float* __restrict__ C,
            int M, int N, int K)
{
    wmma_16bit<__half>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(W_THREADS)
tc_wmma_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
             float* __restrict__ C, int M, int N, int K)
{
    wmma_16bit<__nv_bfloat16>(A, B, C, M, N, K);
}

// tf32: float32 in memory (4 per 16-byte load), rows padded by 4 floats; each fragment
// element is rounded to tf32 (__float_to_tf32) as the WMMA API asks.
extern "C" __global__ void __launch_bounds__(W_THREADS)
tc_wmma_tf32(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
             int M, int N, int K)
{
#if __CUDA_ARCH__ >= 800
    constexpr int AS = WB_K + 4, BS = WB_N + 4;
    __shared__ __align__(16) float sA[WB_M * AS];
    __shared__ __align__(16) float sB[WB_K * BS];
    const int tid = threadIdx.x, warp = tid / 32;
    const int bm0 = blockIdx.y * WB_M, bn0 = blockIdx.x * WB_N;
    const int wm0 = (warp / 4) * W_WM, wn0 = (warp % 4) * W_WN;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < K; k0 += WB_K) {
#pragma unroll
        for (int l = 0; l < 4; ++l) {  // 1024 float4 of A and of B, 4 per thread
            int e = tid + l * W_THREADS;
            int ar = e / (WB_K / 4), ac = (e % (WB_K / 4)) * 4;
            *reinterpret_cast<float4*>(&sA[ar * AS + ac]) =
                *reinterpret_cast<const float4*>(&A[(size_t)(bm0 + ar) * K + k0 + ac]);
            int br = e / (WB_N / 4), bc = (e % (WB_N / 4)) * 4;
            *reinterpret_cast<float4*>(&sB[br * BS + bc]) =
                *reinterpret_cast<const float4*>(&B[(size_t)(k0 + br) * N + bn0 + bc]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < WB_K; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wmma::load_matrix_sync(a[i], &sA[(wm0 + i * 16) * AS + kk], AS);
#pragma unroll
                for (int t = 0; t < a[i].num_elements; ++t) a[i].x[t] = wmma::__float_to_tf32(a[i].x[t]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::load_matrix_sync(b[j], &sB[kk * BS + wn0 + j * 16], BS);
#pragma unroll
                for (int t = 0; t < b[j].num_elements; ++t) b[j].x[t] = wmma::__float_to_tf32(b[j].x[t]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&C[(size_t)(bm0 + wm0 + i * 16) * N + bn0 + wn0 + j * 16],
                                    acc[i][j], N, wmma::mem_row_major);
#endif
}
