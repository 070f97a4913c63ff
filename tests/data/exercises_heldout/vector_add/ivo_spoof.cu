// cudalab-exercise: vector_add
// Correct, but one thread prints a line that looks like compute-sanitizer's report. Its
// own output must not be read as the tool's: under memcheck this is still a clean kernel.
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
    if (i == 0) printf("========= Invalid __global__ write of size 4 bytes (not really)\n");
}
