// Step 4: step 3's kernel, with the A rows that other SMs read again kept in the L2.
//
// What changed from step 3: when a tile's expert has one m-tile (128 rows or fewer), each of its W
// boxes is read by that tile alone, while its rows of A are read by all of the expert's n-tiles, on
// other SMs, at other times. Between those reads the weights of every other tile stream through the
// L2 (15 GB at G256xM128_N4096_K7168, through 50-60 MB) and push A out, so A comes from device memory
// again. The producer loads such A boxes with an evict-last L2 policy (createpolicy, then
// cp.async.bulk.tensor's .L2::cache_hint): the L2 replaces the weights' lines first. Experts of more
// m-tiles keep the default policy: their W boxes are read again too.
#include "grouped_kernel.cuh"

namespace kc::ch08::detail {

void launch_step4(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  if (swiglu) {
    launch_grouped_kernel<GroupedStep::a_evict_last, true>(a_map, w_map, c_map, args, tile_bound, stream);
  } else {
    launch_grouped_kernel<GroupedStep::a_evict_last, false>(a_map, w_map, c_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch08::detail
