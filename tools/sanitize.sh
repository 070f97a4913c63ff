#!/usr/bin/env bash
# compute-sanitizer over a small grid, on a GPU machine: every kernel of the listed
# experiments (none listed: every experiment the config enables) runs under each tool of
# $TOOLS (default memcheck racecheck; synccheck and initcheck are the other two), each tool's
# log written to OUT_DIR/<tool>-<experiment>.log and a summary to OUT_DIR/sanitizer.txt.
#   bash tools/sanitize.sh OUT_DIR CONFIG [EXPERIMENT...]
#   e.g. TOOLS="memcheck racecheck synccheck initcheck" bash tools/sanitize.sh sanitizer tools/sanitize.yaml
#        bash tools/sanitize.sh sanitizer tools/sanitize.yaml matmul coalescing
# A tool that reports an error makes the script exit 1 (after all runs), so a CI or a person
# sees it. The grid is small because sanitized kernels run 10-100x slower.
set -uo pipefail
out=$(readlink -f "$1"); config=$2; shift 2
mkdir -p "$out"
if [ $# -eq 0 ]; then  # the enabled experiments that launch anything on the GPU (static
  # analysis only compiles: the sanitizer would find no CUDA call to instrument and exit 255)
  set -- $(python3 -c "import sys; from cudalab import config as c; \
from cudalab.experiments import REGISTRY; cfg = c.load(sys.argv[1]); \
print(' '.join(n for n in c.enabled_experiments(cfg) if any(p.gpu for p in REGISTRY[n].grid(cfg))))" "$config")
fi
summary=$out/sanitizer.txt
: > "$summary"
status=0
for exp in "$@"; do
  for tool in ${TOOLS:-memcheck racecheck}; do
    log=$out/$tool-$exp.log
    rm -rf "/tmp/sanitize-$exp-$tool"
    compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      python3 -m cudalab.cli measure "$exp" --config "$config" --results "/tmp/sanitize-$exp-$tool" > "$log" 2>&1
    rc=$?
    errors=$(grep -E "(ERROR|RACECHECK) SUMMARY: [0-9]+ (error|hazard)" "$log" | tail -1)
    done_line=$(grep -oE "done: [0-9]+ ok, [0-9]+ wrong, [0-9]+ failed.*" "$log" | tail -1)
    verdict=clean
    [ $rc -ne 0 ] && { verdict="ERRORS (rc=$rc)"; status=1; }
    # a point that is wrong or failed under the sanitizer is a finding too
    echo "$done_line" | grep -qE "done: [0-9]+ ok, 0 wrong, 0 failed" || { verdict="POINTS NOT OK"; status=1; }
    printf '%-10s %-10s %-14s %s | %s\n' "$exp" "$tool" "$verdict" \
      "${errors:-no summary line}" "${done_line:-no done line}" | tee -a "$summary"
  done
done
exit $status
