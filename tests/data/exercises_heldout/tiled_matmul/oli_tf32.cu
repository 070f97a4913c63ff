// cudalab-exercise: tiled_matmul
// Lower precision: rounds every input to 10 mantissa bits (half/TF32 precision) before the
// multiply, which is past the 1e-4 tolerance for any K that is not tiny.
#ifndef TILE
#define TILE 16
#endif

__device__ __forceinline__ float to_half_precision(float x)
{
    return __uint_as_float(__float_as_uint(x) & 0xFFFFE000u);
}

extern "C" __global__ void matmul_tiled(const float* __restrict__ A,
                                        const float* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        int ka = t + threadIdx.x;
        int kb = t + threadIdx.y;
        As[threadIdx.y][threadIdx.x] =
            (row < M && ka < K) ? to_half_precision(A[(size_t)row * K + ka]) : 0.0f;
        Bs[threadIdx.y][threadIdx.x] =
            (kb < K && col < N) ? to_half_precision(B[(size_t)kb * N + col]) : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc = fmaf(As[threadIdx.y][k], Bs[k][threadIdx.x], acc);
        __syncthreads();
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}
