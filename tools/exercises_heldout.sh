#!/usr/bin/env bash
# Judge the held-out class (tests/data/exercises_heldout/) on a GPU machine with the class
# mode, one `snakemake exercises` run per exercise folder, and compare every entry's
# verdict with manifest.yaml: prints student, expected, got, match; exits 1 on a mismatch.
#   tools/exercises_heldout.sh OUT [--sanitize] [--timeout S] [--only EXERCISE]
# Results go to OUT/<exercise>/results/class/<exercise>/ (OUT is made; old results removed).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: tools/exercises_heldout.sh OUT [--sanitize] [--timeout S] [--only EXERCISE]}
shift
SANITIZE=false TIMEOUT=10 ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SANITIZE=true ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift ;;
    --only) ONLY=${2:?--only needs an exercise}; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
HELD=$(pwd)/tests/data/exercises_heldout
MANIFEST=$HELD/manifest.yaml
SENTINEL=$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["sentinel"])' "$MANIFEST")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# the config accepts a submissions path of letters, digits, _ . / - only
if [[ ! "$HELD" =~ ^[A-Za-z0-9_./-]+$ ]]; then
  echo "the checkout's path $HELD holds characters exercises.submissions refuses" >&2; exit 2
fi
rm -f "$HOME/$SENTINEL"

status=0
for dir in "$HELD"/*/; do
  ex=$(basename "$dir")
  [ -n "$ONLY" ] && [ "$ONLY" != "$ex" ] && continue
  work=$OUT/$ex
  rm -rf "$work/results/class"
  mkdir -p "$work"
  # the project's config with this folder as the class: the same run a teacher starts
  "$PY" - "$ex" "$dir" "$TIMEOUT" "$SANITIZE" "$work/class.yaml" <<'EOF'
import sys
import yaml
ex, subs, timeout, sanitize, out = sys.argv[1:]
c = yaml.safe_load(open("config.yaml"))
c["exercises"] = {"submissions": subs.rstrip("/"), "exercise": ex,
                  "launch_timeout_s": float(timeout), "sanitize": sanitize == "true"}
yaml.safe_dump(c, open(out, "w"))
EOF
  echo "== $ex: snakemake exercises (sanitize: $SANITIZE), log in $work/snakemake.log"
  if ! "$PY" -m snakemake exercises --directory "$work" --configfile "$work/class.yaml" \
      > "$work/snakemake.log" 2>&1; then
    echo "   snakemake failed: tail of its log:"; tail -n 15 "$work/snakemake.log"; status=1
  fi
done

"$PY" - "$MANIFEST" "$OUT" "$SANITIZE" "$ONLY" "$HOME/$SENTINEL" <<'EOF' || status=1
"""Compare the class runs' verdicts with the manifest; exit 1 on any mismatch."""
import csv
import sys
from pathlib import Path

import yaml

manifest, out, sanitize, only, sentinel = sys.argv[1:]
m = yaml.safe_load(open(manifest))


def got_verdicts(ex: str) -> dict[str, str]:
    """Entry name (as on disk, or its stem) -> the verdict the class report gives it."""
    folder = Path(out) / ex / "results" / "class" / ex
    got: dict[str, str] = {}
    board = folder / "leaderboard.csv"
    for row in csv.DictReader(board.open()) if board.exists() else []:
        if row.get("refused") == "True":  # refused before any job: named as on disk
            got["notjudged:" + row["name"]] = "rejected"
        elif not row["baseline"]:
            suspect = row["status"] == "ok" and row["suspect"] == "True"
            got[row["name"]] = row["status"] + (" (suspect)" if suspect else "")
    return got


def matches(expected: list[str], got: str) -> bool:
    if got == "ok (suspect)":  # right outputs, timing flagged: ok for an honest kernel too
        return "gamed" in expected or "ok" in expected
    return got in expected or (got == "wrong" and "gamed" in expected)


rows, bad = [], 0
for ex, entries in m["exercises"].items():
    if only and ex != only:
        continue
    got = got_verdicts(ex)
    for entry, want in entries.items():
        exp = want.get("sanitize", want["verdict"]) if sanitize == "true" else want["verdict"]
        exp = exp if isinstance(exp, list) else [exp]
        stem = entry[:-3] if entry.endswith(".cu") else entry
        # a refusal named by its file comes first: a second submission of one student
        g = got.get("notjudged:" + entry) or got.get(stem) or "missing"
        ok = matches(exp, g)
        bad += not ok
        rows.append((f"{ex}/{entry}", "|".join(exp), g, "yes" if ok else "NO"))
w = [max(len(r[i]) for r in rows + [("student", "expected", "got", "match")]) for i in range(4)]
for r in [("student", "expected", "got", "match")] + rows:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
leaked = [p for p in [Path(sentinel), *Path(out).rglob(Path(sentinel).name)] if p.exists()]
if leaked:
    print(f"a file name reached a shell: {', '.join(map(str, leaked))} exists")
print(f"{len(rows) - bad} of {len(rows)} verdicts match")
sys.exit(1 if bad or leaked else 0)
EOF
exit $status
