// Step 3's kernel with its token rows gathered (grouped_gemm_decode_gather): each token row of a tile
// is a one-row TMA box of X at the permutation's token_of_row, issued by its own producer lane, so an
// MoE layer's permuted copy of its tokens is never written. As in Chapter 8's gathering kernel, TMA
// swizzles each row by its shared-memory address: the rows land as one token box would.
#include "swap_kernel.cuh"

namespace kc::ch09::detail {

void launch_gather(int tokens, bool swiglu, const CUtensorMap& x_map, const CUtensorMap& w_map, const SwapArgs& args,
                   std::int64_t tile_bound, cudaStream_t stream) {
  switch (tokens) {
    case 8:
      launch_swap_kernel<8, swap_stages_that_fit(8), true>(swiglu, x_map, w_map, args, tile_bound, stream);
      return;
    case 16:
      launch_swap_kernel<16, swap_stages_that_fit(16), true>(swiglu, x_map, w_map, args, tile_bound, stream);
      return;
    case 32:
      launch_swap_kernel<32, swap_stages_that_fit(32), true>(swiglu, x_map, w_map, args, tile_bound, stream);
      return;
    default:
      launch_swap_kernel<64, swap_stages_that_fit(64), true>(swiglu, x_map, w_map, args, tile_bound, stream);
      return;
  }
}

}  // namespace kc::ch09::detail
