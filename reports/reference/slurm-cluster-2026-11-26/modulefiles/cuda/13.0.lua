-- cuda/13.0: the machine's real toolkit
whatis("CUDA toolkit 13.0")
local root = "@NVCC_DIR@"
prepend_path("PATH", root)
setenv("CUDA_HOME", pathJoin(root, ".."))
