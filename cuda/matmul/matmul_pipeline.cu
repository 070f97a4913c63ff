// The ladder's last CUDA-core rungs: C[M x N] = A[M x K] * B[K x N], row-major float32.
// Both operand tiles go from global to shared memory by cp.async (sm_80+; earlier GPUs
// copy through registers), STAGES tiles deep, so the copies of the next STAGES-1 tiles are
// in flight while a tile is multiplied, with one barrier per tile. Neither tile is
// transposed on its way (cp.async copies bytes as they lie), so A stays row-major in shared
// memory and a thread reads its A values as float4 along k: four k steps per load.
//
//   matmul_pipelined   the A tile as it lies: the 8 rows a warp reads with one LDS.128 fall
//                      into 2 of the 8 16-byte bank groups (BK = 16), a 4-way conflict
//   matmul_swizzled    the A tile's 16-byte chunks XOR-swizzled by row: the same 8 rows
//                      land in 8 different bank groups, conflict-free, without padding
//
// Compile-time parameters (nvcc -D...), one module per combination:
//   BM BN BK       the block's tile of C and the k depth of a stage
//   WM WN          a warp's tile of C; (BM/WM)*(BN/WN) warps, NTHREADS = 32 * that
//   WTM            a warp's threads along m (WTN = 32/WTM along n); a thread owns
//                  TM = WM/WTM rows spaced WTM apart and TN = WN/WTN columns in float4
//                  groups spaced 4*WTN apart, so a warp's loads and stores of one
//                  instruction touch consecutive rows and consecutive float4s
//   STAGES         shared-memory stages (2 = double buffering)
//   MINB           blocks per SM the register budget must allow (__launch_bounds__), 1
//   KORDER         1: the outer product's FFMAs column by column, 2: row by row with the
//                  columns back and forth (default 0: row by row); it changes nothing but
//                  the compiler's register allocation and schedule, and with them how many
//                  FFMAs read two registers of one bank
//   FRAGDB         1: the fragments a thread multiplies are double-buffered in registers,
//                  one k step ahead (B) and one 4-k chunk ahead (A), and the stage's barrier
//                  sits before its last k step, so the next stage's first fragments load
//                  while that step's FFMAs run (default 0: a stage's loads start after the
//                  barrier); every stage holds a tile, STAGES-1 of them in flight
//   SLAB           1: the A tile is stored as 16-deep k slabs ([BK/16][BM][16]) rather than as
//                  BM rows of BK floats: at BK = 32 a warp's float4 reads of A then hit
//                  the bank groups as at BK = 16 (default 0: rows of BK floats)
//   GROUP          > 0: blocks run GROUP block rows at a time, column by column within the
//                  group (L2 reuse of B's columns); 0 (default): row by row

// Every kernel is right for any M, N, K: a tile wholly inside the matrices whose rows are
// 16-byte aligned is copied by cp.async; any other is loaded element by element with
// bounds checks and zero fill, and stores of C are guarded.

#if defined(BM) && defined(BN) && defined(BK) && defined(WM) && defined(WN) && \
    defined(WTM) && defined(STAGES) && defined(NTHREADS)
#ifndef MINB
#define MINB 1
#endif
#ifndef KORDER
#define KORDER 0
#endif
#ifndef FRAGDB
#define FRAGDB 0
#endif
#ifndef GROUP
#define GROUP 0
#endif
#ifndef SLAB
#define SLAB 0
#endif
#if FRAGDB
#define K_LOOP k_loop_frag
#else
#define K_LOOP k_loop
#endif

#define WTN (32 / WTM)
#define TM (WM / WTM)
#define TN (WN / WTN)
#define NWN (BN / WN)
#define ACH (BK / 4)  // 16-byte chunks of k in a row of the A tile
#if SLAB && BK > 16
#define AK 16  // floats of k in a row of a slab of the A tile
#else
#define AK BK
#endif
#define SCH (AK / 4)  // 16-byte chunks in a row of a slab
#define BCH (BN / 4)  // 16-byte chunks in a row of the B tile

static_assert(NTHREADS == (BM / WM) * (BN / WN) * 32, "NTHREADS must be (BM/WM)*(BN/WN)*32");
static_assert(BM % WM == 0 && BN % WN == 0, "BM must be a multiple of WM and BN of WN");
static_assert(WTM == 4 || WTM == 8, "WTM must be 4 or 8");
static_assert(WM % WTM == 0 && WN % (4 * WTN) == 0, "WM must be a multiple of WTM, WN of 4*WTN");
static_assert(BK == 8 || BK == 16 || BK == 32, "BK must be 8, 16 or 32");
static_assert(STAGES >= 2 && STAGES <= 8, "STAGES must be 2..8");
static_assert(STAGES * 4 * BK * (BM + BN) <= 48 * 1024, "more than 48 KiB of static shared memory");

// The swizzle: chunk c of row r of the A tile is stored at chunk c ^ swz(r). A 128-byte
// bank line holds 8 chunks, 8/SCH rows; swz gives the WTM consecutive rows one load reads a
// bank group each. It repeats every WTM rows, so a thread's rows r + i*WTM share one swz and
// the swizzled offsets are computed once, not per row.
__device__ __forceinline__ int a_swz(int r)
{
    return (r / (8 / SCH)) & (WTM * SCH / 8 - 1);
}

// float offset of chunk c (k = 4c..4c+3) of row r in the A tile: slab c / SCH, its row r
template <bool SWZ>
__device__ __forceinline__ int a_off(int r, int c)
{
    const int s = c / SCH, cc = c % SCH;
    return s * (BM * AK) + r * AK + ((SWZ ? (cc ^ a_swz(r)) : cc) << 2);
}

__device__ __forceinline__ void cp_async16(float* dst, const float* src)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(d), "l"(src));
#else
    *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
#endif
}

__device__ __forceinline__ void cp_async_commit()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// until at most PENDING of this thread's committed copy groups are still in flight
template <int PENDING>
__device__ __forceinline__ void cp_async_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
#endif
}

// p[c .. c+3] of a row of n floats, zero outside the row or the matrix
__device__ __forceinline__ float4 guarded4(const float* __restrict__ p, bool in, int c, int n)
{
    float4 v;
    v.x = (in && c + 0 < n) ? p[c + 0] : 0.0f;
    v.y = (in && c + 1 < n) ? p[c + 1] : 0.0f;
    v.z = (in && c + 2 < n) ? p[c + 2] : 0.0f;
    v.w = (in && c + 3 < n) ? p[c + 3] : 0.0f;
    return v;
}

// One stage: A rows r0.. (BM x BK from column k0) and B rows k0.. (BK x BN from column c0).
template <bool SWZ>
__device__ __forceinline__ void load_stage(float* __restrict__ As, float* __restrict__ Bs,
                                           const float* __restrict__ A,
                                           const float* __restrict__ B, int M, int N, int K,
                                           int r0, int c0, int k0, int tid)
{
    const bool fa = r0 + BM <= M && k0 + BK <= K && (K & 3) == 0;
#pragma unroll
    for (int l = 0; l < (BM * ACH + NTHREADS - 1) / NTHREADS; ++l) {
        const int e = tid + l * NTHREADS;
        if ((BM * ACH) % NTHREADS != 0 && e >= BM * ACH)
            break;
        const int r = e / ACH, c = e % ACH;
        const float* src = A + (size_t)(r0 + r) * K + k0 + 4 * c;
        if (fa)
            cp_async16(As + a_off<SWZ>(r, c), src);
        else
            *reinterpret_cast<float4*>(As + a_off<SWZ>(r, c)) =
                guarded4(A + (size_t)(r0 + r) * K, r0 + r < M, k0 + 4 * c, K);
    }
    const bool fb = k0 + BK <= K && c0 + BN <= N && (N & 3) == 0;
#pragma unroll
    for (int l = 0; l < (BK * BCH + NTHREADS - 1) / NTHREADS; ++l) {
        const int e = tid + l * NTHREADS;
        if ((BK * BCH) % NTHREADS != 0 && e >= BK * BCH)
            break;
        const int r = e / BCH, c = e % BCH;
        if (fb)
            cp_async16(Bs + r * BN + 4 * c, B + (size_t)(k0 + r) * N + c0 + 4 * c);
        else
            *reinterpret_cast<float4*>(Bs + r * BN + 4 * c) =
                guarded4(B + (size_t)(k0 + r) * N, k0 + r < K, c0 + 4 * c, N);
    }
}

// The same stage of a block that lies wholly inside the matrices with K a multiple of BK and
// rows 16-byte aligned: cp.async only, no bounds checks, so the main loop stays branch-free.
// a and b point at this thread's first chunk of the stage's A and B tiles.
template <bool SWZ>
__device__ __forceinline__ void load_stage_interior(float* __restrict__ As,
                                                    float* __restrict__ Bs,
                                                    const float* __restrict__ a,
                                                    const float* __restrict__ b, int N, int K,
                                                    int tid)
{
    static_assert((BM * ACH) % NTHREADS == 0 && (BK * BCH) % NTHREADS == 0 &&
                  NTHREADS % ACH == 0 && NTHREADS % BCH == 0,
                  "every thread copies the same chunk columns of the same number of rows");
#pragma unroll
    for (int l = 0; l < BM * ACH / NTHREADS; ++l) {
        const int e = tid + l * NTHREADS;
        cp_async16(As + a_off<SWZ>(e / ACH, e % ACH), a + (size_t)l * (NTHREADS / ACH) * K);
    }
#pragma unroll
    for (int l = 0; l < BK * BCH / NTHREADS; ++l) {
        const int e = tid + l * NTHREADS;
        cp_async16(Bs + (e / BCH) * BN + 4 * (e % BCH), b + (size_t)l * (NTHREADS / BCH) * N);
    }
}

__device__ __forceinline__ float comp(const float4& v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// acc += a x b at step kk of a 4-k chunk: a thread's TM A values (component kk of its A
// float4s) times its TN B values, TM*TN FFMAs
__device__ __forceinline__ void outer(const float4 (&a)[TM], int kk, const float (&b)[TN],
                                      float (&acc)[TM][TN])
{
#if KORDER == 1  // columns outer: another FFMA order, another register allocation
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
        for (int i = 0; i < TM; ++i)
            acc[i][j] = fmaf(comp(a[i], kk), b[j], acc[i][j]);
#elif KORDER == 2  // rows outer, columns back and forth: b[j] repeats at each row change
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int jj = 0; jj < TN; ++jj) {
            const int j = (i & 1) ? TN - 1 - jj : jj;
            acc[i][j] = fmaf(comp(a[i], kk), b[j], acc[i][j]);
        }
#else
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = fmaf(comp(a[i], kk), b[j], acc[i][j]);
#endif
}

// this thread's A float4s of chunk C of a stage (rows arow + i*WTM, k = 4C..4C+3)
template <bool SWZ, int C>
__device__ __forceinline__ void load_a_frag(const float* __restrict__ As, float4 (&a)[TM],
                                            int arow)
{
#pragma unroll
    for (int i = 0; i < TM; ++i)
        a[i] = *reinterpret_cast<const float4*>(As + a_off<SWZ>(arow + i * WTM, C));
}

// this thread's B values of k row k of a stage (float4 groups spaced 4*WTN from bcol)
__device__ __forceinline__ void load_b_frag(const float* __restrict__ Bs, int k, float (&b)[TN],
                                            int bcol)
{
#pragma unroll
    for (int j = 0; j < TN / 4; ++j) {
        float4 v = *reinterpret_cast<const float4*>(Bs + k * BN + bcol + j * 4 * WTN);
        b[4 * j + 0] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
    }
}

// acc += one 4-k chunk C of the stage: TM float4 loads of A, then per k step TN/4 float4
// loads of B and TM*TN FFMAs.
template <bool SWZ, int C>
__device__ __forceinline__ void mac_chunk(const float* __restrict__ As,
                                          const float* __restrict__ Bs,
                                          float (&acc)[TM][TN], int arow, int bcol)
{
    float4 a[TM];
    load_a_frag<SWZ, C>(As, a, arow);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        float b[TN];
        load_b_frag(Bs, 4 * C + kk, b, bcol);
        outer(a, kk, b, acc);
    }
}

// acc += the stage's A x B, chunk by chunk. A template recursion rather than a loop: nvcc
// unrolls a loop over the chunks only twice, leaving the swizzle to be computed at run time.
template <bool SWZ, int C = 0>
__device__ __forceinline__ void mac_stage(const float* __restrict__ As,
                                          const float* __restrict__ Bs,
                                          float (&acc)[TM][TN], int arow, int bcol)
{
    if constexpr (C < ACH) {
        mac_chunk<SWZ, C>(As, Bs, acc, arow, bcol);
        mac_stage<SWZ, C + 1>(As, Bs, acc, arow, bcol);
    }
}

// C[gr][gc .. gc+3] = v, as one float4 where aligned and inside, else element by element
__device__ __forceinline__ void put_c4(float* __restrict__ C, int M, int N, int gr, int gc,
                                       float4 v)
{
    if (gr >= M)
        return;
    float* p = C + (size_t)gr * N;
    if ((N & 3) == 0 && gc + 3 < N) {
        *reinterpret_cast<float4*>(p + gc) = v;
    } else {
        if (gc + 0 < N) p[gc + 0] = v.x;
        if (gc + 1 < N) p[gc + 1] = v.y;
        if (gc + 2 < N) p[gc + 2] = v.z;
        if (gc + 3 < N) p[gc + 3] = v.w;
    }
}

// The k loop: STAGES-1 tiles in flight ahead of the one being multiplied.
template <bool SWZ, bool INTERIOR>
__device__ __forceinline__ void k_loop(float (*As)[BM * BK], float (*Bs)[BK * BN],
                                       const float* __restrict__ A,
                                       const float* __restrict__ B, int M, int N, int K,
                                       int r0, int c0, float (&acc)[TM][TN], int arow, int bcol)
{
    const int tid = threadIdx.x, tiles = (K + BK - 1) / BK;
    // interior: this thread's first chunk of A (row tid/ACH) and of B (row tid/BCH)
    const float* a = A + (size_t)(r0 + tid / ACH) * K + 4 * (tid % ACH);
    const float* b = B + (size_t)(tid / BCH) * N + c0 + 4 * (tid % BCH);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) {
            if (INTERIOR)
                load_stage_interior<SWZ>(As[s], Bs[s], a + s * BK, b + (size_t)s * BK * N, N,
                                         K, tid);
            else
                load_stage<SWZ>(As[s], Bs[s], A, B, M, N, K, r0, c0, s * BK, tid);
        }
        cp_async_commit();  // empty groups too: the wait below counts groups
    }
    for (int t = 0; t < tiles; ++t) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile t have landed ...
        __syncthreads();         // ... everyone's, and stage (t-1) % STAGES is free again
        const int nt = t + STAGES - 1;
        if (nt < tiles) {
            if (INTERIOR)
                load_stage_interior<SWZ>(As[nt % STAGES], Bs[nt % STAGES], a + nt * BK,
                                         b + (size_t)nt * BK * N, N, K, tid);
            else
                load_stage<SWZ>(As[nt % STAGES], Bs[nt % STAGES], A, B, M, N, K, r0, c0,
                                nt * BK, tid);
        }
        cp_async_commit();
        mac_stage<SWZ>(As[t % STAGES], Bs[t % STAGES], acc, arow, bcol);
    }
}

// Steps S .. BK-2 of a stage: each loads the next step's fragments (B every step, A every
// fourth, into the other buffer) before its own FFMAs, so no FFMA waits on its own loads.
template <bool SWZ, int S>
__device__ __forceinline__ void frag_steps(const float* __restrict__ As,
                                           const float* __restrict__ Bs, float4 (&a)[2][TM],
                                           float (&b)[2][TN], float (&acc)[TM][TN], int arow,
                                           int bcol)
{
    if constexpr (S < BK - 1) {
        if constexpr ((S + 1) % 4 == 0)
            load_a_frag<SWZ, (S + 1) / 4>(As, a[((S + 1) / 4) & 1], arow);
        load_b_frag(Bs, S + 1, b[(S + 1) & 1], bcol);
        outer(a[(S / 4) & 1], S % 4, b[S & 1], acc);
        frag_steps<SWZ, S + 1>(As, Bs, a, b, acc, arow, bcol);
    }
}

// The k loop with register double buffering: every stage holds a tile (STAGES-1 in flight
// while one is multiplied). The barrier comes after the fragments of a stage's last k step
// are in registers: then the stage is free for the tile STAGES ahead, and the next stage's
// first fragments load while the last step's FFMAs run instead of after a drained pipeline.
template <bool SWZ, bool INTERIOR>
__device__ __forceinline__ void k_loop_frag(float (*As)[BM * BK], float (*Bs)[BK * BN],
                                            const float* __restrict__ A,
                                            const float* __restrict__ B, int M, int N, int K,
                                            int r0, int c0, float (&acc)[TM][TN], int arow,
                                            int bcol)
{
    static_assert(ACH % 2 == 0, "a stage's last chunk must use A buffer 1, its first buffer 0");
    const int tid = threadIdx.x, tiles = (K + BK - 1) / BK;
    const float* a = A + (size_t)(r0 + tid / ACH) * K + 4 * (tid % ACH);
    const float* b = B + (size_t)(tid / BCH) * N + c0 + 4 * (tid % BCH);
    auto load = [&](int slot, int tile) {
        if (INTERIOR)
            load_stage_interior<SWZ>(As[slot], Bs[slot], a + tile * BK,
                                     b + (size_t)tile * BK * N, N, K, tid);
        else
            load_stage<SWZ>(As[slot], Bs[slot], A, B, M, N, K, r0, c0, tile * BK, tid);
    };
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
        if (s < tiles)
            load(s, s);
        cp_async_commit();  // empty groups too: the waits count groups
    }
    cp_async_wait<STAGES - 1>();  // tile 0
    __syncthreads();
    float4 af[2][TM];
    float bf[2][TN];
    load_a_frag<SWZ, 0>(As[0], af[0], arow);
    load_b_frag(Bs[0], 0, bf[0], bcol);
    for (int t = 0; t < tiles; ++t) {
        const int cur = t % STAGES, nxt = (t + 1) % STAGES;
        frag_steps<SWZ, 0>(As[cur], Bs[cur], af, bf, acc, arow, bcol);
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile t+1 have landed ...
        __syncthreads();              // ... everyone's, and nobody reads stage cur any more
        if (t + STAGES < tiles)
            load(cur, t + STAGES);
        cp_async_commit();
        if (t + 1 < tiles) {
            load_a_frag<SWZ, 0>(As[nxt], af[0], arow);
            load_b_frag(Bs[nxt], 0, bf[0], bcol);
        }
        outer(af[1], 3, bf[1], acc);  // step BK-1: chunk ACH-1's buffer, B buffer 1
    }
}

// This block's tile of C (by, bx): launch order, or GROUP block rows at a time
__device__ __forceinline__ void block_tile(int& by, int& bx)
{
#if GROUP > 0
    const int id = blockIdx.y * gridDim.x + blockIdx.x;
    const int per = GROUP * gridDim.x;  // blocks of one group of GROUP block rows
    const int first = (id / per) * GROUP;
    const int rows = min((int)gridDim.y - first, GROUP);
    by = first + (id % per) % rows;
    bx = (id % per) / rows;
#else
    by = blockIdx.y;
    bx = blockIdx.x;
#endif
}

template <bool SWZ>
__device__ __forceinline__ void gemm_stages(const float* __restrict__ A,
                                            const float* __restrict__ B,
                                            float* __restrict__ C, int M, int N, int K)
{
    __shared__ __align__(16) float As[STAGES][BM * BK];
    __shared__ __align__(16) float Bs[STAGES][BK * BN];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int arow = (warp / NWN) * WM + lane / WTN;          // first row of this thread
    const int bcol = (warp % NWN) * WN + (lane % WTN) * 4;    // first column
    int by, bx;
    block_tile(by, bx);
    const int r0 = by * BM, c0 = bx * BN;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

    if (r0 + BM <= M && c0 + BN <= N && K % BK == 0 && (N & 3) == 0)
        K_LOOP<SWZ, true>(As, Bs, A, B, M, N, K, r0, c0, acc, arow, bcol);
    else
        K_LOOP<SWZ, false>(As, Bs, A, B, M, N, K, r0, c0, acc, arow, bcol);

#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN / 4; ++j)
            put_c4(C, M, N, r0 + arow + i * WTM, c0 + bcol + j * 4 * WTN,
                   make_float4(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2],
                               acc[i][4 * j + 3]));
}

extern "C" __global__ void __launch_bounds__(NTHREADS, MINB)
matmul_pipelined(const float* __restrict__ A, const float* __restrict__ B,
                 float* __restrict__ C, int M, int N, int K)
{
    gemm_stages<false>(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(NTHREADS, MINB)
matmul_swizzled(const float* __restrict__ A, const float* __restrict__ B,
                float* __restrict__ C, int M, int N, int K)
{
    gemm_stages<true>(A, B, C, M, N, K);
}

#endif  // tile parameters
