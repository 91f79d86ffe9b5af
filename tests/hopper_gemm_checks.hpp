// Shared by Chapter 7's test files: the common names, the tolerance, the ladder's steps, and for the
// GPU tests the fixture that skips off sm_90 and the check of one launch against the fp64 reference
// and cuBLAS.
#pragma once

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bf16_gemm_problems.hpp"
#include "hopper_gemm.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"
#include "vendor_cublas.hpp"

namespace kc::test::hopper {

using bf16 = __nv_bfloat16;
using kc::ch07::GemmShape;
using kc::ch07::HopperStep;
using kc::ch07::TensorMapSpec;
using kc::test::expect_invalid_argument;
using kc::test::bf16_gemm::compare_with_reference;
using kc::test::bf16_gemm::Inputs;
using kc::test::bf16_gemm::random_inputs;
using kc::test::bf16_gemm::shape_name;

// Tolerance 1e-2 relative Frobenius (the course's bf16 rule): against the fp64 reference of the bf16
// inputs the only differences are fp32 accumulation (about sqrt(K) · 2^-24 relative) and one rounding
// of each output to bf16 (at most 2^-9 relative), so the error is around 1e-3; against cuBLAS both
// round a sum taken in a different order, neighbouring bf16 values at worst (2^-8). A wrong swizzle,
// descriptor, barrier phase or fragment position gives errors of order 1.
inline constexpr double kTolerance = 1e-2;

inline constexpr HopperStep kSteps[] = {HopperStep::tma_wgmma,         HopperStep::pipeline,
                                        HopperStep::warp_specialized,  HopperStep::persistent,
                                        HopperStep::cluster_multicast, HopperStep::tma_store};

// 16-byte-aligned host storage for validation tests: the rules only look at addresses.
struct alignas(16) HostBuffer {
  bf16 data[256];
};

// The kernels are sm_90a code: sm_90 exactly (an sm_100 or sm_120 GPU cannot run them either).
class HopperGpuTest : public kc::test::Sm90Test {
 protected:
  void SetUp() override {
    kc::test::Sm90Test::SetUp();
    if (IsSkipped()) return;
    if (auto reason = kc::ch07::hopper_unsupported_reason(device().cc_major, device().cc_minor))
      GTEST_SKIP() << *reason;
    if (!kc::ch07::hopper_kernels_built()) GTEST_SKIP() << "built without sm_90a kernels (no 90 architecture)";
  }
};

// One launch of a Chapter 7 kernel on the default stream: a step or `after`.
using Launch = std::function<void(const bf16* a, const bf16* w, bf16* c, GemmShape shape, cudaStream_t stream)>;

inline Launch step_launch(HopperStep step) {
  return [step](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
    kc::ch07::gemm_bf16_hopper_step(step, a, w, c, s, q);
  };
}

// gemm_bf16_hopper without a workspace: every tile whole.
inline Launch whole_tiles_launch() {
  return [](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
    kc::ch07::gemm_bf16_hopper(a, w, c, s, q);
  };
}

// The Stream-K launch's workspace, shared by every test of this program: zero-filled once, as the
// API asks; each launch must leave its flags zero for the next (07_hopper_stream_k_test.cu).
inline kc::DeviceBuffer<unsigned char>& stream_k_workspace() {
  static kc::DeviceBuffer<unsigned char> workspace = [] {
    kc::DeviceBuffer<unsigned char> fresh(kc::ch07::gemm_bf16_hopper_workspace_bytes());
    fresh.fill_bytes(0);
    return fresh;
  }();
  return workspace;
}

// `after`: gemm_bf16_hopper with its workspace (Stream-K where the plan splits the last round).
inline Launch after_launch() {
  return [](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
    kc::DeviceBuffer<unsigned char>& workspace = stream_k_workspace();
    kc::ch07::gemm_bf16_hopper(a, w, c, s, workspace.data(), workspace.size(), q);
  };
}

// Every kernel of the chapter by name: the six steps, `after` and `after` without a workspace.
inline std::vector<std::pair<std::string, Launch>> every_launch() {
  std::vector<std::pair<std::string, Launch>> launches;
  for (HopperStep step : kSteps) launches.emplace_back(kc::ch07::to_string(step), step_launch(step));
  launches.emplace_back("after", after_launch());
  launches.emplace_back("whole_tiles", whole_tiles_launch());
  return launches;
}

// @p launch on fresh random inputs of shape @p s into a poisoned, guarded C: every element written,
// nothing past the end, close to the fp64 reference on samples and (@p against_cublas) to cuBLAS on
// every element.
inline void check_launch(const std::string& name, const Launch& launch, GemmShape s, bool against_cublas) {
  SCOPED_TRACE(name + ", M x N x K = " + shape_name(s));
  const std::uint64_t seed = kc::test::test_seed();
  const Inputs in = random_inputs(s, seed);
  kc::DeviceBuffer<bf16> a(in.a), w(in.w);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  launch(a.data(), w.data(), c.data(), s, nullptr);
  kc::check(cudaDeviceSynchronize());

  const std::vector<bf16> got = c.to_host();
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(got), kc::test::kPoisonByte), 0u) << "elements never written";
  EXPECT_EQ(c.guard_damage(), 0u) << "wrote past the end of c";
  kc::test::expect_close(compare_with_reference(in, got, s, seed), kTolerance, "versus the fp64 reference");
  if (against_cublas) {
    kc::DeviceBuffer<bf16> vendor(got.size());
    kc::ch02::CublasHandle cublas;
    kc::ch02::cublas_gemm_bf16(cublas, a.data(), w.data(), vendor.data(), s);
    kc::check(cudaDeviceSynchronize());
    const std::vector<bf16> want = vendor.to_host();
    std::vector<double> want_wide(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) want_wide[i] = kc::to_double(want[i]);
    kc::test::expect_close(kc::compare<bf16>(got, want_wide, kc::test::kPoisonByte), kTolerance,
                           "versus cuBLAS on every element");
  }
}

inline void check_step(HopperStep step, GemmShape s, bool against_cublas) {
  check_launch(kc::ch07::to_string(step), step_launch(step), s, against_cublas);
}

}  // namespace kc::test::hopper
