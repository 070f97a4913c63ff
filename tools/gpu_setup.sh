#!/usr/bin/env bash
# Set up a bare GPU machine that cannot reach PyPI, from wheels carried in DIR (default .whl):
# installs them into /tmp/site and builds pycuda there if no pycuda wheel was carried.
# Writes the pycuda wheel into DIR and to $OUT (when set) so later runs can carry it instead of building.
#   source tools/gpu_setup.sh .whl
dir=${1:-.whl}
export CUDA_ROOT=${CUDA_ROOT:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
export PATH=/tmp/site/bin:$CUDA_ROOT/bin:$PATH PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site "$dir"/*.whl \
  > /tmp/site-install.log 2>&1 || { tail -30 /tmp/site-install.log; return 1 2>/dev/null || exit 1; }
if ! python3 -c 'import pycuda.driver' 2>/dev/null; then
  t0=$(date +%s)
  python3 -m pip wheel -q --no-index --no-deps --no-build-isolation -w /tmp/pycuda-wheel \
    $(ls "$dir"/pycuda-*.tar.gz "$dir"/src/pycuda-*.tar.gz 2>/dev/null | head -1) > /tmp/pycuda-build.log 2>&1 || { tail -30 /tmp/pycuda-build.log; return 1 2>/dev/null || exit 1; }
  python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/pycuda-wheel/*.whl
  cp /tmp/pycuda-wheel/*.whl "$dir/"  # so an offline `pip install .[gpu]` finds it
  [ -n "${OUT:-}" ] && cp /tmp/pycuda-wheel/*.whl "$OUT/"
  echo "pycuda built in $(( $(date +%s) - t0 )) s"
fi
python3 -c 'import pycuda, snakemake; print("pycuda", pycuda.VERSION_TEXT, "snakemake", snakemake.__version__)'
