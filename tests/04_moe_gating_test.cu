// Chapter 4 tests. CPU tests (argument rules, the fp64 reference on hand-computed cases) run
// everywhere; GPU tests skip with a reason where there is no GPU.
//
// Tolerances. Ids must equal the reference exactly. Weights: 1e-5 relative Frobenius error. The
// kernels compute in fp32: one expf (a few ulp), a sum of at most 512 terms done as per-lane partial
// sums plus a 5-level butterfly (about 20 roundings deep, ~1e-6), one division: well inside 1e-5,
// while a wrong normalisation (a missing renormalisation, a dropped term) is off by far more.
// Counts are integers: exact.
//
// Input design. Every softmax path ranks the logits themselves, so any fp32 or bf16 logits give
// exact ids. DeepSeek-V3 ranks fp32 sigmoid + bias: there the fp64 reference and fp32 kernels agree exactly only when
// no two competing values are within fp32 rounding of each other, so those inputs are built with gaps (logits on a 1/64
// grid; DeepSeek selection scores from a Sidon set, so every group's top-2 sum differs too). Exact ties are made on
// purpose with duplicated values: equal inputs give equal fp32 values on every path, and the tie rule decides.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fused_launch.cuh"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"
#include "moe_gating.hpp"
#include "warp_primitives.hpp"

namespace {

using kc::ch04::CountMode;
using kc::ch04::GatingParams;
using kc::ch04::GatingReference;
using kc::ch04::Scoring;
using kc::test::expect_invalid_argument;

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::numeric_limits<double>::quiet_NaN();

GatingParams softmax_params(std::int64_t t, int e, int k, bool renormalize = false) {
  GatingParams p;
  p.num_tokens = t;
  p.num_experts = e;
  p.k = k;
  p.renormalize = renormalize;
  return p;
}

GatingParams dsv3_params(std::int64_t t, int e = 256, int k = 8, int n_group = 8, int topk_group = 4) {
  GatingParams p;
  p.num_tokens = t;
  p.num_experts = e;
  p.k = k;
  p.scoring = Scoring::deepseek_v3;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.routed_scaling_factor = 2.5f;
  return p;
}

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

// ---------------------------------------------------------------- GPU

// Logits for the softmax tests: a 1/64 grid in [-8, 8) (so probabilities of distinct logits are
// far apart in fp32, and duplicates, i.e. exact ties, are common), or raw uniform fp32 values.
std::vector<float> grid_logits(std::size_t count, std::uint64_t seed) {
  std::vector<float> x(count);
  kc::fill_uniform(std::span<float>(x), seed, -8.0, 8.0);
  for (float& v : x) v = std::floor(v * 64.0f) / 64.0f;
  return x;
}

// DeepSeek inputs with every decision at least ~1e-6 apart (see the file comment): logits on a
// permuted grid, bias = target - sigmoid(logit) where the targets come from the Sidon set
// {2pj + (j^2 mod p)} (all pairwise sums distinct), scaled into [0, 1].
void dsv3_inputs(std::int64_t t, int e, std::uint64_t seed, std::vector<float>& logits, std::vector<float>& bias) {
  std::mt19937_64 rng(seed);
  const int prime = e <= 256 ? 257 : 521;
  std::vector<int> perm(static_cast<std::size_t>(e));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<double> target(static_cast<std::size_t>(e));
  for (int i = 0; i < e; ++i) {
    const long j = perm[i];
    target[i] = static_cast<double>(2 * prime * j + (j * j) % prime) / (2.0 * prime * prime);
  }
  logits.assign(static_cast<std::size_t>(t * e), 0.0f);
  bias.assign(static_cast<std::size_t>(e), 0.0f);
  std::vector<int> logit_rank(static_cast<std::size_t>(e));
  std::iota(logit_rank.begin(), logit_rank.end(), 0);
  std::shuffle(logit_rank.begin(), logit_rank.end(), rng);
  for (int i = 0; i < e; ++i) {
    const double x = (logit_rank[i] - e / 2) * (8.0 / e);
    bias[i] = static_cast<float>(target[i] - 1.0 / (1.0 + std::exp(-x)));
  }
  // Every row holds the same logits: the bias is per expert, and the gaps hold only for this pairing.
  for (std::int64_t r = 0; r < t; ++r) {
    for (int i = 0; i < e; ++i) logits[r * e + i] = static_cast<float>((logit_rank[i] - e / 2) * (8.0 / e));
  }
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widen(const std::vector<__nv_bfloat16>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = kc::to_double(v[i]);
  return d;
}

// step1_packed_keys and step2_lean_rounds: one step's kernel alone, through the chapter's internal
// launch functions (fp32 logits, counts fused, launched the ordinary way). Step 1 is what `after`
// runs past 2^30 logits, too large to test through gating_after().
enum class Path {
  before,
  after_fused,
  after_separate,
  after_no_counts,
  after_automatic,
  step1_packed_keys,
  step2_lean_rounds
};
const char* path_name(Path p) {
  switch (p) {
    case Path::before: return "before";
    case Path::after_fused: return "after_counts_fused";
    case Path::after_separate: return "after_counts_separate";
    case Path::after_no_counts: return "after_no_counts";
    case Path::after_automatic: return "after_counts_automatic";
    case Path::step1_packed_keys: return "step1_packed_keys";
    case Path::step2_lean_rounds: return "step2_lean_rounds";
  }
  return "unknown";
}

template <typename T>
void launch(Path path, const GatingParams& p, const T* logits, const float* bias, const kc::ch04::GatingOutputs& out,
            kc::DeviceBuffer<unsigned char>& workspace, cudaStream_t stream) {
  if (path == Path::before) {
    kc::ch04::gating_before(p, logits, bias, out, workspace.data(), workspace.size(), stream);
  } else if (path == Path::step1_packed_keys || path == Path::step2_lean_rounds) {
    if constexpr (std::is_same_v<T, float>) {
      kc::ch04::validate_gating(p, logits, bias, out);
      if (out.counts != nullptr) {
        kc::check(
            cudaMemsetAsync(out.counts, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t), stream));
      }
      if (p.num_tokens == 0) return;
      namespace fused = kc::ch04::fused;
      const fused::SoftmaxArgs a{out.weights,
                                 out.ids,
                                 out.counts,
                                 p.num_tokens,
                                 p.num_experts,
                                 p.k,
                                 p.scoring == Scoring::softmax_then_topk && !p.renormalize};
      const fused::LaunchOn on{stream, false, false, fused::current_gpu()};
      const bool vector = p.num_experts % 4 == 0;
      if (path == Path::step1_packed_keys) {
        vector ? fused::launch_packed_keys<float, 4>(logits, a, on)
               : fused::launch_packed_keys<float, 1>(logits, a, on);
      } else {
        vector ? fused::launch_lean_rounds<float, 4>(logits, a, on)
               : fused::launch_lean_rounds<float, 1>(logits, a, on);
      }
      kc::check_launch();
    } else {
      FAIL() << "the step paths take fp32 logits only";
    }
  } else if (path == Path::after_automatic) {
    kc::ch04::gating_after(p, logits, bias, out, stream);  // CountMode::automatic, the default
  } else if (path == Path::after_no_counts) {
    kc::ch04::gating_after(p, logits, bias, kc::ch04::GatingOutputs{out.weights, out.ids, nullptr}, stream);
  } else {
    kc::ch04::gating_after(p, logits, bias, out, stream,
                           path == Path::after_fused ? CountMode::fused_atomics : CountMode::separate_kernel);
  }
}

// Runs one path on host logits and checks ids (exact), weights (1e-5), counts (exact), poison, guards.
template <typename T>
void check_case(Path path, const GatingParams& p, const std::vector<T>& logits, const std::vector<float>& bias = {}) {
  SCOPED_TRACE(std::string(path_name(path)) + " T=" + std::to_string(p.num_tokens) +
               " E=" + std::to_string(p.num_experts) + " k=" + std::to_string(p.k));
  const std::size_t tk = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.k);
  kc::DeviceBuffer<T> d_logits(logits);
  kc::DeviceBuffer<float> d_bias(bias);
  kc::test::GuardedOutput<float> weights(tk);
  kc::test::GuardedOutput<std::int32_t> ids(tk);
  kc::test::GuardedOutput<std::int32_t> counts(static_cast<std::size_t>(p.num_experts));
  kc::DeviceBuffer<unsigned char> workspace(kc::ch04::gating_before_workspace_bytes(p));
  launch(path, p, d_logits.data(), bias.empty() ? nullptr : d_bias.data(), {weights.data(), ids.data(), counts.data()},
         workspace, nullptr);
  kc::check(cudaDeviceSynchronize());

  const std::vector<double> bias64(bias.begin(), bias.end());
  const GatingReference ref = kc::ch04::gating_reference(p, widen(logits), bias64);
  const std::vector<std::int32_t> got_ids = ids.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < tk; ++i) wrong += got_ids[i] != ref.ids[i] ? 1 : 0;
  EXPECT_EQ(wrong, 0u) << "ids must equal the reference exactly";
  kc::test::expect_close(kc::compare<float>(weights.to_host(), ref.weights, kc::test::kPoisonByte), 1e-5, "weights");
  if (path == Path::after_no_counts) {
    EXPECT_EQ(kc::count_poisoned(std::span<const std::int32_t>(counts.to_host()), kc::test::kPoisonByte),
              static_cast<std::size_t>(p.num_experts))
        << "no counts asked for: nothing written there";
  } else if (p.num_tokens > 0) {
    EXPECT_EQ(counts.to_host(), ref.counts);
  } else {
    EXPECT_EQ(counts.to_host(), std::vector<std::int32_t>(static_cast<std::size_t>(p.num_experts), 0))
        << "T = 0 launches no kernel but still writes the counts (zeros)";
  }
  EXPECT_EQ(weights.guard_damage() + ids.guard_damage() + counts.guard_damage(), 0u) << "wrote past the end";
}

class MoeGatingGpu : public kc::test::GpuTest {};

const int kExperts[] = {1, 2, 6, 8, 60, 64, 128, 160, 256, 384, 512};
const int kKs[] = {1, 2, 6, 8, 32};

TEST_F(MoeGatingGpu, SoftmaxEveryShapeFp32) {
  const std::uint64_t seed = kc::test::test_seed();
  for (Path path : {Path::after_fused, Path::after_separate, Path::after_no_counts, Path::after_automatic, Path::before,
                    Path::step1_packed_keys}) {
    for (int e : kExperts) {
      for (int k : kKs) {
        if (k > e) continue;
        for (std::int64_t t : {0, 1, 7, 4096}) {
          if (t == 4096 && (kc::test::small_tests_only() || (e > 64 && k > 8))) continue;
          const auto logits = grid_logits(static_cast<std::size_t>(t * e), seed + e * 131 + k);
          for (bool renorm : {false, true}) check_case(path, softmax_params(t, e, k, renorm), logits);
          GatingParams p = softmax_params(t, e, k);
          p.scoring = Scoring::topk_then_softmax;
          check_case(path, p, logits);
        }
      }
    }
  }
}

TEST_F(MoeGatingGpu, SoftmaxEveryShapeBf16) {
  const std::uint64_t seed = kc::test::test_seed();
  for (Path path : {Path::after_fused, Path::before}) {
    for (int e : kExperts) {
      for (int k : kKs) {
        if (k > e) continue;
        for (std::int64_t t : {1, 7, 4096}) {
          if (t == 4096 && (kc::test::small_tests_only() || k > 8)) continue;
          std::vector<__nv_bfloat16> logits(static_cast<std::size_t>(t * e));
          kc::fill_uniform(std::span<__nv_bfloat16>(logits), seed + e, -4.0, 4.0);
          check_case(path, softmax_params(t, e, k, true), logits);
          check_case(path, softmax_params(t, e, k, false), logits);
        }
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

// `after` (step 3 past one wave of rows at 129 <= E <= 256, k = 8; step 2 elsewhere) and steps 1
// and 2 alone must agree with the reference exactly: on every layout (E from 8 to 512), k up to 32
// (step 2 keeps k + 1 winners in shared memory), and on grids with a partial last round of rows.
// 70001 rows: a warp walks ~13 rows at E = 256 (5280 rows a stride on 132 SMs).
void check_large_grids(std::initializer_list<int> experts) {
  const std::uint64_t seed = kc::test::test_seed();
  for (int e : experts) {
    for (int k : {1, 8, 32}) {
      if (k > e) continue;
      for (std::int64_t t : {1, 7, 4096, 70001}) {
        if (t >= 4096 && kc::test::small_tests_only()) continue;
        if (t == 70001 && e != 64 && e != 256 && e != 512) continue;
        std::vector<float> logits(static_cast<std::size_t>(t * e));
        kc::fill_uniform(std::span<float>(logits), seed + e * 7 + k);
        check_case(Path::after_fused, softmax_params(t, e, k, true), logits);
        check_case(Path::step1_packed_keys, softmax_params(t, e, k, true), logits);
        check_case(Path::step2_lean_rounds, softmax_params(t, e, k, true), logits);
      }
    }
  }
}

TEST_F(MoeGatingGpu, StepsMatchTheReferenceUpTo128Experts) { check_large_grids({8, 64, 128}); }
TEST_F(MoeGatingGpu, StepsMatchTheReferenceAt256Experts) { check_large_grids({256}); }
TEST_F(MoeGatingGpu, StepsMatchTheReferenceAbove256Experts) { check_large_grids({384, 512}); }

TEST_F(MoeGatingGpu, ExactTiesPickTheLowerId) {
  for (Path path : {Path::after_fused, Path::before, Path::step1_packed_keys, Path::step2_lean_rounds}) {
    for (int e : {8, 60, 256, 512}) {
      // Few distinct values: every row is full of exact ties, across lanes and within a lane.
      std::vector<float> logits(static_cast<std::size_t>(64) * e);
      for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7919) % 5) - 2.0f;
      check_case(path, softmax_params(64, e, std::min(e, 8), true), logits);
      check_case(path, softmax_params(64, e, std::min(e, 32), false), logits);
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
    // Only the fused paths: the before path ranks probabilities, where NaN and -Inf both become 0.
    for (Path path : {Path::after_fused, Path::step1_packed_keys, Path::step2_lean_rounds}) {
      check_case(path, softmax_params(7, e, std::min(e, 6), false), logits);
      check_case(path, softmax_params(7, e, std::min(e, 6), true), logits);
    }
  }
}

// Rows past one grid: there a warp has several rows, so `after` runs step 3 at E from 129 to 256
// and k = 8 (four rows selected, then one shared epilogue, lane 8 b + r finishing winner r of row
// b). On a 1/64 grid ties are common, so rows whose consecutive winners share a prefix (redone
// exactly inside the batch) fall at every position of a batch, and the warps' last batches are
// partial (70001 rows; 11003 with KC_SMALL_TESTS, still about two rows a warp on an H200). k = 6,
// the full softmax and E = 512 check that those launches keep step 2.
TEST_F(MoeGatingGpu, BatchedEpilogueRedoesAnyRowOfTheBatch) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::int64_t t = kc::test::small_tests_only() ? 11003 : 70001;
  for (int e : {160, 256, 512}) {
    const auto logits = grid_logits(static_cast<std::size_t>(t * e), seed + e);
    if (e <= 256) {
      for (Path path : {Path::after_fused, Path::after_no_counts, Path::step2_lean_rounds}) {
        check_case(path, softmax_params(t, e, 8, true), logits);
        GatingParams p = softmax_params(t, e, 8);
        p.scoring = Scoring::topk_then_softmax;
        check_case(path, p, logits);
      }
      check_case(Path::after_fused, softmax_params(t, e, 8, false), logits);  // full softmax: step 2
    }
    check_case(Path::after_fused, softmax_params(t, e, 6, true), logits);  // k = 6 (and E = 512): step 2
  }
}

// Every special value of the policy, in rows past one grid (where the batched kernel runs): every
// eighth row gets NaNs of both signs with random payloads, +-Inf, -0 beside +0; one in four of
// those rows is almost all special, so NaNs and -Inf reach the winners.
TEST_F(MoeGatingGpu, BatchedEpilogueFollowsTheNanPolicy) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::int64_t t = kc::test::small_tests_only() ? 11003 : 40009;
  std::mt19937_64 rng(seed);
  const auto special = [&]() {
    const unsigned payload = 1u + static_cast<unsigned>(rng() % 0x7FFFFFu);
    unsigned bits = 0;
    switch (rng() % 6) {
      case 0: bits = 0x7F800000u | payload; break;  // NaN
      case 1: bits = 0xFF800000u | payload; break;  // NaN, sign bit set
      case 2: bits = 0x7F800000u; break;            // +Inf
      case 3: bits = 0xFF800000u; break;            // -Inf
      case 4: bits = 0x80000000u; break;            // -0
      default: bits = 0u; break;                    // +0
    }
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  };
  for (int e : {160, 256}) {
    std::vector<float> logits = grid_logits(static_cast<std::size_t>(t * e), seed + e);
    for (std::int64_t r = 0; r < t; r += 8) {
      float* row = logits.data() + r * e;
      const bool almost_all = (r / 8) % 4 == 3;
      const int count = almost_all ? e - 3 : 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < count; ++i) row[rng() % static_cast<unsigned>(e)] = special();
      if (!almost_all) {  // a -0 beside a +0: equal values, so the lower id must win
        row[rng() % static_cast<unsigned>(e)] = -0.0f;
        row[rng() % static_cast<unsigned>(e)] = 0.0f;
      }
    }
    for (Path path : {Path::after_fused, Path::step2_lean_rounds}) {
      check_case(path, softmax_params(t, e, 8, true), logits);
      GatingParams p = softmax_params(t, e, 8);
      p.scoring = Scoring::topk_then_softmax;
      check_case(path, p, logits);
    }
    check_case(Path::after_fused, softmax_params(t, e, 6, true), logits);  // step 2
  }
}

TEST_F(MoeGatingGpu, DeepSeekV3) {
  const std::uint64_t seed = kc::test::test_seed();
  for (Path path :
       {Path::after_fused, Path::after_separate, Path::after_no_counts, Path::after_automatic, Path::before}) {
    for (const GatingParams& shape :
         {dsv3_params(1), dsv3_params(7), dsv3_params(4096), dsv3_params(7, 64, 6, 8, 3), dsv3_params(7, 384, 8, 8, 4),
          dsv3_params(7, 512, 32, 16, 8), dsv3_params(7, 8, 2, 4, 2), dsv3_params(7, 160, 8, 1, 1)}) {
      if (shape.num_tokens == 4096 && kc::test::small_tests_only()) continue;
      std::vector<float> logits, bias;
      dsv3_inputs(shape.num_tokens, shape.num_experts, seed, logits, bias);
      check_case(path, shape, logits, bias);
      // bf16 logits: for E = 64, 256 and 512 the grid (multiples of 8 / E in [-4, 4]) is exact in
      // bf16, so the inputs keep their gaps; the 16-byte vectors then hold 8 experts, not 4.
      if (shape.num_experts == 64 || shape.num_experts == 256 || shape.num_experts == 512) {
        std::vector<__nv_bfloat16> logits_bf16(logits.size());
        for (std::size_t i = 0; i < logits.size(); ++i) {
          logits_bf16[i] = __float2bfloat16_rn(logits[i]);
          ASSERT_EQ(__bfloat162float(logits_bf16[i]), logits[i]) << "the grid must be exact in bf16";
        }
        check_case(path, shape, logits_bf16, bias);
      }
    }
  }
}

// DeepSeek-V3 (fp32 logits in 16-byte vectors) runs blocks of 16 warps on sm_90 once there are 16
// rows for every SM, and blocks of 8 below. T = 16 x SMs - 1 and 16 x SMs + 1 sit on both sides of
// the switch (the wide grid's last block holds one row); a T beyond one wave of wide blocks (two an
// SM) makes every warp loop. dsv3_inputs repeats one row, so a row skipped or run twice shows as
// poison left in the outputs or as counts other than T. The small-tests run (compute-sanitizer)
// keeps the first two.
TEST_F(MoeGatingGpu, DeepSeekV3WideBlocksMatchTheReference) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::int64_t sms = device().sm_count;
  for (const std::int64_t t : {16 * sms - 1, 16 * sms + 1, 2 * 16 * sms + 37}) {
    if (t > 16 * sms + 1 && kc::test::small_tests_only()) continue;
    std::vector<float> logits, bias;
    dsv3_inputs(t, 256, seed, logits, bias);
    for (Path path : {Path::after_fused, Path::after_no_counts}) check_case(path, dsv3_params(t), logits, bias);
  }
}

// On sm_90 a kernel that counts more than 128 experts launches in clusters of 8 blocks once its grid
// has 64 blocks or more (and its clusters fit at once): the blocks of a cluster sum their histograms
// through distributed shared memory, and each flushes a slice of the sum. The shapes at E <= 128
// run the same 65-block grids without clusters. Each shape needs 65 blocks, so the last block holds
// one row and the last cluster seven empty blocks; the small-tests run (compute-sanitizer) keeps
// them, since T = 4096 is skipped there. Rows a block: 256 for E <= 8, 32 for E <= 64, 16 for
// E <= 128, 8 beyond (DeepSeek-V3 too).
TEST_F(MoeGatingGpu, CountsSummedInClustersMatchTheReference) {
  const std::uint64_t seed = kc::test::test_seed();
  const struct {
    int e, k;
    std::int64_t t;
  } shapes[] = {
      {6, 2, 64 * 256 + 1}, {60, 6, 64 * 32 + 1}, {128, 8, 64 * 16 + 1}, {256, 8, 64 * 8 + 1}, {384, 8, 64 * 8 + 1}};
  for (Path path : {Path::after_fused, Path::after_automatic}) {
    for (const auto& shape : shapes) {
      const auto logits = grid_logits(static_cast<std::size_t>(shape.t * shape.e), seed + shape.e);
      check_case(path, softmax_params(shape.t, shape.e, shape.k, true), logits);
    }
    std::vector<float> logits, bias;
    const GatingParams deepseek = dsv3_params(64 * 8 + 1);
    dsv3_inputs(deepseek.num_tokens, deepseek.num_experts, seed, logits, bias);
    check_case(path, deepseek, logits, bias);
  }
}

template <typename T>
kc::test::LaunchUnderTest make_run(Path path, const GatingParams& p, kc::DeviceBuffer<T>& logits,
                                   kc::DeviceBuffer<float>& weights, kc::DeviceBuffer<std::int32_t>& ids,
                                   kc::DeviceBuffer<std::int32_t>& counts, kc::DeviceBuffer<unsigned char>& ws) {
  return {[&, path, p](cudaStream_t s) {
            launch(path, p, logits.data(), nullptr, {weights.data(), ids.data(), counts.data()}, ws, s);
          },
          [&] {
            weights.fill_bytes(kc::test::kPoisonByte);
            ids.fill_bytes(kc::test::kPoisonByte);
            counts.fill_bytes(kc::test::kPoisonByte);
          },
          [&] {
            std::vector<unsigned char> bytes;
            auto append = [&](const auto& h) {
              const auto* b = reinterpret_cast<const unsigned char*>(h.data());
              bytes.insert(bytes.end(), b, b + h.size() * sizeof(h[0]));
            };
            append(weights.to_host());
            append(ids.to_host());
            append(counts.to_host());
            return bytes;
          }};
}

// The kernel a gating launch follows, made to race it: it lets the next kernel launch at once
// (griddepcontrol.launch_dependents), then spins for `nanoseconds`, and only then writes the logits
// (copied from `source`) and stale values into the counts. A gating launch that started reading
// logits or zeroing counts before this kernel finished would see NaN logits or keep stale counts.
__global__ void late_producer(const float* source, float* logits, std::size_t count, std::int32_t* counts,
                              int num_experts, unsigned long long nanoseconds) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    logits[i] = source[i];
  }
  if (blockIdx.x == 0) {
    for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) counts[e] = 1000000 + e;
  }
}

// after launches its kernels early, each as its predecessor's programmatic dependent (sm_90): each
// must still wait for the kernel before it before reading the logits or zeroing the counts. The
// kernel before it here writes both 50 µs after it let them launch.
TEST_F(MoeGatingGpu, EarlyLaunchWaitsForTheKernelBefore) {
  const std::uint64_t seed = kc::test::test_seed();
  for (Path path : {Path::after_fused, Path::after_separate, Path::after_automatic}) {
    for (const GatingParams& p : {softmax_params(4099, 256, 8, true), softmax_params(333, 8, 2, false),
                                  softmax_params(1000, 60, 6, true), dsv3_params(515)}) {
      SCOPED_TRACE(std::string(path_name(path)) + " E=" + std::to_string(p.num_experts) +
                   (p.scoring == Scoring::deepseek_v3 ? " deepseek_v3" : ""));
      const std::size_t n = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.num_experts);
      const std::size_t tk = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.k);
      std::vector<float> host, bias;
      if (p.scoring == Scoring::deepseek_v3) {
        dsv3_inputs(p.num_tokens, p.num_experts, seed, host, bias);
      } else {
        host = grid_logits(n, seed + static_cast<std::uint64_t>(p.num_experts));
      }
      kc::DeviceBuffer<float> source(host), d_bias(bias), logits(n);
      logits.fill_bytes(kc::test::kPoisonByte);  // NaN until late_producer writes
      kc::test::GuardedOutput<float> weights(tk);
      kc::test::GuardedOutput<std::int32_t> ids(tk), counts(static_cast<std::size_t>(p.num_experts));
      // Loaded and run once first: a first launch's module loading outlasts late_producer's 50 us,
      // and the gating kernels would then start after it whatever they do.
      const CountMode mode = path == Path::after_fused      ? CountMode::fused_atomics
                             : path == Path::after_separate ? CountMode::separate_kernel
                                                            : CountMode::automatic;
      const kc::ch04::GatingOutputs out{weights.data(), ids.data(), counts.data()};
      kc::ch04::gating_after(p, logits.data(), bias.empty() ? nullptr : d_bias.data(), out, nullptr, mode);
      kc::check(cudaDeviceSynchronize());
      weights.poison();
      ids.poison();
      late_producer<<<132, 256>>>(source.data(), logits.data(), n, counts.data(), p.num_experts, 50000);
      kc::check(cudaGetLastError());
      kc::ch04::gating_after(p, logits.data(), bias.empty() ? nullptr : d_bias.data(), out, nullptr, mode);
      kc::check(cudaDeviceSynchronize());
      const std::vector<double> bias64(bias.begin(), bias.end());
      const GatingReference ref = kc::ch04::gating_reference(p, widen(host), bias64);
      EXPECT_EQ(ids.to_host(), ref.ids);
      kc::test::expect_close(kc::compare<float>(weights.to_host(), ref.weights, kc::test::kPoisonByte), 1e-5,
                             "weights");
      EXPECT_EQ(counts.to_host(), ref.counts);
    }
  }
}

// DeepSeek-V3's kernel reads the correction bias before its wait (gating_after's contract): the bias
// may be written by a kernel as long as an operation that is not a kernel (here a memset) stands
// between that kernel and the call. late_producer writes the bias 50 us after letting the next
// kernel launch, and poisons it until then; the gating launch must still see the written bias.
// The kernels are loaded and run once first: a first launch's module loading takes longer than the
// 50 us, and the test would pass whatever the order. The race is real: on sm_90 a variant without
// the memset (and without counts) failed.
TEST_F(MoeGatingGpu, DeepSeekBiasWrittenBeforeANonKernelOperationIsSeen) {
  const std::uint64_t seed = kc::test::test_seed();
  cudaStream_t stream = nullptr;  // its own stream: the test's launches only
  kc::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const GatingParams& p : {dsv3_params(515), dsv3_params(4096)}) {
    if (p.num_tokens == 4096 && kc::test::small_tests_only()) continue;
    SCOPED_TRACE("T=" + std::to_string(p.num_tokens));
    const std::size_t tk = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.k);
    std::vector<float> logits, bias;
    dsv3_inputs(p.num_tokens, p.num_experts, seed, logits, bias);
    kc::DeviceBuffer<float> d_logits(logits), source(bias), d_bias(bias.size());
    kc::DeviceBuffer<std::int32_t> scratch(static_cast<std::size_t>(p.num_experts));
    kc::test::GuardedOutput<float> weights(tk);
    kc::test::GuardedOutput<std::int32_t> ids(tk), counts(static_cast<std::size_t>(p.num_experts));
    const kc::ch04::GatingOutputs out{weights.data(), ids.data(), counts.data()};
    kc::ch04::gating_after(p, d_logits.data(), source.data(), out, stream);  // load and run once
    late_producer<<<1, 256, 0, stream>>>(source.data(), d_logits.data(), 0, scratch.data(), p.num_experts, 1);
    kc::check(cudaStreamSynchronize(stream));
    weights.poison();
    ids.poison();
    counts.poison();
    d_bias.fill_bytes(kc::test::kPoisonByte);
    kc::check(cudaDeviceSynchronize());
    late_producer<<<1, 256, 0, stream>>>(source.data(), d_bias.data(), bias.size(), scratch.data(), p.num_experts,
                                         50000);
    kc::check(cudaGetLastError());
    kc::check(cudaMemsetAsync(scratch.data(), 0, sizeof(std::int32_t), stream));  // not a kernel
    kc::ch04::gating_after(p, d_logits.data(), d_bias.data(), out, stream);
    kc::check(cudaStreamSynchronize(stream));
    const GatingReference ref = kc::ch04::gating_reference(p, widen(logits), widen(bias));
    EXPECT_EQ(ids.to_host(), ref.ids);
    kc::test::expect_close(kc::compare<float>(weights.to_host(), ref.weights, kc::test::kPoisonByte), 1e-5, "weights");
    EXPECT_EQ(counts.to_host(), ref.counts);
  }
  kc::check(cudaStreamDestroy(stream));
}

TEST_F(MoeGatingGpu, GraphCapturableAndBitwiseRepeatable) {
  const std::uint64_t seed = kc::test::test_seed();
  for (Path path :
       {Path::after_fused, Path::after_separate, Path::after_no_counts, Path::after_automatic, Path::before}) {
    for (int e : {8, 256}) {
      SCOPED_TRACE(std::string(path_name(path)) + " E=" + std::to_string(e));
      const GatingParams p = softmax_params(4099, e, std::min(e, 8));
      kc::DeviceBuffer<float> logits(grid_logits(static_cast<std::size_t>(p.num_tokens) * e, seed));
      kc::DeviceBuffer<float> weights(4099 * 8);
      kc::DeviceBuffer<std::int32_t> ids(4099 * 8), counts(static_cast<std::size_t>(e));
      kc::DeviceBuffer<unsigned char> ws(kc::ch04::gating_before_workspace_bytes(p));
      const auto run = make_run(path, p, logits, weights, ids, counts, ws);
      kc::test::expect_graph_capturable(run);
      kc::test::expect_bitwise_repeatable(run);
    }
  }
  // Past one grid of rows: step 3 (four rows' epilogue at once).
  for (Path path : {Path::after_fused, Path::after_no_counts}) {
    SCOPED_TRACE(std::string(path_name(path)) + " E=256, past one grid");
    const GatingParams p = softmax_params(11003, 256, 8, true);
    kc::DeviceBuffer<float> logits(grid_logits(static_cast<std::size_t>(p.num_tokens) * 256, seed + 1));
    kc::DeviceBuffer<float> weights(11003 * 8);
    kc::DeviceBuffer<std::int32_t> ids(11003 * 8), counts(256);
    kc::DeviceBuffer<unsigned char> ws(kc::ch04::gating_before_workspace_bytes(p));
    const auto run = make_run(path, p, logits, weights, ids, counts, ws);
    kc::test::expect_graph_capturable(run);
    kc::test::expect_bitwise_repeatable(run);
  }
}

// The one ranking contract for every path (moe_gating.hpp): rows of +-1e4 logits, where all but the
// top probabilities underflow to 0 in fp32, still come out in logit order, ties by lower id.
TEST_F(MoeGatingGpu, HugeLogitsRankByLogitOnEveryPath) {
  for (int e : {8, 64, 256, 384}) {
    std::vector<float> logits(static_cast<std::size_t>(64) * e);
    std::mt19937_64 rng(kc::test::test_seed() + e);
    for (float& v : logits) v = static_cast<float>(static_cast<int>(rng() % 41) - 20) * 1e3f;  // -2e4 .. 2e4
    for (Path path : {Path::before, Path::after_fused, Path::step1_packed_keys, Path::step2_lean_rounds}) {
      check_case(path, softmax_params(64, e, std::min(e, 8), true), logits);
      check_case(path, softmax_params(64, e, std::min(e, 8), false), logits);
      GatingParams p = softmax_params(64, e, std::min(e, 8));
      p.scoring = Scoring::topk_then_softmax;
      check_case(path, p, logits);
    }
    std::vector<__nv_bfloat16> bf16(logits.size());
    for (std::size_t i = 0; i < bf16.size(); ++i) bf16[i] = __float2bfloat16(logits[i]);
    check_case(Path::before, softmax_params(64, e, std::min(e, 8), true), bf16);
    check_case(Path::after_fused, softmax_params(64, e, std::min(e, 8), true), bf16);
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

// ---------------------------------------------------------------- the warp primitives' cost

using kc::ch04::PrimitiveMode;
using kc::ch04::PrimitiveSample;
using kc::ch04::WarpPrimitive;
using kc::ch04::WarpPrimitiveConfig;

constexpr WarpPrimitive kPrimitives[] = {WarpPrimitive::shfl_xor, WarpPrimitive::redux_max, WarpPrimitive::vote_any,
                                         WarpPrimitive::ffma};

WarpPrimitiveConfig primitive_config(WarpPrimitive primitive, PrimitiveMode mode, int iterations = 8) {
  WarpPrimitiveConfig c;
  c.primitive = primitive;
  c.mode = mode;
  c.iterations = iterations;
  return c;
}

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

// Every primitive in both modes on the GPU: each block reports the checksum the host worked out (the
// instructions ran and computed what they should), a positive cycle count and a real SM; the metrics
// follow, and no rate exceeds what an SM can issue (four schedulers, one warp instruction a clock each).
TEST_F(MoeGatingGpu, WarpPrimitivesComputeWhatTheHostExpects) {
  for (WarpPrimitive primitive : kPrimitives) {
    for (PrimitiveMode mode : {PrimitiveMode::latency, PrimitiveMode::throughput}) {
      SCOPED_TRACE(std::string(kc::ch04::to_string(primitive)) +
                   (mode == PrimitiveMode::latency ? " latency" : " throughput"));
      const WarpPrimitiveConfig c = primitive_config(primitive, mode, 3);
      const int sms = device().sm_count;
      kc::test::GuardedOutput<PrimitiveSample> samples(
          static_cast<std::size_t>(kc::ch04::warp_primitive_blocks(c, sms)));
      kc::ch04::warp_primitive(c, sms, samples.data());
      kc::check(cudaDeviceSynchronize());
      const std::vector<PrimitiveSample> host = samples.to_host();
      const unsigned expected = kc::ch04::expected_primitive_checksum(c);
      for (std::size_t b = 0; b < host.size(); ++b) {
        ASSERT_EQ(host[b].checksum, expected) << "block " << b;
        ASSERT_GT(host[b].stop, host[b].start) << "block " << b;
        ASSERT_LT(host[b].sm, static_cast<unsigned>(sms)) << "block " << b;
      }
      if (mode == PrimitiveMode::latency) {
        EXPECT_GE(kc::ch04::primitive_cycles_per_op(c, host), 1.0);
      } else {
        const double rate = kc::ch04::primitive_ops_per_sm_clock(c, sms, host);
        EXPECT_GT(rate, 0.0);
        EXPECT_LE(rate, 4.0);
      }
    }
  }
}

}  // namespace
