// The one block-wide scan of Chapter 5's small kernels (tile prefix, permutation offsets): a
// block of kScanThreads = kMaxExperts threads, one expert per thread. Internal header.
#pragma once

#include "grouped_gemm.hpp"

namespace kc::ch05::detail {

namespace {

constexpr int kScanThreads = kMaxExperts;  // threads of a scanning block
static_assert(kScanThreads % 32 == 0 && kScanThreads / 32 <= 32, "one warp scans the warp totals");

// Inclusive sum of `value` over the block's kScanThreads threads: a shuffle scan inside each warp,
// then one warp scans the 32 warp totals. Every thread of the block must call it.
__device__ int block_inclusive_scan(int value) {
  __shared__ int warp_totals[kScanThreads / 32];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  for (int d = 1; d < 32; d *= 2) {
    const int up = __shfl_up_sync(0xFFFFFFFFu, value, d);
    if (lane >= d) value += up;
  }
  if (lane == 31) warp_totals[warp] = value;
  __syncthreads();
  if (warp == 0) {
    int total = lane < kScanThreads / 32 ? warp_totals[lane] : 0;
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xFFFFFFFFu, total, d);
      if (lane >= d) total += up;
    }
    if (lane < kScanThreads / 32) warp_totals[lane] = total;  // inclusive over warps
  }
  __syncthreads();
  return warp > 0 ? value + warp_totals[warp - 1] : value;
}

}  // namespace

}  // namespace kc::ch05::detail
