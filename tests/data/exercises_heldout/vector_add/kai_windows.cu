// cudalab-exercise: vector_add
// Correct, saved by a Windows editor: a UTF-8 byte order mark and CRLF line endings.
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
