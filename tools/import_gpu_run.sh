#!/usr/bin/env bash
# Puts a tools/gpu_suite.sh run into docs/results/<gpu>/ (default h200), regenerates that folder's
# tables, and refreshes the README's chapter map and the lessons' generated figures. The archive
# holds the run's chapters only, named as in that folder (chNN_bench.json, chNN.md, chNN_suite.log,
# ...), so it replaces their files and leaves the other chapters' as they are.
#   tools/import_gpu_run.sh path/to/kc_gpu_run.tar.gz|path/to/folder/of/its/files [gpu]
set -euo pipefail
run=$1
gpu=${2:-h200}
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/docs/results/$gpu
mkdir -p "$dest"
if [ -d "$run" ]; then
  cp "$run"/ch* "$dest"/
else
  tar -xzf "$run" -C "$dest"
fi
# The README and the lessons are generated from the H200 folder whichever folder was imported: a
# chapter measured elsewhere names its folder in tools/chapters.json (results_gpu) and is read from it.
python3 "$root/tools/kc_results.py" generate --results-dir "$dest"
python3 "$root/tools/kc_results.py" chapter-map --results-dir "$root/docs/results/h200" --readme "$root/README.md"
echo "imported into $dest"
