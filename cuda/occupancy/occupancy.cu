// Kernels of the occupancy experiment: the same element-wise product c = a * b with
// different register and shared-memory footprints, and a tiled matmul whose tile (and so
// its shared memory) is chosen at launch time.
//
// Compile-time parameters (nvcc -D...):
//   LIVE     values vec_mul_regs keeps live at once (more values -> more registers per
//            thread -> fewer resident warps); default 64
//   ROUNDS   mixing rounds over the live values in vec_mul_regs; default 4
//
// Variants the static analysis compiles (one line each):
// cudalab-variant: LIVE=64
// cudalab-variant: LIVE=32

#ifndef LIVE
#define LIVE 64
#endif
#ifndef ROUNDS
#define ROUNDS 4
#endif

// The course kernel: one thread per element, a handful of registers, no shared memory.
extern "C" __global__ void vec_mul(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] * b[i];
}

// Register-heavy: the same product, plus LIVE values that stay live across ROUNDS of mixing
// (each round reads neighbours not yet updated, so none can be retired early). Their sum h
// is added as zero * h with zero = 0 passed at run time: the compiler cannot drop the work,
// and since h is finite, fmaf(0, h, x * y) is exactly the float product x * y.
extern "C" __global__ void vec_mul_regs(const float* __restrict__ a,
                                        const float* __restrict__ b,
                                        float* __restrict__ c, int n, float zero)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float x = a[i], y = b[i];
    float r[LIVE];
#pragma unroll
    for (int k = 0; k < LIVE; ++k)
        r[k] = fmaf(x, (float)(k + 1) * (1.0f / LIVE), y);
#pragma unroll
    for (int round = 0; round < ROUNDS; ++round) {
#pragma unroll
        for (int k = 0; k < LIVE; ++k)
            r[k] = fmaf(r[k], 0.5f, 0.25f * r[(k + round + 1) % LIVE]);
    }
    float h = 0.0f;
#pragma unroll
    for (int k = 0; k < LIVE; ++k)
        h += r[k];
    c[i] = fmaf(zero, h, x * y);
}

// Dynamic shared memory: each block stages its slice of a in shared memory and every thread
// multiplies its right neighbour's value (rotating within the block):
//   c[i] = a[block start + (t + 1) % blockDim.x] * b[i],  t = i - block start,
// where a neighbour past n counts as 0. Launched with at least blockDim.x floats of dynamic
// shared memory; the launch may ask for more, which is what limits occupancy: the SM
// reserves what the launch asks for, not what the kernel touches.
extern "C" __global__ void vec_mul_smem(const float* __restrict__ a,
                                        const float* __restrict__ b,
                                        float* __restrict__ c, int n)
{
    extern __shared__ float s[];
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    s[t] = (i < n) ? a[i] : 0.0f;
    __syncthreads();
    if (i < n)
        c[i] = s[(t + 1) % blockDim.x] * b[i];
}

// Tiled matmul C[M x N] = A[M x K] * B[K x N] (row-major float32) whose tile width T is the
// block edge (blockDim.x == blockDim.y == T, any T with T * T <= 1024): the two T x T tiles
// live in dynamic shared memory, 2 * T * T * 4 bytes, so one compiled kernel serves every
// tile size and the occupancy calculator can pick the tile.
extern "C" __global__ void matmul_tiled_dyn(const float* __restrict__ A,
                                            const float* __restrict__ B,
                                            float* __restrict__ C, int M, int N, int K)
{
    extern __shared__ float tiles[];
    const int T = blockDim.x;
    float* As = tiles;
    float* Bs = tiles + T * T;
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * T + ty;
    int col = blockIdx.x * T + tx;
    float acc = 0.0f;
    for (int t = 0; t < K; t += T) {
        As[ty * T + tx] = (row < M && t + tx < K) ? A[row * K + t + tx] : 0.0f;
        Bs[ty * T + tx] = (t + ty < K && col < N) ? B[(t + ty) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < T; ++k)
            acc += As[ty * T + k] * Bs[k * T + tx];
        __syncthreads();
    }
    if (row < M && col < N)
        C[row * N + col] = acc;
}
