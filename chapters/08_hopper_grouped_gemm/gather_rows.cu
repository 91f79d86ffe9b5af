// Step 4's kernel with A's rows gathered (grouped_gemm_hopper_gather): the rows of an MoE layer's
// permuted tokens are copies of rows of X, so the kernel can load them from X itself, through the
// permutation's token_of_row, and no permuted copy needs to be written and read back. TMA has no row
// gather on Hopper: each row is its own one-row box, and the producer warp's 32 lanes issue the
// tile's 128 of them, four each, per K slice. TMA swizzles a box by its shared-memory address, so the
// rows land exactly as one 128-row box would.
#include "grouped_kernel.cuh"

namespace kc::ch08::detail {

void launch_gather(bool swiglu, const CUtensorMap& x_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                   const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  if (swiglu) {
    launch_grouped_kernel<GroupedStep::a_evict_last, true, true>(x_map, w_map, c_map, args, tile_bound, stream);
  } else {
    launch_grouped_kernel<GroupedStep::a_evict_last, false, true>(x_map, w_map, c_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch08::detail
