#!/usr/bin/env bash
# Unpacks the archive tools/gpu_suite.sh left under $OUT (or its unpacked folder kc_gpu_run/, which
# a run cut short leaves without the archive) into docs/results/<gpu>/ (default h200),
# keeping the raw JSON, metadata, profiles and generated tables/plots, and the run's logs under
# docs/results/<gpu>/logs/<commit>/<chapters>/ (ctest summary, sanitizer summaries, ptxas report),
# <chapters> naming the chapters the run measured (e.g. ch02-ch03), so two runs of one commit keep
# their own logs.
#   tools/import_gpu_run.sh path/to/kc_gpu_run.tar.gz|path/to/kc_gpu_run [gpu]
set -euo pipefail
archive=$1
gpu=${2:-h200}
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/docs/results/$gpu
tmp=$(mktemp -d)
if [ -d "$archive" ]; then
  cp -r "$archive"/. "$tmp"/
else
  tar -xzf "$archive" -C "$tmp"
fi
mkdir -p "$dest"
# The run's commit (from its metadata) names its log folder, and each chapter it measured gets a
# copy of the run's metadata as chNN_metadata.json: a later run of other chapters overwrites
# metadata.json, not the record of the run that measured a given chapter.
commit=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("commit") or "unknown")' "$tmp/results/metadata.json")
chapters=()
for bench in "$tmp"/results/ch*_bench.json; do
  [ -f "$bench" ] || continue
  chapters+=("$(basename "$bench" _bench.json)")
done
run_name=$(IFS=-; echo "${chapters[*]:-tests-only}")
logs=$dest/logs/$commit/$run_name
mkdir -p "$logs"
cp "$tmp"/results/* "$dest"/
for chapter in "${chapters[@]}"; do
  cp "$tmp/results/metadata.json" "$dest/${chapter}_metadata.json"
done
for f in ctest.log ptxas.txt nvidia-smi.csv; do [ -f "$tmp/logs/$f" ] && cp "$tmp/logs/$f" "$logs/"; done
for f in "$tmp"/logs/sanitizer_*.log; do
  [ -f "$f" ] || continue
  # Keep the verdict lines only: the full logs repeat the test output.
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|SKIPPED" "$f" >"$logs/$(basename "$f")" || true
done
rm -rf "$tmp"
python3 "$root/tools/kc_results.py" chapter-map --results-dir "$dest" --readme "$root/README.md"
echo "imported into $dest"
