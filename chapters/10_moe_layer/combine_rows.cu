// The combine of the fused layer (moe_layer.hpp, combine_rows): y[t] = the sum of token t's permuted
// rows in slot order, one rounding. A thread owns eight columns of one token: it reads the token's
// slots' row numbers (the same for the whole block: one broadcast load each), then eight bf16 of each
// row as one 16-byte load, and writes eight bf16 as one 16-byte store. Block x is a token, block y a
// band of 8 · 128 columns: even T = 1 spreads over H / 1024 blocks.
#include <algorithm>
#include <string>

#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "moe_layer.hpp"
// Angle brackets: the exercise build puts the skeleton's combine_slots.hpp first on the include path.
#include <combine_slots.hpp>

namespace kc::ch10 {

namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ Columns8 load_columns(const __nv_bfloat16* p) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
  Columns8 out;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out.v[2 * i] = f.x;
    out.v[2 * i + 1] = f.y;
  }
  return out;
}

__global__ void __launch_bounds__(kThreads)
    combine_rows_kernel(const __nv_bfloat16* __restrict__ rows, const std::int32_t* __restrict__ row_of_pair, int slots,
                        std::int64_t hidden, __nv_bfloat16* __restrict__ y) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.y) * kThreads * 8;
  for (std::int64_t col = (static_cast<std::int64_t>(blockIdx.y) * kThreads + threadIdx.x) * 8; col < hidden;
       col += step) {
    const Columns8 sum = sum_slot_rows(row_of_pair + t * slots, slots, [&](std::int32_t row) {
      return load_columns(rows + static_cast<std::int64_t>(row) * hidden + col);
    });
    uint4 packed;
    auto* out = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __floats2bfloat162_rn(sum.v[2 * i], sum.v[2 * i + 1]);
    *reinterpret_cast<uint4*>(y + t * hidden + col) = packed;
  }
}

}  // namespace

void validate_combine_rows(std::int64_t tokens, int slots, std::int64_t hidden, const __nv_bfloat16* rows,
                           const std::int32_t* row_of_pair, const __nv_bfloat16* y) {
  if (tokens < 0 || tokens > 0x7FFFFFFF) {
    throw InvalidArgument("tokens (" + std::to_string(tokens) + ") must be in [0, 2^31 - 1]");
  }
  if (slots < 1 || slots > kMaxCombineSlots) {
    throw InvalidArgument("slots (" + std::to_string(slots) + ") must be in [1, " + std::to_string(kMaxCombineSlots) +
                          "]");
  }
  if (hidden < 8 || hidden % 8 != 0 || hidden > 0x7FFFFFFF) {
    throw InvalidArgument("hidden (" + std::to_string(hidden) + ") must be a multiple of 8 in [8, 2^31 - 1]");
  }
  if (tokens * slots > 0x7FFFFFFF) throw InvalidArgument("tokens · slots must be at most 2^31 - 1 (int rows)");
  if (tokens == 0) return;
  if (rows == nullptr || row_of_pair == nullptr || y == nullptr) {
    throw InvalidArgument("rows, row_of_pair and y must not be null when tokens > 0");
  }
  if (!kc::aligned_to(rows, 16) || !kc::aligned_to(y, 16)) throw InvalidArgument("rows and y must be 16-byte aligned");
  const std::uint64_t rows_bytes = static_cast<std::uint64_t>(tokens * slots) * hidden * 2;
  const std::uint64_t y_bytes = static_cast<std::uint64_t>(tokens) * hidden * 2;
  if (kc::overlaps(y, y_bytes, rows, rows_bytes)) throw InvalidArgument("y must not overlap rows");
  if (kc::overlaps(y, y_bytes, row_of_pair, static_cast<std::uint64_t>(tokens * slots) * 4)) {
    throw InvalidArgument("y must not overlap row_of_pair");
  }
}

void combine_rows(std::int64_t tokens, int slots, std::int64_t hidden, const __nv_bfloat16* rows,
                  const std::int32_t* row_of_pair, __nv_bfloat16* y, cudaStream_t stream) {
  validate_combine_rows(tokens, slots, hidden, rows, row_of_pair, y);
  if (tokens == 0) return;
  const std::int64_t bands = (hidden / 8 + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(std::min<std::int64_t>(bands, 65535)));
  combine_rows_kernel<<<grid, kThreads, 0, stream>>>(rows, row_of_pair, slots, hidden, y);
  check_launch();
}

}  // namespace kc::ch10
