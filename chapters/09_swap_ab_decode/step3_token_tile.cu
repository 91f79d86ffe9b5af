// Step 3: the token tile from the token count. With one token per expert, step 2's 64-token boxes are
// 63 rows of other experts' tokens or zeros: they take shared memory (8 KiB a stage) and the tensor
// core's time for nothing. The host picks the smallest of 8, 16, 32 and 64 tokens that holds the
// launch's tokens per expert (token_tile_for), and the stages the smaller token box leaves room for
// fill the rest (12 stages at 8 tokens: 192 KiB of weights in flight).
#include "swap_kernel.cuh"

namespace kc::ch09::detail {

static_assert(swap_stages_that_fit(8) == 12, "the lesson's stage count at 8 tokens");

void launch_step3(int tokens, bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream) {
  switch (tokens) {
    case 8: launch_swap_kernel<8, swap_stages_that_fit(8)>(swiglu, a_map, w_map, args, tile_bound, stream); return;
    case 16: launch_swap_kernel<16, swap_stages_that_fit(16)>(swiglu, a_map, w_map, args, tile_bound, stream); return;
    case 32: launch_swap_kernel<32, swap_stages_that_fit(32)>(swiglu, a_map, w_map, args, tile_bound, stream); return;
    default: launch_swap_kernel<64, swap_stages_that_fit(64)>(swiglu, a_map, w_map, args, tile_bound, stream); return;
  }
}

}  // namespace kc::ch09::detail
