#!/usr/bin/env bash
# Does the regression gate catch a real slowdown, and pass unchanged code? On a GPU machine,
# from the repository root: three runs of the shipped config's vector_add block only, each
# through the workflow (README command 1) in its own folder under OUT:
#   A  unchanged code
#   B  unchanged code again (a new process: new buffers, new placement)
#   P  vector_add.cu edited so that half its warps read one more float from far away
#      (+16.7 % DRAM traffic at sizes beyond L2, results unchanged: 0 * x is kept under IEEE)
# then `cudalab compare A B --fail-on-slower` (should exit 0) and `cudalab compare A P
# --fail-on-slower` (should exit 1). Tables and CSVs go to OUT; the source is restored.
#   bash tools/planted_slowdown.sh OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${1:?usage: tools/planted_slowdown.sh OUT}" && cd "$1" && pwd)
SRC=cuda/vector_add/vector_add.cu
cp "$SRC" "$OUT/vector_add.cu.orig"
trap 'cp "$OUT/vector_add.cu.orig" "$SRC"' EXIT

python3 - "$OUT/config.yaml" <<'EOF'
import sys
import yaml
c = yaml.safe_load(open("config.yaml"))
for name, block in c["experiments"].items():
    block["enabled"] = name == "vector_add"
yaml.safe_dump(c, open(sys.argv[1], "w"))
EOF

run() {  # run NAME: the workflow into OUT/NAME
  local t0; t0=$(date +%s)
  rm -rf "${OUT:?}/$1" && mkdir -p "$OUT/$1"
  python3 -m snakemake -s "$PWD/Snakefile" --directory "$OUT/$1" --configfile "$OUT/config.yaml" \
    > "$OUT/$1.log" 2>&1
  echo "planted: run $1 exit $? in $(( $(date +%s) - t0 )) s: $(grep -ho 'vector_add: done: .*' "$OUT/$1"/results/logs/*.log "$OUT/$1"/results/logs/*/*.log 2>/dev/null | head -1)"
}

run A
run B
python3 - "$SRC" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = "        c[i] = a[i] + b[i];\n"
new = ("    {\n        float s = a[i] + b[i];\n"
       "        if (threadIdx.x & 32) s += 0.0f * a[(i + n / 2) % n];  // planted: far read\n"
       "        c[i] = s;\n    }\n")
assert s.count(old) == 1, "vector_add.cu changed: update the planted edit"
open(p, "w").write(s.replace(old, new))
EOF
grep -n "planted" "$SRC"
run P
cp "$OUT/vector_add.cu.orig" "$SRC"

for pair in "A B" "A P"; do
  set -- $pair
  python3 -m cudalab.cli compare "$OUT/$1/results" "$OUT/$2/results" --fail-on-slower \
    --csv "$OUT/compare-$1-vs-$2.csv" > "$OUT/compare-$1-vs-$2.txt" 2>&1
  echo "planted: compare $1 $2 --fail-on-slower: exit $?"
  grep -E "^(vector_add|==)|slower|same|faster|unstable" "$OUT/compare-$1-vs-$2.txt" | tail -16
done
