// cudalab-exercise: register_matmul
// Exercise: C[M x N] = A[M x K] . B[K x N], row-major float32, register tiling: each
// thread computes an RM x RN block of C held in registers.
//
// The slot (do not change it): the harness defines BM = BN = 64, BK = 16, RM = RN = 4 and
// launches (BN / RN) x (BM / RM) = 16 x 16 threads a block:
//     matmul_register<<<dim3(ceil(N / BN), ceil(M / BM)), dim3(BN / RN, BM / RM)>>>(A, B, C, M, N, K)
// Sizes that are no multiple of the tiles are checked too.
// Check your file with:  cudalab exercise check register_matmul.cu

#ifndef BM
#define BM 64
#define BN 64
#define BK 16
#define RM 4
#define RN 4
#endif

extern "C" __global__ void __launch_bounds__((BM / RM) * (BN / RN))
matmul_register(const float* __restrict__ A, const float* __restrict__ B,
                float* __restrict__ C, int M, int N, int K)
{
    // TODO 1: __shared__ slices of A (BM x BK) and B (BK x BN).
    // TODO 2: float acc[RM][RN] = {0}: this thread's block of C.
    // TODO 3: for each BK-deep slice: all threads of the block load the two slices
    //         (zero outside the matrices), __syncthreads(), then for every k load RM values
    //         of A and RN values of B into registers and do RM * RN fmaf's, __syncthreads().
    // TODO 4: store acc to C, checking row < M and col < N for each element.
}
