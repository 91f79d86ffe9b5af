// Chapter 7's CPU tests of the rules a launch checks: arguments, the step table, the tensor maps
// and their rules, the Stream-K workspace. They run everywhere (no GPU involved).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hopper_gemm.hpp"
#include "hopper_gemm_checks.hpp"
#include "hopper_launch.hpp"
#include "hopper_tiles.hpp"
#include "tensor_map.hpp"

namespace {

using namespace kc::test::hopper;  // NOLINT: the chapter's test vocabulary

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

}  // namespace
