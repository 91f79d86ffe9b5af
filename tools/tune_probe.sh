#!/usr/bin/env bash
# A tuning probe in one call of the device tool: build one chapter, run the GPU tests of the
# candidates, then the chapter's KC_TUNE benchmark rows (candidates against the current kernel, same
# process, interleaved repetitions) to JSON. For docs/notes, not the results tables: gpu_suite.sh
# makes those.
#
#   tools/tune_probe.sh CHAPTER COMMIT GTEST_FILTER BENCH_FILTER [REPETITIONS]
#     CHAPTER       chNN (its programs are chNN_*_test and chNN_*_bench)
#     COMMIT        the commit the tree is at (written into the JSON's context)
#     GTEST_FILTER  the candidates' GPU tests, e.g. '*Tuning*'
#     BENCH_FILTER  a --benchmark_filter over the KC_TUNE rows ('' runs them all)
#
# Output: $OUT/details/CHAPTER_tune_COMMIT.json and one log beside it (configure, build and the
# tests, in that order): two files a chapter, since the device returns only about eight files a
# call. The build directory is gpu_suite.sh's, configured the same way, so a suite run on the same
# machine afterwards rebuilds little.
set -uo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 CHAPTER COMMIT GTEST_FILTER BENCH_FILTER [REPETITIONS]" >&2
  exit 2
fi
chapter=$1 commit=$2 gtest_filter=$3 bench_filter=$4 reps=${5:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/out}/details
mkdir -p "$out"
build=$root/build/gpu-suite
start=$(date +%s)
say() { echo "=== [$(($(date +%s) - start))s] $*"; }

log=$out/${chapter}_tune_${commit:0:7}.log
say "configure and build $chapter"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKC_COMMIT="$commit" -DKC_WARNINGS_AS_ERRORS=ON -DKC_BUILD_DOCS=OFF -DCMAKE_CUDA_FLAGS="-Xptxas=-v" \
  >"$log" 2>&1 || { tail -30 "$log"; exit 1; }
cmake --build "$build" --target "$chapter" -j "$(nproc)" >>"$log" 2>&1 ||
  { grep -E "error" "$log" | head -40; exit 1; }
test_program=$(ls "$build"/bin/"${chapter}"_*_test)
bench_program=$(ls "$build"/bin/"${chapter}"_*_bench)

say "GPU tests: $gtest_filter"
echo "##### GPU tests: $gtest_filter" >>"$log"
timeout 240 "$test_program" --gtest_filter="$gtest_filter" --gtest_brief=1 >>"$log" 2>&1
test_rc=$?
echo "tests rc=$test_rc"
sed -n '/##### GPU tests/,$p' "$log" | grep -E "PASSED|FAILED|Failure|tests ran|SKIPPED" | head -20

if [ $test_rc -ne 0 ]; then
  echo "the candidates' tests failed: no benchmark"
  exit 1
fi
say "KC_TUNE benchmark: ${bench_filter:-all rows}, $reps repetitions"
KC_TUNE=1 "$bench_program" --benchmark_filter="${bench_filter:-.}" --benchmark_repetitions="$reps" \
  --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
  --benchmark_out="$out/${chapter}_tune_${commit:0:7}.json" --benchmark_out_format=json 2>&1 |
  grep -E "median|error|ERROR" | head -60
say "done"
