// cudalab-exercise: transpose
// Correct and fast: a padded shared tile (no bank conflicts), coalesced reads and writes.
#ifndef TILE
#define TILE 32
#define BLOCK_ROWS 8
#endif

extern "C" __global__ void transpose(float* __restrict__ out,
                                     const float* __restrict__ in, int rows, int cols)
{
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * cols + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;  // a column of `in` is a row of `out`
    y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        if (x < rows && y + j < cols) out[(size_t)(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}
