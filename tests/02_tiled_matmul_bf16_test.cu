// Chapter 2 tests, tensor-core part: the bf16 GEMM (mma.sync) and the mma.sync peak microbenchmark.
// CPU tests (argument rules, tile choice, FLOP arithmetic) run everywhere; GPU tests skip with a
// reason where there is no GPU.
//
// Reference: fp64 on the CPU from the bf16 inputs widened exactly (kc::ref on widened values), so
// the only differences are the kernel's: fp32 accumulation (about K · 2^-24 relative, tiny) and the
// one rounding of each output to bf16 (at most 2^-9 relative: bf16 keeps 8 significant bits). The
// relative Frobenius error is therefore around 1e-3; the tolerance is 1e-2 (the course's bf16 rule),
// while a wrong fragment, a missed K slice or a swizzle bug gives errors of order 1.
// The comparison of every element with cuBLAS at 4096³ is in 02_tiled_matmul_cublas_test.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "bf16_gemm_problems.hpp"
#include "gemm_bf16.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch02::GemmBf16Tile;
using kc::ch02::GemmShape;
using kc::ch02::MmaPeakConfig;
using kc::test::expect_invalid_argument;
using kc::test::bf16_gemm::compare_with_reference;
using kc::test::bf16_gemm::Inputs;
using kc::test::bf16_gemm::random_inputs;
using kc::test::bf16_gemm::shape_name;

constexpr double kTolerance = 1e-2;        // see the top of the file
constexpr std::size_t kH200Smem = 232448;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90 (227 KiB)
constexpr std::size_t kA100Smem = 166912;  // sm_80 (163 KiB)
constexpr std::size_t kRtxSmem = 101376;   // sm_86 / sm_89 (99 KiB)

// 16-byte-aligned host storage for validation tests: the rules only look at addresses.
struct alignas(16) HostBuffer {
  bf16 data[256];
};

// ---------------------------------------------------------------- CPU: argument rules, no GPU needed

TEST(GemmBf16Arguments, RejectsBadShape) {
  HostBuffer a, w, c;
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_gemm_bf16(a.data, w.data, c.data, {0, 8, 8});
      },
      "shape.m (0) must be in [1, 2^31 - 1]");
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_gemm_bf16(a.data, w.data, c.data, {8, -1, 8});
      },
      "shape.n (-1) must be in [1, 2^31 - 1]");
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_gemm_bf16(a.data, w.data, c.data, {8, 8, 0x80000000LL});
      },
      "shape.k (2147483648) must be in [1, 2^31 - 1]");
}

TEST(GemmBf16Arguments, RejectsKNotMultipleOf8) {
  HostBuffer a, w, c;
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_gemm_bf16(a.data, w.data, c.data, {4, 4, 100});
      },
      "shape.k (100) must be a multiple of 8 (16-byte rows for cp.async)");
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_gemm_bf16(a.data, w.data, c.data, {1, 1, 7});
      },
      "shape.k (7) must be a multiple of 8");
}

TEST(GemmBf16Arguments, RejectsNullPointers) {
  HostBuffer a, w, c;
  const GemmShape s{2, 2, 8};
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(nullptr, w.data, c.data, s); }, "a must not be null");
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(a.data, nullptr, c.data, s); }, "w must not be null");
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(a.data, w.data, nullptr, s); }, "c must not be null");
}

TEST(GemmBf16Arguments, RejectsMisalignedPointers) {
  HostBuffer a, w, c;
  const GemmShape s{2, 2, 8};
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(a.data + 1, w.data, c.data, s); },
                          "a must be 16-byte aligned (16-byte rows for cp.async)");
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(a.data, w.data + 4, c.data, s); },
                          "w must be 16-byte aligned");
  const auto* odd = reinterpret_cast<const bf16*>(reinterpret_cast<const unsigned char*>(c.data) + 1);
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(a.data, w.data, odd, s); },
                          "c must be 2-byte aligned (the alignment of bf16)");
  // c needs only bf16 alignment: an odd element offset is fine.
  EXPECT_NO_THROW(kc::ch02::validate_gemm_bf16(a.data, w.data, c.data + 1, s));
}

TEST(GemmBf16Arguments, RejectsOutputOverlappingAnInput) {
  HostBuffer x, y;
  const GemmShape s{4, 4, 8};  // a: 32 elements, w: 32, c: 16
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(x.data, y.data, x.data + 31, s); },
                          "c must not overlap a");
  expect_invalid_argument([&] { kc::ch02::validate_gemm_bf16(x.data, y.data + 64, y.data + 60, s); },
                          "c must not overlap w");
  EXPECT_NO_THROW(kc::ch02::validate_gemm_bf16(x.data, x.data, x.data + 32, s)) << "a == w is allowed, c after it";
}

TEST(GemmBf16Arguments, RejectsShapesNeedingTooManyBlocks) {
  HostBuffer a, w, c;
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_gemm_bf16(a.data, w.data, c.data, {0x7FFFFFFF, 0x7FFFFFFF, 8});
      },
      "must need at most 2^31 - 1 tiles of 64 x 32");
}

// The launch functions validate before touching CUDA: on a machine without a GPU these throw
// kc::InvalidArgument, not kc::CudaError.
TEST(GemmBf16Arguments, LaunchFunctionsRejectBeforeAnyCudaCall) {
  HostBuffer a, w, c;
  expect_invalid_argument([&] { kc::ch02::gemm_bf16(nullptr, w.data, c.data, {1, 1, 8}); }, "a must not be null");
  expect_invalid_argument(
      [&] {
        kc::ch02::gemm_bf16(a.data, w.data, c.data, {1, 1, 12});
      },
      "shape.k (12) must be a multiple of 8");
  expect_invalid_argument(
      [&] {
        kc::ch02::gemm_bf16_with_tile(a.data + 2, w.data, c.data, {1, 1, 8}, GemmBf16Tile::small);
      },
      "a must be 16-byte aligned");
}

TEST(GemmBf16Tiles, InfoFollowsSharedMemory) {
  const auto large_h200 = kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::large, kH200Smem);
  EXPECT_EQ(large_h200.block_m, 128);
  EXPECT_EQ(large_h200.block_n, 256);
  EXPECT_EQ(large_h200.block_k, 64);
  EXPECT_EQ(large_h200.warps, 8);
  EXPECT_EQ(large_h200.stages, 4);
  EXPECT_EQ(large_h200.smem_bytes, 4u * (128 + 256) * 64 * 2);
  EXPECT_TRUE(large_h200.fits);

  const auto large_a100 = kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::large, kA100Smem);
  EXPECT_EQ(large_a100.stages, 3) << "sm_80 has room for three 48 KiB stages, not four";
  EXPECT_TRUE(large_a100.fits);
  EXPECT_FALSE(kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::large, kRtxSmem).fits);

  const auto medium_rtx = kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::medium, kRtxSmem);
  EXPECT_EQ(medium_rtx.block_m, 128);
  EXPECT_EQ(medium_rtx.block_n, 128);
  EXPECT_EQ(medium_rtx.warps, 8);
  EXPECT_EQ(medium_rtx.stages, 3);
  EXPECT_TRUE(medium_rtx.fits) << "the medium tile exists for the 99 KiB parts";
  EXPECT_EQ(kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::medium, kH200Smem).stages, 4);

  const auto small = kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::small, kRtxSmem);
  EXPECT_EQ(small.block_m, 64);
  EXPECT_EQ(small.block_n, 64);
  EXPECT_EQ(small.warps, 4);
  EXPECT_TRUE(small.fits);

  const auto narrow = kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::narrow, kRtxSmem);
  EXPECT_EQ(narrow.block_m, 64);
  EXPECT_EQ(narrow.block_n, 32);
  EXPECT_EQ(narrow.warps, 4);
  EXPECT_EQ(narrow.stages, 8);
  EXPECT_EQ(narrow.smem_bytes, 8u * (64 + 32) * 64 * 2);
  EXPECT_TRUE(narrow.fits);

  // The deep versions: the same tiles with twice the stages, 192 KiB: sm_90 only.
  const auto small_deep = kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::small_deep, kH200Smem);
  EXPECT_EQ(small_deep.block_m, 64);
  EXPECT_EQ(small_deep.block_n, 64);
  EXPECT_EQ(small_deep.stages, 12);
  EXPECT_EQ(small_deep.smem_bytes, 192u * 1024);
  EXPECT_TRUE(small_deep.fits);
  const auto narrow_deep = kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::narrow_deep, kH200Smem);
  EXPECT_EQ(narrow_deep.block_n, 32);
  EXPECT_EQ(narrow_deep.stages, 16);
  EXPECT_EQ(narrow_deep.smem_bytes, 192u * 1024);
  for (GemmBf16Tile deep : {GemmBf16Tile::small_deep, GemmBf16Tile::narrow_deep}) {
    EXPECT_FALSE(kc::ch02::gemm_bf16_tile_info(deep, kA100Smem).fits);
    EXPECT_FALSE(kc::ch02::gemm_bf16_tile_info(deep, kRtxSmem).fits);
  }
}

TEST(GemmBf16Tiles, ChoiceFillsTheGpu) {
  using kc::ch02::choose_gemm_bf16_tile;
  // Compute-bound square: the big tile (512 blocks for 132 SMs).
  EXPECT_EQ(choose_gemm_bf16_tile({4096, 4096, 4096}, 132, kH200Smem), GemmBf16Tile::large);
  EXPECT_EQ(choose_gemm_bf16_tile({4096, 4096, 4096}, 108, kA100Smem), GemmBf16Tile::large);
  // 99 KiB parts cannot hold the large tile.
  EXPECT_EQ(choose_gemm_bf16_tile({4096, 4096, 4096}, 128, kRtxSmem), GemmBf16Tile::medium);
  // 1024 x 4096: the large tile gives 128 blocks (< 132 SMs), the medium one 256.
  EXPECT_EQ(choose_gemm_bf16_tile({1024, 4096, 4096}, 132, kH200Smem), GemmBf16Tile::medium);
  // Chapter 3's MoE shape: M = 128 leaves large, medium and small tiles with 16, 32 and 128 blocks;
  // 128 blocks keep most SMs busy, so the small tile. M = 16: 64 blocks, half the SMs idle: narrow.
  // Both grids are a single wave, so on sm_90 the deep versions; sm_80 and the 99 KiB parts lack
  // their 192 KiB.
  EXPECT_EQ(choose_gemm_bf16_tile({128, 4096, 7168}, 132, kH200Smem), GemmBf16Tile::small_deep);
  EXPECT_EQ(choose_gemm_bf16_tile({128, 4096, 7168}, 108, kA100Smem), GemmBf16Tile::small);
  EXPECT_EQ(choose_gemm_bf16_tile({16, 4096, 7168}, 132, kH200Smem), GemmBf16Tile::narrow_deep);
  EXPECT_EQ(choose_gemm_bf16_tile({16, 4096, 7168}, 132, kRtxSmem), GemmBf16Tile::narrow);
  EXPECT_EQ(choose_gemm_bf16_tile({16, 8192, 7168}, 132, kH200Smem), GemmBf16Tile::small_deep);
  // Exactly one block per SM is still a single wave; one more block is not.
  EXPECT_EQ(choose_gemm_bf16_tile({64, 64 * 132, 64}, 132, kH200Smem), GemmBf16Tile::small_deep);
  EXPECT_EQ(choose_gemm_bf16_tile({128, 64 * 67, 64}, 132, kH200Smem), GemmBf16Tile::small);
  // 256 x 4096: the small tile's 256 blocks fill the GPU twice over: two 96 KiB blocks per SM.
  EXPECT_EQ(choose_gemm_bf16_tile({256, 4096, 7168}, 132, kH200Smem), GemmBf16Tile::small);
  // Nothing fills the GPU: the tile with the most blocks.
  EXPECT_EQ(choose_gemm_bf16_tile({1, 8, 16}, 132, kH200Smem), GemmBf16Tile::narrow_deep);
  // One SM: any grid fills it, so the largest tile.
  EXPECT_EQ(choose_gemm_bf16_tile({1, 8, 16}, 1, kH200Smem), GemmBf16Tile::large);
  expect_invalid_argument(
      [] {
        kc::ch02::choose_gemm_bf16_tile({1, 8, 16}, 0, kH200Smem);
      },
      "sm_count (0) must be >= 1");
  expect_invalid_argument(
      [] {
        kc::ch02::choose_gemm_bf16_tile({1, 0, 16}, 132, kH200Smem);
      },
      "shape.n (0) must be in [1, 2^31 - 1]");
}

TEST(GemmBf16Tiles, Names) {
  EXPECT_STREQ(kc::ch02::to_string(GemmBf16Tile::large), "large");
  EXPECT_STREQ(kc::ch02::to_string(GemmBf16Tile::medium), "medium");
  EXPECT_STREQ(kc::ch02::to_string(GemmBf16Tile::small), "small");
  EXPECT_STREQ(kc::ch02::to_string(GemmBf16Tile::narrow), "narrow");
  EXPECT_STREQ(kc::ch02::to_string(GemmBf16Tile::small_deep), "small_deep");
  EXPECT_STREQ(kc::ch02::to_string(GemmBf16Tile::narrow_deep), "narrow_deep");
}

TEST(MmaPeakArguments, FlopsAndSinkSize) {
  const MmaPeakConfig defaults;
  // 132 SMs x 4 blocks x 8 warps, 8 accumulators x 4096 iterations, 2·16·8·16 FLOPs per mma.
  EXPECT_DOUBLE_EQ(kc::ch02::mma_peak_flops(defaults, 132), 132.0 * 4 * 8 * 8 * 4096 * 4096);
  EXPECT_EQ(kc::ch02::mma_peak_sink_elements(defaults, 132), 132 * 4 * 8 * 32);
  const MmaPeakConfig one{1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(kc::ch02::mma_peak_flops(one, 1), 4096.0) << "one m16n8k16 is 2048 multiply-adds";
  EXPECT_EQ(kc::ch02::mma_peak_sink_elements(one, 1), 32);
  const MmaPeakConfig wide{32, 2, 16, 10};
  EXPECT_DOUBLE_EQ(kc::ch02::mma_peak_flops(wide, 3), 3.0 * 2 * 32 * 16 * 10 * 4096);
}

TEST(MmaPeakArguments, RejectsBadConfig) {
  float sink = 0;
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_mma_peak({0, 4, 8, 16}, 132, &sink);
      },
      "config.warps_per_block (0) must be in [1, 32]");
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_mma_peak({33, 4, 8, 16}, 132, &sink);
      },
      "config.warps_per_block (33) must be in [1, 32]");
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_mma_peak({8, 0, 8, 16}, 132, &sink);
      },
      "config.blocks_per_sm (0) must be >= 1");
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_mma_peak({8, 4, 3, 16}, 132, &sink);
      },
      "config.accumulators_per_warp (3) must be 1, 2, 4, 8 or 16");
  expect_invalid_argument(
      [&] {
        kc::ch02::validate_mma_peak({8, 4, 8, 0}, 132, &sink);
      },
      "config.iterations (0) must be >= 1");
  expect_invalid_argument([&] { kc::ch02::validate_mma_peak({}, 0, &sink); }, "sm_count (0) must be >= 1");
  expect_invalid_argument([&] { kc::ch02::validate_mma_peak({}, 132, nullptr); }, "sink must not be null");
  expect_invalid_argument([&] { kc::ch02::mma_peak_flops({8, 4, 5, 16}, 132); }, "config.accumulators_per_warp (5)");
  expect_invalid_argument([&] { kc::ch02::mma_peak_sink_elements({8, 4, 8, 16}, -1); }, "sm_count (-1)");
  // The launch validates before any CUDA call.
  expect_invalid_argument([&] { kc::ch02::mma_peak({}, 132, nullptr); }, "sink must not be null");
}

// ---------------------------------------------------------------- GPU

// Runs `launch` (gemm_bf16 or one tile) on random inputs and checks every aspect of the output.
template <typename Launch>
void check_gemm(GemmShape s, Launch launch) {
  SCOPED_TRACE("M x N x K = " + shape_name(s));
  const std::uint64_t seed = kc::test::test_seed();
  const Inputs in = random_inputs(s, seed);
  kc::DeviceBuffer<bf16> a(in.a), w(in.w);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  launch(a.data(), w.data(), c.data(), s);
  kc::check(cudaDeviceSynchronize());

  const std::vector<bf16> got = c.to_host();
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(got), kc::test::kPoisonByte), 0u) << "elements never written";
  EXPECT_EQ(c.guard_damage(), 0u) << "wrote past the end of c";
  kc::test::expect_close(compare_with_reference(in, got, s, seed), kTolerance, shape_name(s));
}

struct ShapeCase {
  GemmShape shape;
  bool large;  // skipped under KC_SMALL_TESTS (compute-sanitizer runs)
};

void PrintTo(const ShapeCase& c, std::ostream* os) { *os << shape_name(c.shape); }

class GemmBf16Gpu : public kc::test::GpuTest, public ::testing::WithParamInterface<ShapeCase> {};

TEST_P(GemmBf16Gpu, MatchesFp64Reference) {
  if (GetParam().large && kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  check_gemm(GetParam().shape,
             [](const bf16* a, const bf16* w, bf16* c, GemmShape s) { kc::ch02::gemm_bf16(a, w, c, s); });
}

const ShapeCase kShapes[] = {
    {{1, 8, 16}, false},        // the smallest: one row, one n8 tile, one k16 step
    {{1, 1, 8}, false},         // N = 1 (odd: element stores), K = 8 (one chunk, the rest of the slice zero)
    {{127, 131, 64}, false},    // not multiples of any tile, odd N
    {{129, 257, 72}, false},    // one past a tile edge in M and N, K tail of 8
    {{255, 127, 1000}, false},  // 16 K slices (the pipeline wraps), K tail of 40
    {{1, 4096, 7168}, true},    // one token through a big layer
    {{4096, 8, 512}, true},     // tall and thin
    {{128, 4096, 7168}, true},  // Chapter 3's MoE shape (the small-tile heuristic)
};

INSTANTIATE_TEST_SUITE_P(GemmBf16, GemmBf16Gpu, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<ShapeCase>& info) { return shape_name(info.param.shape); });

// Every tile this GPU fits, forced, on shapes that cut through its edges: the automatic choice on a
// big GPU picks the small tile for all the small shapes above, and these must work too.
class GemmBf16TileGpu : public kc::test::GpuTest, public ::testing::WithParamInterface<GemmBf16Tile> {
 protected:
  void SetUp() override {
    kc::test::GpuTest::SetUp();
    if (IsSkipped()) return;
    const auto info = kc::ch02::gemm_bf16_tile_info(GetParam(), device().smem_per_block_optin);
    if (!info.fits)
      GTEST_SKIP() << "this GPU's shared memory cannot hold the " << kc::ch02::to_string(GetParam()) << " tile";
  }
  void check(GemmShape s) {
    const GemmBf16Tile tile = GetParam();
    check_gemm(s, [tile](const bf16* a, const bf16* w, bf16* c, GemmShape shape) {
      kc::ch02::gemm_bf16_with_tile(a, w, c, shape, tile);
    });
  }
};

TEST_P(GemmBf16TileGpu, EdgesAndTails) {
  for (GemmShape s : {GemmShape{1, 1, 8}, GemmShape{33, 40, 56}, GemmShape{127, 131, 64}, GemmShape{129, 257, 72},
                      GemmShape{300, 520, 200}, GemmShape{255, 127, 1000}}) {
    check(s);
  }
}

TEST_P(GemmBf16TileGpu, SeveralTilesEachWay) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  check({1000, 1030, 1032});
}

// The large tile stores C through shared memory, the medium tile from registers. Both sum K in the
// same order (k16 steps in turn, no K rotation) and round every accumulator once: the same bits, on
// shapes that take the staged store's 8-byte path (N % 8 == 0) and its element-by-element path
// (odd N, and C at an odd element).
class GemmBf16StoreGpu : public kc::test::GpuTest {};

TEST_F(GemmBf16StoreGpu, StagedAndRegisterStoresGiveTheSameBits) {
  if (!kc::ch02::gemm_bf16_tile_info(GemmBf16Tile::large, device().smem_per_block_optin).fits) {
    GTEST_SKIP() << "this GPU's shared memory cannot hold the large tile";
  }
  const std::uint64_t seed = kc::test::test_seed();
  for (GemmShape s : {GemmShape{300, 520, 200}, GemmShape{129, 257, 72}, GemmShape{1000, 1030, 1032}}) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      SCOPED_TRACE("M x N x K = " + shape_name(s) + ", c at element " + std::to_string(offset));
      const Inputs in = random_inputs(s, seed);
      kc::DeviceBuffer<bf16> a(in.a), w(in.w);
      std::vector<bf16> out[2];
      for (int i = 0; i < 2; ++i) {
        kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n) + offset);
        kc::ch02::gemm_bf16_with_tile(a.data(), w.data(), c.data() + offset, s,
                                      i == 0 ? GemmBf16Tile::large : GemmBf16Tile::medium);
        kc::check(cudaDeviceSynchronize());
        EXPECT_EQ(c.guard_damage(), 0u) << "wrote past the end of c";
        out[i] = c.to_host();
      }
      // As bytes: the poison in front of an offset C is a NaN pattern, and NaN == NaN is false.
      ASSERT_EQ(out[0].size(), out[1].size());
      EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(bf16)), 0)
          << "the staged store and the store from registers differ";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GemmBf16, GemmBf16TileGpu,
                         ::testing::Values(GemmBf16Tile::large, GemmBf16Tile::medium, GemmBf16Tile::small,
                                           GemmBf16Tile::narrow, GemmBf16Tile::small_deep, GemmBf16Tile::narrow_deep),
                         [](const ::testing::TestParamInfo<GemmBf16Tile>& info) {
                           return std::string(kc::ch02::to_string(info.param));
                         });

class GemmBf16ArgumentsGpu : public kc::test::GpuTest {};

// c at an odd element offset (2-byte but not 4-byte aligned) takes the element-by-element stores;
// the elements just before and after the product must stay untouched.
TEST_F(GemmBf16ArgumentsGpu, OddOffsetOutput) {
  const GemmShape s{67, 70, 48};
  const std::uint64_t seed = kc::test::test_seed();
  const Inputs in = random_inputs(s, seed);
  kc::DeviceBuffer<bf16> a(in.a), w(in.w);
  const auto count = static_cast<std::size_t>(s.m * s.n);
  kc::DeviceBuffer<bf16> c(count + 2);
  c.fill_bytes(kc::test::kPoisonByte);
  kc::ch02::gemm_bf16(a.data(), w.data(), c.data() + 1, s);
  const std::vector<bf16> all = c.to_host();
  const std::span<const bf16> out(all.data() + 1, count);
  kc::test::expect_close(compare_with_reference(in, out, s, seed), kTolerance, "c + 1");
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(all.data(), 1), kc::test::kPoisonByte), 1u) << "wrote c[-1]";
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(all.data() + 1 + count, 1), kc::test::kPoisonByte), 1u)
      << "wrote c[M*N]";
}

// A NaN in A poisons exactly its row of C (NaN · x = NaN, and NaN + anything = NaN): the reference
// has NaN there too, and everything else must still be right.
TEST_F(GemmBf16ArgumentsGpu, NanInAPropagatesToItsRow) {
  const GemmShape s{70, 90, 136};
  const std::uint64_t seed = kc::test::test_seed();
  Inputs in = random_inputs(s, seed);
  const std::int64_t nan_row = 37;
  in.a[static_cast<std::size_t>(nan_row * s.k + 100)] = __float2bfloat16(std::numeric_limits<float>::quiet_NaN());
  kc::DeviceBuffer<bf16> a(in.a), w(in.w);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  kc::ch02::gemm_bf16(a.data(), w.data(), c.data(), s);
  const std::vector<bf16> got = c.to_host();
  std::size_t nans = 0, nans_in_row = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(__bfloat162float(got[i]))) {
      ++nans;
      if (static_cast<std::int64_t>(i) / s.n == nan_row) ++nans_in_row;
    }
  }
  EXPECT_EQ(nans_in_row, static_cast<std::size_t>(s.n)) << "every element of the NaN row must be NaN";
  EXPECT_EQ(nans, static_cast<std::size_t>(s.n)) << "NaN leaked into other rows";
  kc::test::expect_close(compare_with_reference(in, got, s, seed), kTolerance, "NaN row");
}

// The comparison itself: a NaN where the reference is finite never passes.
TEST_F(GemmBf16ArgumentsGpu, NanNeverPasses) {
  const GemmShape s{16, 16, 16};
  const std::uint64_t seed = kc::test::test_seed();
  const Inputs in = random_inputs(s, seed);
  kc::DeviceBuffer<bf16> a(in.a), w(in.w);
  kc::DeviceBuffer<bf16> c(static_cast<std::size_t>(s.m * s.n));
  kc::ch02::gemm_bf16(a.data(), w.data(), c.data(), s);
  std::vector<bf16> got = c.to_host();
  ASSERT_TRUE(compare_with_reference(in, got, s, seed).passes(kTolerance));
  got[77] = __float2bfloat16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(compare_with_reference(in, got, s, seed).passes(kTolerance));
}

// Rejected calls launch nothing: the poisoned output is untouched.
TEST_F(GemmBf16ArgumentsGpu, BadArgumentsWriteNothing) {
  const GemmShape s{32, 32, 64};
  kc::DeviceBuffer<bf16> a(static_cast<std::size_t>(s.m * s.k + 8)), w(static_cast<std::size_t>(s.n * s.k));
  a.fill_bytes(0);
  w.fill_bytes(0);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  expect_invalid_argument([&] { kc::ch02::gemm_bf16(a.data() + 1, w.data(), c.data(), s); },
                          "a must be 16-byte aligned (16-byte rows for cp.async)");
  expect_invalid_argument(
      [&] {
        kc::ch02::gemm_bf16(a.data(), w.data(), c.data(), {32, 32, 60});
      },
      "shape.k (60) must be a multiple of 8 (16-byte rows for cp.async)");
  kc::check(cudaDeviceSynchronize());
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(c.to_host()), kc::test::kPoisonByte), c.size())
      << "a rejected call must write nothing";
  EXPECT_EQ(c.guard_damage(), 0u);
}

kc::test::LaunchUnderTest make_run(kc::DeviceBuffer<bf16>& a, kc::DeviceBuffer<bf16>& w, kc::DeviceBuffer<bf16>& c,
                                   GemmShape s) {
  return {[&, s](cudaStream_t stream) { kc::ch02::gemm_bf16(a.data(), w.data(), c.data(), s, stream); },
          [&] { c.fill_bytes(kc::test::kPoisonByte); },
          [&] {
            const std::vector<bf16> h = c.to_host();
            const auto* bytes = reinterpret_cast<const unsigned char*>(h.data());
            return std::vector<unsigned char>(bytes, bytes + h.size() * sizeof(bf16));
          }};
}

// The launch path neither allocates nor synchronises, and the result does not depend on timing
// (every output element is summed by one thread in a fixed order).
TEST_F(GemmBf16ArgumentsGpu, GraphCapturableAndRepeatable) {
  for (GemmShape s : {GemmShape{255, 127, 1000}, GemmShape{520, 1030, 264}}) {
    SCOPED_TRACE(shape_name(s));
    const std::uint64_t seed = kc::test::test_seed();
    const Inputs in = random_inputs(s, seed);
    kc::DeviceBuffer<bf16> a(in.a), w(in.w), c(static_cast<std::size_t>(s.m * s.n));
    const kc::test::LaunchUnderTest run = make_run(a, w, c, s);
    kc::test::expect_graph_capturable(run);
    kc::test::expect_bitwise_repeatable(run);
  }
}

class MmaPeakGpu : public kc::test::GpuTest {};

// Every thread writes one finite checksum, whatever the number of accumulators.
TEST_F(MmaPeakGpu, WritesEverySinkElement) {
  for (int accumulators : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE("accumulators_per_warp = " + std::to_string(accumulators));
    const MmaPeakConfig config{8, 4, accumulators, 64};
    const auto count = static_cast<std::size_t>(kc::ch02::mma_peak_sink_elements(config, device().sm_count));
    kc::test::GuardedOutput<float> sink(count);
    kc::ch02::mma_peak(config, device().sm_count, sink.data());
    kc::check(cudaDeviceSynchronize());
    const std::vector<float> got = sink.to_host();
    EXPECT_EQ(kc::count_poisoned(std::span<const float>(got), kc::test::kPoisonByte), 0u) << "unwritten sink";
    std::size_t nonfinite = 0;
    for (float v : got) nonfinite += std::isfinite(v) ? 0 : 1;
    EXPECT_EQ(nonfinite, 0u);
    EXPECT_EQ(sink.guard_damage(), 0u);
  }
}

}  // namespace
