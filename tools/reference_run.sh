#!/usr/bin/env bash
# The reference run on a GPU machine without network, as a new user would do it: a clean
# clone (from a git bundle or a shallow bare clone carried in WHL), then README command 1
# (pip offline from the
# carried wheels, then snakemake), time-boxed so the results always come back.
#   bash tools/reference_run.sh WHL_DIR OUT_DIR SECONDS [snakemake args...]
# With RESUME=path/to/results.tgz, an earlier, interrupted run's results are unpacked first:
# experiments whose job finished are kept, an unfinished one redoes only its missing points
# (points measured on another GPU are measured again: the GPU UUID is part of the cache key).
set -uo pipefail
whl=$(readlink -f "$1"); out=$(readlink -f "$2"); secs=$3; shift 3
resume=${RESUME:+$(readlink -f "$RESUME")}
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_FIND_LINKS=$whl PIP_BREAK_SYSTEM_PACKAGES=1
export CUDA_ROOT=${CUDA_ROOT:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
# the clone comes from a git bundle, or (smaller: the carried tree is limited to 64 MiB) from
# a shallow bare clone of the commit: git clone --depth 1 --bare file://$PWD WHL/repo.git
src=$whl/repo.bundle; [ -d "$whl/repo.git" ] && src=file://$whl/repo.git
rm -rf /tmp/cudalab && git clone -q "$src" /tmp/cudalab && cd /tmp/cudalab || exit 1
git log -1 --format='clean clone at %h (%s)'
[ -n "$resume" ] && tar xzf "$resume" && echo "resumed from $(ls results/raw | wc -l) experiment folders"
# README command 1. The machine has no network: the dependencies were installed from the
# carried wheels by tools/gpu_setup.sh (pip's offline resolver cannot reconcile them with
# the machine's preinstalled packages), so cudalab itself goes in without them.
t0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/pip.log" 2>&1 \
  || { tail -20 "$out/pip.log"; exit 1; }
timeout -s INT -k 20 "$secs" snakemake "$@" > "$out/pipeline.log" 2>&1
echo "pipeline rc=$? in $(( $(date +%s) - t0 )) s"
grep -E "cudalab plan|: done:|FAILED|WRONG|report written|Error|Terminating" "$out/pipeline.log" | tail -40
tar czf "$out/results.tgz" results
du -sh results "$out/results.tgz"
