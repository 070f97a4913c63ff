#!/usr/bin/env bash
# compute-sanitizer over a small grid, on a GPU machine: every kernel of the listed
# experiments runs under memcheck and racecheck (and synccheck, initcheck), each tool's log
# written to OUT_DIR/<tool>-<experiment>.log and a summary to OUT_DIR/sanitizer.txt.
#   bash tools/sanitize.sh OUT_DIR CONFIG EXPERIMENT...
# A tool that reports an error makes the script exit 1 (after all runs), so a CI or a person
# sees it. The grid is small because sanitized kernels run 10-100x slower.
set -uo pipefail
out=$(readlink -f "$1"); config=$2; shift 2
mkdir -p "$out"
summary=$out/sanitizer.txt
: > "$summary"
status=0
for exp in "$@"; do
  for tool in memcheck racecheck synccheck initcheck; do
    log=$out/$tool-$exp.log
    rm -rf "/tmp/sanitize-$exp-$tool"
    compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      cudalab measure "$exp" --config "$config" --results "/tmp/sanitize-$exp-$tool" > "$log" 2>&1
    rc=$?
    errors=$(grep -E "ERROR SUMMARY: [0-9]+ error" "$log" | tail -1)
    points=$(grep -cE "^\[|\] .*: (ok|WRONG|FAILED)" "$log" || true)
    verdict=clean; [ $rc -ne 0 ] && { verdict="ERRORS (rc=$rc)"; status=1; }
    printf '%-10s %-12s %-16s %s; %s log lines of points\n' "$exp" "$tool" "$verdict" \
      "${errors:-no summary line}" "$points" | tee -a "$summary"
  done
done
exit $status
