// cudalab-exercise: tiled_matmul
// Exercise: C[M x N] = A[M x K] . B[K x N], row-major float32, with shared-memory tiles.
//
// The slot (do not change it): TILE is defined by the harness (-DTILE=16); it launches
//     matmul_tiled<<<dim3(ceil(N / TILE), ceil(M / TILE)), dim3(TILE, TILE)>>>(A, B, C, M, N, K)
// on sizes that are not multiples of TILE (5 x 7 . 7 x 3, 257 x 129 . 129 x 65, ...).
// Check your file with:  cudalab exercise check tiled_matmul.cu

#ifndef TILE
#define TILE 16
#endif

extern "C" __global__ void matmul_tiled(const float* __restrict__ A,
                                        const float* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K)
{
    // TODO 1: declare two __shared__ TILE x TILE tiles, one of A and one of B.
    // TODO 2: row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x.
    // TODO 3: loop over the K dimension one tile at a time: each thread loads one element
    //         of each tile (zero where it falls outside A or B), __syncthreads(), adds
    //         TILE products to its accumulator, __syncthreads() again.
    // TODO 4: if row < M and col < N, store the accumulator in C.
}
