// Stand-in for the six kernels in a build whose CMAKE_CUDA_ARCHITECTURES has no 90 entry: the
// library still links and every host-side rule still works, and a launch says what it needs.
// (gemm_bf16_hopper_step checks kernels_built() first, so these are never reached through the API.)
#include "hopper_gemm.hpp"
#include "hopper_launch.hpp"

namespace kc::ch07::detail {

namespace {
[[noreturn]] void unavailable() {
  throw UnsupportedGpu("Chapter 7 was built without sm_90a kernels (no 90 entry in CMAKE_CUDA_ARCHITECTURES)");
}
}  // namespace

bool kernels_built() { return false; }
int stream_k_resident_clusters() { unavailable(); }
void launch_step1(const CUtensorMap&, const CUtensorMap&, const Output&, int, cudaStream_t) { unavailable(); }
void launch_step2(const CUtensorMap&, const CUtensorMap&, const Output&, int, cudaStream_t) { unavailable(); }
void launch_step3(const CUtensorMap&, const CUtensorMap&, const Output&, int, cudaStream_t) { unavailable(); }
void launch_step4(const CUtensorMap&, const CUtensorMap&, const Output&, int, cudaStream_t) { unavailable(); }
void launch_step5(const CUtensorMap&, const CUtensorMap&, const Output&, int, cudaStream_t) { unavailable(); }
void launch_step6(Step6Kernel, const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const Output&, int,
                  cudaStream_t) {
  unavailable();
}

}  // namespace kc::ch07::detail
