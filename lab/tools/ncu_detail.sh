#!/usr/bin/env bash
# Nsight Compute's detail sections for one benchmark case: where the warps stall (one metric per stall
# reason), how the schedulers issue, the instruction mix, how busy each pipe is, occupancy and the
# launch, as ncu's own text report. For the question a
# kc_profile.py line cannot answer ("the kernel is at 58 % issue efficiency: waiting on what?").
#
#   lab/tools/ncu_detail.sh BENCH CASE KERNEL_REGEX OUT.txt
#
# Clocks are left as they are (--clock-control none), as for every profile in this repository; the
# benchmark runs one repetition of CASE and ncu profiles the first kernel matching KERNEL_REGEX.
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 BENCH CASE KERNEL_REGEX OUT.txt" >&2
  exit 2
fi
bench=$1 case=$2 kernel=$3 out=$4
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats
  --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis
  --section ComputeWorkloadAnalysis)
# The WarpStateStats section prints only its summary in text; the stall reasons themselves (cycles a
# warp spends stalled on each reason, per issued instruction) are asked for as metrics.
stalls=(--metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$')
profile() {
  "$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-count 1 "$@" \
    "$bench" "--benchmark_filter=^${case}(/|\$)" --benchmark_repetitions=1
}
{
  echo "# $case ($kernel): ncu detail sections and stall reasons, clocks as found"
  # An ncu that rejects the stall metrics still gives the sections (and says so).
  profile "${sections[@]}" "${stalls[@]}" ||
    { echo "# ncu rejected the stall-reason metrics: the sections alone"; profile "${sections[@]}"; }
} >"$out" 2>&1
