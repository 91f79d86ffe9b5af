#!/usr/bin/env bash
# The whole GPU run, in one call of the device tool (DESIGN.md, "GPU runs and results"):
# configure and build here, the chapters' tests, compute-sanitizer (memcheck, racecheck, synccheck)
# on small cases, the benchmarks to JSON, the PyTorch baselines, Nsight Compute profiles of the
# lessons' cases, the generated tables and plots, all packed into one archive under $OUT.
#
#   tools/gpu_suite.sh --commit SHA [--reps N] [--no-sanitize] [--no-profile] [chNN ...]
#
# The device's copy of the tree has no .git, so the commit is passed in. Chapters default to all.
# Unpack the archive into docs/results/h200/ (tools/import_gpu_run.sh does it) and commit.
set -uo pipefail

commit=unknown
reps=10
sanitize=1
profile=1
chapters=()
while [ $# -gt 0 ]; do
  case "$1" in
    --commit) commit=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --no-sanitize) sanitize=0; shift ;;
    --no-profile) profile=0; shift ;;
    ch[0-9][0-9]) chapters+=("$1"); shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/out}
# Results and logs are written under $OUT as they are made, so a run cut short still returns what it
# finished; the archive at the end packs the same two folders.
work=$out/kc_gpu_run
rm -rf "$work"
results=$work/results
logs=$work/logs
mkdir -p "$results" "$logs"
build=$root/build/gpu-suite
start=$(date +%s)
status=0
step() { echo; echo "=== [$(($(date +%s) - start))s] $*"; }
fail() { echo "FAILED: $*"; status=1; }

if [ ${#chapters[@]} -eq 0 ]; then
  mapfile -t chapters < <(python3 -c 'import json; [print(c["id"]) for c in json.load(open("tools/chapters.json"))]')
fi
echo "chapters: ${chapters[*]}  commit: $commit  repetitions: $reps"

step "GPU"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv | tee "$logs/nvidia-smi.csv"
nvcc --version | tail -2 | tee "$logs/nvcc.txt"

step "configure and build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKC_COMMIT="$commit" -DKC_WARNINGS_AS_ERRORS=ON -DKC_BUILD_DOCS=OFF -DCMAKE_CUDA_FLAGS="-Xptxas=-v" >"$logs/configure.log" 2>&1 ||
  { fail "configure"; tail -30 "$logs/configure.log"; }
targets=(kc_common_test)
for ch in "${chapters[@]}"; do targets+=("$ch"); done
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" >"$logs/build.log" 2>&1 ||
  { fail "build"; grep -E "error|warning" "$logs/build.log" | head -40; }
# Registers, spills, stack: what ptxas said about every kernel.
grep -E "ptxas info|bytes stack frame|spill|Compiling entry" "$logs/build.log" >"$logs/ptxas.txt" || true

step "tests"
labels=$(IFS='|'; echo "common|${chapters[*]}")
ctest --test-dir "$build" -L "$labels" --output-on-failure --output-junit "$logs/ctest.xml" >"$logs/ctest.log" 2>&1 ||
  fail "tests"
tail -15 "$logs/ctest.log"

if [ "$sanitize" = 1 ]; then
  step "compute-sanitizer on small cases (KC_SMALL_TESTS=1, GPU tests only)"
  programs=("$build/bin/kc_common_test")
  for ch in "${chapters[@]}"; do programs+=("$(ls "$build"/bin/"${ch}"_*_test)"); done
  for program in "${programs[@]}"; do
    name=$(basename "$program")
    for tool in memcheck racecheck synccheck; do
      log="$logs/sanitizer_${name}_${tool}.log"
      # racecheck instruments every shared-memory access: cap each run so one slow tool cannot eat
      # the whole call (a timeout counts as a failure and is reported).
      if KC_SMALL_TESTS=1 KC_SEED=1 timeout "${KC_SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool "$tool" \
        --error-exitcode 99 "$program" --gtest_filter='*Gpu*:-*DeliberateApiError*' >"$log" 2>&1; then
        echo "$name $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
      else
        fail "$name $tool"
        tail -20 "$log"
      fi
    done
  done
fi

step "benchmarks"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits \
  -lms 500 >"$logs/clocks_during_benchmarks.csv" 2>/dev/null &
sampler=$!
for ch in "${chapters[@]}"; do
  program=$(ls "$build"/bin/"${ch}"_*_bench)
  "$program" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
    --benchmark_enable_random_interleaving=true --benchmark_out="$results/${ch}_bench.json" \
    --benchmark_out_format=json >"$logs/${ch}_bench.log" 2>&1 || { fail "$ch benchmark"; tail -20 "$logs/${ch}_bench.log"; }
done

step "PyTorch baselines"
python3 tools/pytorch_baselines.py --chapters "${chapters[@]}" --out "$results" --repetitions "$reps" \
  >"$logs/pytorch.log" 2>&1 || { fail "pytorch baselines"; tail -20 "$logs/pytorch.log"; }
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
# What each PyTorch case launched, in a process of its own (the profiler never runs where the timing
# does): one call per case under torch.profiler, written as labels into the JSON just written.
python3 tools/pytorch_baselines.py --kernels --chapters "${chapters[@]}" --out "$results" \
  >>"$logs/pytorch.log" 2>&1 || { fail "pytorch kernel names"; tail -20 "$logs/pytorch.log"; }

step "metadata"
python3 - "$commit" "$logs" "$results/metadata.json" <<'PY'
import csv, json, statistics, sys, datetime
commit, logs, path = sys.argv[1:4]
smi = list(csv.reader(open(f"{logs}/nvidia-smi.csv")))
head = [h.strip() for h in smi[0]]
row = dict(zip(head, [v.strip() for v in smi[1]]))
samples = [r for r in csv.reader(open(f"{logs}/clocks_during_benchmarks.csv")) if len(r) >= 4]
def median(i):
    vals = [float(r[i]) for r in samples if r[i].strip().replace('.', '', 1).isdigit()]
    return round(statistics.median(vals)) if vals else None
meta = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "commit": commit,
    "gpu": row.get("name"),
    "driver": row.get("driver_version"),
    "cuda": open(f"{logs}/nvcc.txt").read().split(",")[-2].strip() if "," in open(f"{logs}/nvcc.txt").read() else None,
    "sm_clock_mhz_under_load": median(0),
    "mem_clock_mhz": median(1),
    "sm_clock_max_mhz": row.get("clocks.max.sm [MHz]", "").split()[0] or None,
    "power_limit_w": row.get("power.limit [W]", "").split()[0] or None,
    "notes": "clocks as found (never changed); sampled every 0.5 s during the benchmarks",
}
json.dump(meta, open(path, "w"), indent=2)
print(json.dumps(meta, indent=2))
PY

if [ "$profile" = 1 ]; then
  step "Nsight Compute profiles of the lessons' cases"
  for ch in "${chapters[@]}"; do
    program=$(ls "$build"/bin/"${ch}"_*_bench)
    python3 - "$ch" <<'PY' >"$work/cases.txt"
import json, sys
for c in json.load(open("tools/chapters.json")):
    if c["id"] == sys.argv[1]:
        for entry in c.get("profile_cases", []):
            print(entry["case"] + "\t" + entry.get("kernel", ""))
PY
    : >"$results/${ch}_profile.txt"
    while IFS=$'\t' read -r case kernel; do
      [ -n "$case" ] || continue
      echo "## $case" >>"$results/${ch}_profile.txt"
      kernel_args=()
      [ -n "$kernel" ] && kernel_args=(--kernel "$kernel")
      python3 tools/kc_profile.py --bench "$program" --case "$case" "${kernel_args[@]}" \
        >>"$results/${ch}_profile.txt" 2>"$logs/profile.err" ||
        { fail "profile $case"; tail -5 "$logs/profile.err"; }
    done <"$work/cases.txt"
    cat "$results/${ch}_profile.txt"
  done
fi

step "tables and plots"
python3 tools/kc_results.py generate --results-dir "$results" >"$logs/results.log" 2>&1 || { fail "results"; cat "$logs/results.log"; }
for ch in "${chapters[@]}"; do [ -f "$results/$ch.md" ] && cat "$results/$ch.md"; done

step "archive"
tar -czf "$out/kc_gpu_run.tar.gz" -C "$work" results logs
ls -la "$out"
echo "suite status: $status (0 = all passed), $(($(date +%s) - start)) s"
exit $status
