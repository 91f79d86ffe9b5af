// The build with the sm_90a kernels: says so, and sends each step to its launcher
// (kernels_unavailable.cu is the stand-in elsewhere).
#include "swap_launch.hpp"

namespace kc::ch09::detail {

bool kernels_built() { return true; }

void launch_swapped(SwapStep step, int tokens, bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map,
                    const SwapArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  switch (step) {
    case SwapStep::swapped_operands: launch_step1(swiglu, a_map, w_map, args, tile_bound, stream); return;
    case SwapStep::deep_pipeline: launch_step2(swiglu, a_map, w_map, args, tile_bound, stream); return;
    case SwapStep::token_tile: launch_step3(tokens, swiglu, a_map, w_map, args, tile_bound, stream); return;
  }
}

}  // namespace kc::ch09::detail
