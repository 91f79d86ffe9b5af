// Step 2: TMA stores that clip at each expert's end, through a store map per expert written on the
// device.
//
// What changed from step 1:
//   - The store is Chapter 7's step 6: each consumer warpgroup stages 64 × 128 bf16 at a time in
//     shared memory (stmatrix), and one thread hands the two 64 × 64 boxes to TMA, which writes them
//     while the warpgroup goes on to its next tile.
//   - TMA clips a store only at the edges of the tensor its map describes. A map of all of C would
//     let a boundary tile's store write the next expert's rows. So each non-empty expert gets its own
//     map: C's map with the expert's first row as base address and its row count as rows. Nobody on
//     the host knows those numbers, so the prefix kernel writes the maps (expert_prefix.cu): a copy of
//     C's map patched with tensormap.replace, then fence.proxy.tensormap::generic.release.
//   - Before a store leader first uses an expert's map, fence.proxy.tensormap::generic.acquire on
//     that map: the copy engine reads maps through its own proxy, which may otherwise hold a stale copy.
//   - Coordinates are relative to the expert: column, row - the expert's first row.
// The cost: 128 bytes of workspace per expert, written once per launch, and one acquire per expert
// change of a warpgroup.
#include "grouped_kernel.cuh"

namespace kc::ch08::detail {

void launch_step2(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const GroupedArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream) {
  // The stores read args.expert_maps; the kernel's c_map parameter is unused (A's map stands in).
  if (swiglu) {
    launch_grouped_kernel<GroupedStep::device_tensor_maps, true>(a_map, w_map, a_map, args, tile_bound, stream);
  } else {
    launch_grouped_kernel<GroupedStep::device_tensor_maps, false>(a_map, w_map, a_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch08::detail
