#!/usr/bin/env bash
# Does node acceptance find a slow GPU, and pass a healthy node? On a machine of 2+ GPUs,
# from the repository root:
#   U  `cudalab accept` on the node as it is            (should exit 0: no outlier)
#   P  the same with GPU 1's kernels built with -Xptxas -O0 (should exit 1: GPU 1 an outlier)
# (A busy kernel of another process beside GPU 1 does not do: the driver time-slices the
# two contexts, and a batch between two events runs within one slice, seen on two H200s.)
# Tables and pages go to OUT/U and OUT/P.
#   bash tools/accept_planted.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${1:?usage: tools/accept_planted.sh OUT}" && cd "$1" && pwd)
t0=$(date +%s); python3 -m cudalab.cli accept --out "$OUT/U" > "$OUT/U.log" 2>&1
echo "accept_planted: U (unchanged) exit $? in $(( $(date +%s) - t0 )) s"; cat "$OUT/U.log"
t0=$(date +%s); python3 -m cudalab.cli accept --plant-slowdown 1 --out "$OUT/P" > "$OUT/P.log" 2>&1
echo "accept_planted: P (GPU 1's kernels built with -Xptxas -O0) exit $? in $(( $(date +%s) - t0 )) s"
cat "$OUT/P.log"
