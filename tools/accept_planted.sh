#!/usr/bin/env bash
# Does node acceptance find a slow GPU, and pass a healthy node? On a machine of 2+ GPUs,
# from the repository root:
#   U  `cudalab accept` on the node as it is            (should exit 0: no outlier)
#   P  the same while tools/gpu_hog.py keeps GPU 1 busy  (should exit 1: GPU 1 an outlier)
# Tables and pages go to OUT/U and OUT/P.
#   bash tools/accept_planted.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${1:?usage: tools/accept_planted.sh OUT}" && cd "$1" && pwd)
t0=$(date +%s); python3 -m cudalab.cli accept --out "$OUT/U" > "$OUT/U.log" 2>&1
echo "accept_planted: U (unchanged) exit $? in $(( $(date +%s) - t0 )) s"; cat "$OUT/U.log"
gpu1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1)
CUDA_VISIBLE_DEVICES=$gpu1 python3 tools/gpu_hog.py 900 & hog=$!
sleep 5
t0=$(date +%s); python3 -m cudalab.cli accept --out "$OUT/P" > "$OUT/P.log" 2>&1
echo "accept_planted: P (GPU 1 shared with a busy kernel) exit $? in $(( $(date +%s) - t0 )) s"
kill $hog; wait $hog 2>/dev/null; cat "$OUT/P.log"
