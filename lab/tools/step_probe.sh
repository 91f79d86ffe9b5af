#!/usr/bin/env bash
# A first run of new GPU code, step by step, in one call of the device tool: build one chapter, run its
# GPU tests one step at a time under a timeout (so a hang names its step and the later steps still
# run), dump the SASS summary of each kernel, then a short benchmark of the cases that pass.
#
#   lab/tools/step_probe.sh CHAPTER BENCH_FILTER STEP...
#     CHAPTER       chNN (its test and benchmark programs are chNN_*_test and chNN_*_bench)
#     BENCH_FILTER  a --benchmark_filter for the short benchmark ('' skips it)
#     STEP          a gtest filter fragment per step, e.g. step1_tma_wgmma
#
# Logs go to $OUT/probe/. It is not the results run: gpu_suite.sh makes the committed results.
set -uo pipefail
chapter=$1
bench_filter=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-$root/out}/probe
mkdir -p "$out"
build=$root/build/probe
start=$(date +%s)
say() { echo "=== [$(($(date +%s) - start))s] $*"; }

say "configure and build $chapter"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKC_WARNINGS_AS_ERRORS=ON -DKC_BUILD_DOCS=OFF -DCMAKE_CUDA_FLAGS="-Xptxas=-v" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" --target "$chapter" -j "$(nproc)" >"$out/build.log" 2>&1 ||
  { grep -E "error" "$out/build.log" | head -40; exit 1; }
grep -E "ptxas info.*(Compiling|Used)|spill" "$out/build.log" | grep -A1 -i "$chapter\|step" | head -60 >"$out/ptxas.txt"
test_program=$(ls "$build"/bin/"${chapter}"_*_test)
bench_program=$(ls "$build"/bin/"${chapter}"_*_bench)

say "CPU tests"
timeout 120 "$test_program" --gtest_filter='-*Gpu*' --gtest_brief=1 >"$out/cpu_tests.log" 2>&1
echo "cpu tests rc=$? $(grep -E 'PASSED|FAILED' "$out/cpu_tests.log" | tail -2 | tr '\n' ' ')"

passed=()
for step in "$@"; do
  say "GPU tests of $step"
  timeout 90 "$test_program" --gtest_filter="*Gpu*${step}*" --gtest_brief=1 >"$out/gpu_${step}.log" 2>&1
  rc=$?
  echo "$step: rc=$rc $(grep -cE '^\[  FAILED  \]' "$out/gpu_${step}.log") failed lines"
  grep -E "FAILED|Failure|error|max abs|rel" "$out/gpu_${step}.log" | head -12
  [ $rc -eq 124 ] && echo "$step: TIMED OUT (hang?)"
  [ $rc -eq 0 ] && passed+=("$step")
done

say "GPU tests over all steps (random shapes, odd offsets, graph capture)"
timeout 120 "$test_program" --gtest_filter='HopperGpuTest.*:*OtherGpu*' --gtest_brief=1 >"$out/gpu_all_steps.log" 2>&1
echo "all-step tests rc=$?"
grep -E "FAILED|Failure|error" "$out/gpu_all_steps.log" | head -20

say "SASS summary"
sass_tool=$(command -v cuobjdump)
if [ -n "$sass_tool" ]; then
  lib=$(ls "$build"/chapters/*/lib"${chapter}"_*.a 2>/dev/null | head -1)
  [ -z "$lib" ] && lib=$test_program
  "$sass_tool" --dump-sass "$lib" >"$out/sass.txt" 2>/dev/null
  awk '/Function :/{f=$3} /HGMMA|UTMALDG|UTMASTG|SYNCS|USETMAXREG|WARPGROUP|UBLKCP|ACQBULK/{split($0,a,";"); gsub(/^ *\/\*[0-9a-f]*\*\/ */,"",a[1]); split(a[1],b," "); c[f" "b[1]]++} END{for(k in c) print c[k], k}' "$out/sass.txt" | sort -k2 | head -80
fi

if [ -n "$bench_filter" ]; then
  say "short benchmark ($bench_filter)"
  timeout 240 "$bench_program" --benchmark_filter="$bench_filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$out/${chapter}_probe_bench.json" \
    --benchmark_out_format=json >"$out/bench.log" 2>&1
  echo "bench rc=$?"
  grep -E "median|ERROR|error" "$out/bench.log" | head -40
fi
say "done; passed steps: ${passed[*]:-none}"
