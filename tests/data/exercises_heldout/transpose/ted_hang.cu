// cudalab-exercise: transpose
// Hangs: the last block waits for a flag that no thread ever sets (a hand-made grid
// barrier gone wrong). The kernel never returns.
#ifndef TILE
#define TILE 32
#define BLOCK_ROWS 8
#endif

__device__ volatile int all_blocks_done = 0;

extern "C" __global__ void transpose(float* __restrict__ out,
                                     const float* __restrict__ in, int rows, int cols)
{
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += BLOCK_ROWS)
        if (x < cols && y + j < rows) out[(size_t)x * rows + y + j] = in[(size_t)(y + j) * cols + x];
    if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1)
        while (all_blocks_done == 0) {
        }
}
