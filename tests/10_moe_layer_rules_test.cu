// Chapter 10's CPU tests: the three configurations and their rules, the layer's two numbers, the
// workspace's regions, the fp64 references against values worked by hand, and the rules a launch
// checks. No CUDA call: they run without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kc/test_support.hpp"
#include "moe_layer.hpp"
#include "moe_stages.hpp"
#include "moe_workspace.hpp"
// Angle brackets: the exercise build tests the skeleton of combine_slots.hpp.
#include <combine_slots.hpp>

namespace {

using bf16 = __nv_bfloat16;
using kc::ch10::MoeConfig;
using kc::test::expect_invalid_argument;

template <class T>
T* fake(std::uint64_t address) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address));
}

// A small layer the tests can hold whole: 8 experts, top-2, H 64, I 32, one shared expert.
MoeConfig tiny() {
  MoeConfig c = kc::ch10::mixtral_8x7b();
  c.name = "tiny";
  c.hidden = 64;
  c.intermediate = 32;
  c.shared_experts = 1;
  return c;
}

TEST(MoeConfigs, TheModelsAsPublished) {
  const MoeConfig d = kc::ch10::deepseek_v3();
  EXPECT_EQ(std::make_pair(d.hidden, d.intermediate), std::make_pair(std::int64_t{7168}, std::int64_t{2048}));
  EXPECT_EQ(std::make_pair(d.experts, d.k), std::make_pair(256, 8));
  EXPECT_EQ(d.scoring, kc::ch04::Scoring::deepseek_v3);
  EXPECT_EQ(std::make_pair(d.n_group, d.topk_group), std::make_pair(8, 4));
  EXPECT_FLOAT_EQ(d.routed_scaling_factor, 2.5f);
  EXPECT_EQ(d.shared_experts, 1);
  const MoeConfig m = kc::ch10::mixtral_8x7b();
  EXPECT_EQ(std::make_pair(m.hidden, m.intermediate), std::make_pair(std::int64_t{4096}, std::int64_t{14336}));
  EXPECT_EQ(std::make_pair(m.experts, m.k), std::make_pair(8, 2));
  EXPECT_TRUE(m.renormalize);
  EXPECT_EQ(m.shared_experts, 0);
  const MoeConfig q = kc::ch10::qwen3_30b_a3b();
  EXPECT_EQ(std::make_pair(q.hidden, q.intermediate), std::make_pair(std::int64_t{2048}, std::int64_t{768}));
  EXPECT_EQ(std::make_pair(q.experts, q.k), std::make_pair(128, 8));
  for (const MoeConfig& c : {d, m, q, tiny()}) EXPECT_NO_THROW(kc::ch10::moe_config_rules(c)) << c.name;
  const kc::ch04::GatingParams p = kc::ch10::gating_params(d, 5);
  EXPECT_EQ(p.num_tokens, 5);
  EXPECT_EQ(p.n_group, 8);
}

TEST(MoeConfigs, RulesNameTheField) {
  MoeConfig c = tiny();
  c.hidden = 60;
  expect_invalid_argument([&] { kc::ch10::moe_config_rules(c); }, "config.hidden (60) must be a multiple of 8");
  c = tiny();
  c.intermediate = 0;
  expect_invalid_argument([&] { kc::ch10::moe_config_rules(c); }, "config.intermediate (0)");
  c = tiny();
  c.shared_experts = 9;
  expect_invalid_argument([&] { kc::ch10::moe_config_rules(c); }, "config.shared_experts (9) must be in [0, 8]");
  c = tiny();
  c.experts = 1020;
  c.shared_experts = 5;
  expect_invalid_argument([&] { kc::ch10::moe_config_rules(c); },
                          "config.experts + config.shared_experts (1025) must be at most 1024");
  c = tiny();
  c.k = 9;  // more than E
  EXPECT_THROW(kc::ch10::moe_config_rules(c), kc::InvalidArgument);
}

// The two numbers, worked by hand for the tiny layer at T = 3 with experts 0 and 5 busy.
TEST(MoeNumbers, BytesCountActiveExpertsOnce) {
  const MoeConfig c = tiny();
  std::vector<std::int32_t> counts(8, 0);
  counts[0] = 4;
  counts[5] = 2;
  const double elements = 2.0 * 3 * 64 + 8.0 * 64 + 3 * (3.0 * 32 * 64);  // x, y, router, 2 + 1 experts
  EXPECT_DOUBLE_EQ(kc::ch10::moe_min_bytes(c, 3, counts), 2.0 * elements);
  EXPECT_DOUBLE_EQ(kc::ch10::moe_flops(c, 3), 2.0 * 3 * 64 * 8 + 2.0 * 3 * 2 * 3 * 32 * 64 + 2.0 * 3 * 3 * 32 * 64);
  expect_invalid_argument([&] { kc::ch10::moe_min_bytes(c, 3, std::vector<std::int32_t>(7)); },
                          "counts must hold E (8) sizes");
  // DeepSeek-V3 at T = 4096 with every expert busy reads about 22.5 GB of routed weights.
  const MoeConfig d = kc::ch10::deepseek_v3();
  const double all = kc::ch10::moe_min_bytes(d, 4096, std::vector<std::int32_t>(256, 128));
  EXPECT_NEAR(all / 1e9, 22.5 + 0.088 + 0.117 + 0.004, 0.1);
}

// Every region of the workspace is 256-byte aligned, inside it, and disjoint from the others.
TEST(MoeWorkspace, RegionsAreAlignedAndDisjoint) {
  for (std::int64_t tokens : {1, 7, 300}) {
    const MoeConfig c = tiny();
    const std::size_t bytes = kc::ch10::moe_workspace_bytes(c, tokens);
    const kc::ch10::detail::MoeWorkspace at(c, tokens, fake<void>(0x10000));
    EXPECT_EQ(at.bytes, bytes);
    std::vector<std::pair<std::uintptr_t, std::uintptr_t>> spans;
    auto add = [&](const void* p, std::size_t n) {
      const auto b = reinterpret_cast<std::uintptr_t>(p);
      EXPECT_EQ(b % 256, 0u);
      EXPECT_GE(b, 0x10000u);
      EXPECT_LE(b + n, 0x10000u + bytes);
      spans.emplace_back(b, b + n);
    };
    const auto pairs = static_cast<std::size_t>(tokens * c.k);
    const auto rows = static_cast<std::size_t>(tokens * (c.k + 1));  // the shared slot too
    const auto t = static_cast<std::size_t>(tokens);
    add(at.logits, t * 8 * 2);
    add(at.route_weights, pairs * 4);
    add(at.ids, pairs * 4);
    add(at.slot_ids, rows * 4);
    add(at.counts, 9 * 4);
    add(at.offsets, 10 * 4);
    add(at.row_of_pair, rows * 4);
    add(at.token_of_row, rows * 4);
    add(at.weight_of_row, rows * 4);
    add(at.a, rows * 64 * 2);
    add(at.gate_up, pairs * 64 * 2);
    add(at.h, rows * 32 * 2);
    add(at.expert_out, rows * 64 * 2);
    add(at.shared_gate_up, t * 64 * 2);
    add(at.shared_h, t * 32 * 2);
    add(at.shared_out, t * 64 * 2);
    add(at.permute_scratch, at.permute_scratch_bytes);
    add(at.grouped_scratch, at.grouped_scratch_bytes);
    for (std::size_t i = 0; i < spans.size(); ++i) {
      for (std::size_t j = i + 1; j < spans.size(); ++j) {
        EXPECT_TRUE(spans[i].second <= spans[j].first || spans[j].second <= spans[i].first) << i << " and " << j;
      }
    }
    const kc::ch10::MoeRoutingView view = kc::ch10::moe_routing_in(c, tokens, fake<void>(0x10000));
    EXPECT_EQ(view.ids, at.ids);
    EXPECT_EQ(view.weights, at.route_weights);
  }
}

// The references against values small enough to work by hand (every value exact in bf16).
TEST(MoeReferences, WorkedByHand) {
  auto b = [](float v) { return __float2bfloat16(v); };
  const std::vector<bf16> x{b(1.0f), b(2.0f)};
  const std::vector<bf16> router{b(1.0f), b(0.0f), b(0.5f), b(-1.0f), b(0.25f), b(0.25f)};
  const std::vector<double> logits = kc::ch10::logits_reference(x, router, 2);
  EXPECT_EQ(logits, (std::vector<double>{1.0, -1.5, 0.75}));
  // I = 1: gate = x · (1, 0) = 1, up = x · (0, 1) = 2, h = silu(1) · 2; down = (3, -1).
  const std::vector<bf16> up{b(1.0f), b(0.0f), b(0.0f), b(1.0f)};
  const std::vector<bf16> down{b(3.0f), b(-1.0f)};
  const double h = 1.0 / (1.0 + std::exp(-1.0)) * 2.0;
  const std::vector<double> out = kc::ch10::expert_reference(x, up, down, 1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_DOUBLE_EQ(out[0], 3.0 * h);
  EXPECT_DOUBLE_EQ(out[1], -h);
  expect_invalid_argument([&] { kc::ch10::expert_reference(x, up, down, 2); }, "up must be [2 · intermediate, H]");
  expect_invalid_argument([&] { kc::ch10::logits_reference(x, router, 4); }, "whole rows of hidden (4)");
}

TEST(MoeRules, BadArgumentsNameTheRule) {
  const MoeConfig c = tiny();
  kc::ch10::MoeWeights w;
  w.router = fake<const bf16>(0x100000);
  w.up = fake<const bf16>(0x200000);
  w.down = fake<const bf16>(0x300000);
  const bf16* x = fake<const bf16>(0x600000);
  bf16* y = fake<bf16>(0x700000);
  void* ws = fake<void>(0x1000000);
  const std::size_t bytes = kc::ch10::moe_workspace_bytes(c, 5);
  auto call = [&](std::int64_t t, const bf16* xx, const kc::ch10::MoeWeights& ww, bf16* yy, void* wsp, std::size_t n) {
    kc::ch10::moe_layer_before(c, t, xx, ww, yy, wsp, n);
  };
  expect_invalid_argument([&] { call(-1, x, w, y, ws, bytes); }, "tokens (-1) must be in [0, 2^31 / (k + S))");
  expect_invalid_argument([&] { call(5, nullptr, w, y, ws, bytes); }, "x must not be null");
  expect_invalid_argument([&] { call(5, fake<const bf16>(0x600008), w, y, ws, bytes); }, "x must be 16-byte aligned");
  kc::ch10::MoeWeights no_down = w;
  no_down.down = nullptr;
  expect_invalid_argument([&] { call(5, x, no_down, y, ws, bytes); }, "weights.down must not be null");
  expect_invalid_argument([&] { call(5, x, w, fake<bf16>(0x600040), ws, bytes); }, "y must not overlap x");
  expect_invalid_argument([&] { call(5, x, w, y, nullptr, bytes); }, "workspace must not be null");
  expect_invalid_argument([&] { call(5, x, w, y, fake<void>(0x1000080), bytes); }, "256-byte aligned");
  expect_invalid_argument([&] { call(5, x, w, y, ws, bytes - 1); }, "(moe_workspace_bytes)");
  // No tokens: nothing to check past the configuration, nothing launched.
  EXPECT_NO_THROW(call(0, nullptr, {}, nullptr, nullptr, 0));
}

// Every step and `after` check the same rules before anything runs; a value that is no step is refused.
TEST(MoeRules, StepsCheckTheSameRules) {
  const MoeConfig c = tiny();
  kc::ch10::MoeWeights w;
  w.router = fake<const bf16>(0x100000);
  w.up = fake<const bf16>(0x200000);
  w.down = nullptr;
  const bf16* x = fake<const bf16>(0x600000);
  bf16* y = fake<bf16>(0x700000);
  void* ws = fake<void>(0x1000000);
  const std::size_t bytes = kc::ch10::moe_workspace_bytes(c, 5);
  for (kc::ch10::MoeStep step : kc::ch10::kMoeSteps) {
    expect_invalid_argument([&] { kc::ch10::moe_layer_step(step, c, 5, x, w, y, ws, bytes); },
                            "weights.down must not be null");
  }
  expect_invalid_argument([&] { kc::ch10::moe_layer_after(c, 5, x, w, y, ws, bytes); },
                          "weights.down must not be null");
  expect_invalid_argument(
      [&] { kc::ch10::moe_layer_step(static_cast<kc::ch10::MoeStep>(7), c, 5, x, w, y, ws, bytes); },
      "step must be a MoeStep");
  EXPECT_STREQ(kc::ch10::to_string(kc::ch10::MoeStep::row_parallel_copy), "step1_row_parallel_copy");
  EXPECT_STREQ(kc::ch10::to_string(kc::ch10::MoeStep::swiglu_epilogue), "step2_swiglu_epilogue");
  EXPECT_STREQ(kc::ch10::to_string(kc::ch10::MoeStep::weight_in_down), "step3_weight_in_down");
  EXPECT_STREQ(kc::ch10::to_string(kc::ch10::MoeStep::shared_as_expert), "step4_shared_as_expert");
  EXPECT_STREQ(kc::ch10::to_string(kc::ch10::MoeStep::gather_in_up), "step5_gather_in_up");
}

// Each step adds its fusion to the ones before; step 5's gather is its own; after is step 4 with the
// router's decode kernel, and no gather.
TEST(MoeRules, StepsAndAfterFusions) {
  const auto f1 = kc::ch10::detail::fusions_of(kc::ch10::MoeStep::row_parallel_copy);
  EXPECT_FALSE(f1.swiglu_epilogue || f1.weight_in_down || f1.shared_as_expert || f1.gather || f1.router_decode);
  const auto f4 = kc::ch10::detail::fusions_of(kc::ch10::MoeStep::shared_as_expert);
  EXPECT_TRUE(f4.swiglu_epilogue && f4.weight_in_down && f4.shared_as_expert);
  EXPECT_FALSE(f4.gather || f4.router_decode);
  const auto f5 = kc::ch10::detail::fusions_of(kc::ch10::MoeStep::gather_in_up);
  EXPECT_TRUE(f5.shared_as_expert && f5.gather);
  EXPECT_FALSE(f5.router_decode);
  const auto after = kc::ch10::detail::after_fusions();
  EXPECT_TRUE(after.swiglu_epilogue && after.weight_in_down && after.shared_as_expert && after.router_decode);
  EXPECT_FALSE(after.gather);
}

// The router's decode kernel takes 1 to 8 tokens, and says so before any launch.
TEST(MoeRules, RouterDecodeTokens) {
  EXPECT_EQ(kc::ch10::detail::kRouterDecodeTokens, 8);
  const bf16* x = fake<const bf16>(0x100000);
  const bf16* router = fake<const bf16>(0x900000);
  bf16* logits = fake<bf16>(0x1100000);
  expect_invalid_argument([&] { kc::ch10::detail::router_logits_decode(0, 256, 7168, x, router, logits, nullptr); },
                          "tokens (0) must be in [1, 8] for the router's decode kernel");
  expect_invalid_argument([&] { kc::ch10::detail::router_logits_decode(9, 256, 7168, x, router, logits, nullptr); },
                          "tokens (9) must be in [1, 8] for the router's decode kernel");
}

TEST(MoeCombine, RulesNameTheArgument) {
  const bf16* rows = fake<const bf16>(0x100000);
  const std::int32_t* rop = fake<const std::int32_t>(0x900000);
  const bf16* y = fake<const bf16>(0x800000);
  auto check = [&](std::int64_t t, int slots, std::int64_t h, const bf16* r, const std::int32_t* p, const bf16* yy) {
    kc::ch10::validate_combine_rows(t, slots, h, r, p, yy);
  };
  EXPECT_NO_THROW(check(4, 9, 64, rows, rop, y));
  EXPECT_NO_THROW(check(0, 9, 64, nullptr, nullptr, nullptr));
  expect_invalid_argument([&] { check(-1, 9, 64, rows, rop, y); }, "tokens (-1) must be in [0, 2^31 - 1]");
  expect_invalid_argument([&] { check(4, 0, 64, rows, rop, y); }, "slots (0) must be in [1, 40]");
  expect_invalid_argument([&] { check(4, 41, 64, rows, rop, y); }, "slots (41) must be in [1, 40]");
  expect_invalid_argument([&] { check(4, 9, 60, rows, rop, y); }, "hidden (60) must be a multiple of 8");
  expect_invalid_argument([&] { check(0x10000000, 9, 64, rows, rop, y); }, "tokens · slots must be at most 2^31 - 1");
  expect_invalid_argument([&] { check(4, 9, 64, nullptr, rop, y); }, "must not be null when tokens > 0");
  expect_invalid_argument([&] { check(4, 9, 64, fake<const bf16>(0x100008), rop, y); }, "16-byte aligned");
  // rows span [0x100000, 0x100000 + 4 · 9 · 64 · 2): a y inside it is refused.
  expect_invalid_argument([&] { check(4, 9, 64, rows, rop, fake<const bf16>(0x100400)); }, "y must not overlap rows");
  expect_invalid_argument([&] { check(4, 9, 64, rows, rop, fake<const bf16>(0x900010)); },
                          "y must not overlap row_of_pair");
}

// The exercise's function: the token's rows summed in slot order, negative rows skipped. Values chosen
// so that any other order, or a sum that does not start at zero, gives other bits: 2^24 + 1 + 1 is
// 2^24 in fp32 in slot order, 2^24 + 2 when the ones are added first.
TEST(MoeCombine, SumsTheSlotsInOrder) {
  std::vector<kc::ch10::Columns8> rows(6);
  for (int c = 0; c < 8; ++c) {
    rows[0].v[c] = 16777216.0f;  // 2^24
    rows[1].v[c] = 1.0f;
    rows[2].v[c] = 1.0f;
    rows[3].v[c] = static_cast<float>(c) - 3.5f;
    rows[4].v[c] = 1000.0f;  // a row no slot names: never read
    rows[5].v[c] = 0.25f * static_cast<float>(c);
  }
  int loads = 0;
  auto load = [&](std::int32_t r) {
    ++loads;
    EXPECT_GE(r, 0) << "a negative row is skipped, never loaded";
    return rows[static_cast<std::size_t>(r)];
  };
  const std::int32_t slots[] = {0, 1, -1, 2, 3, 5};
  const kc::ch10::Columns8 sum = kc::ch10::sum_slot_rows(slots, 6, load);
  EXPECT_EQ(loads, 5);
  for (int c = 0; c < 8; ++c) {
    float want = 0.0f;
    for (int r : {0, 1, 2, 3, 5}) want += rows[static_cast<std::size_t>(r)].v[c];
    EXPECT_EQ(sum.v[c], want) << "column " << c;
  }
  EXPECT_EQ(sum.v[0], 16777216.0f - 3.5f + 0.0f);  // the ones vanish in slot order
  // One slot: the row itself; a token whose only slot was dropped: zeros.
  const std::int32_t one[] = {5}, none[] = {-1};
  EXPECT_EQ(kc::ch10::sum_slot_rows(one, 1, load).v[7], 1.75f);
  EXPECT_EQ(kc::ch10::sum_slot_rows(none, 1, load).v[3], 0.0f);
}

}  // namespace
