// The course's "map" kernel: element-wise math repeated `iterations` times, so the ratio of
// arithmetic to memory traffic (and with it the kernel time against the copy time) is a
// runtime knob. Used on chunks of a large array, one chunk per CUDA stream, to overlap the
// host-to-device copy, the kernel and the device-to-host copy of different chunks.
//
// out[i] = sum_{k < iterations} ( sin(t_k) * cos(t_k) + sqrt(t_k) ),  t_k = in[i] + k / 64
// (k / 64 is exact in float32, so t_k is one rounding away from its float64 value and the
// float64 reference in cudalab/experiments/streams.py can compute the same sum.)
// Inputs are in [0, 1), so t_k >= 0 and sqrtf is defined.

extern "C" __global__ void map_kernel(const float* __restrict__ in,
                                      float* __restrict__ out, int n, int iterations)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = in[i];
        float acc = 0.0f;
        for (int k = 0; k < iterations; ++k) {
            float t = x + (float)k * 0.015625f;
            acc += sinf(t) * cosf(t) + sqrtf(t);
        }
        out[i] = acc;
    }
}
