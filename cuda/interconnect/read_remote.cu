// A kernel on one GPU copying another GPU's buffer into its own: every load crosses the link
// between the two GPUs (peer access must be on). int4 loads: 16 bytes per thread and step,
// a grid-stride loop so any grid covers the buffer.
extern "C" __global__ void read_remote(const int4 *__restrict__ src, int4 *__restrict__ dst,
                                       size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
