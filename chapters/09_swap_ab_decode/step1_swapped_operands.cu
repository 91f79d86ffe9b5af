// Step 1: the operand swap. Chapter 8's kernel puts 128 token rows on wgmma's M side; at decode an
// expert has a handful of tokens, so most of those rows are padding, and the weights (the bytes that
// decide the time) stream through 4 stages. Here the expert's weight rows take the M side, 64 per
// consumer warpgroup, and its tokens the N side (64 per tile), so each stage holds 16 KiB of weights
// and 8 KiB of tokens. The accumulators are a block of Cᵀ: the epilogue stores them transposed.
// Chapter 8's pipeline depth, 4 stages.
#include "swap_kernel.cuh"

namespace kc::ch09::detail {

void launch_step1(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream) {
  launch_swap_kernel<kMaxTokenTile, kStep1Stages>(swiglu, a_map, w_map, args, tile_bound, stream);
}

}  // namespace kc::ch09::detail
