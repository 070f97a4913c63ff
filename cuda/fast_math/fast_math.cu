// Fast math: the same math-heavy kernel built three ways.
//
//   precise     default build (IEEE division and square root, sinf/cosf/expf at <= 2 ulp)
//   fast_math   the same source built with --use_fast_math: sinf -> __sinf, cosf -> __cosf,
//               expf -> __expf, x/y -> approximate division, sqrtf -> approximate square
//               root, denormals flushed to zero
//   intrinsics  the precise build, but the source asks for the fast functions explicitly
//               (-DUSE_INTRINSICS): __sinf, __cosf, __expf, __fdividef, and the square
//               root as a * rsqrtf(a) (2 ulp); the rest of the program stays IEEE
//
// Each thread reads one x in [-pi, pi] and averages f(t_k) over `iterations` arguments
// t_k = x * (1 - k / 4096), so the work per element grows with `iterations` and the
// compiler cannot hoist f out of the loop. Every t_k stays in [-pi, pi], the range where
// the CUDA Programming Guide bounds the error of __sinf and __cosf.
//
//   f(t) = (1.5 + sin t) * exp(-t^2 / 2) + sqrt(2 + t^2) / (2 + cos t)
//
// Both terms are positive (f >= 0.47), so the relative error of f is bounded by the
// relative errors of its terms: there is no cancellation to hide or magnify anything.
// The average is a compensated (Kahan) sum: it adds about 2 ulp whatever `iterations` is,
// so the error measured is that of the math functions, not of the loop. (nvcc never
// re-associates floating-point additions, not even under --use_fast_math, and the
// compensation has no multiply that could be fused into an FMA.)

#define STEP (1.0f / 4096.0f)  // exact in float; 1 - k * STEP is exact for k < 4096

__device__ __forceinline__ float term(float t)
{
#ifdef USE_INTRINSICS
    float a = 2.0f + t * t;
    return (1.5f + __sinf(t)) * __expf(-0.5f * t * t)
         + __fdividef(a * rsqrtf(a), 2.0f + __cosf(t));
#else
    return (1.5f + sinf(t)) * expf(-0.5f * t * t) + sqrtf(2.0f + t * t) / (2.0f + cosf(t));
#endif
}

extern "C" __global__ void fast_math_kernel(const float* __restrict__ x,
                                            float* __restrict__ y,
                                            int n, int iterations, float inv_iterations)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float xi = x[i];
    float sum = 0.0f, comp = 0.0f;
    for (int k = 0; k < iterations; ++k) {
        float t = xi * (1.0f - (float)k * STEP);
        float v = term(t) - comp;     // Kahan: add what the last addition lost
        float s = sum + v;
        comp = (s - sum) - v;
        sum = s;
    }
    y[i] = sum * inv_iterations;
}
