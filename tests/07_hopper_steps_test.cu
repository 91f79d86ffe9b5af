// Chapter 7's GPU tests of the results: every step and `after` on shapes at and around the tile edges,
// and on random shapes, against the fp64 reference (all elements or a sample) and, for the large
// shapes, every element against cuBLAS. They need an sm_90 GPU and skip with the reason elsewhere.
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

struct ShapeCase {
  GemmShape shape;
  bool large;  // skipped under KC_SMALL_TESTS (compute-sanitizer runs)
};

const ShapeCase kShapes[] = {
    {{1, 8, 16}, false},         // one row, K one k16 slice (the rest of the 64-wide box zero-filled)
    {{1, 1, 8}, false},          // N = 1 (odd: element stores), K = 8 (the smallest TMA row)
    {{1, 300, 72}, false},       // 1 × N: one token
    {{200, 8, 136}, false},      // M × 8: a thin output, most of every W box zero-filled
    {{127, 131, 64}, false},     // not multiples of any tile, odd N; step 5: one cluster, rank 1 idle
    {{129, 257, 520}, false},    // one past the 128 × 256 tile in M and N; K tail of 8
    {{129, 264, 520}, false},    // N a multiple of 8 (step 6 stores through TMA): the last n-tile is
                                 // 8 columns, its first box clipped and its other three not issued
    {{65, 129, 1000}, false},    // one past step 1's 64 × 128 tile; 16 slices: every pipeline wraps
    {{300, 520, 4104}, true},    // 65 slices, over 16 rounds of step 2's 7 stages and step 3's 4;
                                 // step 5: tiles_m = 3 (rank 1 of the last row has no rows), the last
                                 // n-tile's second W half (rows 640..) lies outside W
    {{2100, 4100, 72}, false},   // 17 × 17 tiles: several per persistent block and per cluster; tiles_m odd
    {{2100, 4104, 72}, false},   // the same through step 6's TMA stores (N a multiple of 8): the staging
                                 // buffer reused tile after tile, the last row of clusters half empty
    {{1000, 1500, 2056}, true},  // a few waves of blocks, every tile edge again
    {{1000, 1504, 2056}, true},  // and with TMA stores
    {{4096, 4096, 4096}, true},  // a goal shape
};

void PrintTo(const ShapeCase& c, std::ostream* os) { *os << shape_name(c.shape); }

}  // namespace

namespace kc::ch07 {
// Test names and failure messages show the step's name (found by argument-dependent lookup).
void PrintTo(HopperStep step, std::ostream* os) { *os << to_string(step); }
}  // namespace kc::ch07

namespace {

class HopperGemmGpu : public HopperGpuTest, public ::testing::WithParamInterface<std::tuple<HopperStep, ShapeCase>> {};

TEST_P(HopperGemmGpu, MatchesReferenceAndCublas) {
  const auto& [step, shape_case] = GetParam();
  if (shape_case.large && kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  check_step(step, shape_case.shape, shape_case.large);
}

INSTANTIATE_TEST_SUITE_P(Steps, HopperGemmGpu,
                         ::testing::Combine(::testing::ValuesIn(kSteps), ::testing::ValuesIn(kShapes)),
                         [](const ::testing::TestParamInfo<std::tuple<HopperStep, ShapeCase>>& info) {
                           return std::string(kc::ch07::to_string(std::get<0>(info.param))) + "_" +
                                  shape_name(std::get<1>(info.param).shape);
                         });

// `after` on every shape: step 6's kernel as a programmatic dependent launch (AfterWaitsForThePreviousKernel
// below checks the ordering that this launch relaxes).
class HopperAfterGpu : public HopperGpuTest, public ::testing::WithParamInterface<ShapeCase> {};

TEST_P(HopperAfterGpu, MatchesReferenceAndCublas) {
  const ShapeCase& shape_case = GetParam();
  if (shape_case.large && kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  check_launch("after", after_launch(), shape_case.shape, shape_case.large);
}

INSTANTIATE_TEST_SUITE_P(After, HopperAfterGpu, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<ShapeCase>& info) { return shape_name(info.param.shape); });

// Random shapes: M and N in [1, 700] (N a multiple of 8 every other time), K a multiple of 8 in
// [8, 1200], for every step.
TEST_F(HopperGpuTest, RandomShapes) {
  const std::uint64_t seed = kc::test::test_seed();
  for (int i = 0; i < 6; ++i) {
    const std::int64_t n = 1 + static_cast<std::int64_t>(kc::uniform01(seed, 3 * i + 1) * 700);
    const GemmShape s{1 + static_cast<std::int64_t>(kc::uniform01(seed, 3 * i) * 700),
                      i % 2 == 1 ? (n + 7) / 8 * 8 : n,  // odd i: N a multiple of 8 (step 6's TMA stores)
                      8 * (1 + static_cast<std::int64_t>(kc::uniform01(seed, 3 * i + 2) * 150))};
    for (HopperStep step : kSteps) check_step(step, s, false);
    check_launch("after", after_launch(), s, false);
  }
}

}  // namespace
