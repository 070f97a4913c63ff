// cudalab-exercise: transpose
// Exercise: out = in^T for a rows x cols row-major float32 matrix (out is cols x rows).
//
// The slot (do not change it): the harness defines TILE = 32 and BLOCK_ROWS = 8 and
// launches a TILE x BLOCK_ROWS block per TILE x TILE tile:
//     transpose<<<dim3(ceil(cols / TILE), ceil(rows / TILE)), dim3(TILE, BLOCK_ROWS)>>>(out, in, rows, cols)
// Each thread handles TILE / BLOCK_ROWS elements of its tile. Non-square sizes and sizes
// that are no multiple of TILE are checked, bit for bit.
// Check your file with:  cudalab exercise check transpose.cu

#ifndef TILE
#define TILE 32
#define BLOCK_ROWS 8
#endif

extern "C" __global__ void transpose(float* __restrict__ out,
                                     const float* __restrict__ in, int rows, int cols)
{
    // TODO 1: a __shared__ tile (think about its row length: bank conflicts).
    // TODO 2: read the tile: coalesced rows of `in` (check x < cols and y < rows).
    // TODO 3: __syncthreads(), then write coalesced rows of `out` from columns of the tile.
}
