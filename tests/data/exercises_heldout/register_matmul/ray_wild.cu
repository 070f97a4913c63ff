// cudalab-exercise: register_matmul
// Crashes: computes its block of C, then stores it through a pointer offset by a
// garbage 64-bit index (a debugging leftover): an illegal address on every launch.
#ifndef BM
#define BM 64
#define BN 64
#define BK 16
#define RM 4
#define RN 4
#endif

extern "C" __global__ void __launch_bounds__((BM / RM) * (BN / RN))
matmul_register(const float* __restrict__ A, const float* __restrict__ B,
                float* __restrict__ C, int M, int N, int K)
{
    const int r0 = blockIdx.y * BM + threadIdx.y * RM;
    const int c0 = blockIdx.x * BN + threadIdx.x * RN;
    const size_t wild = (size_t)1 << 46;  // far past any allocation
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) {
            int r = r0 + i, c = c0 + j;
            if (r >= M || c >= N) continue;
            float acc = 0.0f;
            for (int k = 0; k < K; ++k) acc = fmaf(A[(size_t)r * K + k], B[(size_t)k * N + c], acc);
            C[wild + (size_t)r * N + c] = acc;
        }
}
