// cudalab-exercise: vector_add
// Exercise: vector addition c[i] = a[i] + b[i] for n float32 values.
//
// The slot (do not change it): the harness launches
//     vector_add<<<ceil(n / threads), threads>>>(a, b, c, n)
// with threads = 32, 256 and 1024, so the last block may have threads past the end.
// Check your file with:  cudalab exercise check vector_add.cu
// No #include is allowed: everything CUDA needs is already there.

extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    // TODO 1: the global index of this thread, from blockIdx.x, blockDim.x, threadIdx.x.
    // TODO 2: only threads with an index below n may touch memory.
    // TODO 3: write c at that index.
}
