#!/usr/bin/env bash
# Redraw the figures and the report of a stored reference run with the current code, from
# its recorded results (no GPU needed):
#   bash tools/rerender_reference.sh reports/reference/NVIDIA-H100-80GB-HBM3
#   REPORT_CONFIG=cfg.yaml bash tools/rerender_reference.sh DIR   (e.g. report.baselines)
# results.csv is rebuilt from the raw records, the figures and report.html are rewritten;
# SVG copies are dropped as in save_reference.sh.
set -euo pipefail
ref=$(readlink -f "$1")
cd "$(dirname "$0")/.."
# the run's own config (config.json, as the workflow wrote it; older references kept it as
# report-config.yaml): the report describes that run, not today's config.yaml
[ -z "${REPORT_CONFIG:-}" ] && [ ! -f "$ref/config.json" ] && [ -f "$ref/report-config.yaml" ] \
  && REPORT_CONFIG="$ref/report-config.yaml"
python -m cudalab.cli aggregate --results "$ref" --out "$ref/results.csv"
rm -f "$ref/results.parquet"
exps=$(python -c "import pandas as pd, sys; from cudalab.experiments import REGISTRY; \
d = pd.read_csv(sys.argv[1]); print(' '.join(n for n, e in REGISTRY.items() \
if e.lesson.figures and (d['experiment'] == n).any()))" "$ref/results.csv")
for e in $exps; do
  python -m cudalab.cli figures "$e" --table "$ref/results.csv" --out "$ref/figures"
done
python -m cudalab.cli run-figures --table "$ref/results.csv" --results "$ref" --out "$ref/figures"
python -m cudalab.cli compare-figures ${REPORT_CONFIG:+--config "$REPORT_CONFIG"} --table "$ref/results.csv" \
  --out "$ref/figures"
python -m cudalab.cli report ${REPORT_CONFIG:+--config "$REPORT_CONFIG"} --table "$ref/results.csv" --figures "$ref/figures" \
  --results "$ref" --out "$ref/report.html"
find "$ref/figures" "$ref/telemetry" -name '*.svg' -delete
