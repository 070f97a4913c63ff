// cudalab-exercise: vector_add
// Calls a device function that is declared but defined nowhere: an unresolved symbol
// when the cubin is built (no -rdc, nothing to link against).
extern "C" __device__ float fast_add(float x, float y);

extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = fast_add(a[i], b[i]);
}
