// Chapter 4 tests: the softmax routings on every shape class (E from 1 to 512, k up to 32, odd
// T, fp32 and bf16), exact ties, NaN and Inf, huge logits, T = 0 and bad arguments.
// The shared inputs, paths and checks, with the tolerances and why, are in moe_gating_checks.hpp.
// GPU tests skip with a reason where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "moe_gating_checks.hpp"

namespace {

using namespace kc::test::moe_gating;
using kc::test::expect_invalid_argument;

constexpr int kKs[] = {1, 2, 6, 8, 32};

// Every path on every shape class: T in {0, 1, 7, 4096} (4096 only up to k = 8 above 64 experts, and
// not with KC_SMALL_TESTS), each with softmax then top-k (plain and renormalised) and top-k then
// softmax. One reference a case serves all six paths.
void softmax_every_shape_fp32(std::initializer_list<int> experts) {
  const std::uint64_t seed = kc::test::test_seed();
  for (int e : experts) {
    for (int k : kKs) {
      if (k > e) continue;
      for (std::int64_t t : {0, 1, 7, 4096}) {
        if (t == 4096 && (kc::test::small_tests_only() || (e > 64 && k > 8))) continue;
        const auto logits = grid_logits(static_cast<std::size_t>(t * e), seed + e * 131 + k);
        GatingParams topk_first = softmax_params(t, e, k);
        topk_first.scoring = Scoring::topk_then_softmax;
        for (const GatingParams& p : {softmax_params(t, e, k, false), softmax_params(t, e, k, true), topk_first}) {
          check_paths({Path::after_fused, Path::after_separate, Path::after_no_counts, Path::after_automatic,
                       Path::before, Path::step1_packed_keys},
                      p, logits);
        }
      }
    }
  }
}

TEST_F(MoeGatingGpu, SoftmaxEveryShapeFp32UpTo64Experts) { softmax_every_shape_fp32({1, 2, 6, 8, 60, 64}); }
TEST_F(MoeGatingGpu, SoftmaxEveryShapeFp32From128To256Experts) { softmax_every_shape_fp32({128, 160, 256}); }
TEST_F(MoeGatingGpu, SoftmaxEveryShapeFp32Above256Experts) { softmax_every_shape_fp32({384, 512}); }

TEST_F(MoeGatingGpu, SoftmaxEveryShapeBf16) {
  const std::uint64_t seed = kc::test::test_seed();
  for (int e : {1, 2, 6, 8, 60, 64, 128, 160, 256, 384, 512}) {
    for (int k : kKs) {
      if (k > e) continue;
      for (std::int64_t t : {1, 7, 4096}) {
        if (t == 4096 && (kc::test::small_tests_only() || k > 8)) continue;
        std::vector<__nv_bfloat16> logits(static_cast<std::size_t>(t * e));
        kc::fill_uniform(std::span<__nv_bfloat16>(logits), seed + e, -4.0, 4.0);
        check_paths({Path::after_fused, Path::before}, softmax_params(t, e, k, true), logits);
        check_paths({Path::after_fused, Path::before}, softmax_params(t, e, k, false), logits);
      }
    }
  }
}

// The fused kernel ranks logits, so arbitrary fp32 values (close pairs included) give exact ids.
TEST_F(MoeGatingGpu, AfterIsExactOnUnstructuredFp32) {
  const std::uint64_t seed = kc::test::test_seed();
  for (int e : {8, 64, 256, 384}) {
    std::vector<float> logits(static_cast<std::size_t>(4096) * e);
    kc::fill_uniform(std::span<float>(logits), seed + e);
    check_case(Path::after_fused, softmax_params(4096, e, std::min(e, 8), true), logits);
  }
}

TEST_F(MoeGatingGpu, ExactTiesPickTheLowerId) {
  for (int e : {8, 60, 256, 512}) {
    // Few distinct values: every row is full of exact ties, across lanes and within a lane.
    std::vector<float> logits(static_cast<std::size_t>(64) * e);
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7919) % 5) - 2.0f;
    for (const GatingParams& p :
         {softmax_params(64, e, std::min(e, 8), true), softmax_params(64, e, std::min(e, 32))}) {
      check_paths({Path::after_fused, Path::before, Path::step1_packed_keys, Path::step2_lean_rounds}, p, logits);
    }
  }
}

TEST_F(MoeGatingGpu, NanAndInfRowsFollowThePolicy) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (int e : {8, 64, 256, 512}) {
    std::vector<float> logits = grid_logits(static_cast<std::size_t>(7) * e, 99);
    float* r = logits.data();
    r[0 * e + 3] = nan;                                  // row 0: one NaN among finite values
    r[1 * e + 1] = inf;                                  // row 1: one +Inf
    r[2 * e + 0] = inf, r[2 * e + e - 1] = inf;          // row 2: two +Inf share the mass
    std::fill(r + 3 * e, r + 4 * e, -inf);               // row 3: all -Inf: weights 0
    std::fill(r + 4 * e, r + 5 * e, nan);                // row 4: all NaN: weights 0
    for (int i = 0; i < e; i += 2) r[5 * e + i] = -inf;  // row 5: half -Inf
    r[6 * e + 0] = inf, r[6 * e + 1] = -inf;             // row 6: +Inf beside -Inf (one lane's sum is NaN)
    // Every path, the three-kernel before included: the policy is part of the one contract.
    for (const GatingParams& p :
         {softmax_params(7, e, std::min(e, 6), false), softmax_params(7, e, std::min(e, 6), true)}) {
      check_paths({Path::before, Path::after_fused, Path::step1_packed_keys, Path::step2_lean_rounds}, p, logits);
    }
  }
}

// The one ranking contract for every path (moe_gating.hpp): rows of +-1e4 logits, where all but the
// top probabilities underflow to 0 in fp32, still come out in logit order, ties by lower id.
TEST_F(MoeGatingGpu, HugeLogitsRankByLogitOnEveryPath) {
  for (int e : {8, 64, 256, 384}) {
    std::vector<float> logits(static_cast<std::size_t>(64) * e);
    std::mt19937_64 rng(kc::test::test_seed() + e);
    for (float& v : logits) v = static_cast<float>(static_cast<int>(rng() % 41) - 20) * 1e3f;  // -2e4 .. 2e4
    GatingParams topk_first = softmax_params(64, e, std::min(e, 8));
    topk_first.scoring = Scoring::topk_then_softmax;
    for (const GatingParams& p :
         {softmax_params(64, e, std::min(e, 8), true), softmax_params(64, e, std::min(e, 8), false), topk_first}) {
      check_paths({Path::before, Path::after_fused, Path::step1_packed_keys, Path::step2_lean_rounds}, p, logits);
    }
    std::vector<__nv_bfloat16> bf16(logits.size());
    for (std::size_t i = 0; i < bf16.size(); ++i) bf16[i] = __float2bfloat16(logits[i]);
    check_paths({Path::before, Path::after_fused}, softmax_params(64, e, std::min(e, 8), true), bf16);
  }
}

// T = 0 launches no kernel but overwrites the counts with zeros: a reused counts buffer holds no
// stale values.
TEST_F(MoeGatingGpu, EmptyBatchZeroesAReusedCountsBuffer) {
  for (Path path : {Path::before, Path::after_fused, Path::after_separate, Path::after_automatic}) {
    for (const GatingParams& p : {softmax_params(0, 64, 6, true), dsv3_params(0)}) {
      kc::test::GuardedOutput<std::int32_t> counts(static_cast<std::size_t>(p.num_experts));
      std::vector<std::int32_t> stale(static_cast<std::size_t>(p.num_experts), 12345);
      kc::check(cudaMemcpy(counts.data(), stale.data(), stale.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
      kc::DeviceBuffer<unsigned char> workspace(0);
      launch(path, p, static_cast<const float*>(nullptr), nullptr, {nullptr, nullptr, counts.data()}, workspace,
             nullptr);
      kc::check(cudaDeviceSynchronize());
      EXPECT_EQ(counts.to_host(), std::vector<std::int32_t>(stale.size(), 0)) << path_name(path);
      EXPECT_EQ(counts.guard_damage(), 0u);
    }
  }
}

TEST_F(MoeGatingGpu, BadArgumentsWriteNothing) {
  kc::DeviceBuffer<float> logits(64 * 8);
  kc::test::GuardedOutput<float> weights(64 * 2);
  kc::test::GuardedOutput<std::int32_t> ids(64 * 2), counts(8);
  const kc::ch04::GatingOutputs out{weights.data(), ids.data(), counts.data()};
  expect_invalid_argument([&] { kc::ch04::gating_after(softmax_params(64, 8, 9), logits.data(), nullptr, out); },
                          "k (9) must be <= num_experts (8)");
  expect_invalid_argument([&] { kc::ch04::gating_after(softmax_params(64, 513, 2), logits.data(), nullptr, out); },
                          "num_experts (513) must be <= 512");
  expect_invalid_argument(
      [&] { kc::ch04::gating_before(softmax_params(64, 8, 2), logits.data(), nullptr, out, nullptr, 0); },
      "workspace must not be null");
  kc::check(cudaDeviceSynchronize());
  EXPECT_EQ(kc::count_poisoned(std::span<const float>(weights.to_host()), kc::test::kPoisonByte), 128u);
  EXPECT_EQ(kc::count_poisoned(std::span<const std::int32_t>(ids.to_host()), kc::test::kPoisonByte), 128u);
  EXPECT_EQ(kc::count_poisoned(std::span<const std::int32_t>(counts.to_host()), kc::test::kPoisonByte), 8u);
}

}  // namespace
