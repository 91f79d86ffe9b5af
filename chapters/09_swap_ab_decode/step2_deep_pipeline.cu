// Step 2: bytes in flight. A memory-bound kernel streams at the copy rate only when each SM keeps
// enough loads outstanding to cover the memory latency (bytes in flight per SM ≈ its share of the
// bandwidth × the latency). Step 1's 4 stages hold 64 KiB of weights per SM; here the stages fill the
// shared memory the staging buffer leaves (swap_stages_that_fit: 7 stages of 24 KiB at 64 tokens).
#include "swap_kernel.cuh"

namespace kc::ch09::detail {

static_assert(swap_stages_that_fit(kMaxTokenTile) == 7, "the lesson's stage count at 64 tokens");

void launch_step2(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream) {
  launch_swap_kernel<kMaxTokenTile, swap_stages_that_fit(kMaxTokenTile)>(swiglu, a_map, w_map, args, tile_bound,
                                                                         stream);
}

}  // namespace kc::ch09::detail
