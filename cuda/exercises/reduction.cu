// cudalab-exercise: reduction
// Exercise: *out += the sum of n float32 values, with a shared-memory tree per block.
//
// The slot (do not change it): the harness defines BLOCK = 256, sets *out = 0 and launches
//     sum_reduce<<<ceil(n / (2 * BLOCK)), BLOCK>>>(x, out, n)
// Each block sums 2 * BLOCK elements and adds its total to *out with one atomicAdd.
// n = 1 and sizes that are no multiple of 2 * BLOCK are checked.
// Check your file with:  cudalab exercise check reduction.cu

#ifndef BLOCK
#define BLOCK 256
#endif

extern "C" __global__ void sum_reduce(const float* __restrict__ x, float* out, int n)
{
    // TODO 1: __shared__ float s[BLOCK]; each thread loads two elements (zero past n) and
    //         stores their sum in s[threadIdx.x].
    // TODO 2: the tree: for stride = BLOCK / 2 down to 1, threads below stride add
    //         s[tid + stride] into s[tid]; __syncthreads() after every level.
    // TODO 3: thread 0 adds s[0] to *out with atomicAdd.
}
