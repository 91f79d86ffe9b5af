// Step 3: TMA stores that clip at each expert's end, through one rank-3 "ragged" map made on the host.
//
// What changed from step 2: no map is written on the device, no fence is needed. The host encodes one
// map of C with a third dimension (grouped_tiles.hpp, "Step 3's rank-3 store map"): dimension 1 counts
// rows up to 2^30 and dimension 2 counts end rows, both with a stride of one row, from a base 2^30
// rows below C. A store at (column, 2^30 - rows_e + local row, end_e) addresses row begin_e + local
// row of C, and TMA's own bounds check on dimension 1 drops every row from end_e on. One map serves
// every expert; the coordinates carry the expert's end and size.
#include "grouped_kernel.cuh"

namespace kc::ch08::detail {

void launch_step3(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  if (swiglu) {
    launch_grouped_kernel<GroupedStep::ragged_tensor_map, true>(a_map, w_map, c_map, args, tile_bound, stream);
  } else {
    launch_grouped_kernel<GroupedStep::ragged_tensor_map, false>(a_map, w_map, c_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch08::detail
