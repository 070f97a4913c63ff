// Sobel edge detection on an 8-bit grey image u (H rows x W columns, row-major):
// for an interior pixel (i, j)
//   gx = (u[i-1][j+1] - u[i-1][j-1]) + 2 (u[i][j+1] - u[i][j-1]) + (u[i+1][j+1] - u[i+1][j-1])
//   gy = (u[i-1][j-1] + 2 u[i-1][j] + u[i-1][j+1]) - (u[i+1][j-1] + 2 u[i+1][j] + u[i+1][j+1])
//   e[i][j] = 255 if gx^2 + gy^2 > threshold else 0
// and e = 0 on the one-pixel border. Integer arithmetic only, so every variant must match
// the CPU reference exactly. One thread per output pixel; x is the column, y the row.
//
// Compile-time parameters (nvcc -D...), for sobel_shared only:
//   BX, BY   block shape (threads in x and y); the kernel must be launched with it

#ifndef BX
#define BX 16
#endif
#ifndef BY
#define BY 16
#endif

__device__ __forceinline__ unsigned char edge(int gx, int gy, int threshold)
{
    return (gx * gx + gy * gy > threshold) ? 255 : 0;
}

// 1. Global memory: the nine neighbours straight from global memory (each input pixel is
// read by up to nine threads; the L1/L2 caches absorb most of the re-reads), weights
// written into the arithmetic.
extern "C" __global__ void sobel_global(const unsigned char* __restrict__ u,
                                        unsigned char* __restrict__ e,
                                        int h, int w, int threshold)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= h || j >= w)
        return;
    if (i == 0 || j == 0 || i == h - 1 || j == w - 1) {
        e[i * w + j] = 0;
        return;
    }
    const unsigned char* up = u + (i - 1) * w;
    const unsigned char* mid = u + i * w;
    const unsigned char* dn = u + (i + 1) * w;
    int gx = (up[j + 1] - up[j - 1]) + 2 * (mid[j + 1] - mid[j - 1]) + (dn[j + 1] - dn[j - 1]);
    int gy = (up[j - 1] + 2 * up[j] + up[j + 1]) - (dn[j - 1] + 2 * dn[j] + dn[j + 1]);
    e[i * w + j] = edge(gx, gy, threshold);
}

// 2. Shared-memory tile with a one-pixel halo: the block loads its (BY+2) x (BX+2) input
// window once (each input pixel read from global memory about once per block), then all
// nine neighbour reads of every thread hit shared memory. Out-of-image halo cells are 0
// (never used: border outputs are 0 anyway).
extern "C" __global__ void sobel_shared(const unsigned char* __restrict__ u,
                                        unsigned char* __restrict__ e,
                                        int h, int w, int threshold)
{
    __shared__ unsigned char tile[BY + 2][BX + 2];
    int tx = threadIdx.x, ty = threadIdx.y;
    int i0 = blockIdx.y * BY - 1;  // image row of tile row 0
    int j0 = blockIdx.x * BX - 1;  // image column of tile column 0
    for (int k = ty * BX + tx; k < (BY + 2) * (BX + 2); k += BX * BY) {
        int r = k / (BX + 2), c = k % (BX + 2);
        int gi = i0 + r, gj = j0 + c;
        tile[r][c] = (gi >= 0 && gi < h && gj >= 0 && gj < w) ? u[gi * w + gj] : 0;
    }
    __syncthreads();
    int i = i0 + 1 + ty, j = j0 + 1 + tx;
    if (i >= h || j >= w)
        return;
    if (i == 0 || j == 0 || i == h - 1 || j == w - 1) {
        e[i * w + j] = 0;
        return;
    }
    int r = ty + 1, c = tx + 1;
    int gx = (tile[r - 1][c + 1] - tile[r - 1][c - 1]) + 2 * (tile[r][c + 1] - tile[r][c - 1])
           + (tile[r + 1][c + 1] - tile[r + 1][c - 1]);
    int gy = (tile[r - 1][c - 1] + 2 * tile[r - 1][c] + tile[r - 1][c + 1])
           - (tile[r + 1][c - 1] + 2 * tile[r + 1][c] + tile[r + 1][c + 1]);
    e[i * w + j] = edge(gx, gy, threshold);
}

// 3. Weights in constant memory: the 3x3 masks are data, set by the host
// (Module.get_global + memcpy_htod) before the launch, and read through the constant
// cache; every thread of a warp reads the same weight at the same time, the access
// pattern constant memory broadcasts in one transaction. Pixels from global memory.
// Row-major masks: sobel_wx[(di + 1) * 3 + (dj + 1)] weighs u[i + di][j + dj].
__constant__ int sobel_wx[9];
__constant__ int sobel_wy[9];

extern "C" __global__ void sobel_constant(const unsigned char* __restrict__ u,
                                          unsigned char* __restrict__ e,
                                          int h, int w, int threshold)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= h || j >= w)
        return;
    if (i == 0 || j == 0 || i == h - 1 || j == w - 1) {
        e[i * w + j] = 0;
        return;
    }
    int gx = 0, gy = 0;
#pragma unroll
    for (int di = -1; di <= 1; ++di) {
#pragma unroll
        for (int dj = -1; dj <= 1; ++dj) {
            int v = u[(i + di) * w + (j + dj)];
            gx += sobel_wx[(di + 1) * 3 + (dj + 1)] * v;
            gy += sobel_wy[(di + 1) * 3 + (dj + 1)] * v;
        }
    }
    e[i * w + j] = edge(gx, gy, threshold);
}
