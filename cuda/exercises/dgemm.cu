// cudalab-exercise: dgemm
// Exercise: DGEMM, C[M x N] = A[M x K] . B[K x N], row-major float64. First simple (one
// thread per element of C), then with shared-memory tiles.
//
// The slot (do not change it): TILE is defined by the harness (-DTILE=16); it launches
//     dgemm<<<dim3(ceil(N / TILE), ceil(M / TILE)), dim3(TILE, TILE)>>>(A, B, C, M, N, K)
// on sizes that are no multiple of TILE. The check allows a relative error of 1e-12.
// Check your file with:  cudalab exercise check dgemm.cu

#ifndef TILE
#define TILE 16
#endif

extern "C" __global__ void dgemm(const double* __restrict__ A,
                                 const double* __restrict__ B,
                                 double* __restrict__ C, int M, int N, int K)
{
    // TODO 1 (simple): row = blockIdx.y * blockDim.y + threadIdx.y, col likewise with x;
    //         if row < M and col < N, sum A[row * K + k] * B[k * N + col] over k into C.
    // TODO 2 (shared memory): load TILE x TILE tiles of A and B into __shared__ arrays,
    //         as in the tiled float matmul, and reuse each loaded value TILE times.
}
