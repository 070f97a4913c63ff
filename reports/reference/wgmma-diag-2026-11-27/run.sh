#!/usr/bin/env bash
# On the lent H100/H200, from the checkout's root, carrying .wg (prepare.sh built it):
#   bash .wg/run.sh          BUDGET_S: seconds for the diagnostic steps (default 200)
# Prints everything and writes $OUT/wg/: diag.log, results.json, memcheck.log, racecheck.log,
# gpu.txt, sass.txt. Installs the carried pycuda into /tmp/site if python has none.
set -o pipefail
W=$(cd "$(dirname "$0")" && pwd)
O=${OUT:-/tmp/wg-out}/wg; mkdir -p "$O"
PY=${PY:-/opt/torch/.venv/bin/python3}; [ -x "$PY" ] || PY=python3
export PYTHONUNBUFFERED=1 PYTHONPATH="$W/repo:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c 'import pycuda.driver' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$W"/whl/*.whl \
    > /tmp/wg-pip.log 2>&1 || tail -5 /tmp/wg-pip.log
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv,noheader | tee "$O/gpu.txt"
"$PY" -c 'import pycuda, cupy; print("pycuda", pycuda.VERSION_TEXT, "cupy", cupy.__version__)'
[ -f "$W/sass.txt" ] && cp "$W/sass.txt" "$O/" && grep ' s4 \|^s4 ' "$W/sass.txt"
B=${BUDGET_S:-200}
timeout $(( B + 20 )) "$PY" "$W/wgmma_diag.py" --cubins "$W/cub" --out "$O" --budget "$B"
echo "run.sh: rc $?"
