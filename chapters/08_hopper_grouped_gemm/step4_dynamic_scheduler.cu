// Step 4: tiles claimed in launch order from a counter (Chapter 6's dynamic scheduler), with step 3's
// store.
//
// What changed from step 3: the order in which tiles start. With a static round-robin, block b takes
// tiles b, b + grid, b + 2·grid, ...: after a few rounds the blocks have drifted apart in time, and the
// tiles that share an A tile (the n-tiles of one m-tile, consecutive in the grouped order) no longer
// run together. Where an expert has one m-tile (G256×128) its 16 n-tiles each read the same 1.8 MB of
// A; run apart, the W stream of the tiles between them evicts that A from L2 and it comes from DRAM
// again. Here the producer thread of each block claims its next tile with an atomicAdd on a counter
// in the workspace (the prefix kernel sets it to 0 before every launch): tiles start in launch order,
// as the hardware's block scheduler starts a non-persistent grid, and an expert's tiles run together.
//
// The claimed id reaches the consumers through a ring of 8 slots in shared memory, each with a full
// and an empty mbarrier, as the K slices do: the producer may run up to 8 tiles ahead. The claim past
// the last tile is passed on too, and ends every role's loop.
#include "grouped_kernel.cuh"

namespace kc::ch08::detail {

void launch_step4(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  if (swiglu) {
    launch_grouped_kernel<GroupedStep::dynamic_scheduler, true>(a_map, w_map, c_map, args, tile_bound, stream);
  } else {
    launch_grouped_kernel<GroupedStep::dynamic_scheduler, false>(a_map, w_map, c_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch08::detail
