// Matrix multiplication C[M x N] = A[M x K] * B[K x N], row-major float32.
// Every kernel checks bounds, so any M, N, K is right (not only tile multiples).
// The kernels past register tiling (float4 loads, double buffering, warp tiling) are in
// matmul_ladder.cu.
//
// Compile-time parameters (nvcc -D...); one module per combination:
//   REAL   element type of matmul_naive and matmul_tiled (float, or double for the FP64
//          lesson; the other kernels are float32 only)
//   TILE   tile width of the shared-memory kernels (8, 16 or 32; TILE*TILE threads a block)
//   BM, BN block tile of matmul_register: the block computes a BM x BN tile of C
//   BK     depth of the shared-memory slices of A (BM x BK) and B (BK x BN)
//   RM, RN register tile: each thread of matmul_register computes RM x RN elements of C,
//          so a block has (BM / RM) * (BN / RN) threads

#ifndef TILE
#define TILE 16
#endif
#ifndef REAL
#define REAL float
#endif

// One thread per element of C: 2*K global loads for 2*K flops. Neighbouring threads share
// a row of A (same address: one load for the warp) or neighbouring columns of B, so L1
// and L2 serve most of those loads; DRAM sees far less than 2*K per element.
extern "C" __global__ void matmul_naive(const REAL* __restrict__ A,
                                        const REAL* __restrict__ B,
                                        REAL* __restrict__ C, int M, int N, int K)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        REAL acc = 0;
        for (int k = 0; k < K; ++k)
            acc += A[row * K + k] * B[k * N + col];
        C[row * N + col] = acc;
    }
}

// Shared-memory tiling: a block loads a TILE x TILE tile of A and of B once, then every
// thread reuses each loaded value TILE times. Global traffic drops by the tile factor.
// Out-of-range elements are loaded as zeros so partial tiles add nothing.
extern "C" __global__ void matmul_tiled(const REAL* __restrict__ A,
                                        const REAL* __restrict__ B,
                                        REAL* __restrict__ C, int M, int N, int K)
{
    __shared__ REAL As[TILE][TILE];
    __shared__ REAL Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    REAL acc = 0;
    for (int t = 0; t < K; t += TILE) {
        As[ty][tx] = (row < M && t + tx < K) ? A[row * K + t + tx] : (REAL)0;
        Bs[ty][tx] = (t + ty < K && col < N) ? B[(t + ty) * N + col] : (REAL)0;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N)
        C[row * N + col] = acc;
}

// ---------------------------------------------------------------------------------------
// Shared-memory bank conflicts. Shared memory is 32 banks of 4-byte words; word w lives in
// bank w % 32. The 32 threads of a warp are served in one pass only if they hit distinct
// banks (or the very same word: a broadcast). The two kernels below keep the B tile
// transposed, Bt[col][k], so in the inner loop thread tx reads Bt[tx][k]: the threads of
// a warp walk DOWN a column of the shared array. The only difference is the row length:
//   tiled_conflict: Bt[TILE][TILE]     word tx*TILE + k -> bank (tx*TILE + k) % 32. For
//                   TILE = 32 all 32 threads hit ONE bank: a 32-way conflict, the read is
//                   replayed 32 times (TILE 16: 8-way, TILE 8: 2-way; threads of a warp
//                   with the same tx read the same word, a broadcast).
//   tiled_padded:   Bt[TILE][TILE + 1] word tx*(TILE+1) + k -> bank (tx + k) % 32 for
//                   TILE = 32: 32 distinct banks, no conflict. One unused word per row.
// The transposing store Bt[tx][ty] = ... (once per tile, not once per k) conflicts the
// same way; padded, it is conflict-free at TILE 32 and 2-way at 16 and 8.
// A is read along a row (As[ty][k]: one word for the whole row of threads, a broadcast),
// so it needs no padding. Global loads are the same coalesced ones as matmul_tiled.
template <int BPITCH>
__device__ __forceinline__ void matmul_transposed_b(const float* __restrict__ A,
                                                    const float* __restrict__ B,
                                                    float* __restrict__ C, int M, int N, int K)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bt[TILE][BPITCH];  // Bt[c][k] = B[k][c]: B tile stored transposed
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        As[ty][tx] = (row < M && t + tx < K) ? A[row * K + t + tx] : 0.0f;
        Bt[tx][ty] = (t + ty < K && col < N) ? B[(t + ty) * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bt[tx][k];  // a warp reads down a column of Bt
        __syncthreads();
    }
    if (row < M && col < N)
        C[row * N + col] = acc;
}

extern "C" __global__ void matmul_tiled_conflict(const float* __restrict__ A,
                                                 const float* __restrict__ B,
                                                 float* __restrict__ C, int M, int N, int K)
{
    matmul_transposed_b<TILE>(A, B, C, M, N, K);
}

extern "C" __global__ void matmul_tiled_padded(const float* __restrict__ A,
                                               const float* __restrict__ B,
                                               float* __restrict__ C, int M, int N, int K)
{
    matmul_transposed_b<TILE + 1>(A, B, C, M, N, K);
}

// ---------------------------------------------------------------------------------------
// Register tiling (unroll-and-jam of the i and j loops): each thread accumulates an
// RM x RN block of C in registers. Per k step it loads RM values of A and RN values of B
// from shared memory and does RM*RN FMAs with them, so a shared-memory load feeds RN (or
// RM) FMAs instead of one. The block tile BM x BN reuses each global value BN (BM) times.
//
// Thread (tx, ty) of the (BN/RN) x (BM/RM) block owns
//   rows  r0 + ty*RM + i       (i < RM, consecutive: the A reads broadcast within a row
//                               of threads and are 16-byte vectorisable)
//   cols  c0 + tx + j*(BN/RN)  (j < RN, strided: neighbouring threads read neighbouring
//                               B words, conflict-free, and store coalesced rows of C)
// A is stored transposed in shared memory (As[k][m]) so its reads run along a row.
// Loads are bounds-checked (zero fill), stores too: any M, N, K works.
#if defined(BM) && defined(BN) && defined(BK) && defined(RM) && defined(RN)

#define NTX (BN / RN)             // threads along N
#define NTY (BM / RM)             // threads along M
#define NTHREADS (NTX * NTY)
#define A_LOADS ((BM * BK + NTHREADS - 1) / NTHREADS)  // tile elements each thread loads
#define B_LOADS ((BK * BN + NTHREADS - 1) / NTHREADS)
#define APAD 4                    // keeps As rows 16-byte aligned, spreads the transposing store

#if (BM % RM) || (BN % RN)
#error "BM must be a multiple of RM and BN of RN"
#endif
#if NTHREADS > 1024
#error "more than 1024 threads per block"
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS)
matmul_register(const float* __restrict__ A, const float* __restrict__ B,
                float* __restrict__ C, int M, int N, int K)
{
    __shared__ __align__(16) float As[BK][BM + APAD];
    __shared__ __align__(16) float Bs[BK][BN];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tid = ty * NTX + tx;
    const int r0 = blockIdx.y * BM;
    const int c0 = blockIdx.x * BN;

    float acc[RM][RN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j)
            acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        // A tile: BM rows x BK columns, consecutive threads read consecutive k (along a
        // row of A) and store them transposed.
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            int e = tid + l * NTHREADS;
            if ((BM * BK) % NTHREADS == 0 || e < BM * BK) {
                int r = e / BK, c = e % BK;
                int gr = r0 + r, gc = k0 + c;
                As[c][r] = (gr < M && gc < K) ? A[(size_t)gr * K + gc] : 0.0f;
            }
        }
        // B tile: BK rows x BN columns, consecutive threads read consecutive columns.
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            int e = tid + l * NTHREADS;
            if ((BK * BN) % NTHREADS == 0 || e < BK * BN) {
                int r = e / BN, c = e % BN;
                int gr = k0 + r, gc = c0 + c;
                Bs[r][c] = (gr < K && gc < N) ? B[(size_t)gr * N + gc] : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[RM], b[RN];
#pragma unroll
            for (int i = 0; i < RM; ++i)
                a[i] = As[k][ty * RM + i];
#pragma unroll
            for (int j = 0; j < RN; ++j)
                b[j] = Bs[k][tx + j * NTX];
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < RN; ++j)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < RM; ++i) {
        int gr = r0 + ty * RM + i;
        if (gr < M) {
#pragma unroll
            for (int j = 0; j < RN; ++j) {
                int gc = c0 + tx + j * NTX;
                if (gc < N)
                    C[(size_t)gr * N + gc] = acc[i][j];
            }
        }
    }
}

#endif  // register tiling parameters
