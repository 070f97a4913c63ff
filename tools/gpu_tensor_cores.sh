#!/usr/bin/env bash
# The tensor-core lesson as the shipped config.yaml defines it (its wgmma rungs included),
# switched on and run alone through Snakemake with the Nsight Compute counters it reads (the
# operands' traffic; config.yaml's profile.metrics lists them), then its kernels
# under compute-sanitizer: the H100 (or H200) reference of the lesson in one call.
#   bash tools/gpu_tensor_cores.sh OUT_DIR [SECONDS]
# OUT_DIR gets config.yaml (what ran), run/results (results.csv, claims.json, report.html,
# the lesson's figures), snakemake.log, lesson.txt (the lesson's claims, state and evidence,
# and the facts the report states) and sanitizer/ (memcheck and racecheck over
# tools/sanitize.yaml's small grid). SECONDS (default 420) bounds the Snakemake run; the
# sanitizers take about a minute more.
set -uo pipefail
out=$(readlink -f "$1"); secs=${2:-420}
mkdir -p "$out"
python3 - "$out/config.yaml" <<'PY'
import sys

import yaml

config = yaml.safe_load(open("config.yaml"))
lesson = dict(config["experiments"]["tensor_cores"], enabled=True)
config["experiments"] = {"tensor_cores": lesson}
# only the shipped counters the lesson reads (who moves the operands): a pass or two per
# kernel, so the 114 points' counters fit the time box
from cudalab.experiments.tensor_cores import wgmma_lesson as wl
from cudalab.ncu_csv import SHORT_NAMES

read = {c for c, _ in wl.TRAFFIC} | {wl.WAVEFRONTS, wl.WARP_INST}
profile = config.get("profile") or {}
config["profile"] = dict(profile, ncu=True, metrics=[
    m for m in profile["metrics"] if f"m_ncu_{SHORT_NAMES.get(m)}" in read])
config["run_name"] = "tensor-cores-shipped"
with open(sys.argv[1], "w") as f:
    f.write("# config.yaml's tensor_cores block alone, switched on, with Nsight Compute "
            "counters (tools/gpu_tensor_cores.sh)\n")
    yaml.safe_dump(config, f, sort_keys=False)
PY
t0=$(date +%s)
timeout -s INT -k 20 "$secs" python3 -m snakemake -s "$PWD/Snakefile" \
  --directory "$out/run" --configfile "$out/config.yaml" > "$out/snakemake.log" 2>&1
echo "tensor-core lesson: snakemake exit $? in $(( $(date +%s) - t0 )) s"
grep -h ": done: \|ncu: " "$out"/run/results/logs/measure_*.log 2>/dev/null
python3 - "$out/run/results" > "$out/lesson.txt" <<'PY'
import json
import sys
from pathlib import Path

from cudalab import explain, results

folder = Path(sys.argv[1])
try:
    lesson = json.loads((folder / "claims.json").read_text())["lessons"]["tensor_cores"]
    table = results.read_table(folder / "results.csv")
except (OSError, KeyError, ValueError) as exc:
    sys.exit(f"no claims of the lesson: {exc}")
for c in lesson["claims"]:
    print(f"{c['state']:>13}  {c['key']}: {c['evidence']}")
for said in explain.explain("tensor_cores", table):  # the facts under the report's caption
    print(f"{'fact':>13}  {said}")
PY
cat "$out/lesson.txt"
rm -rf "$out/run/.snakemake"
bash tools/sanitize.sh "$out/sanitizer" tools/sanitize.yaml tensor_cores
echo "sanitizers: exit $? (summary: $out/sanitizer/sanitizer.txt)"
