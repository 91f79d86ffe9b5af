// Chapter 4 tests: the rules that run on the host everywhere (argument checks, the fp64 reference
// on hand-computed cases, the warp primitives' host arithmetic).
// The shared inputs, paths and checks, with the tolerances and why, are in moe_gating_checks.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "moe_gating_checks.hpp"

namespace {

using namespace kc::test::moe_gating;
using kc::test::expect_invalid_argument;

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------- CPU: argument rules

TEST(MoeGatingArguments, RejectsBadShapes) {
  float x = 0;
  std::int32_t i = 0;
  const kc::ch04::GatingOutputs out{&x, &i, nullptr};
  auto v = [&](GatingParams p) { kc::ch04::validate_gating(p, &x, nullptr, out); };
  expect_invalid_argument([&] { v(softmax_params(-1, 8, 2)); }, "num_tokens (-1) must be >= 0");
  expect_invalid_argument([&] { v(softmax_params(1, 0, 1)); }, "num_experts (0) must be >= 1");
  expect_invalid_argument([&] { v(softmax_params(1, 513, 2)); }, "num_experts (513) must be <= 512");
  expect_invalid_argument([&] { v(softmax_params(1, 8, 0)); }, "k (0) must be >= 1");
  expect_invalid_argument([&] { v(softmax_params(1, 8, 9)); }, "k (9) must be <= num_experts (8)");
  expect_invalid_argument([&] { v(softmax_params(1, 64, 33)); }, "k (33) must be <= 32");
}

TEST(MoeGatingArguments, RejectsBadDeepSeekGroups) {
  float x = 0;
  std::int32_t i = 0;
  const kc::ch04::GatingOutputs out{&x, &i, nullptr};
  auto v = [&](GatingParams p) { kc::ch04::validate_gating(p, &x, nullptr, out); };
  expect_invalid_argument([&] { v(dsv3_params(1, 60, 8, 8, 4)); }, "num_experts (60) must be divisible by n_group (8)");
  expect_invalid_argument([&] { v(dsv3_params(1, 256, 8, 4, 5)); }, "topk_group (5) must be <= n_group (4)");
  expect_invalid_argument([&] { v(dsv3_params(1, 256, 8, 0, 1)); }, "n_group (0) must be in [1, 32]");
  expect_invalid_argument([&] { v(dsv3_params(1, 16, 8, 8, 2)); },
                          "k (8) must be <= topk_group * experts per group (4)");
  GatingParams p = dsv3_params(1);
  p.routed_scaling_factor = std::nanf("");
  expect_invalid_argument([&] { v(p); }, "routed_scaling_factor");
  expect_invalid_argument([&] { kc::ch04::validate_gating(softmax_params(1, 8, 2), &x, &x, out); },
                          "correction_bias must be null unless scoring is deepseek_v3");
}

TEST(MoeGatingArguments, RejectsNullPointersOnlyWhenThereAreTokens) {
  float x = 0;
  std::int32_t i = 0;
  expect_invalid_argument(
      [&] {
        kc::ch04::validate_gating(softmax_params(1, 8, 2), nullptr, nullptr, {&x, &i});
      },
      "logits must not be null");
  expect_invalid_argument(
      [&] {
        kc::ch04::validate_gating(softmax_params(1, 8, 2), &x, nullptr, {nullptr, &i});
      },
      "out.weights must not be null");
  expect_invalid_argument(
      [&] {
        kc::ch04::validate_gating(softmax_params(1, 8, 2), &x, nullptr, {&x, nullptr});
      },
      "out.ids must not be null");
  EXPECT_NO_THROW(kc::ch04::validate_gating(softmax_params(0, 8, 2), nullptr, nullptr, {}));
}

// Every launch function validates before touching CUDA: these throw without a GPU.
TEST(MoeGatingArguments, LaunchFunctionsRejectBeforeAnyCudaCall) {
  const GatingParams bad = softmax_params(4, 8, 9);
  expect_invalid_argument([&] { kc::ch04::gating_after(bad, static_cast<const float*>(nullptr), nullptr, {}); },
                          "k (9) must be <= num_experts (8)");
  expect_invalid_argument(
      [&] { kc::ch04::gating_before(bad, static_cast<const float*>(nullptr), nullptr, {}, nullptr, 0); },
      "k (9) must be <= num_experts (8)");
  alignas(16) static unsigned char arena[1024];  // fake device buffers, never dereferenced
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_before(softmax_params(4, 8, 2), reinterpret_cast<const float*>(arena), nullptr,
                                {reinterpret_cast<float*>(arena + 256), reinterpret_cast<std::int32_t*>(arena + 512)},
                                arena + 768, 4);
      },
      "workspace_bytes (4) must be >= gating_before_workspace_bytes(params)");
  EXPECT_NO_THROW(kc::ch04::gating_after(softmax_params(0, 8, 2), static_cast<const float*>(nullptr), nullptr, {}))
      << "T = 0 must launch nothing";
  EXPECT_EQ(kc::ch04::gating_before_workspace_bytes(softmax_params(0, 8, 2)), 0u);
}

// `after` runs the lean kernels (steps 2 and 3), which count rows in 32 bits, up to 2^30 logits,
// and step 1's packed-key kernel beyond.
TEST(MoeGatingArguments, LeanKernelsRunUpTo2To30Logits) {
  EXPECT_TRUE(kc::ch04::gating_rows_fit_int32(softmax_params(0, 8, 2)));
  EXPECT_TRUE(kc::ch04::gating_rows_fit_int32(softmax_params(65536, 256, 8)));
  EXPECT_TRUE(kc::ch04::gating_rows_fit_int32(softmax_params(std::int64_t{1} << 22, 256, 8)));  // exactly 2^30
  EXPECT_FALSE(kc::ch04::gating_rows_fit_int32(softmax_params((std::int64_t{1} << 22) + 1, 256, 8)));
  EXPECT_TRUE(kc::ch04::gating_rows_fit_int32(softmax_params((std::int64_t{1} << 30) / 384, 384, 8)));
  EXPECT_FALSE(kc::ch04::gating_rows_fit_int32(softmax_params((std::int64_t{1} << 30) / 384 + 1, 384, 8)));
  EXPECT_FALSE(kc::ch04::gating_rows_fit_int32(softmax_params(std::int64_t{1} << 40, 8, 2)));
}

// No output may overlap another argument; the rule is checked on the host, before any CUDA call,
// so fake device addresses are enough (nothing is dereferenced).
TEST(MoeGatingArguments, RejectsOverlappingBuffers) {
  const GatingParams p = softmax_params(4, 8, 2);  // logits 128 bytes, weights and ids 32, counts 32
  alignas(16) static unsigned char arena[4096];
  const auto at = [&](std::size_t offset) { return arena + offset; };
  const auto* logits = reinterpret_cast<const float*>(at(0));
  auto* weights = reinterpret_cast<float*>(at(1024));
  auto* ids = reinterpret_cast<std::int32_t*>(at(2048));
  auto* counts = reinterpret_cast<std::int32_t*>(at(3072));
  EXPECT_NO_THROW(kc::ch04::validate_gating(p, logits, nullptr, {weights, ids, counts}));
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_after(p, logits, nullptr, {weights, reinterpret_cast<std::int32_t*>(at(1024 + 28)), counts});
      },
      "out.weights and out.ids must not overlap");
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_after(p, logits, nullptr, {weights, ids, reinterpret_cast<std::int32_t*>(at(2048 + 16))});
      },
      "out.ids and out.counts must not overlap");
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_after(p, logits, nullptr, {reinterpret_cast<float*>(at(124)), ids, counts});
      },
      "logits and out.weights must not overlap");
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_after(p, logits, nullptr, {weights, ids, reinterpret_cast<std::int32_t*>(at(100))});
      },
      "logits and out.counts must not overlap");
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_before(p, logits, nullptr, {weights, ids, reinterpret_cast<std::int32_t*>(at(1024))}, at(3500),
                                4096);
      },
      "out.weights and out.counts must not overlap");
  // bf16 logits take half the bytes: weights right after 64 bytes of bf16 logits do not overlap.
  const auto* bf16_logits = reinterpret_cast<const __nv_bfloat16*>(at(0));
  EXPECT_NO_THROW(
      kc::ch04::validate_gating(p, bf16_logits, nullptr, {reinterpret_cast<float*>(at(64)), ids, counts}, 2));
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_after(p, bf16_logits, nullptr, {reinterpret_cast<float*>(at(60)), ids, counts});
      },
      "logits and out.weights must not overlap");
  // DeepSeek-V3's bias is an input too.
  const GatingParams d = dsv3_params(4, 8, 2, 2, 1);
  expect_invalid_argument(
      [&] {
        kc::ch04::gating_after(d, logits, reinterpret_cast<const float*>(at(3072 - 8)), {weights, ids, counts});
      },
      "correction_bias and out.counts must not overlap");
  // Inputs may share memory; an empty problem's ranges overlap nothing.
  EXPECT_NO_THROW(kc::ch04::validate_gating(d, logits, logits, {weights, ids, counts}));
  EXPECT_NO_THROW(kc::ch04::validate_gating(softmax_params(0, 8, 2), logits, nullptr,
                                            {weights, reinterpret_cast<std::int32_t*>(weights), nullptr}));
}

// ---------------------------------------------------------------- CPU: the reference itself

TEST(MoeGatingReference, SoftmaxThenTopkByHand) {
  // logits [0, ln 2, ln 4, 0]: probabilities 1/8, 2/8, 4/8, 1/8.
  const std::vector<double> logits = {0.0, std::log(2.0), std::log(4.0), 0.0};
  const GatingReference r = kc::ch04::gating_reference(softmax_params(1, 4, 2), logits);
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{2, 1}));
  EXPECT_NEAR(r.weights[0], 0.5, 1e-15);
  EXPECT_NEAR(r.weights[1], 0.25, 1e-15);
  const GatingReference n = kc::ch04::gating_reference(softmax_params(1, 4, 2, true), logits);
  EXPECT_NEAR(n.weights[0], 2.0 / 3.0, 1e-15);
  EXPECT_NEAR(n.weights[1], 1.0 / 3.0, 1e-15);
  EXPECT_EQ(r.counts, (std::vector<std::int32_t>{0, 1, 1, 0}));
}

TEST(MoeGatingReference, TopkThenSoftmaxEqualsRenormalisedSoftmax) {
  std::vector<double> logits(3 * 60);
  kc::fill_uniform(std::span<double>(logits), 7, -4.0, 4.0);
  GatingParams p = softmax_params(3, 60, 6, true);
  const GatingReference a = kc::ch04::gating_reference(p, logits);
  p.scoring = Scoring::topk_then_softmax;
  p.renormalize = false;
  const GatingReference b = kc::ch04::gating_reference(p, logits);
  EXPECT_EQ(a.ids, b.ids);
  for (std::size_t i = 0; i < a.weights.size(); ++i) EXPECT_NEAR(a.weights[i], b.weights[i], 1e-15);
}

TEST(MoeGatingReference, TiesPickTheLowerId) {
  const std::vector<double> logits = {1.0, 3.0, 2.0, 3.0, -0.0, 0.0};
  const GatingReference r = kc::ch04::gating_reference(softmax_params(1, 6, 6), logits);
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{1, 3, 2, 0, 4, 5})) << "-0 and +0 are equal: lower id first";
  EXPECT_EQ(r.weights[0], r.weights[1]);
}

TEST(MoeGatingReference, NanRanksLastAndWeighsZero) {
  const std::vector<double> logits = {kNan, -kInf, 0.0, kNan};
  const GatingReference r = kc::ch04::gating_reference(softmax_params(1, 4, 4), logits);
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{2, 1, 0, 3}));
  EXPECT_EQ(r.weights, (std::vector<double>{1.0, 0.0, 0.0, 0.0}));
}

TEST(MoeGatingReference, PlusInfinityWinsAndSharesTheMass) {
  const std::vector<double> logits = {5.0, kInf, 1.0, kInf};
  const GatingReference r = kc::ch04::gating_reference(softmax_params(1, 4, 3), logits);
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{1, 3, 0}));
  EXPECT_EQ(r.weights, (std::vector<double>{0.5, 0.5, 0.0}));
}

TEST(MoeGatingReference, AllMinusInfinityRowGivesZeroWeights) {
  const std::vector<double> logits(8, -kInf);
  for (Scoring s : {Scoring::softmax_then_topk, Scoring::topk_then_softmax}) {
    GatingParams p = softmax_params(1, 8, 3, true);
    p.scoring = s;
    const GatingReference r = kc::ch04::gating_reference(p, logits);
    EXPECT_EQ(r.ids, (std::vector<std::int32_t>{0, 1, 2}));
    EXPECT_EQ(r.weights, (std::vector<double>(3, 0.0)));
  }
}

TEST(MoeGatingReference, DeepSeekMaskedGroupCanHoldAHigherScore) {
  // 4 groups of 2 experts, keep 2 groups, k = 2. Group 0 holds the single best score (expert 0) but
  // a poor partner; groups 1 and 2 have better top-2 sums. Logits 0 -> sigmoid 0.5; bias sets the rest.
  GatingParams p = dsv3_params(1, 8, 2, 4, 2);
  p.routed_scaling_factor = 1.0f;
  const std::vector<double> logits(8, 0.0);
  const std::vector<double> bias = {0.40, -0.40, 0.30, 0.20, 0.25, 0.25, -0.5, -0.5};
  // choice: 0.90 0.10 | 0.80 0.70 | 0.75 0.75 | 0.0 0.0 -> group sums 1.0, 1.5, 1.5, 0.0: keep 1 and 2.
  const GatingReference r = kc::ch04::gating_reference(p, logits, bias);
  // Among experts 2..5: 2 (0.80) then 4 and 5 (0.75, tie -> 4); k = 2 -> {2, 4}. Expert 0 (0.90) is
  // excluded. Weights are the unbiased scores (0.5 each), renormalised: 0.5 each; ties -> lower id.
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{2, 4}));
  EXPECT_NEAR(r.weights[0], 0.5, 1e-15);
  EXPECT_NEAR(r.weights[1], 0.5, 1e-15);
}

TEST(MoeGatingReference, DeepSeekWeightsAreScaledUnbiasedScoresSortedByWeight) {
  GatingParams p = dsv3_params(1, 4, 2, 1, 1);
  const std::vector<double> logits = {0.0, 2.0, -1.0, 1.0};
  const std::vector<double> bias = {1.0, 0.0, 0.0, 0.0};  // selection: 1.5, 0.88, 0.27, 0.73
  const GatingReference r = kc::ch04::gating_reference(p, logits, bias);
  const double s0 = 0.5, s1 = 1.0 / (1.0 + std::exp(-2.0));
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{1, 0})) << "sorted by the unbiased weight, not the biased score";
  EXPECT_NEAR(r.weights[0], s1 / (s0 + s1) * 2.5, 1e-12);
  EXPECT_NEAR(r.weights[1], s0 / (s0 + s1) * 2.5, 1e-12);
}

// Logits of +-1e4: every probability but the winners' underflows to 0, even in double. The ranking
// is by logit (ties by lower id), never by the underflowed probability.
TEST(MoeGatingReference, HugeLogitsRankByLogitNotByUnderflowedProbability) {
  GatingParams p = softmax_params(1, 6, 4);
  const std::vector<double> logits = {-1e4, 1e4, -2e4, 3e3, -5e3, 1e4};
  const GatingReference ref = kc::ch04::gating_reference(p, logits);
  EXPECT_EQ(ref.ids, (std::vector<std::int32_t>{1, 5, 3, 4}));
  EXPECT_EQ(ref.weights, (std::vector<double>{0.5, 0.5, 0.0, 0.0}));
}

TEST(MoeGatingReference, RejectsWrongSpanLengths) {
  expect_invalid_argument([] { kc::ch04::gating_reference(softmax_params(2, 4, 1), std::vector<double>(7)); },
                          "logits has 7 elements");
}

// The GPU tests' reference runs on row slices in parallel; joined, it must be the one-call reference.
TEST(MoeGatingReference, RowSlicesJoinToTheWholeReference) {
  std::vector<float> logits, bias;
  dsv3_inputs(3001, 64, 7, logits, bias);
  const std::vector<double> bias64(bias.begin(), bias.end());
  for (const GatingParams& p : {softmax_params(5003, 64, 6, true), dsv3_params(3001, 64, 6, 8, 3)}) {
    const std::vector<double> x = p.scoring == Scoring::deepseek_v3 ? widen(logits) : widen(grid_logits(5003 * 64, 3));
    const std::vector<double> b = p.scoring == Scoring::deepseek_v3 ? bias64 : std::vector<double>{};
    const GatingReference whole = kc::ch04::gating_reference(p, x, b);
    const GatingReference joined = reference(p, x, b);
    EXPECT_EQ(joined.ids, whole.ids);
    EXPECT_EQ(joined.weights, whole.weights);
    EXPECT_EQ(joined.counts, whole.counts);
  }
}

// ---------------------------------------------------------------- the warp primitives' cost

using kc::ch04::PrimitiveMode;
using kc::ch04::PrimitiveSample;
using kc::ch04::WarpPrimitive;
using kc::ch04::WarpPrimitiveConfig;

TEST(WarpPrimitiveArguments, RulesAreNamed) {
  const PrimitiveSample sample;
  const auto v = [&](WarpPrimitiveConfig c, int sms = 132) { kc::ch04::validate_warp_primitive(c, sms, &sample); };
  WarpPrimitiveConfig c = primitive_config(WarpPrimitive::redux_max, PrimitiveMode::throughput);
  EXPECT_NO_THROW(v(c));
  c.primitive = static_cast<WarpPrimitive>(7);
  expect_invalid_argument([&] { v(c); }, "config.primitive (7) must be a WarpPrimitive value");
  c = primitive_config(WarpPrimitive::redux_max, static_cast<PrimitiveMode>(2));
  expect_invalid_argument([&] { v(c); }, "config.mode (2) must be a PrimitiveMode value");
  c = primitive_config(WarpPrimitive::shfl_xor, PrimitiveMode::throughput);
  c.warps_per_block = 33;
  expect_invalid_argument([&] { v(c); }, "config.warps_per_block (33) must be in [1, 32]");
  c.warps_per_block = 16;
  c.blocks_per_sm = 0;
  expect_invalid_argument([&] { v(c); }, "config.blocks_per_sm (0) must be in [1, 8]");
  c.blocks_per_sm = 5;
  expect_invalid_argument([&] { v(c); }, "config.warps_per_block x config.blocks_per_sm (16 x 5) must be at most 64");
  c.blocks_per_sm = 4;
  c.iterations = 0;
  expect_invalid_argument([&] { v(c); }, "config.iterations (0) must be >= 1");
  c.iterations = 1;
  expect_invalid_argument([&] { v(c, 0); }, "sm_count (0) must be >= 1");
  expect_invalid_argument([&] { kc::ch04::validate_warp_primitive(c, 132, nullptr); }, "samples must not be null");
  expect_invalid_argument([&] { kc::ch04::warp_primitive(c, 132, nullptr); }, "samples must not be null");
}

TEST(WarpPrimitiveArguments, BlocksAndWork) {
  WarpPrimitiveConfig c = primitive_config(WarpPrimitive::vote_any, PrimitiveMode::latency, 10);
  EXPECT_EQ(kc::ch04::warp_primitive_blocks(c, 132), 1);
  EXPECT_EQ(kc::ch04::warp_primitive_ops_per_warp(c), 10 * kc::ch04::kOpsPerChainPerIteration);
  c.mode = PrimitiveMode::throughput;
  c.blocks_per_sm = 3;
  EXPECT_EQ(kc::ch04::warp_primitive_blocks(c, 132), 396);
  EXPECT_EQ(kc::ch04::warp_primitive_ops_per_warp(c),
            10 * kc::ch04::kOpsPerChainPerIteration * kc::ch04::kThroughputChains);
}

// The checksums the host expects, worked out by hand for thread 0 (lane 0) of a block.
TEST(WarpPrimitiveArguments, ExpectedChecksumsByHand) {
  // Lane mask 1, an even number of shuffles: lane 0 ends with its own start, 0 * 7 + c * 1000 + 1.
  EXPECT_EQ(kc::ch04::expected_primitive_checksum(primitive_config(WarpPrimitive::shfl_xor, PrimitiveMode::latency)),
            1u);
  EXPECT_EQ(kc::ch04::expected_primitive_checksum(primitive_config(WarpPrimitive::shfl_xor, PrimitiveMode::throughput)),
            1u + 1001u + 2001u + 3001u);
  // The max over lanes of lane * 7 + c * 1000 + 1 is lane 31's: 218 + c * 1000.
  EXPECT_EQ(kc::ch04::expected_primitive_checksum(primitive_config(WarpPrimitive::redux_max, PrimitiveMode::latency)),
            218u);
  EXPECT_EQ(
      kc::ch04::expected_primitive_checksum(primitive_config(WarpPrimitive::redux_max, PrimitiveMode::throughput)),
      218u + 1218u + 2218u + 3218u);
  // Lane c starts true, so every chain is true (1) after its first vote.
  EXPECT_EQ(kc::ch04::expected_primitive_checksum(primitive_config(WarpPrimitive::vote_any, PrimitiveMode::throughput)),
            4u);
  // x -> x / 2 + 1 from lane 0's 0.0f: after 128 steps it is 2.0f exactly (the gap halves each step).
  const float two = 2.0f;
  unsigned two_bits = 0;
  std::memcpy(&two_bits, &two, sizeof(two_bits));
  EXPECT_EQ(kc::ch04::expected_primitive_checksum(primitive_config(WarpPrimitive::ffma, PrimitiveMode::latency)),
            two_bits);
  // One trip is 16 steps from 0: 2 - 2^-15, not yet 2.
  const float almost = 2.0f - 0x1p-15f;
  unsigned almost_bits = 0;
  std::memcpy(&almost_bits, &almost, sizeof(almost_bits));
  EXPECT_EQ(kc::ch04::expected_primitive_checksum(primitive_config(WarpPrimitive::ffma, PrimitiveMode::latency, 1)),
            almost_bits);
}

TEST(WarpPrimitiveArguments, MetricsFromSamples) {
  const WarpPrimitiveConfig latency = primitive_config(WarpPrimitive::redux_max, PrimitiveMode::latency, 4);
  const std::vector<PrimitiveSample> one = {{100, 100 + 64 * 30, 5, 0}};  // 64 instructions, 30 cycles each
  EXPECT_DOUBLE_EQ(kc::ch04::primitive_cycles_per_op(latency, one), 30.0);
  expect_invalid_argument([&] { kc::ch04::primitive_cycles_per_op(latency, std::vector<PrimitiveSample>{}); },
                          "samples must hold exactly the one sample");
  expect_invalid_argument(
      [&] {
        kc::ch04::primitive_cycles_per_op(latency, std::vector<PrimitiveSample>{{7, 7, 0, 0}});
      },
      "with stop > start");

  WarpPrimitiveConfig throughput = primitive_config(WarpPrimitive::shfl_xor, PrimitiveMode::throughput, 2);
  throughput.warps_per_block = 8;
  throughput.blocks_per_sm = 2;
  // 2 SMs were asked for 2 blocks each; each warp runs 2 x 16 x 4 = 128 shuffles, a block 8 x 128 =
  // 1024. The scheduler put three blocks on SM 1 (span 500 .. 2036: 3072 shuffles in 1536 cycles,
  // 2 a clock) and one on SM 0 (1024 in 256 cycles, 4 a clock). Counting each SM as the two blocks
  // asked for, over one of its blocks' time, would give 2 and 8; the median of the SMs' rates is 4
  // (upper middle).
  std::vector<PrimitiveSample> four = {{500, 1524, 1, 0}, {1000, 2036, 1, 0}, {10, 266, 0, 0}, {800, 1800, 1, 0}};
  EXPECT_DOUBLE_EQ(kc::ch04::primitive_ops_per_sm_clock(throughput, 2, four), 4.0);
  four[2] = {10, 522, 0, 0};  // SM 0 at 2 a clock too
  EXPECT_DOUBLE_EQ(kc::ch04::primitive_ops_per_sm_clock(throughput, 2, four), 2.0);
  expect_invalid_argument([&] { kc::ch04::primitive_ops_per_sm_clock(throughput, 3, four); },
                          "samples (4) must hold one sample per block (6)");
  four[3].sm = 2;
  expect_invalid_argument([&] { kc::ch04::primitive_ops_per_sm_clock(throughput, 2, four); },
                          "every sample's sm (2) must be below sm_count (2)");
  four[3] = {9, 9, 1, 0};
  expect_invalid_argument([&] { kc::ch04::primitive_ops_per_sm_clock(throughput, 2, four); },
                          "every sample must have stop > start");
  expect_invalid_argument([&] { kc::ch04::primitive_ops_per_sm_clock(latency, 1, one); },
                          "config.mode must be PrimitiveMode::throughput");
  expect_invalid_argument([&] { kc::ch04::primitive_cycles_per_op(throughput, one); },
                          "config.mode must be PrimitiveMode::latency");
}

}  // namespace
