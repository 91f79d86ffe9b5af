#!/usr/bin/env bash
# Runs chapter benchmark programs to JSON and prints the summary table.
#   tools/run_benchmarks.sh OUT_DIR BENCH_PROGRAM...
# Extra Google Benchmark flags can be given in KC_BENCH_FLAGS (e.g. a --benchmark_filter).
# Without a GPU every program prints why it skipped; this script then says so and exits 0.
set -euo pipefail
out_dir=$1
shift
mkdir -p "$out_dir"
repetitions=${KC_BENCH_REPETITIONS:-5}
ran=()
for program in "$@"; do
  name=$(basename "$program")           # ch01_vector_add_bench
  chapter=${name%%_*}                   # ch01
  json="$out_dir/${chapter}_bench.json"
  rm -f "$json"
  echo "== $name"
  # shellcheck disable=SC2086
  "$program" --benchmark_repetitions="$repetitions" --benchmark_report_aggregates_only=true \
    --benchmark_enable_random_interleaving=true --benchmark_out="$json" --benchmark_out_format=json \
    ${KC_BENCH_FLAGS:-}
  [ -s "$json" ] && ran+=("$json")
done
if [ ${#ran[@]} -eq 0 ]; then
  echo "No benchmark ran: this machine has no usable CUDA GPU (see the lines above). Nothing to summarise."
  exit 0
fi
python3 "$(dirname "$0")/kc_results.py" summary "${ran[@]}"
