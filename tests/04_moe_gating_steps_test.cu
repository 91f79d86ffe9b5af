// Chapter 4 tests: the fused kernel's steps (step 1 packed keys, step 2 lean rounds, step 3 the
// batched epilogue) against the reference on large grids, the counts summed in clusters, and graph
// capture with bitwise-repeatable results.
// The shared inputs, paths and checks, with the tolerances and why, are in moe_gating_checks.hpp.
// GPU tests skip with a reason where there is no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moe_gating_checks.hpp"

namespace {

using namespace kc::test::moe_gating;

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
        check_paths({Path::after_fused, Path::step1_packed_keys, Path::step2_lean_rounds},
                    softmax_params(t, e, k, true), logits);
      }
    }
  }
}

TEST_F(MoeGatingGpu, StepsMatchTheReferenceUpTo128Experts) { check_large_grids({8, 64, 128}); }
TEST_F(MoeGatingGpu, StepsMatchTheReferenceAt256Experts) { check_large_grids({256}); }
TEST_F(MoeGatingGpu, StepsMatchTheReferenceAbove256Experts) { check_large_grids({384, 512}); }

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
      GatingParams topk_first = softmax_params(t, e, 8);
      topk_first.scoring = Scoring::topk_then_softmax;
      for (const GatingParams& p : {softmax_params(t, e, 8, true), topk_first}) {
        check_paths({Path::after_fused, Path::after_no_counts, Path::step2_lean_rounds}, p, logits);
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
    GatingParams topk_first = softmax_params(t, e, 8);
    topk_first.scoring = Scoring::topk_then_softmax;
    for (const GatingParams& p : {softmax_params(t, e, 8, true), topk_first}) {
      check_paths({Path::after_fused, Path::step2_lean_rounds}, p, logits);
    }
    check_case(Path::after_fused, softmax_params(t, e, 6, true), logits);  // step 2
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
  for (const auto& shape : shapes) {
    const auto logits = grid_logits(static_cast<std::size_t>(shape.t * shape.e), seed + shape.e);
    check_paths({Path::after_fused, Path::after_automatic}, softmax_params(shape.t, shape.e, shape.k, true), logits);
  }
  std::vector<float> logits, bias;
  const GatingParams deepseek = dsv3_params(64 * 8 + 1);
  dsv3_inputs(deepseek.num_tokens, deepseek.num_experts, seed, logits, bias);
  check_paths({Path::after_fused, Path::after_automatic}, deepseek, logits, bias);
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

}  // namespace
