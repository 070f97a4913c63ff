// cudalab-exercise: dgemm
// Another signature: the kernel takes float pointers (copied from the float matmul), so
// launching it on float64 buffers must be refused before any launch.
extern "C" __global__ void dgemm(const float* __restrict__ A,
                                 const float* __restrict__ B,
                                 float* __restrict__ C, int M, int N)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < N; ++k) acc += A[(size_t)row * N + k] * B[(size_t)k * N + col];
    C[(size_t)row * N + col] = acc;
}
