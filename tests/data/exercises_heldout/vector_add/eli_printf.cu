// cudalab-exercise: vector_add
// Correct, but every thread prints a line: megabytes of device printf output per launch
// (the device printf buffer fills and the rest is dropped). The judge must not choke on it.
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
        printf("thread %d of %d: %f + %f = %f\n", i, n, a[i], b[i], c[i]);
    }
}
