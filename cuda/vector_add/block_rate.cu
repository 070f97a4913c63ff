// Block-rate probe: how many blocks per nanosecond the GPU starts and retires when a block
// does (almost) nothing. Timed over several block counts, the slope of time against blocks
// is the GPU-wide block rate; a kernel whose blocks each do little work (vector add with
// small blocks) is limited by it where its time is close to blocks / rate.
//
// block_empty: no work at all, the pure cost of a block (its one argument is unused: a
// launch with a non-empty parameter buffer, like every other launch of the project).
// block_one_load: every thread loads one int (as a vector-add thread loads its element),
// wrapping over a power-of-two buffer (mask = its length - 1). The store happens only where
// the loaded value equals `flag`: the timed launches pass a flag no element holds, so no
// thread stores, yet the compiler must keep every load; the check passes an element's
// value and finds it in sink[0], which shows the loads read the buffer.

extern "C" __global__ void block_empty(int unused) {}

extern "C" __global__ void block_one_load(const int* __restrict__ a, unsigned int mask,
                                          int flag, int* __restrict__ sink)
{
    unsigned int i = (blockIdx.x * blockDim.x + threadIdx.x) & mask;
    int v = a[i];
    if (v == flag)
        sink[0] = v;
}
