// cudalab-exercise: vector_add
// Does not compile: a missing semicolon and an undeclared name on line 8.
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x
    if (i < n) c[i] = a[i] + bb[i];
}
