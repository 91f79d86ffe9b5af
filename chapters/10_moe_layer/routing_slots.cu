// The two small kernels of the fused steps (moe_stages.hpp): the shared experts' slots appended to
// each token's routed ids, and the routing weight of each permuted row for the down projection's
// epilogue. One thread per (token, slot); both read and write a few bytes per pair.
#include "kc/check.hpp"
#include "moe_stages.hpp"

namespace kc::ch10::detail {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    append_shared_slots_kernel(const std::int32_t* __restrict__ ids, std::int64_t pairs, int k, int slots, int experts,
                               std::int32_t* __restrict__ slot_ids) {
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;  // pair of slot_ids
  if (p >= pairs) return;
  const std::int64_t t = p / slots;
  const int j = static_cast<int>(p % slots);
  slot_ids[p] = j < k ? ids[t * k + j] : experts + (j - k);
}

__global__ void __launch_bounds__(kThreads)
    scatter_row_weights_kernel(const float* __restrict__ route_weights, const std::int32_t* __restrict__ row_of_pair,
                               std::int64_t pairs, int k, int slots, float* __restrict__ weight_of_row) {
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (p >= pairs) return;
  const int row = row_of_pair[p];
  if (row < 0) return;
  const std::int64_t t = p / slots;
  const int j = static_cast<int>(p % slots);
  weight_of_row[row] = j < k ? route_weights[t * k + j] : 1.0f;
}

unsigned blocks_for(std::int64_t pairs) { return static_cast<unsigned>((pairs + kThreads - 1) / kThreads); }

}  // namespace

void append_shared_slots(std::int64_t tokens, int k, int experts, int shared, const std::int32_t* ids,
                         std::int32_t* slot_ids, cudaStream_t stream) {
  const std::int64_t pairs = tokens * (k + shared);
  if (pairs == 0) return;
  append_shared_slots_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(ids, pairs, k, k + shared, experts, slot_ids);
  check_launch();
}

void scatter_row_weights(std::int64_t tokens, int k, int slots, const float* route_weights,
                         const std::int32_t* row_of_pair, float* weight_of_row, cudaStream_t stream) {
  const std::int64_t pairs = tokens * slots;
  if (pairs == 0) return;
  scatter_row_weights_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(route_weights, row_of_pair, pairs, k, slots,
                                                                         weight_of_row);
  check_launch();
}

}  // namespace kc::ch10::detail
