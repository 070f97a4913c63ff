// cudalab-exercise: vector_add
// Forgets the bounds check: the last block's threads past n read a and b and write c
// out of bounds (up to 1023 floats past the end).
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    c[i] = a[i] + b[i];
}
