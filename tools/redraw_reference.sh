#!/usr/bin/env bash
# Redraw a committed reference folder's figures, report and slides with the current code,
# from its own results.csv (and raw/, telemetry/ where it has them); no GPU needed.
#   tools/redraw_reference.sh reports/reference/NVIDIA-H100-80GB-HBM3
set -euo pipefail
REF=${1:?usage: tools/redraw_reference.sh REFERENCE_FOLDER}
CUDALAB="${PYTHON:-python3} -m cudalab.cli"
TABLE="$REF/results.csv"
CONF=$(mktemp --suffix .json)
trap 'rm -f "$CONF"' EXIT
# the config the report states: the run's own (config.json as the workflow wrote it, or an
# older reference's report-config.yaml), else the default
SRC="$REF/config.json"; [ -f "$SRC" ] || SRC="$REF/report-config.yaml"; [ -f "$SRC" ] || SRC=config.yaml
"${PYTHON:-python3}" -c 'import json, sys; from cudalab import config; json.dump(config.load(sys.argv[1]), open(sys.argv[2], "w"))' "$SRC" "$CONF"
for exp in $("${PYTHON:-python3}" -c 'import sys; from cudalab import results; print(" ".join(sorted(set(results.read_table(sys.argv[1])["experiment"]))))' "$TABLE"); do
  $CUDALAB figures "$exp" --table "$TABLE" --out "$REF/figures" > /dev/null
done
$CUDALAB run-figures --table "$TABLE" --results "$REF" --out "$REF/figures" > /dev/null
$CUDALAB compare-figures --config "$CONF" --table "$TABLE" --out "$REF/figures" > /dev/null
$CUDALAB report --config "$CONF" --table "$TABLE" --figures "$REF/figures" --results "$REF" \
  --out "$REF/report.html"
$CUDALAB slides --table "$TABLE" --out "$REF/slides"
# the deck holds every slide (embedded): the PNG and SVG files stay out of the repository
rm -f "$REF"/slides/*.png "$REF"/slides/*.svg
# the report embeds every figure; the folder keeps their PNG twins only (the repository, and
# with it what a GPU call carries, stays small)
find "$REF/figures" "$REF/telemetry" -name '*.svg' -delete 2>/dev/null || true
