#!/usr/bin/env bash
# Store a GPU machine's reference run under reports/reference/<gpu-name>/:
#   bash tools/save_reference.sh RESULTS_TGZ [LOGS_DIR]
# RESULTS_TGZ is what tools/reference_run.sh wrote; LOGS_DIR may hold pipeline.log,
# pytest-gpu.log and stability.{txt,json} from the same session. The table, the report,
# the raw records, the telemetry and the job logs are kept; SVG copies of the figures are
# not (the PNGs and the report carry the same figures); ncu's logs are gzipped.
set -euo pipefail
tgz=$(readlink -f "$1"); logs=${2:+$(readlink -f "$2")}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tar xzf "$tgz" -C "$tmp"
gpu=$(python3 -c "import pandas as pd, sys; d = pd.read_csv(sys.argv[1]); \
print(d['gpu_name'].dropna().iloc[0].replace(' ', '-'))" "$tmp/results/results.csv")
dest=$(dirname "$0")/../reports/reference/$gpu
rm -rf "$dest" && mkdir -p "$dest"
cp -r "$tmp"/results/{results.csv,report.html,raw,telemetry,logs,figures} "$dest/"
# the run's own validated config: a later re-rendering describes this run, not config.yaml
[ -f "$tmp/results/config.json" ] && cp "$tmp/results/config.json" "$dest/"
find "$dest" -name '*.svg' -delete
# ncu's raw CSV repeats ~250 device and launch attributes on every row: gzip keeps the
# reference small enough to carry to the GPU machine again (zcat reads it)
find "$dest/telemetry" -name 'ncu.log' -exec gzip -9 {} +
for f in pipeline.log pytest-gpu.log stability.txt stability.json; do
  [ -n "$logs" ] && [ -f "$logs/$f" ] && cp "$logs/$f" "$dest/"
done
du -sh "$dest"; echo "saved to $(readlink -f "$dest")"
