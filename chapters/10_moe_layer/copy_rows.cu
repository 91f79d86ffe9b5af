// The permuted token copies as their own kernel (moe_stages.hpp, copy_token_rows): a[r] =
// x[token_of_row[r]]. Chapter 5's permutation copies inside its scatter, one warp per 256 pairs, so a
// layer of 8192 pairs copies with 32 warps; here a grid that fills the GPU takes a row per block at a
// time, 16 bytes per thread per load, and the row count (offsets[E]) is read on the device.
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
  // A block per row at a time: the row's source is one broadcast load, its 16-byte vectors go to the
  // block's threads side by side (no division per vector).
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* from = x + static_cast<std::int64_t>(token_of_row[row]) * row_vectors;
    uint4* to = a + row * row_vectors;
    for (std::int64_t v = threadIdx.x; v < row_vectors; v += kThreads) to[v] = from[v];
  }
}

}  // namespace

void copy_token_rows(std::int64_t max_rows, std::int64_t hidden, const __nv_bfloat16* x,
                     const std::int32_t* token_of_row, const std::int32_t* offsets_end, __nv_bfloat16* a,
                     cudaStream_t stream) {
  const std::int64_t row_vectors = hidden / 8;  // hidden is a multiple of 8 (moe_config_rules)
  if (max_rows == 0 || row_vectors == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(max_rows, kMaxBlocks));
  copy_token_rows_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(x), token_of_row, offsets_end,
                                                          max_rows, row_vectors, reinterpret_cast<uint4*>(a));
  check_launch();
}

}  // namespace kc::ch10::detail
