// Test-only kernels for the failure-handling GPU tests.
extern "C" __global__ void fill(float* out, int n, float v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}

// Writes far outside any allocation: an illegal address, which kills the CUDA context.
extern "C" __global__ void wild_write(float* out)
{
    out[(size_t)1 << 40] = 1.0f;
}
