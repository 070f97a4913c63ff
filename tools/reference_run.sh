#!/usr/bin/env bash
# The reference run on a GPU machine without network, as a new user would do it:
# a clean clone (from a git bundle carried in WHL), the README's two commands (pip offline
# from the carried wheels), then the GPU tests and the stability benchmark.
#   bash tools/reference_run.sh WHL_DIR OUT_DIR [snakemake args...]
set -uo pipefail
whl=$(readlink -f "$1"); out=$(readlink -f "$2"); shift 2
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_FIND_LINKS=$whl
export CUDA_ROOT=${CUDA_ROOT:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
rm -rf /tmp/cudalab && git clone -q "$whl/repo.bundle" /tmp/cudalab && cd /tmp/cudalab || exit 1
git log -1 --format='clean clone at %h (%s)'
# README command 1 (pip offline: PIP_NO_INDEX + PIP_FIND_LINKS point at the carried wheels)
t0=$(date +%s)
{ python3 -m pip install -q -e ".[gpu]" && snakemake "$@"; } > "$out/pipeline.log" 2>&1
echo "pipeline rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "cudalab plan|done:|FAILED|WRONG|report written|Error" "$out/pipeline.log" | tail -40
# GPU tests
python3 -m pip install -q pytest 2>/dev/null
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests > "$out/pytest-gpu.log" 2>&1
echo "pytest -m gpu rc=$?"; tail -15 "$out/pytest-gpu.log"
tar czf "$out/results.tgz" results
cp results/results.csv results/report.html "$out/" 2>/dev/null
