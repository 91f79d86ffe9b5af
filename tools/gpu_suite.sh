#!/usr/bin/env bash
# The whole GPU run, in one call of the device tool: configure and build on the GPU machine, the
# chapters' tests (in parallel; tests named *Timing* run alone), Chapter 10's layer against PyTorch's
# module (tools/ch10_check_pytorch.py), compute-sanitizer (memcheck,
# racecheck, synccheck) on small cases, each chapter's untouched exercise skeleton (it must fail the
# chapter's tests), the benchmarks to JSON, the PyTorch baselines, Nsight Compute profiles of the
# lessons' cases, then the generated tables and plots.
#
#   tools/gpu_suite.sh --commit SHA [--reps N] [--jobs N] [--no-sanitize] [--no-exercises]
#                      [--no-profile] [--no-pytorch] [--no-bench] [--no-tests] [chNN ...]
#
# --no-bench stops after the tests, sanitizers and exercise checks: a correctness run. --no-tests skips
# ctest (for a call that has just run the README's test command).
#
# The device's copy of the tree has no .git, so the commit is passed in. Chapters default to all.
# What lands under $OUT:
#   kc_gpu_run.tar.gz   the results, named as in docs/results/h200/: per chapter chNN_bench.json,
#                       chNN_pytorch.json, chNN.md, chNN.png (and chNN_sweep.png), chNN_metadata.json, chNN_profile.txt and
#                       chNN_suite.log (GPU, clocks, test and sanitizer summaries, the exercise check,
#                       benchmark wall time). tools/import_gpu_run.sh unpacks it there.
#   kc_gpu_logs.tar.gz  the full logs (build, ctest, sanitizers, benchmark output), for a failure
# Both are packed again after every step, so a run cut short still returns what it finished (the
# device returns at most 8 files: nothing else is written under $OUT).
set -uo pipefail

commit=unknown
reps=10
jobs=8
sanitize=1
exercises=1
profile=1
pytorch=1
bench=1
tests=1
chapters=()
while [ $# -gt 0 ]; do
  case "$1" in
    --commit) commit=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-sanitize) sanitize=0; shift ;;
    --no-exercises) exercises=0; shift ;;
    --no-profile) profile=0; shift ;;
    --no-pytorch) pytorch=0; shift ;;
    --no-bench) bench=0; shift ;;
    --no-tests) tests=0; shift ;;
    ch[0-9][0-9]) chapters+=("$1"); shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/out}
mkdir -p "$out"
work=$root/build/gpu-suite-run
rm -rf "$work"
results=$work/results
logs=$work/logs
mkdir -p "$results" "$logs"
build=$root/build/gpu-suite
start=$(date +%s)
status=0
# pack: (re)writes the two archives under $OUT from what the run has written so far.
pack() {
  tar -czf "$out/kc_gpu_run.tar.gz" -C "$results" .
  tar -czf "$out/kc_gpu_logs.tar.gz" -C "$work" logs
}
step() { pack; echo; echo "=== [$(($(date +%s) - start))s] $*"; }
# note CHAPTER|all TEXT...: a line of the chapters' summary logs (chNN_suite.log).
note() {
  local who=$1
  shift
  if [ "$who" = all ]; then
    for ch in "${chapters[@]}"; do printf '%s\n' "$@" >>"$results/${ch}_suite.log"; done
  else
    printf '%s\n' "$@" >>"$results/${who}_suite.log"
  fi
}
fail() {  # fail CHAPTER|all WHAT
  echo "FAILED: $2"
  note "$1" "FAILED: $2"
  status=1
}
# chapter_target chNN: the chapter's library name (ch01_vector_add) from tools/chapters.json.
chapter_target() {
  python3 -c 'import json, sys
for c in json.load(open("tools/chapters.json")):
    if c["id"] == sys.argv[1]: print(c["id"] + "_" + c["dir"].split("_", 1)[1])' "$1"
}
# ctest_summary LOG: ctest's verdict lines (the tally, failed tests, total time).
ctest_summary() { grep -E "tests passed|\*\*\*(Failed|Timeout|Not Run|Exception)|Total Test time" "$1" || true; }

if [ ${#chapters[@]} -eq 0 ]; then
  mapfile -t chapters < <(python3 -c 'import json; [print(c["id"]) for c in json.load(open("tools/chapters.json"))]')
fi
echo "chapters: ${chapters[*]}  commit: $commit  repetitions: $reps  test jobs: $jobs"
for ch in "${chapters[@]}"; do
  echo "# $ch: GPU suite (tools/gpu_suite.sh) at commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC')" >"$results/${ch}_suite.log"
done

step "GPU"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv | tee "$logs/nvidia-smi.csv"
nvcc --version | tail -2 | tee "$logs/nvcc.txt"
note all "" "## GPU (nvidia-smi, before the run)" "$(cat "$logs/nvidia-smi.csv")" "$(tail -1 "$logs/nvcc.txt")"

step "configure and build"
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKC_COMMIT="$commit" -DKC_WARNINGS_AS_ERRORS=ON -DKC_BUILD_DOCS=OFF -DCMAKE_CUDA_FLAGS="-Xptxas=-v" >"$logs/configure.log" 2>&1 ||
  { fail all "configure"; tail -30 "$logs/configure.log"; }
targets=(kc_common_test "${chapters[@]}")
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" >"$logs/build.log" 2>&1 ||
  { fail all "build"; grep -E "error|warning" "$logs/build.log" | head -40; }
# Registers, spills, stack: what ptxas said about every kernel.
grep -E "ptxas info|bytes stack frame|spill|Compiling entry" "$logs/build.log" >"$logs/ptxas.txt" || true
note all "" "## Build (sm_90, warnings as errors): $(($(date +%s) - t0)) s, $(grep -c 'Compiling entry' "$logs/ptxas.txt") kernels compiled"

if [ "$tests" = 1 ]; then
  step "tests (ctest -j $jobs; tests named *Timing* run alone)"
  t0=$(date +%s)
  ctest --test-dir "$build" -L '^common$' -j "$jobs" --timeout 300 --output-on-failure >"$logs/ctest_common.log" 2>&1 ||
    fail all "common tests"
  note all "" "## Tests of the shared harness (ctest -L common)" "$(ctest_summary "$logs/ctest_common.log")"
  for ch in "${chapters[@]}"; do
    t0=$(date +%s)
    ctest --test-dir "$build" -L "^$ch\$" -j "$jobs" --timeout 300 --output-on-failure \
      --output-junit "$logs/ctest_$ch.xml" >"$logs/ctest_$ch.log" 2>&1 || fail "$ch" "$ch tests"
    note "$ch" "" "## Tests (ctest -L $ch -j $jobs): $(($(date +%s) - t0)) s wall" "$(ctest_summary "$logs/ctest_$ch.log")"
    echo "$ch: $(grep -E 'tests passed' "$logs/ctest_$ch.log")"
  done
fi

# Chapter 10's layer against PyTorch's module on the same tensors (CI has no PyTorch: it runs here).
if [ "$tests" = 1 ] && [ "$pytorch" = 1 ] && [[ " ${chapters[*]} " == *" ch10 "* ]]; then
  step "Chapter 10 against PyTorch's module (tools/ch10_check_pytorch.py)"
  t0=$(date +%s)
  { cmake --build "$build" --target kc_ch10_capi -j "$(nproc)" >>"$logs/build.log" 2>&1 &&
    python3 tools/ch10_check_pytorch.py --lib "$build/lib/libkc_ch10_capi.so" >"$logs/ch10_vs_pytorch.log" 2>&1; } ||
    fail ch10 "ch10 against PyTorch"
  note ch10 "" "## The layer against PyTorch's module (tools/ch10_check_pytorch.py): $(($(date +%s) - t0)) s" \
    "$(cat "$logs/ch10_vs_pytorch.log" 2>/dev/null)"
fi

if [ "$sanitize" = 1 ]; then
  step "compute-sanitizer on small cases (KC_SMALL_TESTS=1, GPU tests only)"
  for ch in common "${chapters[@]}"; do
    if [ "$ch" = common ]; then program=$build/bin/kc_common_test; else program=$build/bin/$(chapter_target "$ch")_test; fi
    [ "$ch" = common ] && who=all || who=$ch
    note "$who" "" "## compute-sanitizer, $(basename "$program") (KC_SMALL_TESTS=1, --gtest_filter='*Gpu*')"
    for tool in memcheck racecheck synccheck; do
      log="$logs/sanitizer_$(basename "$program")_$tool.log"
      t0=$(date +%s)
      # racecheck instruments every shared-memory access: cap each run so one slow tool cannot eat
      # the whole call (a timeout counts as a failure and is reported).
      if KC_SMALL_TESTS=1 KC_SEED=1 timeout "${KC_SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool "$tool" \
        --error-exitcode 99 "$program" --gtest_filter='*Gpu*:-*DeliberateApiError*' >"$log" 2>&1; then
        verdict="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) ($(($(date +%s) - t0)) s)"
        echo "$(basename "$program") $tool: $verdict"
        note "$who" "$tool: $verdict"
      else
        fail "$who" "$(basename "$program") $tool (exit or timeout after $(($(date +%s) - t0)) s)"
        tail -20 "$log"
      fi
    done
  done
fi

if [ "$exercises" = 1 ]; then
  step "exercise skeletons: each, alone in place of its solution, must fail its chapter's tests"
  exbuild=$root/build/gpu-suite-exercises
  for ch in "${chapters[@]}"; do
    t0=$(date +%s)
    log=$logs/exercise_$ch.log
    # Only this chapter's skeleton is swapped in (KC_EXERCISE_CHAPTERS), so a failure is its own.
    if cmake -S . -B "$exbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DKC_BUILD_DOCS=OFF -DKC_EXERCISES=ON -DKC_EXERCISE_CHAPTERS="$ch" >"$log" 2>&1 &&
      cmake --build "$exbuild" --target "$(chapter_target "$ch")_test" -j "$(nproc)" >>"$log" 2>&1; then
      rc=0
      ctest --test-dir "$exbuild" -L "^$ch\$" -j "$jobs" --timeout 60 --stop-on-failure >>"$log" 2>&1 || rc=$?
      if [ "$rc" -ne 0 ] && grep -qE '\*\*\*(Failed|Timeout|Exception)' "$log" && ! grep -q 'Not Run' "$log"; then
        verdict="the untouched skeleton fails the chapter's tests, as it must"
      else
        verdict="the untouched skeleton PASSES the chapter's tests (ctest exit $rc): a TODO no test catches"
        fail "$ch" "$ch exercise check"
      fi
    else
      verdict="the skeleton does not build"
      fail "$ch" "$ch exercise build"
      grep -E "error" "$log" | head -20
    fi
    echo "$ch: $verdict"
    note "$ch" "" "## Exercise skeleton ($(($(date +%s) - t0)) s): $verdict" "$(ctest_summary "$log" | head -8)"
  done
fi

if [ "$bench" = 0 ]; then
  pack
  echo "suite status: $status (0 = all passed; correctness only, no benchmarks), $(($(date +%s) - start)) s"
  exit $status
fi

step "benchmarks ($reps repetitions, interleaved)"
for ch in "${chapters[@]}"; do
  program=$build/bin/$(chapter_target "$ch")_bench
  # The clocks while this chapter's benchmarks run, for its metadata.
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits \
    -lms 500 >"$logs/clocks_$ch.csv" 2>/dev/null &
  sampler=$!
  t0=$(date +%s)
  "$program" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
    --benchmark_enable_random_interleaving=true --benchmark_out="$results/${ch}_bench.json" \
    --benchmark_out_format=json >"$logs/${ch}_bench.log" 2>&1 || { fail "$ch" "$ch benchmark"; tail -20 "$logs/${ch}_bench.log"; }
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  echo "$ch: $(($(date +%s) - t0)) s"
  note "$ch" "" "## Benchmarks: $(($(date +%s) - t0)) s wall, $reps repetitions, random interleaving"
  pack
done

if [ "$pytorch" = 1 ]; then
  step "PyTorch baselines"
  t0=$(date +%s)
  python3 tools/pytorch_baselines.py --chapters "${chapters[@]}" --out "$results" --repetitions "$reps" \
    >"$logs/pytorch.log" 2>&1 || { fail all "pytorch baselines"; tail -20 "$logs/pytorch.log"; }
  # What each PyTorch case launched, in a process of its own (the profiler never runs where the timing
  # does): one call per case under torch.profiler, written as labels into the JSON just written.
  python3 tools/pytorch_baselines.py --kernels --chapters "${chapters[@]}" --out "$results" \
    >>"$logs/pytorch.log" 2>&1 || { fail all "pytorch kernel names"; tail -20 "$logs/pytorch.log"; }
  note all "" "## PyTorch baselines (every chapter of the run, timing and kernel names): $(($(date +%s) - t0)) s wall"
fi

step "metadata"
for ch in "${chapters[@]}"; do
  python3 - "$commit" "$logs" "$ch" "$results/${ch}_metadata.json" <<'PY'
import csv, datetime, json, statistics, sys
commit, logs, chapter, path = sys.argv[1:5]
with open(f"{logs}/nvidia-smi.csv") as f:
    smi = list(csv.reader(f))
row = dict(zip([h.strip() for h in smi[0]], [v.strip() for v in smi[1]])) if len(smi) > 1 else {}
try:
    with open(f"{logs}/clocks_{chapter}.csv") as f:
        samples = [r for r in csv.reader(f) if len(r) >= 4]
except OSError:
    samples = []
def median(i):
    values = []
    for r in samples:
        try:
            values.append(float(r[i]))
        except ValueError:
            pass
    return round(statistics.median(values)) if values else None
with open(f"{logs}/nvcc.txt") as f:
    nvcc = f.read()
meta = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "commit": commit,
    "gpu": row.get("name"),
    "driver": row.get("driver_version"),
    "cuda": nvcc.split(",")[-2].strip() if nvcc.count(",") >= 2 else None,
    "sm_clock_mhz_under_load": median(0),
    "mem_clock_mhz": median(1),
    "sm_clock_max_mhz": (row.get("clocks.max.sm [MHz]") or "").split(" ")[0] or None,
    "power_limit_w": (row.get("power.limit [W]") or "").split(" ")[0] or None,
    "notes": "clocks as found (never changed); sampled every 0.5 s during this chapter's benchmarks",
}
with open(path, "w") as f:
    json.dump(meta, f, indent=2)
    f.write("\n")
PY
  note "$ch" "" "## Clocks during the benchmarks (${ch}_metadata.json)" \
    "$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print("SM %s MHz (max %s), memory %s MHz, power limit %s W" % (m["sm_clock_mhz_under_load"], m["sm_clock_max_mhz"], m["mem_clock_mhz"], m["power_limit_w"]))' "$results/${ch}_metadata.json")"
done

if [ "$profile" = 1 ]; then
  step "Nsight Compute profiles of the lessons' cases"
  for ch in "${chapters[@]}"; do
    program=$build/bin/$(chapter_target "$ch")_bench
    python3 - "$ch" <<'PY' >"$work/cases.txt"
import json, sys
for c in json.load(open("tools/chapters.json")):
    if c["id"] == sys.argv[1]:
        for entry in c.get("profile_cases", []):
            print(entry["case"] + "\t" + entry.get("kernel", "") + "\t" + str(entry.get("launch_count", 1)))
PY
    : >"$results/${ch}_profile.txt"
    while IFS=$'\t' read -r case kernel count; do
      [ -n "$case" ] || continue
      echo "## $case" >>"$results/${ch}_profile.txt"
      kernel_args=(--launch-count "$count")
      [ -n "$kernel" ] && kernel_args+=(--kernel "$kernel")
      python3 tools/kc_profile.py --bench "$program" --case "$case" "${kernel_args[@]}" \
        >>"$results/${ch}_profile.txt" 2>"$logs/profile.err" ||
        { fail "$ch" "profile $case"; tail -5 "$logs/profile.err"; }
    done <"$work/cases.txt"
    [ -s "$results/${ch}_profile.txt" ] || rm -f "$results/${ch}_profile.txt"
  done
fi

step "tables and plots"
python3 tools/kc_results.py generate --results-dir "$results" >"$logs/results.log" 2>&1 ||
  { fail all "results tables"; cat "$logs/results.log"; }
for ch in "${chapters[@]}"; do [ -f "$results/$ch.md" ] && cat "$results/$ch.md"; done

step "archives"
note all "" "## Suite: $(($(date +%s) - start)) s for chapters ${chapters[*]}; status $status (0: every step passed)"
pack
ls -la "$out"
echo "suite status: $status (0 = all passed), $(($(date +%s) - start)) s"
exit $status
