// Chapter 4 tests: DeepSeek-V3's grouped routing (fp32 and bf16 logits, several group shapes,
// E from 8 to 512, k up to 32) on every path, and its wide blocks on both sides of the switch.
// The shared inputs, paths and checks, with the tolerances and why, are in moe_gating_checks.hpp.
// GPU tests skip with a reason where there is no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "moe_gating_checks.hpp"

namespace {

using namespace kc::test::moe_gating;

TEST_F(MoeGatingGpu, DeepSeekV3) {
  const std::uint64_t seed = kc::test::test_seed();
  for (const GatingParams& shape :
       {dsv3_params(1), dsv3_params(7), dsv3_params(4096), dsv3_params(7, 64, 6, 8, 3), dsv3_params(7, 384, 8, 8, 4),
        dsv3_params(7, 512, 32, 16, 8), dsv3_params(7, 8, 2, 4, 2), dsv3_params(7, 160, 8, 1, 1)}) {
    if (shape.num_tokens == 4096 && kc::test::small_tests_only()) continue;
    std::vector<float> logits, bias;
    dsv3_inputs(shape.num_tokens, shape.num_experts, seed, logits, bias);
    check_paths({Path::after_fused, Path::after_separate, Path::after_no_counts, Path::after_automatic, Path::before},
                shape, logits, bias);
    // bf16 logits: for E = 64, 256 and 512 the grid (multiples of 8 / E in [-4, 4]) is exact in
    // bf16, so the inputs keep their gaps; the 16-byte vectors then hold 8 experts, not 4.
    if (shape.num_experts == 64 || shape.num_experts == 256 || shape.num_experts == 512) {
      std::vector<__nv_bfloat16> logits_bf16(logits.size());
      for (std::size_t i = 0; i < logits.size(); ++i) {
        logits_bf16[i] = __float2bfloat16_rn(logits[i]);
        ASSERT_EQ(__bfloat162float(logits_bf16[i]), logits[i]) << "the grid must be exact in bf16";
      }
      check_paths({Path::after_fused, Path::after_separate, Path::after_no_counts, Path::after_automatic, Path::before},
                  shape, logits_bf16, bias);
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
    check_paths({Path::after_fused, Path::after_no_counts}, dsv3_params(t), logits, bias);
  }
}

}  // namespace
