// cudalab-exercise: vector_add
// A correct kernel in a file whose name holds a space, a non-ASCII letter and shell
// metacharacters: the name must be refused, never pasted into a shell command.
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
