// Chapter 7 tests: the Hopper GEMM ladder (TMA, wgmma, warp specialization, persistence, clusters).
// CPU tests (argument rules, tensor-map descriptions and their rules, the step table, the
// accumulator and descriptor maps the kernels use, the persistent steps' tile orders, grids, pipeline
// counters and cluster byte counts) run everywhere. GPU tests need an sm_90 GPU (the
// kernels are sm_90a code) and skip with the reason elsewhere.
//
// Tolerance 1e-2 relative Frobenius (the course's bf16 rule): against the fp64 reference of the bf16
// inputs the only differences are fp32 accumulation (about sqrt(K) · 2^-24 relative) and one rounding
// of each output to bf16 (at most 2^-9 relative), so the error is around 1e-3; against cuBLAS both
// round a sum taken in a different order, neighbouring bf16 values at worst (2^-8). A wrong swizzle,
// descriptor, barrier phase or fragment position gives errors of order 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bf16_gemm_problems.hpp"
#include "hopper_gemm.hpp"
#include "hopper_launch.hpp"
#include "hopper_tiles.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"
#include "tensor_map.hpp"
#include "vendor_cublas.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch07::GemmShape;
using kc::ch07::HopperStep;
using kc::ch07::TensorMapSpec;
using kc::test::expect_invalid_argument;
using kc::test::bf16_gemm::compare_with_reference;
using kc::test::bf16_gemm::Inputs;
using kc::test::bf16_gemm::random_inputs;
using kc::test::bf16_gemm::shape_name;

constexpr double kTolerance = 1e-2;  // see the top of the file
constexpr kc::ch07::HopperTuning kTunings[] = {
    kc::ch07::HopperTuning::step6_three_stages,  kc::ch07::HopperTuning::step6_small_tile,
    kc::ch07::HopperTuning::step6_prefetch_maps, kc::ch07::HopperTuning::step6_box_ring,
    kc::ch07::HopperTuning::step6_held_stage,    kc::ch07::HopperTuning::step6_held_stage_late};
constexpr HopperStep kSteps[] = {HopperStep::tma_wgmma,  HopperStep::pipeline,          HopperStep::warp_specialized,
                                 HopperStep::persistent, HopperStep::cluster_multicast, HopperStep::tma_store};

// 16-byte-aligned host storage for validation tests: the rules only look at addresses.
struct alignas(16) HostBuffer {
  bf16 data[256];
};

// ---------------------------------------------------------------- CPU: argument rules

TEST(HopperGemmArguments, RejectsBadShape) {
  HostBuffer a, w, c;
  expect_invalid_argument(
      [&] {
        kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data, {0, 8, 8});
      },
      "shape.m (0) must be in [1, 2^31 - 1]");
  expect_invalid_argument(
      [&] {
        kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data, {8, -3, 8});
      },
      "shape.n (-3) must be in [1, 2^31 - 1]");
}

TEST(HopperGemmArguments, RejectsKNotMultipleOf8) {
  HostBuffer a, w, c;
  expect_invalid_argument(
      [&] {
        kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data, {4, 4, 100});
      },
      "shape.k (100) must be a multiple of 8 (TMA: rows of a multiple of 16 bytes)");
  expect_invalid_argument(
      [&] {
        kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data, {1, 1, 7});
      },
      "shape.k (7) must be a multiple of 8");
  EXPECT_NO_THROW(kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data + 128, {1, 1, 8}));
}

TEST(HopperGemmArguments, RejectsNullMisalignedAndOverlapping) {
  HostBuffer a, w, c;
  const GemmShape s{2, 2, 8};
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(nullptr, w.data, c.data, s); },
                          "a must not be null");
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(a.data, nullptr, c.data, s); },
                          "w must not be null");
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, nullptr, s); },
                          "c must not be null");
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(a.data + 4, w.data, c.data, s); },
                          "a must be 16-byte aligned (TMA reads from a 16-byte-aligned base)");
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(a.data, w.data + 1, c.data, s); },
                          "w must be 16-byte aligned");
  const auto* odd = reinterpret_cast<const bf16*>(reinterpret_cast<const unsigned char*>(c.data) + 1);
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, odd, s); },
                          "c must be 2-byte aligned (the alignment of bf16)");
  EXPECT_NO_THROW(kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data + 1, s)) << "c needs only 2 bytes";
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, a.data + 15, s); },
                          "c must not overlap a");
  expect_invalid_argument([&] { kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, w.data, s); },
                          "c must not overlap w");
  EXPECT_NO_THROW(kc::ch07::validate_gemm_bf16_hopper(a.data, a.data, c.data, s)) << "a == w is allowed";
}

TEST(HopperGemmArguments, RejectsShapesNeedingTooManyTiles) {
  HostBuffer a, w, c;
  expect_invalid_argument(
      [&] {
        kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data, {0x7FFFFFFF, 0x7FFFFFFF, 8}, HopperStep::tma_wgmma);
      },
      "must need at most 2^31 - 1 tiles of 64 x 128");
  expect_invalid_argument(
      [&] {
        kc::ch07::validate_gemm_bf16_hopper(a.data, w.data, c.data, {0x7FFFFFFF, 0x7FFFFFFF, 8});
      },
      "tiles of 128 x 256");
}

// The launch functions validate before touching CUDA: on a machine without a GPU these throw
// kc::InvalidArgument, not kc::CudaError, and nothing is written.
TEST(HopperGemmArguments, LaunchFunctionsRejectBeforeAnyCudaCall) {
  HostBuffer a, w, c;
  expect_invalid_argument(
      [&] {
        kc::ch07::gemm_bf16_hopper(nullptr, w.data, c.data, {1, 1, 8});
      },
      "a must not be null");
  for (HopperStep step : kSteps) {
    expect_invalid_argument(
        [&] {
          kc::ch07::gemm_bf16_hopper_step(step, a.data, w.data, c.data, {1, 1, 12});
        },
        "shape.k (12) must be a multiple of 8");
  }
  expect_invalid_argument(
      [&] {
        kc::ch07::gemm_bf16_hopper_step(static_cast<HopperStep>(7), a.data, w.data, c.data, {1, 1, 8});
      },
      "step (7) is not a HopperStep");
}

TEST(HopperGemmArguments, SaysWhatGpuItNeeds) {
  EXPECT_EQ(kc::ch07::hopper_unsupported_reason(9, 0), std::nullopt);
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{8, 9}, std::pair{10, 0}, std::pair{12, 0}}) {
    const std::optional<std::string> reason = kc::ch07::hopper_unsupported_reason(major, minor);
    ASSERT_TRUE(reason.has_value()) << major << "." << minor;
    EXPECT_NE(reason->find("need an sm_90 GPU"), std::string::npos) << *reason;
    EXPECT_NE(reason->find("sm_" + std::to_string(major) + std::to_string(minor)), std::string::npos) << *reason;
  }
}

// ---------------------------------------------------------------- CPU: the step table

TEST(HopperSteps, Table) {
  const auto s1 = kc::ch07::hopper_step_info(HopperStep::tma_wgmma);
  EXPECT_EQ(s1.block_m, 64);
  EXPECT_EQ(s1.block_n, 128);
  EXPECT_EQ(s1.block_k, 64);
  EXPECT_EQ(s1.threads, 128);
  EXPECT_EQ(s1.stages, 1);
  EXPECT_EQ(s1.stage_bytes, (64 + 128) * 64 * 2);

  const auto s2 = kc::ch07::hopper_step_info(HopperStep::pipeline);
  EXPECT_EQ(s2.block_m, 128);
  EXPECT_EQ(s2.block_n, 128);
  EXPECT_EQ(s2.threads, 256);
  EXPECT_EQ(s2.consumer_warpgroups, 2);
  EXPECT_EQ(s2.producer_warpgroups, 0);
  EXPECT_EQ(s2.stages, 7);
  EXPECT_EQ(s2.stage_bytes, 32768);

  const auto s3 = kc::ch07::hopper_step_info(HopperStep::warp_specialized);
  EXPECT_EQ(s3.block_m, 128);
  EXPECT_EQ(s3.block_n, 256);
  EXPECT_EQ(s3.threads, 384);
  EXPECT_EQ(s3.consumer_warpgroups, 2);
  EXPECT_EQ(s3.producer_warpgroups, 1);
  EXPECT_EQ(s3.stages, 4);
  EXPECT_EQ(s3.stage_bytes, 49152);

  const auto s4 = kc::ch07::hopper_step_info(HopperStep::persistent);
  EXPECT_EQ(s4.block_m, 128);
  EXPECT_EQ(s4.block_n, 256);
  EXPECT_EQ(s4.threads, 384);
  EXPECT_EQ(s4.stages, 4);
  EXPECT_EQ(s4.cluster_m, 1);
  EXPECT_TRUE(s4.persistent);
  EXPECT_FALSE(s3.persistent);

  const auto s5 = kc::ch07::hopper_step_info(HopperStep::cluster_multicast);
  EXPECT_EQ(s5.block_m, 128);
  EXPECT_EQ(s5.block_n, 256);
  EXPECT_EQ(s5.threads, 384);
  EXPECT_EQ(s5.stages, 4);
  EXPECT_EQ(s5.stage_bytes, 49152) << "a stage still holds the whole W tile: half loaded here, half by the peer";
  EXPECT_EQ(s5.cluster_m, 2);
  EXPECT_TRUE(s5.persistent);
  EXPECT_EQ(s5.c_staging_bytes, 0);

  const auto s6 = kc::ch07::hopper_step_info(HopperStep::tma_store);
  EXPECT_EQ(s6.block_m, 128);
  EXPECT_EQ(s6.block_n, 256);
  EXPECT_EQ(s6.threads, 384);
  EXPECT_EQ(s6.stages, 4) << "step 5's stages kept";
  EXPECT_EQ(s6.stage_bytes, 49152);
  EXPECT_EQ(s6.cluster_m, 2);
  EXPECT_EQ(s6.c_staging_bytes, 128 * 256 * 2 / 2) << "half the tile staged at a time: what the 4 stages leave";
  EXPECT_TRUE(s6.persistent);

  for (HopperStep step : kSteps) {
    const auto info = kc::ch07::hopper_step_info(step);
    SCOPED_TRACE(kc::ch07::to_string(step));
    EXPECT_LE(info.smem_bytes, kc::ch07::kSm90SmemPerBlock) << "fits an sm_90 block";
    EXPECT_EQ(info.smem_bytes, 1024u + static_cast<std::size_t>(info.stages) * (info.stage_bytes + 16) +
                                   static_cast<std::size_t>(info.c_staging_bytes))
        << "slack + stages + two barriers per stage + C staging";
    EXPECT_EQ(info.c_staging_bytes % 1024, 0) << "the barriers after it stay aligned, the boxes in it too";
    EXPECT_EQ(info.stage_bytes % 1024, 0) << "each stage keeps the next 1024-byte aligned (128-byte swizzle)";
    EXPECT_LT(info.stage_bytes, 1 << 20) << "an mbarrier phase counts at most 2^20 - 1 bytes";
    EXPECT_EQ(info.block_m, 64 * info.consumer_warpgroups) << "each consumer warpgroup owns 64 rows";
  }
  expect_invalid_argument([] { kc::ch07::hopper_step_info(static_cast<HopperStep>(-1)); },
                          "step (-1) is not a HopperStep");
}

TEST(HopperSteps, Names) {
  EXPECT_STREQ(kc::ch07::to_string(HopperStep::tma_wgmma), "step1_tma_wgmma");
  EXPECT_STREQ(kc::ch07::to_string(HopperStep::pipeline), "step2_pipeline");
  EXPECT_STREQ(kc::ch07::to_string(HopperStep::warp_specialized), "step3_warp_specialized");
  EXPECT_STREQ(kc::ch07::to_string(HopperStep::persistent), "step4_persistent");
  EXPECT_STREQ(kc::ch07::to_string(HopperStep::cluster_multicast), "step5_cluster_multicast");
  EXPECT_STREQ(kc::ch07::to_string(HopperStep::tma_store), "step6_tma_store");
  EXPECT_EQ(kc::ch07::kAfterStep, HopperStep::tma_store);
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_three_stages), "tune_step6_three_stages");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_small_tile), "tune_step6_small_tile");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_prefetch_maps), "tune_step6_prefetch_maps");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_mainloop_only), "tune_step6_mainloop_only");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_loads_only), "tune_step6_loads_only");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_small_loads_only), "tune_step6_small_loads_only");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_box_ring), "tune_step6_box_ring");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_held_stage), "tune_step6_held_stage");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_held_stage_late), "tune_step6_held_stage_late");
  EXPECT_STREQ(kc::ch07::to_string(kc::ch07::HopperTuning::step6_stage_only), "tune_step6_stage_only");
  const auto three = kc::ch07::kStep6ThreeStageTile;
  EXPECT_EQ(three.stages, 3);
  EXPECT_EQ(three.c_staging_bytes(), 128 * 256 * 2) << "the whole tile at once";
  EXPECT_LE(three.smem_bytes(), kc::ch07::kSm90SmemPerBlock);
  const auto small = kc::ch07::kStep6SmallTile;
  EXPECT_EQ(small.block_n, 128);
  EXPECT_EQ(small.stages, 6);
  EXPECT_EQ(small.stage_bytes(), 32768);
  EXPECT_EQ(small.c_staging_bytes(), 128 * 128 * 2) << "the whole tile at once";
  EXPECT_LE(small.smem_bytes(), kc::ch07::kSm90SmemPerBlock);
}

// ---------------------------------------------------------------- CPU: tensor maps

TEST(HopperTensorMaps, OperandMapsOfEachStep) {
  HostBuffer a, w;
  const GemmShape s{300, 1000, 1032};  // none a multiple of any tile
  for (HopperStep step : kSteps) {
    SCOPED_TRACE(kc::ch07::to_string(step));
    const auto info = kc::ch07::hopper_step_info(step);
    const kc::ch07::OperandMaps maps = kc::ch07::operand_maps(a.data, w.data, s, step);
    EXPECT_EQ(maps.a.global_address, a.data);
    EXPECT_EQ(maps.a.global_dim[0], 1032u) << "innermost first: K";
    EXPECT_EQ(maps.a.global_dim[1], 300u) << "then rows: M";
    EXPECT_EQ(maps.a.row_stride_bytes, 1032u * 2);
    EXPECT_EQ(maps.a.box_dim[0], 64u) << "64 bf16 = 128 bytes, the 128-byte swizzle span";
    EXPECT_EQ(maps.a.box_dim[1], static_cast<std::uint32_t>(info.block_m));
    EXPECT_EQ(maps.a.swizzle, kc::ch07::TensorMapSwizzle::bytes128);
    EXPECT_EQ(maps.w.global_address, w.data);
    EXPECT_EQ(maps.w.global_dim[0], 1032u);
    EXPECT_EQ(maps.w.global_dim[1], 1000u) << "W's rows: N";
    EXPECT_EQ(maps.w.box_dim[1], static_cast<std::uint32_t>(info.block_n / info.cluster_m))
        << "with a cluster, each CTA loads its slice of the W tile";
    EXPECT_EQ(static_cast<int>(maps.a.box_bytes() + info.cluster_m * maps.w.box_bytes()), info.stage_bytes)
        << "the full barrier expects A and every W slice, zero-filled parts included";
    EXPECT_NO_THROW(kc::ch07::validate_tensor_map(maps.a, "a"));
    EXPECT_NO_THROW(kc::ch07::validate_tensor_map(maps.w, "w"));
  }
}

TensorMapSpec good_map(const void* base) {
  TensorMapSpec spec;
  spec.global_address = base;
  spec.global_dim = {1024, 300};
  spec.row_stride_bytes = 2048;
  spec.box_dim = {64, 128};
  return spec;
}

TEST(HopperTensorMaps, RulesNameTheMapAndTheRule) {
  HostBuffer buffer;
  const void* base = buffer.data;
  EXPECT_NO_THROW(kc::ch07::validate_tensor_map(good_map(base), "a"));
  auto expect_rule = [&](auto change, const std::string& rule) {
    TensorMapSpec spec = good_map(base);
    change(spec);
    expect_invalid_argument([&] { kc::ch07::validate_tensor_map(spec, "w"); }, "w's tensor map: " + rule);
  };
  expect_rule([](TensorMapSpec& s) { s.global_address = nullptr; }, "global_address must not be null");
  expect_rule([&](TensorMapSpec& s) { s.global_address = buffer.data + 1; },
              "global_address must be 16-byte aligned (TMA)");
  expect_rule([](TensorMapSpec& s) { s.global_dim[1] = 0; }, "global_dim[1] (0) must be in [1, 2^32]");
  expect_rule([](TensorMapSpec& s) { s.global_dim[0] = (std::uint64_t{1} << 32) + 1; },
              "global_dim[0] (4294967297) must be in [1, 2^32]");
  expect_rule([](TensorMapSpec& s) { s.row_stride_bytes = 2002; },
              "row_stride_bytes (2002) must be a multiple of 16 (TMA; for bf16 rows, a multiple of 8 elements)");
  expect_rule([](TensorMapSpec& s) { s.row_stride_bytes = 1024; },
              "row_stride_bytes (1024) must be >= global_dim[0] * element_bytes (2048)");
  expect_rule(
      [](TensorMapSpec& s) {
        s.global_dim[0] = 8;
        s.row_stride_bytes = std::uint64_t{1} << 40;
      },
      "row_stride_bytes (1099511627776) must be < 2^40");
  expect_rule([](TensorMapSpec& s) { s.box_dim[1] = 257; }, "box_dim[1] (257) must be in [1, 256]");
  expect_rule([](TensorMapSpec& s) { s.box_dim[0] = 0; }, "box_dim[0] (0) must be in [1, 256]");
  expect_rule(
      [](TensorMapSpec& s) {
        s.box_dim[0] = 12;
        s.swizzle = kc::ch07::TensorMapSwizzle::none;
      },
      "box_dim[0] * element_bytes (24) must be a multiple of 16");
  expect_rule([](TensorMapSpec& s) { s.box_dim[0] = 128; },
              "box_dim[0] * element_bytes (256) must be <= the swizzle span (128 bytes)");
  expect_rule([](TensorMapSpec& s) { s.element_bytes = 3; }, "element_bytes (3) must be 1, 2, 4 or 8");
  // Without a swizzle a box row may be up to 256 elements.
  TensorMapSpec wide = good_map(base);
  wide.box_dim[0] = 128;
  wide.swizzle = kc::ch07::TensorMapSwizzle::none;
  EXPECT_NO_THROW(kc::ch07::validate_tensor_map(wide, "a"));
}

// Encoding validates first: a bad map is reported in the course's words, with no CUDA call.
TEST(HopperTensorMaps, EncodeValidatesBeforeTheDriver) {
  HostBuffer buffer;
  TensorMapSpec spec = good_map(buffer.data);
  spec.row_stride_bytes = 2050;
  expect_invalid_argument([&] { kc::ch07::encode_tensor_map(spec, "a"); }, "a's tensor map: row_stride_bytes (2050)");
}

TEST(HopperTensorMaps, SwizzleSpans) {
  EXPECT_EQ(kc::ch07::swizzle_span_bytes(kc::ch07::TensorMapSwizzle::none), 0u);
  EXPECT_EQ(kc::ch07::swizzle_span_bytes(kc::ch07::TensorMapSwizzle::bytes32), 32u);
  EXPECT_EQ(kc::ch07::swizzle_span_bytes(kc::ch07::TensorMapSwizzle::bytes64), 64u);
  EXPECT_EQ(kc::ch07::swizzle_span_bytes(kc::ch07::TensorMapSwizzle::bytes128), 128u);
}

// ---------------------------------------------------------------- CPU: the maps the kernels use

// Every (row, col) of a 64 × N wgmma tile is held by exactly one (thread, register) pair, the pairs
// (i, i + 1) with even i are adjacent columns (so one bf16x2 store each), and warp w holds rows
// 16w..16w+15 (the PTX ISA's fragment figure).
TEST(HopperFragments, AccumulatorPositionsCoverTheTileOnce) {
  for (int n : {128, 256}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    std::set<std::pair<int, int>> seen;
    for (int thread = 0; thread < 128; ++thread) {
      for (int i = 0; i < n / 2; ++i) {
        const auto at = kc::ch07::accumulator_position(thread, i);
        ASSERT_GE(at.row, 0);
        ASSERT_LT(at.row, 64);
        ASSERT_GE(at.col, 0);
        ASSERT_LT(at.col, n);
        EXPECT_EQ(at.row / 16, thread / 32) << "warp " << thread / 32 << " owns 16 rows";
        EXPECT_TRUE(seen.insert({at.row, at.col}).second) << "(" << at.row << ", " << at.col << ") twice";
        if (i % 2 == 1) {
          const auto left = kc::ch07::accumulator_position(thread, i - 1);
          EXPECT_EQ(left.row, at.row);
          EXPECT_EQ(left.col + 1, at.col);
          EXPECT_EQ(left.col % 2, 0) << "pairs start on even columns: 4-byte aligned when N is even";
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(64 * n));
  }
  // Spot values from the fragment figure: thread 0 holds (0,0), (0,1), (8,0), (8,1), (0,8), ...
  EXPECT_EQ(kc::ch07::accumulator_position(0, 2).row, 8);
  EXPECT_EQ(kc::ch07::accumulator_position(0, 4).col, 8);
  EXPECT_EQ(kc::ch07::accumulator_position(5, 0).row, 1);
  EXPECT_EQ(kc::ch07::accumulator_position(5, 0).col, 2);
}

TEST(HopperFragments, SharedMemoryDescriptorFields) {
  const std::uint32_t address = 0x1C400;  // a 1024-byte-aligned shared-memory address
  const std::uint64_t d = kc::ch07::smem_descriptor_sw128(address);
  EXPECT_EQ(d & 0x3FFF, address >> 4) << "start address >> 4 in bits 0-13";
  EXPECT_EQ((d >> 16) & 0x3FFF, 1u) << "leading byte offset 16 >> 4";
  EXPECT_EQ((d >> 32) & 0x3FFF, 64u) << "stride byte offset 1024 >> 4: the next 8 rows of 128 bytes";
  EXPECT_EQ((d >> 49) & 0x7, 0u) << "base offset 0: tiles are 1024-byte aligned";
  EXPECT_EQ(d >> 62, 1u) << "layout type 1: 128-byte swizzle";
  // The k16 slices of a 64-wide row are 32 bytes apart: +2 in the address field.
  EXPECT_EQ(kc::ch07::smem_descriptor_sw128(address + 32), d + 2);
  // Only the 18 bits of a shared-memory address take part.
  EXPECT_EQ(kc::ch07::smem_descriptor_sw128(address | 0xFFFC0000u), d);
}

// Step 6's staging: c_staging_offset lays a 64 × 256 tile out as four 64 × 64 boxes with 128-byte
// swizzle (each element once, inside the 32 KiB buffer, chunks permuted within their own row), and the
// stmatrix rows each lane addresses are the accumulator layout (register i of lane l of matrix j sits
// where accumulator_position puts acc[8 · step + 2j], acc[8 · step + 2j + 1]), with no bank conflict
// among the 8 rows of one matrix.
TEST(HopperFragments, StagingLayoutIsTheSwizzledBoxAndMatchesTheAccumulators) {
  constexpr int kN = 256;
  std::set<int> offsets;
  for (int row = 0; row < 64; ++row) {
    for (int col = 0; col < kN; ++col) {
      const int at = kc::ch07::c_staging_offset(row, col);
      ASSERT_GE(at, 0);
      ASSERT_LT(at, 64 * kN * 2);
      EXPECT_EQ(at % 2, 0);
      EXPECT_TRUE(offsets.insert(at).second) << "(" << row << ", " << col << ") shares a byte";
      const int box = col / 64;
      EXPECT_EQ(at / kc::ch07::kStoreBoxBytes, box) << "box col / 64";
      EXPECT_EQ(at % kc::ch07::kStoreBoxBytes / 128, row) << "rows of 128 bytes within the box";
      // The swizzle: chunk bits (4-6) XOR row bits (7-9) give the unswizzled chunk back.
      const int in_box = at % kc::ch07::kStoreBoxBytes;
      EXPECT_EQ(((in_box >> 4) & 7) ^ ((in_box >> 7) & 7), (col % 64) / 8);
    }
  }
  EXPECT_EQ(kc::ch07::c_staging_offset(0, 0), 0);
  EXPECT_EQ(kc::ch07::c_staging_offset(1, 0), 128 + 16) << "row 1's first chunk moves to chunk 1";
  EXPECT_EQ(kc::ch07::c_staging_offset(0, 64), 8192) << "the second box";

  for (int warp = 0; warp < 4; ++warp) {
    for (int step = 0; step < kN / 16; ++step) {
      for (int matrix = 0; matrix < 4; ++matrix) {
        std::set<int> chunks;
        for (int row_lane = 0; row_lane < 8; ++row_lane) {
          const auto row = kc::ch07::stmatrix_row(warp, 8 * matrix + row_lane, step);
          EXPECT_EQ(row.col % 8, 0);
          chunks.insert(kc::ch07::c_staging_offset(row.row, row.col) / 16 % 8);
        }
        EXPECT_EQ(chunks.size(), 8u) << "8 rows in 8 different 16-byte chunks: all 32 banks, no conflict";
        // Register `matrix` of thread t holds acc[8·step + 2·matrix] and the next: (row lane/4,
        // column 2·(lane%4)) of the matrix whose rows lanes 8·matrix.. address.
        for (int lane = 0; lane < 32; ++lane) {
          const int thread = 32 * warp + lane;
          const auto want = kc::ch07::stmatrix_row(warp, 8 * matrix + lane / 4, step);
          const auto got = kc::ch07::accumulator_position(thread, 8 * step + 2 * matrix);
          EXPECT_EQ(got.row, want.row) << "warp " << warp << " lane " << lane << " step " << step << " matrix "
                                       << matrix;
          EXPECT_EQ(got.col, want.col + 2 * (lane % 4));
        }
      }
    }
  }
}

TEST(HopperTensorMaps, StepSixStoresThroughTmaOnlyWhenItCan) {
  HostBuffer c;
  EXPECT_TRUE(kc::ch07::c_tma_storable(c.data, {70, 136, 64}));
  EXPECT_FALSE(kc::ch07::c_tma_storable(c.data, {70, 130, 64})) << "rows of 260 bytes: not a multiple of 16";
  EXPECT_FALSE(kc::ch07::c_tma_storable(c.data + 4, {70, 136, 64})) << "8-byte aligned only";
  const TensorMapSpec map = kc::ch07::c_store_map(c.data, {70, 136, 64});
  EXPECT_EQ(map.global_dim[0], 136u);
  EXPECT_EQ(map.global_dim[1], 70u);
  EXPECT_EQ(map.row_stride_bytes, 272u);
  EXPECT_EQ(map.box_dim[0], 64u);
  EXPECT_EQ(map.box_dim[1], 64u);
  EXPECT_EQ(map.box_bytes(), static_cast<std::uint32_t>(kc::ch07::kStoreBoxBytes));
  EXPECT_EQ(map.swizzle, kc::ch07::TensorMapSwizzle::bytes128);
  EXPECT_NO_THROW(kc::ch07::validate_tensor_map(map, "c"));
}

TEST(HopperFragments, TileOriginsWalkRows) {
  // 3 tiles per row: blocks 0, 1, 2 share rows 0..127; block 3 starts the next row of tiles.
  EXPECT_EQ(kc::ch07::tile_origin(0, 3, 128, 256).m0, 0);
  EXPECT_EQ(kc::ch07::tile_origin(2, 3, 128, 256).n0, 512);
  EXPECT_EQ(kc::ch07::tile_origin(3, 3, 128, 256).m0, 128);
  EXPECT_EQ(kc::ch07::tile_origin(3, 3, 128, 256).n0, 0);
  EXPECT_EQ(kc::ch07::tile_origin(7, 3, 64, 128).m0, 128);
  EXPECT_EQ(kc::ch07::tile_origin(7, 3, 64, 128).n0, 128);
}

// ---------------------------------------------------------------- CPU: the persistent steps' maps

// Every tile of a tiles_m × tiles_n grid exactly once, for tile counts that are and are not
// multiples of the band height (including a last band of one m-tile, and one row or column).
TEST(HopperPersistent, GroupedOrderIsABijection) {
  for (int tiles_m : {1, 2, 3, 7, 16, 17, 32, 33, 64}) {
    for (int tiles_n : {1, 2, 5, 16, 28, 31}) {
      for (int group_m : {1, 2, 3, 8, 16, 100}) {
        SCOPED_TRACE(std::to_string(tiles_m) + " x " + std::to_string(tiles_n) + ", group_m " +
                     std::to_string(group_m));
        std::vector<int> seen(static_cast<std::size_t>(tiles_m * tiles_n), 0);
        for (int t = 0; t < tiles_m * tiles_n; ++t) {
          const auto c = kc::ch07::grouped_tile_order(t, tiles_m, tiles_n, group_m);
          ASSERT_GE(c.m_tile, 0);
          ASSERT_LT(c.m_tile, tiles_m);
          ASSERT_GE(c.n_tile, 0);
          ASSERT_LT(c.n_tile, tiles_n);
          ++seen[static_cast<std::size_t>(c.m_tile * tiles_n + c.n_tile)];
        }
        for (int count : seen) ASSERT_EQ(count, 1);
      }
    }
  }
}

TEST(HopperPersistent, GroupedOrderWalksBandsColumnByColumn) {
  // The drawing in hopper_tiles.hpp: 3 × 4 tiles, bands of 2 m-tiles.
  const int expect_m[] = {0, 1, 0, 1, 0, 1, 0, 1, 2, 2, 2, 2};
  const int expect_n[] = {0, 0, 1, 1, 2, 2, 3, 3, 0, 1, 2, 3};
  for (int t = 0; t < 12; ++t) {
    const auto c = kc::ch07::grouped_tile_order(t, 3, 4, 2);
    EXPECT_EQ(c.m_tile, expect_m[t]) << "tile " << t;
    EXPECT_EQ(c.n_tile, expect_n[t]) << "tile " << t;
  }
  // 4096³ with 128 × 256 tiles (32 × 16) and the kernels' band of 16: the first 132 tiles (one per
  // SM) cover 16 m-tiles and 9 n-tiles, not the 9 m-tiles and 16 n-tiles of the row-major order.
  std::set<int> ms, ns;
  for (int t = 0; t < 132; ++t) {
    const auto c = kc::ch07::grouped_tile_order(t, 32, 16, kc::ch07::kGroupM);
    ms.insert(c.m_tile);
    ns.insert(c.n_tile);
  }
  EXPECT_EQ(ms.size(), 16u);
  EXPECT_EQ(ns.size(), 9u);
  // A huge band (group_m · tiles_n beyond int) still works: one band, column by column.
  const auto far = kc::ch07::grouped_tile_order(5, 3, 1 << 30, 1 << 30);
  EXPECT_EQ(far.m_tile, 2);
  EXPECT_EQ(far.n_tile, 1);
}

// Step 5: the cluster's CTAs together cover every tile once; the only member tiles past the last
// m-tile are rank 1's in the last cluster row when tiles_m is odd (one per n-tile).
TEST(HopperPersistent, ClusterMembersCoverEveryTileOnce) {
  constexpr int kClusterM = kc::ch07::kStep5Tile.cluster_m;
  for (int tiles_m : {1, 2, 3, 15, 16, 17, 33, 64}) {
    for (int tiles_n : {1, 3, 16, 28}) {
      SCOPED_TRACE(std::to_string(tiles_m) + " x " + std::to_string(tiles_n));
      const std::int64_t cluster_tiles = kc::ch07::cluster_tile_count(tiles_m, tiles_n, kClusterM);
      EXPECT_EQ(cluster_tiles, static_cast<std::int64_t>((tiles_m + 1) / 2) * tiles_n);
      std::vector<int> seen(static_cast<std::size_t>(tiles_m * tiles_n), 0);
      int without_rows = 0;
      for (int ct = 0; ct < cluster_tiles; ++ct) {
        const auto upper = kc::ch07::cluster_member_tile(ct, 0, tiles_m, tiles_n, kc::ch07::kGroupM, kClusterM);
        const auto lower = kc::ch07::cluster_member_tile(ct, 1, tiles_m, tiles_n, kc::ch07::kGroupM, kClusterM);
        EXPECT_EQ(upper.n_tile, lower.n_tile) << "both CTAs need the same W tile: that is what they share";
        EXPECT_EQ(upper.m_tile % 2, 0);
        EXPECT_EQ(lower.m_tile, upper.m_tile + 1);
        ASSERT_LT(upper.m_tile, tiles_m) << "rank 0 always has rows of C";
        ++seen[static_cast<std::size_t>(upper.m_tile * tiles_n + upper.n_tile)];
        if (lower.m_tile < tiles_m) {
          ++seen[static_cast<std::size_t>(lower.m_tile * tiles_n + lower.n_tile)];
        } else {
          ++without_rows;
          EXPECT_EQ(lower.m_tile, tiles_m) << "only the row just past the end";
        }
      }
      for (int count : seen) ASSERT_EQ(count, 1);
      EXPECT_EQ(without_rows, tiles_m % 2 == 1 ? tiles_n : 0);
    }
  }
}

TEST(HopperPersistent, Grids) {
  // Step 4: one block per SM, fewer when there are fewer tiles, never none.
  EXPECT_EQ(kc::ch07::persistent_grid(512, 132), 132);
  EXPECT_EQ(kc::ch07::persistent_grid(128, 132), 128);
  EXPECT_EQ(kc::ch07::persistent_grid(1, 132), 1);
  EXPECT_EQ(kc::ch07::persistent_grid(std::int64_t{1} << 40, 132), 132);
  EXPECT_EQ(kc::ch07::persistent_grid(10, 0), 1) << "a device query of 0 still launches a block";
  // Step 5: whole clusters, at most the resident ones, at most one per cluster tile, never none.
  EXPECT_EQ(kc::ch07::cluster_grid(32, 16, 2, 66), 132) << "4096³: 256 cluster tiles, 66 resident clusters";
  EXPECT_EQ(kc::ch07::cluster_grid(32, 16, 2, 64), 128) << "a GPC with an odd SM left over: fewer clusters";
  EXPECT_EQ(kc::ch07::cluster_grid(1, 1, 2, 66), 2) << "one tile: one cluster, rank 1 without rows";
  EXPECT_EQ(kc::ch07::cluster_grid(3, 5, 2, 66), 20) << "ceil(3 / 2) · 5 = 10 cluster tiles";
  EXPECT_EQ(kc::ch07::cluster_grid(16, 8, 2, 0), 2) << "a query of 0 still launches one cluster";
  for (int tiles_m = 1; tiles_m < 40; ++tiles_m) {
    for (int resident : {1, 7, 66}) {
      const int grid = kc::ch07::cluster_grid(tiles_m, 3, 2, resident);
      EXPECT_EQ(grid % 2, 0) << "a grid is whole clusters";
      EXPECT_GE(grid, 2);
      EXPECT_LE(grid / 2, resident);
      EXPECT_LE(grid / 2, kc::ch07::cluster_tile_count(tiles_m, 3, 2)) << "no cluster without a tile";
    }
  }
}

// Step 5's full barrier: what each CTA expects must equal what lands in it. The bytes that land are
// simulated here sender by sender (its own A box; each rank's W slice, multicast to both), the
// expectation is the kernel's cluster_stage_bytes.
TEST(HopperPersistent, ClusterStageBytesMatchWhatLands) {
  constexpr auto tile = kc::ch07::kStep5Tile;
  constexpr auto small = kc::ch07::kStep6SmallTile;
  EXPECT_EQ(small.w_box_rows(), 64);
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(small, true, 0, 4096), 32768) << "the small tile: A + both 64-row halves";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(small, true, 128, 192), 16384 + 8192) << "its second half starts at row N";
  EXPECT_EQ(tile.w_box_rows(), 128);
  EXPECT_EQ(tile.w_box_bytes(), 16384);
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 0, 4096), 49152) << "an inner tile: A + both W halves";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 0, 8), 32768) << "N = 8: the second W half lies outside W";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, false, 0, 4096), 32768) << "no rows of C: W only, no A";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, false, 512, 520), 16384) << "neither A nor the second half";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 512, 641), 49152) << "one row of the second half is in W";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 512, 640), 32768) << "the second half starts at row N";
  // The last n-tile of the largest N (2^31 - 1): its second half starts at row 0x7FFFFF80.
  EXPECT_FALSE(kc::ch07::w_slice_in_matrix(tile, 1, 0x7FFFFF00, 0x7FFFFF80));
  EXPECT_TRUE(kc::ch07::w_slice_in_matrix(tile, 1, 0x7FFFFF00, 0x7FFFFFFF));
  for (const kc::ch07::TileConfig& t : {tile, small}) {
    for (int n : {1, 8, 64, 65, 129, 255, 256, 257, 300, 520, 1000}) {
      for (int n_tile = 0; n_tile * t.block_n < n; ++n_tile) {
        const int n0 = n_tile * t.block_n;
        int w_landing = 0;  // sent by each rank whose slice starts inside W, to both CTAs
        for (int rank = 0; rank < t.cluster_m; ++rank) {
          if (n0 + rank * t.w_box_rows() < n) w_landing += t.w_box_rows() * kc::ch07::kBlockK * 2;
        }
        for (bool has_rows : {true, false}) {
          EXPECT_EQ(kc::ch07::cluster_stage_bytes(t, has_rows, n0, n), (has_rows ? t.a_box_bytes() : 0) + w_landing)
              << "block_n " << t.block_n << ", n " << n << ", n0 " << n0 << ", has_rows " << has_rows;
        }
      }
    }
  }
}

// The pipeline counters the persistent kernels carry across tiles: after i slices, stage i mod S,
// parity (i / S) mod 2, and "wrapped" (a stage is being reused) from slice S on.
TEST(HopperPersistent, PipelineStateWrapsAndFlipsPhase) {
  for (int stages : {1, 4, 7}) {
    kc::ch07::PipelineState p;
    for (int i = 0; i < 10 * stages + 3; ++i) {
      ASSERT_EQ(p.stage, i % stages) << "slice " << i;
      ASSERT_EQ(p.phase, static_cast<std::uint32_t>((i / stages) & 1)) << "slice " << i;
      ASSERT_EQ(p.wrapped, i >= stages) << "slice " << i;
      p.advance(stages);
    }
  }
}

// The plan's rule, on the shapes of the benchmark with the H200's 66 clusters: Stream-K where the
// last round is short, whole tiles where it is full, where there is one round or less, or where
// the split would save too little.
TEST(HopperStreamK, PlanRule) {
  using kc::ch07::stream_k_plan;
  const auto expect_plan = [](kc::ch07::StreamKPlan p, int whole, int split) {
    EXPECT_EQ(p.whole_tiles, whole);
    EXPECT_EQ(p.split_tiles, split);
  };
  expect_plan(stream_k_plan(256, 66, 64), 256, 0);     // 4096³: shares of 57 slices save 7, not split
  expect_plan(stream_k_plan(576, 66, 96), 528, 48);    // 6144³: 48 / 66, split
  expect_plan(stream_k_plan(1024, 66, 128), 990, 34);  // 8192³
  expect_plan(stream_k_plan(896, 66, 32), 896, 0);     // 8192 × 7168 × 2048: shares of 19 of 32 save 13
  expect_plan(stream_k_plan(64, 66, 32), 64, 0);       // 2048³: one round, not even full
  expect_plan(stream_k_plan(132, 66, 64), 132, 0);     // two full rounds
  expect_plan(stream_k_plan(131, 66, 64), 131, 0);     // 65 of 66: too full (and a share would save nothing)
  expect_plan(stream_k_plan(115, 66, 64), 66, 49);     // shares of 48 save 16: split
  expect_plan(stream_k_plan(116, 66, 64), 116, 0);     // shares of 49 save 15: not split
  expect_plan(stream_k_plan(67, 66, 64), 67, 0);       // 64 slices for 66 clusters: shares would be empty
  expect_plan(stream_k_plan(67, 66, 200), 66, 1);      // 200 slices for 66 clusters, none empty
  expect_plan(stream_k_plan(67, 66, 8), 67, 0);        // 8 slices for 66 clusters: shares would be empty
}

// Every split slice lies in exactly one piece; a share has at most two pieces, in decreasing tile
// order, of which at most one is stored as a partial; each split tile has one owner, whose piece is
// the last of its share; and the clusters from stream_k_first_cluster up to the owner are exactly
// the ones holding pieces of the tile (the owner reads their partials).
TEST(HopperStreamK, PiecesCoverEverySliceOnceAndOwnersComeLast) {
  for (const int clusters : {1, 2, 7, 60, 66}) {
    for (const std::int64_t tiles : {3, 67, 100, 133, 256, 1000}) {
      for (const int k_tiles : {1, 4, 17, 64, 128}) {
        const kc::ch07::StreamKPlan plan = kc::ch07::stream_k_plan(tiles, clusters, k_tiles);
        SCOPED_TRACE("tiles " + std::to_string(tiles) + ", clusters " + std::to_string(clusters) + ", k_tiles " +
                     std::to_string(k_tiles));
        ASSERT_EQ(plan.whole_tiles + plan.split_tiles, tiles);
        if (plan.split_tiles == 0) continue;
        EXPECT_LT(plan.split_tiles, clusters);
        EXPECT_EQ(plan.whole_tiles % clusters, 0) << "the whole tiles fill their rounds";
        std::vector<int> covered(static_cast<std::size_t>(plan.split_slices()), 0);
        std::vector<int> owner(static_cast<std::size_t>(plan.split_tiles), -1);
        std::vector<std::set<int>> holders(static_cast<std::size_t>(plan.split_tiles));
        for (int c = 0; c < clusters; ++c) {
          int stored = 0, previous_tile = plan.split_tiles;
          bool owned_seen = false;
          for (int i = 0; i < 2; ++i) {
            const kc::ch07::StreamKPiece piece = kc::ch07::stream_k_piece(plan, c, i);
            if (piece.k_begin == piece.k_end) continue;
            ASSERT_FALSE(owned_seen) << "cluster " << c << ": a piece after the one it owns";
            ASSERT_LT(piece.tile, previous_tile) << "cluster " << c << ": pieces in decreasing tile order";
            previous_tile = piece.tile;
            ASSERT_GE(piece.k_begin, 0);
            ASSERT_LE(piece.k_end, k_tiles);
            for (int k = piece.k_begin; k < piece.k_end; ++k) {
              ++covered[static_cast<std::size_t>(piece.tile) * k_tiles + k];
            }
            holders[piece.tile].insert(c);
            if (piece.k_end == k_tiles) {
              ASSERT_EQ(owner[piece.tile], -1) << "tile " << piece.tile << " has two owners";
              owner[piece.tile] = c;
              owned_seen = true;
            } else {
              ++stored;
            }
          }
          EXPECT_LE(stored, 1) << "cluster " << c << " stores more than one partial";
          EXPECT_LT(plan.share_begin(c), plan.share_begin(c + 1)) << "cluster " << c << ": empty share";
        }
        for (std::size_t slice = 0; slice < covered.size(); ++slice) {
          ASSERT_EQ(covered[slice], 1) << "split slice " << slice;
          EXPECT_EQ(plan.cluster_of_slice(static_cast<std::int64_t>(slice)),
                    [&] {
                      int c = 0;
                      while (plan.share_begin(c + 1) <= static_cast<std::int64_t>(slice)) ++c;
                      return c;
                    }())
              << "slice " << slice;
        }
        for (int t = 0; t < plan.split_tiles; ++t) {
          ASSERT_GE(owner[t], 0) << "tile " << t << " has no owner";
          std::set<int> expected;
          for (int c = kc::ch07::stream_k_first_cluster(plan, t); c <= owner[t]; ++c) expected.insert(c);
          EXPECT_EQ(holders[t], expected) << "tile " << t;
        }
      }
    }
  }
}

TEST(HopperStreamK, WorkspaceBytes) {
  // A flag region for 256 clusters, then 4 partials of 64 × 256 fp32 per cluster.
  EXPECT_EQ(kc::ch07::hopper_workspace_bytes(132), 4096u + 66u * 4u * 65536u);
  EXPECT_EQ(kc::ch07::hopper_workspace_bytes(133), kc::ch07::hopper_workspace_bytes(132))
      << "an odd SM holds no cluster";
  expect_invalid_argument([] { kc::ch07::hopper_workspace_bytes(1); }, "sms (1) must be at least 2");
  expect_invalid_argument([] { kc::ch07::hopper_workspace_bytes(514); }, "sms (514) must be at most 512");
}

TEST(HopperStreamK, RejectsBadWorkspace) {
  HostBuffer a, w, c;
  alignas(16) static unsigned char scratch[4096 + 64];
  const GemmShape s{2, 2, 8};
  const auto validate = [&](const void* workspace, std::size_t bytes) {
    kc::ch07::validate_hopper_workspace(a.data, w.data, c.data, s, workspace, bytes, 4096);
  };
  expect_invalid_argument([&] { validate(nullptr, 4096); }, "workspace must not be null");
  expect_invalid_argument([&] { validate(scratch + 8, 4096); }, "workspace must be 16-byte aligned");
  expect_invalid_argument([&] { validate(scratch, 4095); }, "workspace_bytes (4095) must be at least 4096");
  expect_invalid_argument([&] { validate(c.data, 4096); }, "workspace must not overlap a, w or c");
  expect_invalid_argument([&] { validate(a.data, 4096); }, "workspace must not overlap a, w or c");
  EXPECT_NO_THROW(validate(scratch, 4096));
}

// ---------------------------------------------------------------- GPU

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

// One step on one shape: poisoned C with a guard, every element written, nothing past the end,
// fp64 reference (all or sampled), and for the larger shapes every element against cuBLAS.
// One launch of a Chapter 7 kernel on the default stream: a step, `after`, or a tuning alternative.
using Launch = std::function<void(const bf16* a, const bf16* w, bf16* c, GemmShape shape, cudaStream_t stream)>;

Launch step_launch(HopperStep step) {
  return [step](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
    kc::ch07::gemm_bf16_hopper_step(step, a, w, c, s, q);
  };
}

// gemm_bf16_hopper without a workspace: every tile whole.
Launch whole_tiles_launch() {
  return [](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
    kc::ch07::gemm_bf16_hopper(a, w, c, s, q);
  };
}

// The Stream-K launch's workspace, shared by every test of this program: zero-filled once, as the
// API asks; each launch must leave it zero-filled for the next (StreamKRepeatsAndLeavesItsFlagsDown).
kc::DeviceBuffer<unsigned char>& stream_k_workspace() {
  static kc::DeviceBuffer<unsigned char> workspace = [] {
    kc::DeviceBuffer<unsigned char> fresh(kc::ch07::gemm_bf16_hopper_workspace_bytes());
    fresh.fill_bytes(0);
    return fresh;
  }();
  return workspace;
}

// `after`: gemm_bf16_hopper with its workspace (Stream-K where the plan splits the last round).
Launch after_launch() {
  return [](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
    kc::DeviceBuffer<unsigned char>& workspace = stream_k_workspace();
    kc::ch07::gemm_bf16_hopper(a, w, c, s, workspace.data(), workspace.size(), q);
  };
}

Launch tuning_launch(kc::ch07::HopperTuning tuning) {
  return [tuning](const bf16* a, const bf16* w, bf16* c, GemmShape s, cudaStream_t q) {
    kc::ch07::gemm_bf16_hopper_tuning(tuning, a, w, c, s, q);
  };
}

// Every kernel of the chapter by name: the six steps, `after` and step 6's tuning alternatives.
std::vector<std::pair<std::string, Launch>> every_launch() {
  std::vector<std::pair<std::string, Launch>> launches;
  for (HopperStep step : kSteps) launches.emplace_back(kc::ch07::to_string(step), step_launch(step));
  launches.emplace_back("after", after_launch());
  launches.emplace_back("whole_tiles", whole_tiles_launch());
  for (auto tuning : kTunings) {
    launches.emplace_back(kc::ch07::to_string(tuning), tuning_launch(tuning));
  }
  return launches;
}

// @p launch on fresh random inputs of shape @p s into a poisoned, guarded C: every element written,
// nothing past the end, close to the fp64 reference on samples and (@p against_cublas) to cuBLAS on
// every element.
void check_launch(const std::string& name, const Launch& launch, GemmShape s, bool against_cublas) {
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

void check_step(HopperStep step, GemmShape s, bool against_cublas) {
  check_launch(kc::ch07::to_string(step), step_launch(step), s, against_cublas);
}

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

// Step 6's measured alternatives (the tuning rows), on shapes that exercise the whole-tile store (N a
// multiple of 8: TMA stores; the last n-tile partly outside C), the register fallback, and several
// tiles per cluster (the staging buffer reused; the held stage released at the next tile's first
// or second slice, or at its only one when K = 64).
class HopperTuningGpu : public HopperGpuTest, public ::testing::WithParamInterface<kc::ch07::HopperTuning> {};

TEST_P(HopperTuningGpu, MatchesReference) {
  const kc::ch07::HopperTuning tuning = GetParam();
  for (const GemmShape s :
       {GemmShape{129, 264, 520}, GemmShape{300, 392, 1032}, GemmShape{2100, 4104, 72}, GemmShape{2100, 4100, 72},
        GemmShape{127, 131, 64}, GemmShape{1, 8, 16}, GemmShape{2100, 4104, 64}, GemmShape{1100, 4104, 1032}}) {
    check_launch(kc::ch07::to_string(tuning), tuning_launch(tuning), s, false);
  }
}

INSTANTIATE_TEST_SUITE_P(Tunings, HopperTuningGpu, ::testing::ValuesIn(kTunings),
                         [](const ::testing::TestParamInfo<kc::ch07::HopperTuning>& info) {
                           return std::string(kc::ch07::to_string(info.param));
                         });

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

// c only 2-byte aligned (an odd element offset) and N even: the launch must fall back to element
// stores, and still write every element.
// Step 6 with N a multiple of 8 but c only 8-byte aligned (4 elements in) falls back to register
// stores too; with c 16-byte aligned (8 elements in) it stores through TMA from an offset base.
TEST_F(HopperGpuTest, OddOutputOffsetUsesElementStores) {
  struct Case {
    GemmShape shape;
    int offset;  // elements between the allocation and c
  };
  for (const Case& k : {Case{{70, 130, 64}, 1}, Case{{70, 136, 64}, 4}, Case{{70, 136, 64}, 8}}) {
    const GemmShape s = k.shape;
    SCOPED_TRACE(shape_name(s) + ", c at element " + std::to_string(k.offset));
    const Inputs in = random_inputs(s, kc::test::test_seed());
    kc::DeviceBuffer<bf16> a(in.a), w(in.w);
    const auto offset = static_cast<std::size_t>(k.offset);
    kc::test::GuardedOutput<bf16> storage(static_cast<std::size_t>(s.m * s.n) + offset);
    for (const auto& [name, launch] : every_launch()) {
      storage.poison();
      launch(a.data(), w.data(), storage.data() + offset, s, nullptr);
      kc::check(cudaDeviceSynchronize());
      const std::vector<bf16> all = storage.to_host();
      EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(all.data(), offset), kc::test::kPoisonByte), offset)
          << name << " wrote before c";
      const std::span<const bf16> got(all.data() + offset, all.size() - offset);
      kc::test::expect_close(compare_with_reference(in, got, s, 0), kTolerance, name);
      EXPECT_EQ(storage.guard_damage(), 0u) << name;
    }
  }
}

// Graph capture (global mode: any synchronisation or allocation in the launch path fails it) and
// bitwise repeatability, for every kernel.
TEST_F(HopperGpuTest, GraphCapturableAndRepeatable) {
  // N = 296 also takes step 6's TMA-store path (N a multiple of 8); N = 300 its register fallback.
  for (const GemmShape s : {GemmShape{257, 300, 1032}, GemmShape{257, 296, 1032}}) {
    const Inputs in = random_inputs(s, kc::test::test_seed());
    kc::DeviceBuffer<bf16> a(in.a), w(in.w);
    kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
    for (const auto& [name, launch] : every_launch()) {
      SCOPED_TRACE(name + ", " + shape_name(s));
      kc::test::LaunchUnderTest run{
          [&, launch = launch](cudaStream_t stream) { launch(a.data(), w.data(), c.data(), s, stream); },
          [&] { c.poison(); },
          [&] {
            const std::vector<bf16> host = c.to_host();
            const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
            return std::vector<unsigned char>(bytes, bytes + host.size() * sizeof(bf16));
          }};
      kc::test::expect_graph_capturable(run);
      kc::test::expect_bitwise_repeatable(run);
    }
  }
}

// `after` is a programmatic dependent launch: its blocks may start while the previous kernel in the
// stream still runs, and must wait for it before touching memory. Two pairs of launches on one
// stream, one per hazard, each against step 6 run launch by launch with a synchronisation between
// them, bit for bit (the same kernel code, the same order of sums):
//   - read after write: X = A·W1ᵀ, then Y = X·W2ᵀ reads the X the first launch is writing;
//   - write after read: X = A·W1ᵀ, then A = B·Vᵀ overwrites the A the first launch is reading.
// The first launch of each pair is long (2048 × 2048 × 4096, several µs per tile), so a second launch
// that did not wait would read X before it is written or overwrite A before it is read.
TEST_F(HopperGpuTest, AfterWaitsForThePreviousKernel) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shapes";
  const GemmShape first{2048, 2048, 4096};    // X = A·W1ᵀ
  const GemmShape chained{2048, 264, 2048};   // Y = X·W2ᵀ
  const GemmShape overwrite{2048, 4096, 72};  // A = B·Vᵀ, A's own shape
  const std::uint64_t seed = kc::test::test_seed();
  const Inputs in_first = random_inputs(first, seed);
  const Inputs in_chained = random_inputs(chained, seed + 1);
  const Inputs in_overwrite = random_inputs(overwrite, seed + 2);
  kc::DeviceBuffer<bf16> w1(in_first.w), w2(in_chained.w), b(in_overwrite.a), v(in_overwrite.w);
  const auto step6 = [](const bf16* a, const bf16* w, bf16* c, GemmShape s) {
    kc::ch07::gemm_bf16_hopper_step(HopperStep::tma_store, a, w, c, s);
    kc::check(cudaDeviceSynchronize());
  };
  const Launch after = after_launch();  // none of these shapes splits its last round: whole tiles, as step 6
  const auto elements = [](GemmShape s) { return static_cast<std::size_t>(s.m * s.n); };
  const auto same_bits = [](const kc::DeviceBuffer<bf16>& got, const kc::DeviceBuffer<bf16>& want) {
    const std::vector<bf16> g = got.to_host(), w = want.to_host();
    return g.size() == w.size() && std::memcmp(g.data(), w.data(), g.size() * sizeof(bf16)) == 0;
  };

  // Read after write.
  {
    kc::DeviceBuffer<bf16> a(in_first.a), x_want(elements(first)), y_want(elements(chained));
    step6(a.data(), w1.data(), x_want.data(), first);
    step6(x_want.data(), w2.data(), y_want.data(), chained);
    kc::DeviceBuffer<bf16> x(elements(first)), y(elements(chained));
    x.fill_bytes(kc::test::kPoisonByte);
    y.fill_bytes(kc::test::kPoisonByte);
    kc::check(cudaDeviceSynchronize());
    after(a.data(), w1.data(), x.data(), first, nullptr);
    after(x.data(), w2.data(), y.data(), chained, nullptr);
    kc::check(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(x, x_want)) << "X = A·W1ᵀ differs from step 6";
    EXPECT_TRUE(same_bits(y, y_want)) << "Y = X·W2ᵀ read X before the launch writing it had finished";
  }
  // Write after read.
  {
    kc::DeviceBuffer<bf16> a(in_first.a), x_want(elements(first)), a_want(elements(overwrite));
    step6(a.data(), w1.data(), x_want.data(), first);
    step6(b.data(), v.data(), a_want.data(), overwrite);
    kc::DeviceBuffer<bf16> x(elements(first));
    x.fill_bytes(kc::test::kPoisonByte);
    kc::check(cudaDeviceSynchronize());
    after(a.data(), w1.data(), x.data(), first, nullptr);
    after(b.data(), v.data(), a.data(), overwrite, nullptr);
    kc::check(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(x, x_want)) << "X = A·W1ᵀ read an A that the next launch had overwritten";
    EXPECT_TRUE(same_bits(a, a_want)) << "A = B·Vᵀ differs from step 6";
  }
}

// The measurements run the kernel's loads (and math) but write nothing: C stays poisoned, also
// through the TMA-store path (N a multiple of 8) and on several tiles per cluster.
TEST_F(HopperGpuTest, MeasurementsWriteNothing) {
  for (const auto measurement :
       {kc::ch07::HopperTuning::step6_mainloop_only, kc::ch07::HopperTuning::step6_loads_only,
        kc::ch07::HopperTuning::step6_small_loads_only, kc::ch07::HopperTuning::step6_stage_only})
    for (const GemmShape s : {GemmShape{129, 264, 520}, GemmShape{2100, 4104, 72}, GemmShape{127, 131, 64}}) {
      SCOPED_TRACE(std::string(kc::ch07::to_string(measurement)) + ", " + shape_name(s));
      const Inputs in = random_inputs(s, kc::test::test_seed());
      kc::DeviceBuffer<bf16> a(in.a), w(in.w);
      kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
      kc::ch07::gemm_bf16_hopper_tuning(measurement, a.data(), w.data(), c.data(), s);
      kc::check(cudaDeviceSynchronize());
      const std::vector<bf16> got = c.to_host();
      EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(got), kc::test::kPoisonByte), got.size()) << "wrote into c";
      EXPECT_EQ(c.guard_damage(), 0u);
    }
}

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
    ASSERT_GT(kc::ch07::gemm_bf16_hopper_stream_k_plan(s).split_tiles, 0) << shape_name(s) << " must split here";
    check_launch("after", after_launch(), s, false);
  }
  if (kc::test::small_tests_only()) return;  // KC_SMALL_TESTS: no large shapes
  for (const GemmShape s : {GemmShape{6144, 6144, 6144}, GemmShape{8192, 8192, 4096}}) {
    ASSERT_GT(kc::ch07::gemm_bf16_hopper_stream_k_plan(s).split_tiles, 0) << shape_name(s) << " must split here";
    check_launch("after", after_launch(), s, true);
  }
}

// Stream-K is bitwise repeatable (the owner adds the partials in a fixed order), graph-capturable,
// and leaves every flag of its workspace down after each launch, as the next launch needs.
TEST_F(HopperGpuTest, StreamKRepeatsAndLeavesItsFlagsDown) {
  const GemmShape s = kSplitShapes[0];
  const Inputs in = random_inputs(s, kc::test::test_seed());
  kc::DeviceBuffer<bf16> a(in.a), w(in.w);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  const Launch launch = after_launch();
  const auto flags_down = [] {
    std::vector<std::int32_t> flags(kc::ch07::detail::StreamKWorkspace::kFlagBytes / sizeof(std::int32_t));
    kc::check(cudaMemcpy(flags.data(), stream_k_workspace().data(), flags.size() * sizeof(std::int32_t),
                         cudaMemcpyDeviceToHost));
    for (std::int32_t f : flags)
      if (f != 0) return false;
    return true;
  };
  kc::test::LaunchUnderTest run{[&](cudaStream_t stream) { launch(a.data(), w.data(), c.data(), s, stream); },
                                [&] { c.poison(); },
                                [&] {
                                  EXPECT_TRUE(flags_down()) << "a flag was left up";
                                  const std::vector<bf16> host = c.to_host();
                                  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
                                  return std::vector<unsigned char>(bytes, bytes + host.size() * sizeof(bf16));
                                }};
  kc::test::expect_graph_capturable(run);
  kc::test::expect_bitwise_repeatable(run);
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

// On a GPU that is not sm_90 the launch says what it needs (and launches nothing).
class HopperGemmOtherGpu : public kc::test::GpuTest {};

TEST_F(HopperGemmOtherGpu, SaysWhatItNeeds) {
  if (!kc::ch07::hopper_unsupported_reason(device().cc_major, device().cc_minor)) {
    GTEST_SKIP() << "this GPU is sm_90: the kernels run here (the other GPU tests cover it)";
  }
  kc::DeviceBuffer<bf16> a(64), w(64), c(64);
  c.fill_bytes(kc::test::kPoisonByte);
  try {
    kc::ch07::gemm_bf16_hopper(a.data(), w.data(), c.data(), {8, 8, 8});
    ADD_FAILURE() << "expected kc::ch07::UnsupportedGpu";
  } catch (const kc::ch07::UnsupportedGpu& e) {
    EXPECT_NE(std::string(e.what()).find("sm_90"), std::string::npos) << e.what();
  }
  const std::vector<bf16> after = c.to_host();
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(after), kc::test::kPoisonByte), after.size()) << "nothing written";
}

}  // namespace
