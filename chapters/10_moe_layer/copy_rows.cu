// The permuted token copies as their own kernel (moe_stages.hpp, copy_token_rows): a[r] =
// x[token_of_row[r]]. Chapter 5's permutation copies inside its scatter, one warp per 256 pairs, so a
// layer of 8192 pairs copies with 32 warps; here every thread of a grid that fills the GPU moves 16
// bytes at a time, and the row count (offsets[E]) is read on the device.
#include <algorithm>

#include "kc/check.hpp"
#include "moe_stages.hpp"

namespace kc::ch10::detail {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 132 * 16;  // enough to fill any Hopper GPU; the loop strides past it

__global__ void __launch_bounds__(kThreads)
    copy_token_rows_kernel(const uint4* __restrict__ x, const std::int32_t* __restrict__ token_of_row,
                           const std::int32_t* __restrict__ offsets_end, std::int64_t max_rows,
                           std::int64_t row_vectors, uint4* __restrict__ a) {
  const std::int64_t rows = min(static_cast<std::int64_t>(*offsets_end), max_rows);
  const std::int64_t total = rows * row_vectors;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride) {
    const std::int64_t row = i / row_vectors, v = i % row_vectors;
    a[i] = x[static_cast<std::int64_t>(token_of_row[row]) * row_vectors + v];
  }
}

}  // namespace

void copy_token_rows(std::int64_t max_rows, std::int64_t hidden, const __nv_bfloat16* x,
                     const std::int32_t* token_of_row, const std::int32_t* offsets_end, __nv_bfloat16* a,
                     cudaStream_t stream) {
  const std::int64_t row_vectors = hidden / 8;  // hidden is a multiple of 8 (moe_config_rules)
  const std::int64_t total = max_rows * row_vectors;
  if (total == 0) return;
  const auto blocks = static_cast<unsigned>(std::min((total + kThreads - 1) / kThreads, kMaxBlocks));
  copy_token_rows_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(x), token_of_row, offsets_end,
                                                          max_rows, row_vectors, reinterpret_cast<uint4*>(a));
  check_launch();
}

}  // namespace kc::ch10::detail
