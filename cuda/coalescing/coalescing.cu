// Global-memory coalescing: copy kernels with different access patterns (one float or one
// float4 per thread, shifted, strided), and matrix transpose (naive against shared-memory
// tiled, with and without padding). The experiment also times cudaMemcpy device to device of
// the same bytes: the ceiling every copy here is compared with.
//
// A warp's 32 loads are served in 32-byte sectors. When neighbouring threads read
// neighbouring floats (copy, offset 0, stride 1) one warp needs 4 sectors = 128 bytes, all
// of it used. A misaligned start (offset) touches one sector more; a stride of s floats
// spreads the warp over up to s times as many sectors, most of whose bytes are wasted.
//
// Compile-time parameters (nvcc -D...):
//   TILE        edge of the transpose tile (32: one warp across a tile row)
//   BLOCK_ROWS  thread rows of a transpose block; each thread moves TILE / BLOCK_ROWS elements

#ifndef TILE
#define TILE 32
#endif
#ifndef BLOCK_ROWS
#define BLOCK_ROWS 8
#endif

// a[i] = b[i]: fully coalesced, the reference speed.
extern "C" __global__ void copy_coalesced(float* __restrict__ a,
                                          const float* __restrict__ b, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        a[i] = b[i];
}

// a[i] = b[i], four floats per access: one 16-byte load and store per thread and step, over
// a grid that fills the chip once (grid-stride loop: the launch needs only SMs x blocks per
// SM blocks, whatever n). The last n % 4 floats are copied one by one.
extern "C" __global__ void copy_vec4(float* __restrict__ a, const float* __restrict__ b,
                                     unsigned int n)
{
    const unsigned int n4 = n / 4;
    const unsigned int stride = gridDim.x * blockDim.x;
    const unsigned int first = blockIdx.x * blockDim.x + threadIdx.x;
    const float4* __restrict__ b4 = reinterpret_cast<const float4*>(b);
    float4* __restrict__ a4 = reinterpret_cast<float4*>(a);
    for (unsigned int i = first; i < n4; i += stride)
        a4[i] = b4[i];
    if (first < n - 4 * n4)
        a[4 * n4 + first] = b[4 * n4 + first];
}

// a[i] = b[(i + offset) % n]: reads start `offset` floats past an aligned boundary.
// offset < n, so the wrap-around needs one subtraction, not a division.
extern "C" __global__ void copy_offset(float* __restrict__ a, const float* __restrict__ b,
                                       unsigned int n, unsigned int offset)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int j = i + offset;
        if (j >= n)
            j -= n;
        a[i] = b[j];
    }
}

// a[i] = b[(i * stride) % n]: neighbouring threads read `stride` floats apart.
// mask = n - 1 when n is a power of two (then 32-bit wrap-around of i * stride is harmless
// and the modulo is a cheap AND); mask = 0 selects the general 64-bit modulo.
extern "C" __global__ void copy_stride(float* __restrict__ a, const float* __restrict__ b,
                                       unsigned int n, unsigned int stride, unsigned int mask)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int j = mask ? ((i * stride) & mask)
                              : (unsigned int)(((unsigned long long)i * stride) % n);
        a[i] = b[j];
    }
}

// out = in^T for a rows x cols row-major matrix (out is cols x rows).
// Block: TILE x BLOCK_ROWS threads covering a TILE x TILE tile; grid: ceil(cols / TILE) x
// ceil(rows / TILE). Bounds checks make any size right, not only multiples of TILE.

// Reads are coalesced (a warp reads one tile row), writes are strided by `rows` floats:
// every thread of a warp writes to a different row of out.
extern "C" __global__ void transpose_naive(float* __restrict__ out,
                                           const float* __restrict__ in, int rows, int cols)
{
    int x = blockIdx.x * TILE + threadIdx.x;  // column of in
    int y = blockIdx.y * TILE + threadIdx.y;  // row of in
    if (x < cols) {
        for (int j = 0; j < TILE; j += BLOCK_ROWS)
            if (y + j < rows)
                out[(size_t)x * rows + y + j] = in[(size_t)(y + j) * cols + x];
    }
}

// Stage the tile in shared memory: coalesced read of a tile row, coalesced write of an out
// row. Reading a *column* of the shared tile hits one bank 32 times unless the row is
// padded by one float (PAD = 1): then consecutive rows start in consecutive banks.
template <int PAD>
__device__ __forceinline__ void transpose_tile(float* __restrict__ out,
                                               const float* __restrict__ in, int rows, int cols)
{
    __shared__ float tile[TILE][TILE + PAD];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        if (x < cols && y + j < rows)
            tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * cols + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;  // column of out (= row of in)
    y = blockIdx.x * TILE + threadIdx.y;  // row of out (= column of in)
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        if (x < rows && y + j < cols)
            out[(size_t)(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}

extern "C" __global__ void transpose_tiled(float* __restrict__ out,
                                           const float* __restrict__ in, int rows, int cols)
{
    transpose_tile<0>(out, in, rows, cols);
}

extern "C" __global__ void transpose_padded(float* __restrict__ out,
                                            const float* __restrict__ in, int rows, int cols)
{
    transpose_tile<1>(out, in, rows, cols);
}
