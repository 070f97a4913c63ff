// Hopper's own matrix product: wgmma (sm_90a) on operands that the tensor memory accelerator
// (TMA) brings into shared memory in the 128-byte swizzle, C[M x N] = A[M x K] * B[K x N],
// row-major, A and B in fp16, bf16 or tf32 (fp32 bit patterns rounded to tf32 on the host),
// FP32 accumulation, C in float32. Four rungs, each adding one thing to the one before:
//
//   tc_wgmma_tma_*      two warpgroups, a 128 x 128 block tile, ONE shared-memory stage: TMA
//                       loads a k-slice, every warp waits on its mbarrier, wgmma, then the
//                       next load (copy and compute never overlap)
//   tc_wgmma_pipe_*     the same warps, STAGES stages: the loads of STAGES-1 later slices are
//                       in flight while the tensor cores work on one (full mbarriers)
//   tc_wgmma_ws_*       warp specialisation: one producer warpgroup issues the TMA loads, two
//                       consumer warpgroups only multiply (full and empty mbarriers, no block
//                       barrier in the loop); setmaxnreg moves registers from the producer to
//                       the consumers, whose 128 x WS_BN tile needs WS_BN / 2 accumulators
//   tc_wgmma_persist_*  the ws kernel on a persistent grid (one block per SM walking the
//                       tiles): the producer already loads the next tile's slices while the
//                       consumers store this tile, so the epilogue no longer stalls the loads
//
// Kernel parameters: (tensor map of A, tensor map of B, C, M, N, K); the maps are 128-byte
// CUtensorMaps made on the host by cuTensorMapEncodeTiled (tensor_cores/tma.py) and passed
// by value as __grid_constant__ parameters. They are 64-byte aligned, and the compiler aligns
// a parameter's address in the constant bank (parameters from byte 0x210 on sm_90), so the
// parameter buffer starts with 48 bytes of padding: ta at 48, tb at 176, C at 304, M, N, K
// at 312, 316, 320 (cuobjdump -elf shows them as EIATTR_KPARAM_INFO). pycuda hands the
// driver one packed buffer, copied as is: wgmma.py packs it that way, and checks it once per
// module with tc_wgmma_param_probe. tc_wgmma_dump_* are a diagnostic (the swizzled stage). A's map: the M x K matrix, box 128 rows x 128
// bytes of K. B's map: fp16/bf16 B itself (K x N, "N-major", box BK rows x 64 columns,
// read by wgmma with its transpose bit); tf32 (and the *_bt kernels) B^T, N x K, box
// BN rows x 128 bytes, since wgmma reads tf32 operands K-major only.
//
// One k-slice is 128 bytes of K (64 fp16/bf16 or 32 tf32 elements): one swizzle row. A's
// slice is 128 rows x 128 B, B's BN x 128 B; STAGES x (16 KiB + BN x 128 B) of dynamic shared
// memory, plus 1 KiB to align the stages to the swizzle pattern's 1024-byte period.
// Sizes: M a multiple of 128, N of the block's BN, K of 64 (the experiment keeps to 256).
// sm_90a only (wgmma, setmaxnreg): other targets compile empty bodies and the experiment
// reports these rungs as not applicable there.

#include <stdint.h>

#ifndef STAGES
#define STAGES 4
#endif
#ifndef WS_BN
#define WS_BN 256
#endif
#ifndef MN_SWAP  // 1: exchange the two strides of the N-major descriptor (a diagnostic)
#define MN_SWAP 0
#endif
#define BM 128        // every rung: two consumer warpgroups of 64 rows
#define ROW 128       // bytes of K in one slice: the 128-byte swizzle's row
#define GROUP_M 8     // block rows that sweep the block columns together (L2 reuse)
#define PRODUCER_REGS 40
#define CONSUMER_REGS 232  // 128 x 40 + 256 x 232 <= 65536

struct __align__(64) TensorMap {
    unsigned long long v[16];
};

enum Prec { FP16 = 0, BF16 = 1, TF32 = 2 };

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int P> struct Elem {
    static constexpr int bytes = P == TF32 ? 4 : 2;
    static constexpr int bk = ROW / bytes;  // K elements of one slice
};

__device__ __forceinline__ uint32_t saddr(const void* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(saddr(bar)), "r"(count));
}

// After the inits: make them visible to the copy engine (async proxy) and the other threads.
__device__ __forceinline__ void mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(saddr(bar)),
                 "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(saddr(bar)) : "memory");
}

__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity)
{
    uint32_t ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return ok != 0;
}

// Wait until the phase of `parity` has completed. A phase that never completes (a copy that
// never lands, a miscounted arrival) traps after about 4e9 cycles instead of hanging the GPU.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity)
{
    const uint32_t a = saddr(bar);
    if (mbar_try(a, parity)) return;
    const long long t0 = clock64();
    while (!mbar_try(a, parity))
        if (clock64() - t0 > 4000000000LL) __trap();
}

// TMA: the box at element coordinates (x innermost, y) of `map` into shared memory at dst;
// completion is counted in bytes on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, uint64_t* bar, int x, int y)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(saddr(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(saddr(bar)), "r"(x), "r"(y)
                 : "memory");
}

// wgmma's shared-memory matrix descriptor for the 128-byte swizzle: start address, leading
// and stride byte offsets (all in 16-byte units), swizzle mode 1 (128 B) in bits 62-63.
__device__ __forceinline__ uint64_t sw128_desc(const void* p, uint32_t lbo, uint32_t sbo)
{
    return static_cast<uint64_t>((saddr(p) & 0x3FFFF) >> 4) |
           (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

#define WG_REGS64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_REGS128 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F16(i) WG_F4(i), WG_F4(i + 4), WG_F4(i + 8), WG_F4(i + 12)
#define WG_D64 WG_F16(0), WG_F16(16), WG_F16(32), WG_F16(48)
#define WG_D128 WG_D64, WG_F16(64), WG_F16(80), WG_F16(96), WG_F16(112)
// D += A B for one m64nNk16 (k8 for tf32); TAIL: the transpose immediates (none for tf32).
#define WGMMA_N128(INSTR, TAIL)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" INSTR " " WG_REGS64             \
                 ", %64, %65, p, 1, 1" TAIL ";\n}\n" : WG_D64 : "l"(a), "l"(b), "n"(1))
#define WGMMA_N256(INSTR, TAIL)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" INSTR " " WG_REGS128           \
                 ", %128, %129, p, 1, 1" TAIL ";\n}\n" : WG_D128 : "l"(a), "l"(b), "n"(1))

// One wgmma of a 64 x N tile; TB: B is N-major (the transpose bit, fp16/bf16 only).
template <int P, int N, bool TB>
__device__ __forceinline__ void wgmma(float* d, uint64_t a, uint64_t b)
{
    static_assert(N == 128 || N == 256, "N: 128 or 256");
    static_assert(!(TB && P == TF32), "tf32 operands are K-major only");
    if constexpr (N == 128) {
        if constexpr (P == TF32) WGMMA_N128("wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "");
        else if constexpr (P == BF16 && TB) WGMMA_N128("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", ", 0, 1");
        else if constexpr (P == BF16) WGMMA_N128("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", ", 0, 0");
        else if constexpr (TB) WGMMA_N128("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", ", 0, 1");
        else WGMMA_N128("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", ", 0, 0");
    } else {
        if constexpr (P == TF32) WGMMA_N256("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", "");
        else if constexpr (P == BF16 && TB) WGMMA_N256("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", ", 0, 1");
        else if constexpr (P == BF16) WGMMA_N256("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", ", 0, 0");
        else if constexpr (TB) WGMMA_N256("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", ", 0, 1");
        else WGMMA_N256("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", ", 0, 0");
    }
}

// The stages start on a 1024-byte boundary: the swizzle pattern repeats every 1024 bytes and
// the descriptors assume it starts at the stage's base.
__device__ __forceinline__ uint8_t* align1024(uint8_t* p)
{
    return p + ((1024 - (saddr(p) & 1023)) & 1023);
}

// Tile t of the grid in grouped order: GROUP_M block rows sweep the block columns together.
__device__ __forceinline__ void tile_of(int t, int grid_m, int grid_n, int& bm, int& bn)
{
    const int width = GROUP_M * grid_n, first = (t / width) * GROUP_M;
    const int rows = min(grid_m - first, GROUP_M);
    bm = first + (t % width) % rows;
    bn = (t % width) / rows;
}

// Producer side: one k-slice (kt) of A (128 x 128 B) and B (BN x 128 B) into a stage.
template <int P, int BN, bool BT>
__device__ __forceinline__ void load_slice(uint8_t* sA, uint8_t* sB, const TensorMap* ta,
                                           const TensorMap* tb, uint64_t* full, int bm, int bn, int kt)
{
    constexpr int BK = Elem<P>::bk;
    mbar_expect_tx(full, (BM + BN) * ROW);
    tma_load(sA, ta, full, kt * BK, bm * BM);
    if constexpr (BT) {
        tma_load(sB, tb, full, kt * BK, bn * BN);  // B^T: BN rows of K
    } else {
#pragma unroll
        for (int j = 0; j < BN / 64; ++j)  // B: BK rows, 64 columns (128 B) per box
            tma_load(sB + j * BK * ROW, tb, full, bn * BN + 64 * j, kt * BK);
    }
}

// Consumer side: warpgroup wg's 64 x BN share of one slice, four wgmma (32 bytes of K each),
// committed as one group.
template <int P, int BN, bool BT>
__device__ __forceinline__ void mma_slice(float* acc, const uint8_t* sA, const uint8_t* sB, int wg)
{
    constexpr int BK = Elem<P>::bk;
    constexpr uint32_t lbo = MN_SWAP ? 1024 : BK * ROW, sbo = MN_SWAP ? BK * ROW : 1024;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        // K-major, swizzled: the next 8 rows are 1024 bytes on; a k-step moves 32 bytes along
        // the row. N-major: 64-column blocks BK x 128 B apart, 8-row groups 1024 B apart; a
        // k-step of 16 (fp16/bf16) moves 16 rows, 2048 bytes.
        const uint64_t da = sw128_desc(sA + wg * 64 * ROW + kk * 32, 16, 1024);
        const uint64_t db = BT ? sw128_desc(sB + kk * 32, 16, 1024)
                               : sw128_desc(sB + kk * 16 * ROW, lbo, sbo);
        wgmma<P, BN, !BT>(acc, da, db);
    }
    wg_commit();
}

// Accumulator layout of m64nN (per warpgroup): warp w holds rows 16w..16w+15; thread lane
// holds, for each 8-column group j, (row lane/4, columns 2(lane%4)+{0,1}) and row + 8.
template <int BN>
__device__ __forceinline__ void store_tile(const float* acc, float* C, int N, int row, int col0)
{
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int col = col0 + 8 * j;
        *reinterpret_cast<float2*>(C + (size_t)row * N + col) = make_float2(acc[4 * j], acc[4 * j + 1]);
        *reinterpret_cast<float2*>(C + (size_t)(row + 8) * N + col) =
            make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
}

__device__ __forceinline__ int out_row(int bm, int wg)
{
    const int t = threadIdx.x % 128;
    return bm * BM + 64 * wg + 16 * (t / 32) + (t % 32) / 4;
}
__device__ __forceinline__ int out_col(int bn, int bn_size) { return bn * bn_size + 2 * (threadIdx.x % 4); }

// Rung 1: one stage, every thread waits for the copy, then the tensor cores.
template <int P, bool BT>
__device__ void gemm_tma(const TensorMap* ta, const TensorMap* tb, float* C, int M, int N, int K)
{
    constexpr int BN = 128;
    __shared__ uint64_t full;
    extern __shared__ uint8_t dyn[];
    uint8_t* sA = align1024(dyn);
    uint8_t* sB = sA + BM * ROW;
    const int wg = threadIdx.x / 128;
    int bm, bn;
    tile_of(blockIdx.x, M / BM, N / BN, bm, bn);
    if (threadIdx.x == 0) {
        mbar_init(&full, 1);
        mbar_init_fence();
    }
    __syncthreads();
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    const int KT = K / Elem<P>::bk;
    for (int kt = 0; kt < KT; ++kt) {
        if (threadIdx.x == 0) load_slice<P, BN, BT>(sA, sB, ta, tb, &full, bm, bn, kt);
        mbar_wait(&full, kt & 1);
        mma_slice<P, BN, BT>(acc, sA, sB, wg);
        wg_wait<0>();
        __syncthreads();  // both warpgroups are done with the stage before it is refilled
    }
    store_tile<BN>(acc, C, N, out_row(bm, wg), out_col(bn, BN));
}

// Rung 2: STAGES stages; thread 0 refills a stage as soon as every warp is done with it.
template <int P, bool BT>
__device__ void gemm_pipe(const TensorMap* ta, const TensorMap* tb, float* C, int M, int N, int K)
{
    constexpr int BN = 128, SA = BM * ROW, SB = BN * ROW;
    __shared__ uint64_t full[STAGES];
    extern __shared__ uint8_t dyn[];
    uint8_t* sA = align1024(dyn);
    uint8_t* sB = sA + STAGES * SA;
    const int wg = threadIdx.x / 128;
    int bm, bn;
    tile_of(blockIdx.x, M / BM, N / BN, bm, bn);
    const int KT = K / Elem<P>::bk;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) mbar_init(&full[s], 1);
        mbar_init_fence();
        for (int s = 0; s < STAGES && s < KT; ++s)
            load_slice<P, BN, BT>(sA + s * SA, sB + s * SB, ta, tb, &full[s], bm, bn, s);
    }
    __syncthreads();
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(&full[s], (kt / STAGES) & 1);
        mma_slice<P, BN, BT>(acc, sA + s * SA, sB + s * SB, wg);
        wg_wait<0>();
        __syncthreads();  // stage s is free
        if (threadIdx.x == 0 && kt + STAGES < KT)
            load_slice<P, BN, BT>(sA + s * SA, sB + s * SB, ta, tb, &full[s], bm, bn, kt + STAGES);
    }
    store_tile<BN>(acc, C, N, out_row(bm, wg), out_col(bn, BN));
}

// Rungs 3 and 4: a producer warpgroup and two consumer warpgroups. full[s]: the slice in
// stage s has landed (one arrival + its bytes); empty[s]: both consumers are done with it.
// The slice counter `it` runs on across tiles (persistent grid): stage it % STAGES, phase
// parity (it / STAGES) & 1; the producer's first pass waits on the phase before the first,
// which counts as complete.
template <int P, int BN, bool BT, bool PERSIST>
__device__ void gemm_ws(const TensorMap* ta, const TensorMap* tb, float* C, int M, int N, int K)
{
    constexpr int SA = BM * ROW, SB = BN * ROW;
    __shared__ uint64_t full[STAGES], empty[STAGES];
    extern __shared__ uint8_t dyn[];
    uint8_t* sA = align1024(dyn);
    uint8_t* sB = sA + STAGES * SA;
    const int grid_m = M / BM, grid_n = N / BN, tiles = grid_m * grid_n;
    const int KT = K / Elem<P>::bk;
    const int step = PERSIST ? gridDim.x : tiles;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 2);
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (threadIdx.x == 0) {
            int it = 0;
            for (int t = blockIdx.x; t < tiles; t += step) {
                int bm, bn;
                tile_of(t, grid_m, grid_n, bm, bn);
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const int s = it % STAGES;
                    mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
                    load_slice<P, BN, BT>(sA + s * SA, sB + s * SB, ta, tb, &full[s], bm, bn, kt);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
        const int wg = threadIdx.x / 128 - 1;
        const bool leader = threadIdx.x % 128 == 0;
        float acc[BN / 2];
        int it = 0;
        for (int t = blockIdx.x; t < tiles; t += step) {
            int bm, bn;
            tile_of(t, grid_m, grid_n, bm, bn);
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
            for (int kt = 0; kt < KT; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(&full[s], (it / STAGES) & 1);
                mma_slice<P, BN, BT>(acc, sA + s * SA, sB + s * SB, wg);
                // keep this slice's group in flight; the one before has finished reading
                wg_wait<1>();
                if (leader && kt > 0) mbar_arrive(&empty[(it - 1) % STAGES]);
            }
            wg_wait<0>();
            if (leader) mbar_arrive(&empty[(it - 1) % STAGES]);
            store_tile<BN>(acc, C, N, out_row(bm, wg), out_col(bn, BN));
        }
    }
}

// Diagnostic: k-slice 0 of block tile (0, 0) as rung 1 loads it (A's 128 rows, then B's 128
// columns), copied byte for byte from shared memory to C, where the host checks the swizzle.
template <int P, bool BT>
__device__ void tma_dump(const TensorMap* ta, const TensorMap* tb, float* C)
{
    __shared__ uint64_t full;
    extern __shared__ uint8_t dyn[];
    uint8_t* sA = align1024(dyn);
    if (threadIdx.x == 0) {
        mbar_init(&full, 1);
        mbar_init_fence();
        load_slice<P, 128, BT>(sA, sA + BM * ROW, ta, tb, &full, 0, 0, 0);
    }
    __syncthreads();
    mbar_wait(&full, 0);
    for (int i = threadIdx.x; i < (BM + 128) * ROW / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(C)[i] = reinterpret_cast<const uint4*>(sA)[i];
}

template <typename T>
__device__ void transpose(const T* __restrict__ in, T* __restrict__ out, int rows, int cols)
{
    __shared__ T tile[32][33];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
#pragma unroll
    for (int i = 0; i < 32; i += 8) tile[threadIdx.y + i][threadIdx.x] = in[(size_t)(y + i) * cols + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x;
    y = blockIdx.x * 32 + threadIdx.y;
#pragma unroll
    for (int i = 0; i < 32; i += 8) out[(size_t)(y + i) * rows + x] = tile[threadIdx.x][threadIdx.y + i];
}
#define BODY(call) call
#else
#define BODY(call)
#endif

#define PARAMS const __grid_constant__ TensorMap ta, const __grid_constant__ TensorMap tb, \
               float* __restrict__ C, int M, int N, int K
#define RUNGS(SUFFIX, P, BT)                                                                   \
    extern "C" __global__ void __launch_bounds__(256, 1) tc_wgmma_tma_##SUFFIX(PARAMS)        \
    {                                                                                          \
        BODY((gemm_tma<P, BT>(&ta, &tb, C, M, N, K)));                                        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 1) tc_wgmma_pipe_##SUFFIX(PARAMS)       \
    {                                                                                          \
        BODY((gemm_pipe<P, BT>(&ta, &tb, C, M, N, K)));                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(384, 1) tc_wgmma_ws_##SUFFIX(PARAMS)         \
    {                                                                                          \
        BODY((gemm_ws<P, WS_BN, BT, false>(&ta, &tb, C, M, N, K)));                           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(384, 1) tc_wgmma_persist_##SUFFIX(PARAMS)    \
    {                                                                                          \
        BODY((gemm_ws<P, WS_BN, BT, true>(&ta, &tb, C, M, N, K)));                            \
    }                                                                                          \
    extern "C" __global__ void tc_wgmma_dump_##SUFFIX(PARAMS)                                  \
    {                                                                                          \
        BODY((tma_dump<P, BT>(&ta, &tb, C)));                                                  \
    }

RUNGS(fp16, FP16, false)
RUNGS(bf16, BF16, false)
RUNGS(tf32, TF32, true)
RUNGS(fp16_bt, FP16, true)  // B^T (K-major) for fp16 too: the layout tf32 must use

// What a launch's parameters arrive as: C, M, N, K and the first and last 8 bytes of each map.
// The host compares them with what it packed before it launches a rung (wgmma.py); they go
// to a module global, not through C, so that a wrong layout is reported, not a fault.
__device__ unsigned long long tc_wgmma_params_seen[8];
extern "C" __global__ void tc_wgmma_param_probe(PARAMS)
{
    unsigned long long* o = tc_wgmma_params_seen;
    o[0] = reinterpret_cast<unsigned long long>(C);
    o[1] = static_cast<unsigned>(M);
    o[2] = static_cast<unsigned>(N);
    o[3] = static_cast<unsigned>(K);
    o[4] = ta.v[0];
    o[5] = ta.v[15];
    o[6] = tb.v[0];
    o[7] = tb.v[15];
}

// out (cols x rows) = in (rows x cols)^T, 32 x 32 tiles, block (32, 8): B^T for the K-major rungs.
extern "C" __global__ void tc_transpose_b32(const uint32_t* __restrict__ in, uint32_t* __restrict__ out,
                                            int rows, int cols)
{
    BODY((transpose<uint32_t>(in, out, rows, cols)));
}
extern "C" __global__ void tc_transpose_b16(const uint16_t* __restrict__ in, uint16_t* __restrict__ out,
                                            int rows, int cols)
{
    BODY((transpose<uint16_t>(in, out, rows, cols)));
}
