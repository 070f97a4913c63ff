// cudalab-exercise: register_matmul
// Correct: shared-memory slices and a 4 x 4 block of C in registers per thread, every
// load and store checked against the matrix edges.
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
    __shared__ float As[BM][BK];
    __shared__ float Bs[BK][BN];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tid = ty * (BN / RN) + tx;
    const int threads = (BM / RM) * (BN / RN);
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[RM][RN] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int e = tid; e < BM * BK; e += threads) {
            int r = e / BK, k = e % BK;
            As[r][k] = (row0 + r < M && k0 + k < K) ? A[(size_t)(row0 + r) * K + k0 + k] : 0.0f;
        }
        for (int e = tid; e < BK * BN; e += threads) {
            int k = e / BN, c = e % BN;
            Bs[k][c] = (k0 + k < K && col0 + c < N) ? B[(size_t)(k0 + k) * N + col0 + c] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            float a[RM], b[RN];
            for (int i = 0; i < RM; ++i) a[i] = As[ty * RM + i][k];
            for (int j = 0; j < RN; ++j) b[j] = Bs[k][tx * RN + j];
            for (int i = 0; i < RM; ++i)
                for (int j = 0; j < RN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) {
            int r = row0 + ty * RM + i, c = col0 + tx * RN + j;
            if (r < M && c < N) C[(size_t)r * N + c] = acc[i][j];
        }
}
