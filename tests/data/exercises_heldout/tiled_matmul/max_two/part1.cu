// cudalab-exercise: tiled_matmul
// A folder with two .cu files: which one is the submission is ambiguous.
extern "C" __global__ void matmul_tiled(const float* A, const float* B, float* C,
                                        int M, int N, int K);
