// Stand-in for the kernels in a build whose CMAKE_CUDA_ARCHITECTURES has no 90 entry: the library
// still links and every host-side rule still works, and a launch says what it needs.
#include "swap_launch.hpp"

namespace kc::ch09::detail {

bool kernels_built() { return false; }

void launch_swapped(SwapStep, int, bool, const CUtensorMap&, const CUtensorMap&, const SwapArgs&, std::int64_t,
                    cudaStream_t) {
  throw UnsupportedGpu("Chapter 9 was built without sm_90a kernels (no 90 entry in CMAKE_CUDA_ARCHITECTURES)");
}

void launch_gather(int, bool, const CUtensorMap&, const CUtensorMap&, const SwapArgs&, std::int64_t, cudaStream_t) {
  throw UnsupportedGpu("Chapter 9 was built without sm_90a kernels (no 90 entry in CMAKE_CUDA_ARCHITECTURES)");
}

}  // namespace kc::ch09::detail
