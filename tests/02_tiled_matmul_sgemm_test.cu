// Chapter 2 tests, the fp32 SGEMM ladder (sgemm.hpp). CPU tests (argument rules, step names) run
// everywhere; GPU tests skip with a reason where there is no GPU. This file is linked with the
// chapter's bf16 tests and gtest_main into one program: every suite here starts with "Sgemm".
//
// Tolerance: 1e-5 relative Frobenius error against an fp64 reference. Each output is a sum of K
// products of inputs uniform in [-1, 1], accumulated in fp32: every add rounds with relative error
// at most 2^-24, and with random signs the rounding errors add up like a random walk, so the
// expected relative error grows like sqrt(K) * 2^-24: 5e-6 for the largest K here (7168), and
// about 1e-6 in practice since a rounding error is on average well under its bound. A kernel that
// drops, repeats or misplaces even one product per output is off by ~1 / sqrt(K) relative, 1e-2
// or more: orders of magnitude above the tolerance. NaN never passes (kc::compare counts a NaN
// where the reference is finite as a failure).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "kc/check.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"
#include "sgemm.hpp"
#include "sgemm_steps.cuh"

namespace {

using kc::ch02::GemmShape;
using kc::ch02::SgemmStep;
using kc::test::expect_invalid_argument;

constexpr double kTolerance = 1e-5;  // see the top of the file

constexpr SgemmStep kAllSteps[] = {SgemmStep::kNaive,       SgemmStep::kCoalesced,   SgemmStep::kSharedTiled,
                                   SgemmStep::kBlocktile1d, SgemmStep::kBlocktile2d, SgemmStep::kVectorized,
                                   SgemmStep::kWarptiled};

std::string step_name(const ::testing::TestParamInfo<SgemmStep>& info) { return kc::ch02::sgemm_step_name(info.param); }

std::string shape_text(const GemmShape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

// ---------------------------------------------------------------- CPU: argument rules, no GPU needed

TEST(SgemmArguments, RejectsDimensionsOutsideOneTo2Pow31) {
  float x[4] = {};
  auto call = [&](GemmShape s) { kc::ch02::validate_sgemm(x, x + 1, x + 2, s); };
  expect_invalid_argument([&] { call({0, 1, 1}); }, "shape.m (0) must be in [1, 2^31 - 1]");
  expect_invalid_argument([&] { call({1, -3, 1}); }, "shape.n (-3) must be in [1, 2^31 - 1]");
  expect_invalid_argument(
      [&] {
        call({1, 1, std::int64_t{1} << 31});
      },
      "shape.k (2147483648) must be in [1, 2^31 - 1]");
}

TEST(SgemmArguments, RejectsNullPointers) {
  float a[4] = {}, b[4] = {}, c[4] = {};
  const GemmShape s{2, 2, 2};
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(nullptr, b, c, s); }, "a must not be null");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(a, nullptr, c, s); }, "b must not be null");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(a, b, nullptr, s); }, "c must not be null");
  EXPECT_NO_THROW(kc::ch02::validate_sgemm(a, b, c, s));
}

TEST(SgemmArguments, RejectsPointersNotAlignedForFloat) {
  alignas(16) unsigned char raw[256] = {};
  auto* odd = reinterpret_cast<const float*>(raw + 2);
  auto* fine_a = reinterpret_cast<const float*>(raw);
  auto* fine_b = reinterpret_cast<const float*>(raw + 64);
  auto* fine_c = reinterpret_cast<const float*>(raw + 128);
  const GemmShape s{2, 2, 2};
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(odd, fine_b, fine_c, s); }, "a must be 4-byte aligned");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(fine_a, odd, fine_c, s); }, "b must be 4-byte aligned");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(fine_a, fine_b, odd + 32, s); }, "c must be 4-byte aligned");
}

TEST(SgemmArguments, RejectsCOverlappingAOrB) {
  // A [3, 4] = 12 floats, B [4, 5] = 20, C [3, 5] = 15.
  const GemmShape s{3, 5, 4};
  float mem[64] = {};
  const float* a = mem;
  const float* b = mem + 12;
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(a, b, mem, s); }, "c must not overlap a");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(a, b, mem + 11, s); }, "c must not overlap a");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(mem + 20, b, mem + 6, s); }, "c must not overlap a");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(a, b, mem + 31, s); }, "c must not overlap b");
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(a, mem + 40, mem + 26, s); }, "c must not overlap b");
  // Touching is not overlapping: C right after B, and C right before A.
  EXPECT_NO_THROW(kc::ch02::validate_sgemm(a, b, mem + 32, s));
  EXPECT_NO_THROW(kc::ch02::validate_sgemm(mem + 15, mem + 27, mem, s));
  // A and B are only read: they may overlap each other (A · A for a square A).
  EXPECT_NO_THROW(kc::ch02::validate_sgemm(mem, mem, mem + 16, GemmShape{4, 4, 4}));
}

TEST(SgemmArguments, OverlapCheckDoesNotWrapAtHugeShapes) {
  // M * N * 4 bytes near 2^64: an end address computed as start + bytes would wrap around.
  float mem[4] = {};
  const GemmShape huge{0x7FFFFFFF, 0x7FFFFFFF, 1};
  expect_invalid_argument([&] { kc::ch02::validate_sgemm(mem + 1, mem + 2, mem, huge); }, "c must not overlap a");
}

TEST(SgemmArguments, LaunchRejectsBeforeAnyCudaCall) {
  // These run (and throw) without a GPU: sgemm validates before it touches CUDA.
  float mem[64] = {};
  for (SgemmStep step : kAllSteps) {
    SCOPED_TRACE(kc::ch02::sgemm_step_name(step));
    expect_invalid_argument(
        [&] {
          kc::ch02::sgemm(step, nullptr, mem, mem + 32, GemmShape{2, 2, 2});
        },
        "a must not be null");
    expect_invalid_argument(
        [&] {
          kc::ch02::sgemm(step, mem, mem + 8, mem + 32, GemmShape{2, 0, 2});
        },
        "shape.n (0) must be in [1, 2^31 - 1]");
    expect_invalid_argument(
        [&] {
          kc::ch02::sgemm(step, mem, mem + 8, mem + 2, GemmShape{2, 2, 2});
        },
        "c must not overlap a");
  }
  expect_invalid_argument(
      [&] {
        kc::ch02::sgemm(static_cast<SgemmStep>(0), mem, mem + 8, mem + 32, {2, 2, 2});
      },
      "step (0) must be a SgemmStep, 1 to 7");
  expect_invalid_argument([&] { kc::ch02::sgemm(static_cast<SgemmStep>(8), nullptr, nullptr, nullptr, {}); },
                          "step (8) must be a SgemmStep, 1 to 7");
}

TEST(SgemmArguments, GridLimitIsCheckedBeforeLaunch) {
  // Unreachable through sgemm() with real memory (C would need terabytes), but the launch functions
  // still refuse a grid of more than 2^31 - 1 blocks instead of truncating it.
  expect_invalid_argument(
      [] {
        kc::ch02::detail::tile_grid(GemmShape{0x7FFFFFFF, 0x7FFFFFFF, 1}, 32, 8);
      },
      "more than the 2^31 - 1 blocks of a grid");
  EXPECT_EQ(kc::ch02::detail::tile_grid(GemmShape{129, 257, 1}, 128, 128), 2u * 3u);
  EXPECT_EQ(kc::ch02::detail::tile_grid(GemmShape{1, 1, 1}, 32, 8), 1u);
}

TEST(SgemmArguments, UnknownWarptileIsRejectedBeforeLaunch) {
  float mem[64] = {};
  expect_invalid_argument(
      [&] {
        kc::ch02::detail::sgemm_step7_warptiled(mem, mem + 8, mem + 32, GemmShape{2, 2, 2}, nullptr,
                                                static_cast<kc::ch02::detail::Warptile>(99));
      },
      "config (99) must be a Warptile value");
}

TEST(SgemmStepNames, StreamsPrintTheName) {
  std::ostringstream os;
  os << SgemmStep::kVectorized << " " << static_cast<SgemmStep>(9);
  EXPECT_EQ(os.str(), "step6_vectorized SgemmStep(9)");
}

TEST(SgemmStepNames, EveryStepHasItsName) {
  EXPECT_STREQ(kc::ch02::sgemm_step_name(SgemmStep::kNaive), "step1_naive");
  EXPECT_STREQ(kc::ch02::sgemm_step_name(SgemmStep::kCoalesced), "step2_coalesced");
  EXPECT_STREQ(kc::ch02::sgemm_step_name(SgemmStep::kSharedTiled), "step3_shared_tiled");
  EXPECT_STREQ(kc::ch02::sgemm_step_name(SgemmStep::kBlocktile1d), "step4_blocktile_1d");
  EXPECT_STREQ(kc::ch02::sgemm_step_name(SgemmStep::kBlocktile2d), "step5_blocktile_2d");
  EXPECT_STREQ(kc::ch02::sgemm_step_name(SgemmStep::kVectorized), "step6_vectorized");
  EXPECT_STREQ(kc::ch02::sgemm_step_name(SgemmStep::kWarptiled), "step7_warptiled");
  EXPECT_EQ(kc::ch02::kBestSgemmStep, SgemmStep::kWarptiled);
  expect_invalid_argument([] { kc::ch02::sgemm_step_name(static_cast<SgemmStep>(0)); }, "step (0) must be");
}

// ---------------------------------------------------------------- GPU

using Launch = std::function<void(const float* a, const float* b, float* c, const GemmShape& shape)>;

std::vector<double> reference(const std::vector<float>& a, const std::vector<float>& b, const GemmShape& s) {
  return kc::ref::matmul_nn(kc::ref::widen(std::span<const float>(a)), kc::ref::widen(std::span<const float>(b)),
                            static_cast<std::size_t>(s.m), static_cast<std::size_t>(s.n),
                            static_cast<std::size_t>(s.k));
}

// Fresh random A and B in [-1, 1], C poisoned with a guard behind it; runs `launch` and checks
// every element of C against the fp64 reference, and that nothing past C was written.
void check_against_reference(const Launch& launch, const GemmShape& shape, const std::string& what) {
  SCOPED_TRACE(what + " " + shape_text(shape));
  const std::uint64_t seed = kc::test::test_seed();
  std::vector<float> a(static_cast<std::size_t>(shape.m * shape.k));
  std::vector<float> b(static_cast<std::size_t>(shape.k * shape.n));
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  kc::DeviceBuffer<float> da(a), db(b);
  kc::test::GuardedOutput<float> dc(static_cast<std::size_t>(shape.m * shape.n));

  launch(da.data(), db.data(), dc.data(), shape);
  kc::check(cudaDeviceSynchronize());

  const kc::Comparison result = kc::compare<float>(dc.to_host(), reference(a, b, shape), kc::test::kPoisonByte);
  kc::test::expect_close(result, kTolerance, what);
  EXPECT_EQ(dc.guard_damage(), 0u) << "wrote past the end of C";
}

// As check_against_reference, with C one float past a 16-byte boundary, and A and B too when
// `offset_a_and_b`: the 16-byte paths must notice and fall back (a float4 access there would
// fault). Checks every element of C and that nothing around C is written.
void check_with_c_offset(const Launch& launch, const GemmShape& shape, bool offset_a_and_b, const std::string& what) {
  SCOPED_TRACE(what + " " + shape_text(shape));
  const std::uint64_t seed = kc::test::test_seed();
  const std::size_t ab = offset_a_and_b ? 1 : 0;
  const auto c_count = static_cast<std::size_t>(shape.m * shape.n);
  std::vector<float> a(static_cast<std::size_t>(shape.m * shape.k) + ab);
  std::vector<float> b(static_cast<std::size_t>(shape.k * shape.n) + ab);
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  kc::DeviceBuffer<float> da(a), db(b), dc(c_count + 8);
  dc.fill_bytes(kc::test::kPoisonByte);

  launch(da.data() + ab, db.data() + ab, dc.data() + 1, shape);
  kc::check(cudaDeviceSynchronize());

  const std::vector<float> a_used(a.begin() + static_cast<std::ptrdiff_t>(ab), a.end());
  const std::vector<float> b_used(b.begin() + static_cast<std::ptrdiff_t>(ab), b.end());
  const std::vector<float> all = dc.to_host();
  const kc::Comparison result = kc::compare<float>(std::span<const float>(all.data() + 1, c_count),
                                                   reference(a_used, b_used, shape), kc::test::kPoisonByte);
  kc::test::expect_close(result, kTolerance, what);
  const std::size_t untouched =
      kc::count_poisoned(std::span<const float>(all.data(), 1), kc::test::kPoisonByte) +
      kc::count_poisoned(std::span<const float>(all.data() + 1 + c_count, 7), kc::test::kPoisonByte);
  EXPECT_EQ(untouched, 8u) << "wrote outside [c, c + M * N)";
}

class SgemmGpu : public kc::test::GpuTest, public ::testing::WithParamInterface<SgemmStep> {
 protected:
  void check(const GemmShape& shape) {
    const SgemmStep step = GetParam();
    check_against_reference(
        [step](const float* a, const float* b, float* c, const GemmShape& s) { kc::ch02::sgemm(step, a, b, c, s); },
        shape, kc::ch02::sgemm_step_name(step));
  }
};

TEST_P(SgemmGpu, OneByOneByOne) { check({1, 1, 1}); }
// Primes: no tile size divides any dimension.
TEST_P(SgemmGpu, Primes127x131x67) { check({127, 131, 67}); }
// One past a multiple of every tile size in M and N, K not a multiple of 4 (scalar loads).
TEST_P(SgemmGpu, NonMultiples129x257x33) { check({129, 257, 33}); }
// One short of a tile in M and N, long K with a partial last step.
TEST_P(SgemmGpu, NonMultiples255x127x1000) { check({255, 127, 1000}); }
// N and K multiples of 4 (16-byte loads), M and N not multiples of the tiles, K % 16 = 4.
TEST_P(SgemmGpu, VectorPathWithEdges300x520x260) { check({300, 520, 260}); }
// Multiples of every tile: only full tiles, the unmasked interior path everywhere.
TEST_P(SgemmGpu, FullTilesOnly256x256x64) { check({256, 256, 64}); }
TEST_P(SgemmGpu, TallSkinny1x4096x7168) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: skipping the 1 x 4096 x 7168 case";
  check({1, 4096, 7168});
}
TEST_P(SgemmGpu, TallSkinny4096x8x512) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: skipping the 4096 x 8 x 512 case";
  check({4096, 8, 512});
}

// Pointers one float past a 16-byte boundary: the 16-byte paths of steps 6 and 7 must notice and
// fall back to scalar accesses (a float4 access there would fault). Nothing around C is written.
TEST_P(SgemmGpu, PointersOffFrom16ByteAlignment) {
  const SgemmStep step = GetParam();
  check_with_c_offset(
      [step](const float* a, const float* b, float* c, const GemmShape& s) { kc::ch02::sgemm(step, a, b, c, s); },
      {133, 100, 64}, true, "offset pointers");
}

// A NaN in A must reach every output of its row, and a NaN in B every output of its column: a
// kernel that skips a product, or masks with a multiply by 0 (0 * NaN is NaN, so that one would
// spread NaN too far), fails here.
TEST_P(SgemmGpu, NanPropagatesAlongItsRowAndColumn) {
  const GemmShape shape{130, 140, 70};
  const std::int64_t nan_row = 77, nan_col = 101;
  const std::uint64_t seed = kc::test::test_seed();
  std::vector<float> a(130 * 70), b(70 * 140);
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  a[nan_row * shape.k + 33] = std::numeric_limits<float>::quiet_NaN();
  b[5 * shape.n + nan_col] = std::numeric_limits<float>::quiet_NaN();
  kc::DeviceBuffer<float> da(a), db(b);
  kc::test::GuardedOutput<float> dc(130 * 140);

  kc::ch02::sgemm(GetParam(), da.data(), db.data(), dc.data(), shape);
  kc::check(cudaDeviceSynchronize());

  const std::vector<float> got = dc.to_host();
  // The fp64 reference has NaN exactly in that row and column; compare() requires NaN there and
  // finite, accurate values everywhere else.
  kc::test::expect_close(kc::compare<float>(got, reference(a, b, shape), kc::test::kPoisonByte), kTolerance,
                         "NaN inputs");
  std::size_t nan_count = 0;
  for (float v : got) nan_count += std::isnan(v) ? 1 : 0;
  EXPECT_EQ(nan_count, static_cast<std::size_t>(shape.n + shape.m - 1)) << "one row and one column of NaN";
}

TEST_P(SgemmGpu, BadArgumentsWriteNothing) {
  kc::DeviceBuffer<float> da(64), db(64);
  kc::test::GuardedOutput<float> dc(64);
  expect_invalid_argument(
      [&] {
        kc::ch02::sgemm(GetParam(), nullptr, db.data(), dc.data(), {8, 8, 8});
      },
      "a must not be null");
  expect_invalid_argument(
      [&] {
        kc::ch02::sgemm(GetParam(), da.data(), db.data(), dc.data(), {8, 8, 0});
      },
      "shape.k (0)");
  kc::check(cudaDeviceSynchronize());
  EXPECT_EQ(kc::count_poisoned(std::span<const float>(dc.to_host()), kc::test::kPoisonByte), 64u)
      << "a rejected call must write nothing";
}

// No allocation or synchronisation in the launch path (a CUDA graph can capture it), and the same
// bits every run: each output's K products are summed in a fixed order, with no atomics.
TEST_P(SgemmGpu, GraphCapturableAndBitwiseRepeatable) {
  const GemmShape shape{300, 520, 260};
  const std::uint64_t seed = kc::test::test_seed();
  std::vector<float> a(300 * 260), b(260 * 520);
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  kc::DeviceBuffer<float> da(a), db(b), dc(300 * 520);
  const SgemmStep step = GetParam();
  const kc::test::LaunchUnderTest run{
      [&](cudaStream_t s) { kc::ch02::sgemm(step, da.data(), db.data(), dc.data(), shape, s); },
      [&] { dc.fill_bytes(kc::test::kPoisonByte); },
      [&] {
        const std::vector<float> h = dc.to_host();
        const auto* bytes = reinterpret_cast<const unsigned char*>(h.data());
        return std::vector<unsigned char>(bytes, bytes + h.size() * sizeof(float));
      }};
  kc::test::expect_graph_capturable(run);
  kc::test::expect_bitwise_repeatable(run);
}

INSTANTIATE_TEST_SUITE_P(Steps, SgemmGpu, ::testing::ValuesIn(kAllSteps), step_name);

}  // namespace

namespace kc::ch02::detail {
// Printed by name in test names and failure messages (GoogleTest finds it by argument-dependent
// lookup, so it lives in Warptile's namespace).
const char* warptile_text(Warptile config) {
  switch (config) {
    case Warptile::k128x128x8_w32x64: return "k128x128x8_w32x64";
    case Warptile::k128x128x16_w64x64: return "k128x128x16_w64x64";
    case Warptile::k128x256x8_w64x64: return "k128x256x8_w64x64";
    case Warptile::k128x128x8_w64x64_by_columns: return "k128x128x8_w64x64_by_columns";
  }
  return "unknown";
}
void PrintTo(Warptile config, std::ostream* os) { *os << warptile_text(config); }
}  // namespace kc::ch02::detail

namespace {

// Every tile configuration of step 7 (the tuning space), not only the default that sgemm() runs.
using kc::ch02::detail::Warptile;
using kc::ch02::detail::warptile_text;

constexpr Warptile kAllWarptiles[] = {Warptile::k128x128x8_w32x64, Warptile::k128x128x16_w64x64,
                                      Warptile::k128x256x8_w64x64, Warptile::k128x128x8_w64x64_by_columns};

std::string warptile_name(const ::testing::TestParamInfo<Warptile>& info) { return warptile_text(info.param); }

class SgemmWarptileGpu : public kc::test::GpuTest, public ::testing::WithParamInterface<Warptile> {
 protected:
  void check(const GemmShape& shape) {
    const Warptile config = GetParam();
    check_against_reference(
        [config](const float* a, const float* b, float* c, const GemmShape& s) {
          kc::ch02::detail::sgemm_step7_warptiled(a, b, c, s, nullptr, config);
        },
        shape, std::string("step7 ") + warptile_text(config));
  }
};

TEST_P(SgemmWarptileGpu, Primes127x131x67) { check({127, 131, 67}); }
TEST_P(SgemmWarptileGpu, VectorPathWithEdges300x520x260) { check({300, 520, 260}); }
TEST_P(SgemmWarptileGpu, FullTilesOnly256x512x64) { check({256, 512, 64}); }
// Whole tiles and 16-byte aligned A and B, but C one float past a 16-byte boundary: the unmasked
// interior kernel stores float4s, so the launch must pick the masked one here (a float4 store
// would fault). Nothing around C is written.
TEST_P(SgemmWarptileGpu, WholeTilesWithCOffFrom16ByteAlignment) {
  const Warptile config = GetParam();
  check_with_c_offset(
      [config](const float* a, const float* b, float* c, const GemmShape& s) {
        kc::ch02::detail::sgemm_step7_warptiled(a, b, c, s, nullptr, config);
      },
      {256, 512, 64}, false, std::string("step7 ") + warptile_text(config) + ", C offset");
}
TEST_P(SgemmWarptileGpu, TallSkinny4096x8x512) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: skipping the 4096 x 8 x 512 case";
  check({4096, 8, 512});
}

INSTANTIATE_TEST_SUITE_P(Configs, SgemmWarptileGpu, ::testing::ValuesIn(kAllWarptiles), warptile_name);

}  // namespace
