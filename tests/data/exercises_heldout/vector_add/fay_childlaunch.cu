// cudalab-exercise: vector_add
// Tries to escape the timer with dynamic parallelism: the slot kernel launches the real
// work as a child grid on its own stream and returns. Without -rdc nvcc refuses it.
__global__ void add_child(const float* a, const float* b, float* c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        add_child<<<(n + 255) / 256, 256, 0, s>>>(a, b, c, n);
    }
}
