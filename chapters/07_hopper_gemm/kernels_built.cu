// The build with the sm_90a kernels says so (kernels_unavailable.cu is its stand-in elsewhere).
#include "hopper_launch.hpp"

namespace kc::ch07::detail {

bool kernels_built() { return true; }

}  // namespace kc::ch07::detail
