#!/usr/bin/env bash
# The shipped config.yaml's wall time on one GPU against every GPU of the machine, like for
# like: each run in its own folder with its own empty compile caches (pycuda's kernel cache
# and cudalab's build cache both live under XDG_CACHE_HOME), alone on the host.
#   bash tools/gpu_speedup.sh OUT_DIR one [SECONDS [KEY=VALUE...]]   the run on GPU 0 (gpus=[0])
#   bash tools/gpu_speedup.sh OUT_DIR all [SECONDS [KEY=VALUE...]]   the run on every GPU
# KEY=VALUE: config overrides for both runs alike, e.g. max_shards=8 (split large lessons).
#   bash tools/gpu_speedup.sh OUT_DIR report          the speed-up, and cudalab compare of the two
# One run per call (each takes minutes); a run cut by SECONDS records its exit status, and the
# report then says the speed-up was not measured.
set -uo pipefail
out=$(readlink -f "$1"); what=$2; secs=${3:-560}; shift $(( $# < 3 ? $# : 3 ))
mkdir -p "$out"
case $what in
  one|all)
    dir=$out/run-$what; rm -rf "$dir"; mkdir -p "$dir/cache"
    sets=("$@"); [ "$what" = one ] && sets+=("gpus=[0]")
    extra=(); [ ${#sets[@]} -gt 0 ] && extra=(--config "${sets[@]}")
    t0=$(date +%s.%N)
    XDG_CACHE_HOME=$dir/cache timeout -s INT -k 20 "$secs" python3 -m snakemake \
      -s "$PWD/Snakefile" --directory "$dir" --configfile "$PWD/config.yaml" "${extra[@]}" \
      > "$dir/snakemake.log" 2>&1
    rc=$?
    wall=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    echo "$what $rc $wall $(nvidia-smi -L | wc -l)" > "$dir/wall.txt"
    echo "default grid on $what GPU(s): exit $rc in $wall s (machine: $(nvidia-smi -L | wc -l) GPUs, $(nproc) cores)"
    grep -h "measures on\|: done: " "$dir"/results/logs/measure_*.log 2>/dev/null
    rm -rf "$dir/cache" "$dir/.snakemake" ;;
  report)
    read -r _ rc1 w1 _ < "$out/run-one/wall.txt"; read -r _ rcn wn n < "$out/run-all/wall.txt"
    if [ "$rc1" != 0 ] || [ "$rcn" != 0 ]; then
      echo "speed-up not measured: a run did not finish (exit $rc1 on one GPU, $rcn on $n)"; exit 1
    fi
    python3 -c "print(f'speed-up on $n GPUs: {$w1 / $wn:.2f}x ($w1 s on one GPU, $wn s on $n, empty caches each)')"
    python3 -m cudalab.cli compare "$out/run-one/results" "$out/run-all/results" \
      > "$out/compare-one-vs-all.txt" 2>&1
    grep -A4 "== verdicts per run ==" "$out/compare-one-vs-all.txt" ;;
  *) echo "usage: $0 OUT_DIR one|all [SECONDS] | OUT_DIR report" >&2; exit 2 ;;
esac
