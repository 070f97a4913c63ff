// Matrix multiplication past register tiling, toward cuBLAS: C[M x N] = A[M x K] * B[K x N],
// row-major float32. Every kernel is right for any M, N, K: a tile that lies wholly inside
// the matrices (and rows whose length is a multiple of 4 floats, so every float4 is
// 16-byte aligned) takes the 128-bit fast path; any other tile is loaded element by
// element with bounds checks and zero fill, and stores of C are guarded the same way.
//
// Compile-time parameters (nvcc -D...); one module per combination:
//   matmul_vec4, matmul_dbuf   BM BN BK TM TN      a block computes a BM x BN tile of C
//                                                   with (BM/TM)*(BN/TN) threads, each
//                                                   thread TM x TN outputs
//   matmul_warptile            BM BN BK WM WN WNITER TM TN NTHREADS
//                                                   each warp owns a WM x WN sub-tile,
//                                                   iterated WMITER x WNITER times
// The A tile is stored transposed (As[k][m]) so a thread reads its TM values of A, like its
// TN values of B, as float4 along a row of shared memory. APAD floats of padding per row
// keep rows 16-byte aligned and spread the transposing store over the banks.

#define APAD 4

// -- tile loads shared by every kernel -------------------------------------------------
// A tile: BM rows x BK columns of A starting at (r0, k0), in float4s along k (a row of A);
// F4 float4s per thread. fetch_* loads into registers, store_* writes shared memory: the
// double-buffered kernel issues the fetch of the next tile before the current tile's math.
template <int BM_, int BK_, int NT>
struct ATile {
    static constexpr int V = BM_ * BK_ / 4;
    static constexpr int F4 = (V + NT - 1) / NT;

    __device__ __forceinline__ static void fetch(float4 (&r)[F4], const float* __restrict__ A,
                                                 int M, int K, int r0, int k0, int tid)
    {
        const bool fast = r0 + BM_ <= M && k0 + BK_ <= K && (K & 3) == 0;
#pragma unroll
        for (int l = 0; l < F4; ++l) {
            int e = tid + l * NT;
            if (V % NT == 0 || e < V) {
                int row = e / (BK_ / 4), col = (e % (BK_ / 4)) * 4;
                int gr = r0 + row, gc = k0 + col;
                if (fast) {
                    r[l] = *reinterpret_cast<const float4*>(A + (size_t)gr * K + gc);
                } else {
                    const float* p = A + (size_t)gr * K;
                    bool in = gr < M;
                    r[l].x = (in && gc + 0 < K) ? p[gc + 0] : 0.0f;
                    r[l].y = (in && gc + 1 < K) ? p[gc + 1] : 0.0f;
                    r[l].z = (in && gc + 2 < K) ? p[gc + 2] : 0.0f;
                    r[l].w = (in && gc + 3 < K) ? p[gc + 3] : 0.0f;
                }
            }
        }
    }

    // transposed: As[k][m]
    __device__ __forceinline__ static void store(const float4 (&r)[F4],
                                                 float (*As)[BM_ + APAD], int tid)
    {
#pragma unroll
        for (int l = 0; l < F4; ++l) {
            int e = tid + l * NT;
            if (V % NT == 0 || e < V) {
                int row = e / (BK_ / 4), col = (e % (BK_ / 4)) * 4;
                As[col + 0][row] = r[l].x;
                As[col + 1][row] = r[l].y;
                As[col + 2][row] = r[l].z;
                As[col + 3][row] = r[l].w;
            }
        }
    }
};

// B tile: BK rows x BN columns of B starting at (k0, c0), in float4s along n.
template <int BK_, int BN_, int NT>
struct BTile {
    static constexpr int V = BK_ * BN_ / 4;
    static constexpr int F4 = (V + NT - 1) / NT;

    __device__ __forceinline__ static bool fast(int K, int N, int k0, int c0)
    {
        return k0 + BK_ <= K && c0 + BN_ <= N && (N & 3) == 0;
    }

    __device__ __forceinline__ static float4 guarded(const float* __restrict__ B, int K, int N,
                                                     int gr, int gc)
    {
        const float* p = B + (size_t)gr * N;
        bool in = gr < K;
        float4 v;
        v.x = (in && gc + 0 < N) ? p[gc + 0] : 0.0f;
        v.y = (in && gc + 1 < N) ? p[gc + 1] : 0.0f;
        v.z = (in && gc + 2 < N) ? p[gc + 2] : 0.0f;
        v.w = (in && gc + 3 < N) ? p[gc + 3] : 0.0f;
        return v;
    }

    __device__ __forceinline__ static void fetch(float4 (&r)[F4], const float* __restrict__ B,
                                                 int K, int N, int k0, int c0, int tid)
    {
        const bool f = fast(K, N, k0, c0);
#pragma unroll
        for (int l = 0; l < F4; ++l) {
            int e = tid + l * NT;
            if (V % NT == 0 || e < V) {
                int row = e / (BN_ / 4), col = (e % (BN_ / 4)) * 4;
                int gr = k0 + row, gc = c0 + col;
                r[l] = f ? *reinterpret_cast<const float4*>(B + (size_t)gr * N + gc)
                         : guarded(B, K, N, gr, gc);
            }
        }
    }

    __device__ __forceinline__ static void store(const float4 (&r)[F4], float (*Bs)[BN_],
                                                 int tid)
    {
#pragma unroll
        for (int l = 0; l < F4; ++l) {
            int e = tid + l * NT;
            if (V % NT == 0 || e < V) {
                int row = e / (BN_ / 4), col = (e % (BN_ / 4)) * 4;
                *reinterpret_cast<float4*>(&Bs[row][col]) = r[l];
            }
        }
    }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // sm_80+: straight from global to shared memory, no registers, asynchronously
    // (cp.async.cg: 16 bytes, cached in L2 only). Edge tiles are stored synchronously.
    __device__ __forceinline__ static void copy_async(float (*Bs)[BN_],
                                                      const float* __restrict__ B, int K,
                                                      int N, int k0, int c0, int tid)
    {
        const bool f = fast(K, N, k0, c0);
#pragma unroll
        for (int l = 0; l < F4; ++l) {
            int e = tid + l * NT;
            if (V % NT == 0 || e < V) {
                int row = e / (BN_ / 4), col = (e % (BN_ / 4)) * 4;
                int gr = k0 + row, gc = c0 + col;
                if (f) {
                    unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(&Bs[row][col]));
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                                 :: "r"(dst), "l"(B + (size_t)gr * N + gc));
                } else {
                    *reinterpret_cast<float4*>(&Bs[row][col]) = guarded(B, K, N, gr, gc);
                }
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    }
#endif
};

__device__ __forceinline__ void cp_async_wait_all()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// C[gr][gc .. gc+3] = v, as one float4 where aligned and inside, else element by element
__device__ __forceinline__ void store_c4(float* __restrict__ C, int M, int N, int gr, int gc,
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

// ---------------------------------------------------------------------------------------
#if defined(WM) && defined(WN) && defined(WNITER) && defined(BM) && defined(BN) && \
    defined(BK) && defined(TM) && defined(TN) && defined(NTHREADS)
// Warp tiling: the block's BM x BN tile is split into (BM/WM) x (BN/WN) warp tiles; a warp
// computes its WM x WN tile as WMITER x WNITER sub-tiles of WSUBM x WSUBN, each thread TM x TN
// of every sub-tile. A warp's shared-memory reads then stay within its own sub-tile rows and
// columns (few distinct addresses, broadcasts), and each thread holds
// WMITER*TM + WNITER*TN operands for WMITER*TM*WNITER*TN FMAs per k.
#define WMITER ((WM * WN) / (32 * TM * TN * WNITER))
#define WSUBM (WM / WMITER)
#define WSUBN (WN / WNITER)
#define TCOLS (WSUBN / TN)  // threads of a warp along n

static_assert(NTHREADS == (BM / WM) * (BN / WN) * 32, "NTHREADS must be (BM/WM)*(BN/WN)*32");
static_assert(BM % WM == 0 && BN % WN == 0, "BM must be a multiple of WM and BN of WN");
static_assert(WMITER >= 1 && (WM * WN) % (32 * TM * TN * WNITER) == 0,
              "WM*WN must be a multiple of 32*TM*TN*WNITER");
static_assert(WN % WNITER == 0 && WSUBN % TN == 0 && 32 % TCOLS == 0,
              "WN/WNITER must be a multiple of TN, and WN/WNITER/TN must divide 32");
static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "TM, TN and BK must be multiples of 4");
static_assert((32 / TCOLS) * TM == WSUBM, "a warp's threads must cover its sub-tile");

extern "C" __global__ void __launch_bounds__(NTHREADS)
matmul_warptile(const float* __restrict__ A, const float* __restrict__ B,
                float* __restrict__ C, int M, int N, int K)
{
    typedef ATile<BM, BK, NTHREADS> AT;
    typedef BTile<BK, BN, NTHREADS> BT;
    __shared__ __align__(16) float As[BK][BM + APAD];
    __shared__ __align__(16) float Bs[BK][BN];
    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int wrow = warp / (BN / WN), wcol = warp % (BN / WN);
    const int trow = lane / TCOLS, tcol = lane % TCOLS;
    const int r0 = blockIdx.y * BM, c0 = blockIdx.x * BN;

    float acc[WMITER * TM][WNITER * TN];
#pragma unroll
    for (int i = 0; i < WMITER * TM; ++i)
#pragma unroll
        for (int j = 0; j < WNITER * TN; ++j)
            acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        float4 ra[AT::F4], rb[BT::F4];
        AT::fetch(ra, A, M, K, r0, k0, tid);
        BT::fetch(rb, B, K, N, k0, c0, tid);
        AT::store(ra, As, tid);
        BT::store(rb, Bs, tid);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[WMITER * TM], b[WNITER * TN];
#pragma unroll
            for (int wm = 0; wm < WMITER; ++wm)
#pragma unroll
                for (int i = 0; i < TM; i += 4) {
                    float4 v = *reinterpret_cast<const float4*>(
                        &As[k][wrow * WM + wm * WSUBM + trow * TM + i]);
                    a[wm * TM + i + 0] = v.x; a[wm * TM + i + 1] = v.y;
                    a[wm * TM + i + 2] = v.z; a[wm * TM + i + 3] = v.w;
                }
#pragma unroll
            for (int wn = 0; wn < WNITER; ++wn)
#pragma unroll
                for (int j = 0; j < TN; j += 4) {
                    float4 v = *reinterpret_cast<const float4*>(
                        &Bs[k][wcol * WN + wn * WSUBN + tcol * TN + j]);
                    b[wn * TN + j + 0] = v.x; b[wn * TN + j + 1] = v.y;
                    b[wn * TN + j + 2] = v.z; b[wn * TN + j + 3] = v.w;
                }
#pragma unroll
            for (int i = 0; i < WMITER * TM; ++i)
#pragma unroll
                for (int j = 0; j < WNITER * TN; ++j)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int wm = 0; wm < WMITER; ++wm)
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            int gr = r0 + wrow * WM + wm * WSUBM + trow * TM + i;
#pragma unroll
            for (int wn = 0; wn < WNITER; ++wn)
#pragma unroll
                for (int j = 0; j < TN; j += 4) {
                    int gc = c0 + wcol * WN + wn * WSUBN + tcol * TN + j;
                    const int ii = wm * TM + i, jj = wn * TN + j;
                    store_c4(C, M, N, gr, gc, make_float4(acc[ii][jj], acc[ii][jj + 1],
                                                          acc[ii][jj + 2], acc[ii][jj + 3]));
                }
        }
}

// ---------------------------------------------------------------------------------------
#elif defined(BM) && defined(BN) && defined(BK) && defined(TM) && defined(TN)
// vec4 and dbuf: register tiling with 128-bit loads. Thread (tx, ty) of the
// (BN/TN) x (BM/TM) block owns the float4 groups
//   rows  r0 + i*(NTY*4) + ty*4 + (0..3)   (i < TM/4)
//   cols  c0 + j*(NTX*4) + tx*4 + (0..3)   (j < TN/4)
// so neighbouring threads read neighbouring float4s of a shared row (conflict-free: a
// quarter warp reads 128 contiguous bytes) and store neighbouring float4s of C.
#define NTX (BN / TN)
#define NTY (BM / TM)
#define NT (NTX * NTY)

static_assert(BM % TM == 0 && BN % TN == 0, "BM must be a multiple of TM and BN of TN");
static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "TM, TN and BK must be multiples of 4");
static_assert(NT <= 1024, "more than 1024 threads per block");

__device__ __forceinline__ void mac_tile(const float (*As)[BM + APAD], const float (*Bs)[BN],
                                         float (&acc)[TM][TN], int tx, int ty)
{
#pragma unroll
    for (int k = 0; k < BK; ++k) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM / 4; ++i) {
            float4 v = *reinterpret_cast<const float4*>(&As[k][i * NTY * 4 + ty * 4]);
            a[4 * i + 0] = v.x; a[4 * i + 1] = v.y; a[4 * i + 2] = v.z; a[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < TN / 4; ++j) {
            float4 v = *reinterpret_cast<const float4*>(&Bs[k][j * NTX * 4 + tx * 4]);
            b[4 * j + 0] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j)
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

__device__ __forceinline__ void store_tile(float* __restrict__ C, int M, int N, int r0, int c0,
                                           const float (&acc)[TM][TN], int tx, int ty)
{
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int gr = r0 + (i / 4) * NTY * 4 + ty * 4 + i % 4;
#pragma unroll
        for (int j = 0; j < TN / 4; ++j)
            store_c4(C, M, N, gr, c0 + j * NTX * 4 + tx * 4,
                     make_float4(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2],
                                 acc[i][4 * j + 3]));
    }
}

__device__ __forceinline__ void zero(float (&acc)[TM][TN])
{
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;
}

// One shared tile pair: load (float4 from global, A stored transposed), sync, multiply, sync.
extern "C" __global__ void __launch_bounds__(NT)
matmul_vec4(const float* __restrict__ A, const float* __restrict__ B,
            float* __restrict__ C, int M, int N, int K)
{
    typedef ATile<BM, BK, NT> AT;
    typedef BTile<BK, BN, NT> BT;
    __shared__ __align__(16) float As[BK][BM + APAD];
    __shared__ __align__(16) float Bs[BK][BN];
    const int tid = threadIdx.x, tx = tid % NTX, ty = tid / NTX;
    const int r0 = blockIdx.y * BM, c0 = blockIdx.x * BN;
    float acc[TM][TN];
    zero(acc);
    for (int k0 = 0; k0 < K; k0 += BK) {
        float4 ra[AT::F4], rb[BT::F4];
        AT::fetch(ra, A, M, K, r0, k0, tid);
        BT::fetch(rb, B, K, N, k0, c0, tid);
        AT::store(ra, As, tid);
        BT::store(rb, Bs, tid);
        __syncthreads();
        mac_tile(As, Bs, acc, tx, ty);
        __syncthreads();
    }
    store_tile(C, M, N, r0, c0, acc, tx, ty);
}

// Double buffering: two shared tile pairs. While the block multiplies tile t out of one
// pair, tile t+1 is on its way into the other: B by cp.async (sm_80+: global -> shared
// without registers; earlier GPUs stage it in registers like A), A through registers
// (cp.async copies bytes as they lie and cannot transpose), written after the math. One
// __syncthreads per tile instead of two.
extern "C" __global__ void __launch_bounds__(NT)
matmul_dbuf(const float* __restrict__ A, const float* __restrict__ B,
            float* __restrict__ C, int M, int N, int K)
{
    typedef ATile<BM, BK, NT> AT;
    typedef BTile<BK, BN, NT> BT;
    __shared__ __align__(16) float As[2][BK][BM + APAD];
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int tid = threadIdx.x, tx = tid % NTX, ty = tid / NTX;
    const int r0 = blockIdx.y * BM, c0 = blockIdx.x * BN;
    const int tiles = (K + BK - 1) / BK;
    float acc[TM][TN];
    zero(acc);
    float4 ra[AT::F4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    BT::copy_async(Bs[0], B, K, N, 0, c0, tid);
#else
    float4 rb[BT::F4];
    BT::fetch(rb, B, K, N, 0, c0, tid);
    BT::store(rb, Bs[0], tid);
#endif
    AT::fetch(ra, A, M, K, r0, 0, tid);
    AT::store(ra, As[0], tid);
    cp_async_wait_all();
    __syncthreads();
    for (int t = 0; t < tiles; ++t) {
        const int cur = t & 1, nxt = cur ^ 1;
        const bool more = t + 1 < tiles;
        if (more) {  // buffer nxt was last read before the previous iteration's barrier
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
            BT::copy_async(Bs[nxt], B, K, N, (t + 1) * BK, c0, tid);
#else
            BT::fetch(rb, B, K, N, (t + 1) * BK, c0, tid);
#endif
            AT::fetch(ra, A, M, K, r0, (t + 1) * BK, tid);
        }
        mac_tile(As[cur], Bs[cur], acc, tx, ty);
        if (more) {
            AT::store(ra, As[nxt], tid);
#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
            BT::store(rb, Bs[nxt], tid);
#endif
            cp_async_wait_all();
        }
        __syncthreads();
    }
    store_tile(C, M, N, r0, c0, acc, tx, ty);
}

#endif  // tile parameters
