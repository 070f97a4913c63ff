// cudalab-exercise: vector_add
// An include hidden behind a lone carriage return: one line to a check that splits
// lines on \n, two lines to the preprocessor.
static const int version = 1;#include "/etc/passwd"
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
