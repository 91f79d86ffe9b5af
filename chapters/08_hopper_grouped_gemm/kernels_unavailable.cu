// Stand-in for the kernels in a build whose CMAKE_CUDA_ARCHITECTURES has no 90 entry: the library
// still links and every host-side rule still works, and a launch says what it needs.
#include "grouped_launch.hpp"

namespace kc::ch08::detail {

namespace {
[[noreturn]] void unavailable() {
  throw UnsupportedGpu("Chapter 8 was built without sm_90a kernels (no 90 entry in CMAKE_CUDA_ARCHITECTURES)");
}
}  // namespace

bool kernels_built() { return false; }
void launch_expert_prefix(const std::int32_t*, int, int, std::int32_t*, const CUtensorMap&, const __nv_bfloat16*, int,
                          CUtensorMap*, cudaStream_t) {
  unavailable();
}
void launch_grouped(GroupedStep, bool, const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const GroupedArgs&,
                    std::int64_t, cudaStream_t) {
  unavailable();
}
void launch_gather(bool, const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const GroupedArgs&, std::int64_t,
                   cudaStream_t) {
  unavailable();
}

}  // namespace kc::ch08::detail
