#!/usr/bin/env bash
# Build the wgmma diagnostic bundle into <checkout>/.wg (git-ignored there), from this branch,
# without a GPU: sm_90a cubins (nvcc), the cudalab package, tools/wgmma_diag.py and
# tools/wgmma_bench.py, run.sh, pycuda's wheels (WHL, default /work/main/.whl) and, where
# cuobjdump is found, a SASS summary. Under 10 MB.
#   bash reports/reference/wgmma-diag-2026-11-27/prepare.sh [CHECKOUT]   (default: this one)
# then on the GPU, from CHECKOUT's root, carrying .wg:  bash .wg/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); src=$(cd "$here/../../.." && pwd)
co=$(cd "${1:-$src}" && pwd); dst=$co/.wg
ex=$(git -C "$co" rev-parse --git-path info/exclude); case $ex in /*) ;; *) ex=$co/$ex;; esac
grep -qx '/.wg/' "$ex" 2>/dev/null || echo /.wg/ >> "$ex"
rm -rf "$dst"; mkdir -p "$dst/cub" "$dst/repo" "$dst/whl"
F="-cubin -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a"
w=$src/cuda/tensor_cores/wgmma.cu
nvcc $F -o "$dst/cub/s4.cubin" "$w"                        # STAGES=4 WS_BN=256: the defaults
nvcc $F -DMN_SWAP=1 -o "$dst/cub/swap.cubin" "$w"          # N-major strides exchanged
nvcc $F -DSTAGES=3 -o "$dst/cub/s3.cubin" "$w"
nvcc $F -DWS_BN=128 -o "$dst/cub/bn128.cubin" "$w"
nvcc $F -DSTAGES=6 -DWS_BN=128 -o "$dst/cub/s6.cubin" "$w"
tar -C "$src" --exclude=__pycache__ -cf - cudalab | tar -C "$dst/repo" -xf -
cp "$src/tools/wgmma_diag.py" "$src/tools/wgmma_bench.py" "$dst/"
cp "$here/run.sh" "$dst/run.sh"
whl=${WHL:-/work/main/.whl}
for p in pycuda-*-linux_x86_64 pytools-* platformdirs-* mako-* siphash24-*; do
  cp $whl/$p.whl "$dst/whl/" 2>/dev/null || echo "no $p wheel in $whl (pycuda must be there already)"
done
if command -v cuobjdump >/dev/null; then
  for f in "$dst"/cub/*.cubin; do
    for k in tma_fp16 pipe_fp16 ws_fp16 persist_fp16 ws_tf32 persist_bf16; do
      s=$(cuobjdump -sass -fun tc_wgmma_$k "$f")
      printf '%-6s %-13s HGMMA %d USETMAXREG %d UTMALDG %d SYNCS %d LDL/STL %d\n' \
        "$(basename "$f" .cubin)" "$k" "$(grep -c HGMMA <<<"$s")" "$(grep -c USETMAXREG <<<"$s")" \
        "$(grep -c UTMALDG <<<"$s")" "$(grep -c SYNCS <<<"$s")" "$(grep -cE 'LDL|STL' <<<"$s")"
    done
  done > "$dst/sass.txt"
fi
du -sh "$dst"
