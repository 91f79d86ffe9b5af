// Step 5: step 4's kernel, launched with a block per tile instead of a persistent grid.
//
// What changed from step 4: the grid. A persistent block walks tile ids b, b + grid, b + 2·grid, ...
// at its own pace, and after a few rounds the blocks have drifted apart in time: tiles of different
// cost (an expert's short last m-tile, an idle warpgroup, a W box some other block brought into the L2)
// move each block's next start by a few microseconds, and those add up. Two m-tiles of one expert at
// the same n-tile read the same W boxes; at DeepSeek-V3's up projection the weights (15 GB) stream
// through the L2 (50-60 MB) at the copy rate, so a W line lasts there only the microseconds the
// stream takes to pass the L2's size, and a partner further behind reads it from DRAM again. With a
// block per tile the GPU starts blocks in id order whenever an SM frees up, so the tiles of a band
// start within microseconds of each other, every round. The price: each tile's prologue (barriers,
// the first loads) and epilogue no longer overlap the next tile's loads.
#include "grouped_kernel.cuh"

namespace kc::ch08::detail {

void launch_step5(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  if (swiglu) {
    launch_grouped_kernel<GroupedStep::block_per_tile, true>(a_map, w_map, c_map, args, tile_bound, stream);
  } else {
    launch_grouped_kernel<GroupedStep::block_per_tile, false>(a_map, w_map, c_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch08::detail
