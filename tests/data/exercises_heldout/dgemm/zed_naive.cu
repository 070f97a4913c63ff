// cudalab-exercise: dgemm
// Correct and slow: one thread per element of C, no shared memory, every operand from
// global memory.
extern "C" __global__ void dgemm(const double* __restrict__ A,
                                 const double* __restrict__ B,
                                 double* __restrict__ C, int M, int N, int K)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    double acc = 0.0;
    for (int k = 0; k < K; ++k) acc = fma(A[(size_t)row * K + k], B[(size_t)k * N + col], acc);
    C[(size_t)row * N + col] = acc;
}
