#!/usr/bin/env bash
# Build what gpu_run.sh needs into <checkout>/.wg (git-ignored there), from this branch:
# cubins for sm_90a (nvcc here, no GPU needed), a copy of the branch, the bench, the config.
#   bash reports/reference/wgmma-2026-11-27/prepare.sh /work/main
# then, with the device tool: run(carry=[".whl", ".wg"], command=
#   "source tools/gpu_setup.sh .whl >/dev/null && BUDGET_S=400 bash .wg/run.sh", timeout_s=460)
set -euo pipefail
src=$(cd "$(dirname "$0")/../../.." && pwd); dst=${1:?checkout that the device tool ships}/.wg
grep -qx '/.wg/' "$1/.git/info/exclude" 2>/dev/null || echo /.wg/ >> "$1/.git/info/exclude"
rm -rf "$dst"; mkdir -p "$dst/cub" "$dst/repo"
F="-cubin -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a"
w="$src/cuda/tensor_cores/wgmma.cu"
nvcc $F -DSTAGES=4 -o "$dst/cub/s4.cubin" "$w"
nvcc $F -DSTAGES=2 -o "$dst/cub/s2.cubin" "$w"
nvcc $F -DSTAGES=3 -o "$dst/cub/s3.cubin" "$w"
nvcc $F -DSTAGES=6 -DWS_BN=128 -o "$dst/cub/s6.cubin" "$w"
nvcc $F -DWS_BN=128 -o "$dst/cub/bn128.cubin" "$w"
nvcc $F -DMN_SWAP=1 -o "$dst/cub/swap.cubin" "$w"
nvcc -cubin -O3 -lineinfo -arch=sm_90 -DBM=128 -DBN=256 -DBK=32 -DWM=64 -DWN=64 -DSTAGES=4 \
  -o "$dst/cub/mma.cubin" "$(ls "$src"/cuda/tensor_core_mma.cu "$src"/cuda/tensor_cores/mma*.cu 2>/dev/null | head -1)"
tar -C "$src" --exclude=./.git --exclude=./reports --exclude=./.wg --exclude=./.whl --exclude=./.gpu --exclude=./results --exclude=__pycache__ -cf - . | tar -C "$dst/repo" -xf -
mkdir -p "$dst/repo/reports" && cp -r "$src/reports/templates" "$dst/repo/reports/"
here=$(dirname "$0")
cp "$src/tools/wgmma_bench.py" "$dst/"; cp "$here/gpu_run.sh" "$dst/run.sh"; cp "$here/config.yaml" "$dst/tc.yaml"
du -sh "$dst"
