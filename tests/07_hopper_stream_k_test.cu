// Chapter 7's GPU tests of Stream-K on the last round: results on shapes that split, repeatability,
// graph capture, the workspace contract (flags back to zero; the partial region scratch) and a
// workspace too small.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "hopper_gemm.hpp"
#include "hopper_gemm_checks.hpp"
#include "hopper_launch.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"

namespace {

using namespace kc::test::hopper;  // NOLINT: the chapter's test vocabulary

// Shapes whose last round Stream-K splits (checked against the plan for this GPU). A few split tiles
// of 32 or 33 slices are shared by every cluster, two or three slices each, so a tile has up to a dozen
// pieces and its owner adds up to a dozen partials.
//   - 18 × 8 tiles, K = 2048 (32 slices);
//   - 17 × 8 tiles (rank 1 of the last cluster row has no rows: it stores no partial and reads
//     none), N = 2044 (register stores), K = 2056 (a K tail in the last slice);
//   - the same with N = 2048 (TMA stores).
const GemmShape kSplitShapes[] = {{2304, 2048, 2048}, {2100, 2044, 2056}, {2100, 2048, 2056}};

// Stream-K against the fp64 reference on the split shapes, and on the goal shapes (which split too)
// against cuBLAS on every element.
TEST_F(HopperGpuTest, StreamKMatchesReference) {
  for (const GemmShape s : kSplitShapes) {
    ASSERT_GT(kc::ch07::gemm_bf16_hopper_stream_k_plan(s).sk_tiles, 0) << shape_name(s) << " must split here";
    check_launch("after", after_launch(), s, false);
  }
  if (kc::test::small_tests_only()) return;  // KC_SMALL_TESTS: no large shapes
  for (const GemmShape s : {GemmShape{6144, 6144, 6144}, GemmShape{8192, 8192, 4096}}) {
    ASSERT_GT(kc::ch07::gemm_bf16_hopper_stream_k_plan(s).sk_tiles, 0) << shape_name(s) << " must split here";
    check_launch("after", after_launch(), s, true);
  }
}

// All flags of @p workspace are zero.
bool flags_down(const kc::DeviceBuffer<unsigned char>& workspace) {
  std::vector<std::int32_t> flags(kc::ch07::detail::StreamKWorkspace::kFlagBytes / sizeof(std::int32_t));
  kc::check(cudaMemcpy(flags.data(), workspace.data(), flags.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  for (std::int32_t f : flags)
    if (f != 0) return false;
  return true;
}

// Stream-K is bitwise repeatable (the owner adds the partials in a fixed order), graph-capturable,
// and leaves every flag of its workspace down after each launch, as the next launch needs.
TEST_F(HopperGpuTest, StreamKRepeatsAndLeavesItsFlagsDown) {
  const GemmShape s = kSplitShapes[0];
  const Inputs in = random_inputs(s, kc::test::test_seed());
  kc::DeviceBuffer<bf16> a(in.a), w(in.w);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  const Launch launch = after_launch();
  kc::test::LaunchUnderTest run{[&](cudaStream_t stream) { launch(a.data(), w.data(), c.data(), s, stream); },
                                [&] { c.poison(); },
                                [&] {
                                  EXPECT_TRUE(flags_down(stream_k_workspace())) << "a flag was left up";
                                  const std::vector<bf16> host = c.to_host();
                                  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
                                  return std::vector<unsigned char>(bytes, bytes + host.size() * sizeof(bf16));
                                }};
  kc::test::expect_graph_capturable(run);
  kc::test::expect_bitwise_repeatable(run);
}

// The workspace contract (hopper_gemm.hpp): the flags must be zero before a launch, and every launch
// puts them back to zero; the partial region is scratch, its content before a launch irrelevant and
// after it unspecified. So a split launch on a workspace whose partial region holds garbage (all
// bits set: NaN as fp32, which would poison any sum that read a partial before it was written) is
// still right and leaves every flag zero, twice in a row on the same workspace. What the launches
// leave in the partial region is not checked: nothing is promised about it.
TEST_F(HopperGpuTest, StreamKWorkspaceFlagsAreResetAndPartialsAreScratch) {
  const GemmShape s = kSplitShapes[2];
  ASSERT_GT(kc::ch07::gemm_bf16_hopper_stream_k_plan(s).sk_tiles, 0) << shape_name(s) << " must split here";
  kc::DeviceBuffer<unsigned char> workspace(kc::ch07::gemm_bf16_hopper_workspace_bytes());
  workspace.fill_bytes(0xFF);
  kc::check(cudaMemset(workspace.data(), 0, kc::ch07::detail::StreamKWorkspace::kFlagBytes));
  const Launch launch = [&workspace](const bf16* a, const bf16* w, bf16* c, GemmShape shape, cudaStream_t q) {
    kc::ch07::gemm_bf16_hopper(a, w, c, shape, workspace.data(), workspace.size(), q);
  };
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("launch " + std::to_string(run + 1) + " on this workspace");
    check_launch("after, partial region poisoned", launch, s, false);
    EXPECT_TRUE(flags_down(workspace)) << "a flag was left up";
  }
}

// A workspace too small for this GPU is rejected before the launch: C keeps its poison.
TEST_F(HopperGpuTest, StreamKRejectsASmallWorkspace) {
  const GemmShape s = kSplitShapes[0];
  kc::DeviceBuffer<bf16> a(static_cast<std::size_t>(s.m * s.k)), w(static_cast<std::size_t>(s.n * s.k));
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  kc::DeviceBuffer<unsigned char>& workspace = stream_k_workspace();
  expect_invalid_argument(
      [&] { kc::ch07::gemm_bf16_hopper(a.data(), w.data(), c.data(), s, workspace.data(), workspace.size() - 16); },
      "workspace_bytes (" + std::to_string(workspace.size() - 16) + ") must be at least");
  kc::check(cudaDeviceSynchronize());
  const std::vector<bf16> got = c.to_host();
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(got), kc::test::kPoisonByte), got.size()) << "wrote into c";
}

}  // namespace
