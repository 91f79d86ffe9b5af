// The build with the sm_90a kernels: says so, and sends each step to its launcher
// (kernels_unavailable.cu is the stand-in elsewhere).
#include "grouped_launch.hpp"

namespace kc::ch08::detail {

bool kernels_built() { return true; }

void launch_grouped(GroupedStep step, bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map,
                    const CUtensorMap& c_map, const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  switch (step) {
    case GroupedStep::masked_store: launch_step1(swiglu, a_map, w_map, args, tile_bound, stream); return;
    case GroupedStep::device_tensor_maps: launch_step2(swiglu, a_map, w_map, args, tile_bound, stream); return;
    case GroupedStep::ragged_tensor_map: launch_step3(swiglu, a_map, w_map, c_map, args, tile_bound, stream); return;
    case GroupedStep::a_evict_last: launch_step4(swiglu, a_map, w_map, c_map, args, tile_bound, stream); return;
    case GroupedStep::block_per_tile: launch_step5(swiglu, a_map, w_map, c_map, args, tile_bound, stream); return;
  }
}

}  // namespace kc::ch08::detail
