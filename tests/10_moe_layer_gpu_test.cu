// Chapter 10 on the GPU: every variant of the layer (before, the steps, after) against the fp64
// reference. The routing is compared first (the router's bf16 logits may break a near-tie the other
// way), then the output of every token whose experts agree: the weighted sum of its experts' fp64
// outputs plus the shared experts'. Small configurations of each routing kind at T from 1 to 300;
// sampled tokens of the three real models; experts left empty and one expert with every token; ties
// in the router; a NaN token; the combine alone; CUDA graph capture and bitwise-identical reruns.
// Skipped off sm_90.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "grouped_gemm_problems.hpp"  // bytes_of
#include "hopper_gemm_checks.hpp"
#include "kc/check.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"
#include "moe_layer.hpp"
#include "moe_stages.hpp"  // the router's decode kernel
// Angle brackets: the exercise build tests the skeleton of combine_slots.hpp.
#include <combine_slots.hpp>

namespace {

using bf16 = __nv_bfloat16;
using kc::ch10::MoeConfig;
using kc::ch10::MoeStep;

class MoeLayerGpu : public kc::test::hopper::HopperGpuTest {};

std::uint16_t bits(bf16 v) {
  std::uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

// A variant of the layer: before, a step, or after.
struct Variant {
  std::string name;
  std::function<void(const MoeConfig&, std::int64_t, const bf16*, const kc::ch10::MoeWeights&, bf16*, void*,
                     std::size_t, cudaStream_t)>
      launch;
};

std::vector<Variant> variants() {
  std::vector<Variant> all{{"before", kc::ch10::moe_layer_before}};
  for (MoeStep step : kc::ch10::kMoeSteps) {
    all.push_back(
        {kc::ch10::to_string(step),
         [step](const MoeConfig& c, std::int64_t t, const bf16* x, const kc::ch10::MoeWeights& w, bf16* y, void* ws,
                std::size_t n, cudaStream_t s) { kc::ch10::moe_layer_step(step, c, t, x, w, y, ws, n, s); }});
  }
  all.push_back({"after", kc::ch10::moe_layer_after});
  return all;
}

// Small layers of each routing kind: softmax top-2 of 8 (Mixtral's), softmax top-8 of 128 renormalised
// (Qwen3's), and DeepSeek-V3's grouped sigmoid routing over 64 experts in 8 groups with a shared expert.
std::vector<MoeConfig> small_configs() {
  MoeConfig mixtral = kc::ch10::mixtral_8x7b();
  mixtral.hidden = 256;
  mixtral.intermediate = 128;
  MoeConfig qwen = kc::ch10::qwen3_30b_a3b();
  qwen.hidden = 128;
  qwen.intermediate = 64;
  MoeConfig dsv3 = kc::ch10::deepseek_v3();
  dsv3.hidden = 256;
  dsv3.intermediate = 64;
  dsv3.experts = 64;
  return {mixtral, qwen, dsv3};
}

// The layer's inputs on the device and on the host (the reference reads the host copies).
struct Layer {
  MoeConfig config;
  std::int64_t tokens;
  std::vector<bf16> x, router, up, down;
  std::vector<float> bias;
  std::optional<kc::DeviceBuffer<bf16>> d_x, d_router, d_up, d_down;
  std::optional<kc::DeviceBuffer<float>> d_bias;

  // The real models' experts live on the device only (DeepSeek-V3's are 22.6 GB): the reference copies
  // back the experts it needs, once each.
  bool device_only = false;
  mutable std::map<std::int64_t, std::pair<std::vector<bf16>, std::vector<bf16>>> fetched;

  Layer(const MoeConfig& c, std::int64_t t, std::uint64_t seed, bool on_device_only = false)
      : config(c),
        tokens(t),
        x(static_cast<std::size_t>(t * c.hidden)),
        router(static_cast<std::size_t>(c.experts * c.hidden)),
        bias(static_cast<std::size_t>(c.experts)) {
    // Weights scaled as a trained layer's are (about 1 / sqrt(fan-in)), so activations stay O(1).
    const double wr = 2.0 / std::sqrt(static_cast<double>(c.hidden));
    const double wu = 1.0 / std::sqrt(static_cast<double>(c.hidden));
    kc::fill_uniform(std::span<bf16>(x), seed, -1.0, 1.0);
    kc::fill_uniform(std::span<bf16>(router), seed + 1, -wr, wr);
    kc::fill_uniform(std::span<float>(bias), seed + 6, -0.1, 0.1);
    const auto all = static_cast<std::size_t>((c.experts + c.shared_experts) * 3 * c.intermediate * c.hidden / 3);
    device_only = on_device_only;
    if (device_only) {
      d_up.emplace(2 * all);
      d_down.emplace(all);
      kc::fill_uniform_device(d_up->data(), d_up->size(), seed + 2, -wu, wu);
      kc::fill_uniform_device(d_down->data(), d_down->size(), seed + 3, -2.0 * wu, 2.0 * wu);
      kc::check(cudaDeviceSynchronize());
    } else {
      up.resize(2 * all);
      down.resize(all);
      kc::fill_uniform(std::span<bf16>(up), seed + 2, -wu, wu);
      kc::fill_uniform(std::span<bf16>(down), seed + 3, -2.0 * wu, 2.0 * wu);
      d_up.emplace(up);
      d_down.emplace(down);
    }
    upload_inputs();
  }

  // x, the router and the bias again, after a test changed their host copies.
  void upload_inputs() {
    d_x.emplace(x);
    d_router.emplace(router);
    d_bias.emplace(bias);
  }

  kc::ch10::MoeWeights weights() const {
    kc::ch10::MoeWeights w;
    w.router = d_router->data();
    w.up = d_up->data();
    w.down = d_down->data();
    if (config.scoring == kc::ch04::Scoring::deepseek_v3) w.correction_bias = d_bias->data();
    return w;
  }

  // Expert e's output for token t in fp64.
  std::vector<double> expert_output(std::int64_t t, std::int64_t e) const {
    const std::int64_t h = config.hidden, i = config.intermediate;
    const auto up_size = static_cast<std::size_t>(2 * i * h), down_size = static_cast<std::size_t>(h * i);
    std::span<const bf16> w_up, w_down;
    if (device_only) {
      auto [it, fresh] = fetched.try_emplace(e);
      if (fresh) {
        it->second.first.resize(up_size);
        it->second.second.resize(down_size);
        kc::check(
            cudaMemcpy(it->second.first.data(), d_up->data() + e * 2 * i * h, up_size * 2, cudaMemcpyDeviceToHost));
        kc::check(
            cudaMemcpy(it->second.second.data(), d_down->data() + e * h * i, down_size * 2, cudaMemcpyDeviceToHost));
      }
      w_up = it->second.first;
      w_down = it->second.second;
    } else {
      w_up = std::span<const bf16>(up).subspan(static_cast<std::size_t>(e) * up_size, up_size);
      w_down = std::span<const bf16>(down).subspan(static_cast<std::size_t>(e) * down_size, down_size);
    }
    return kc::ch10::expert_reference(
        std::span<const bf16>(x).subspan(static_cast<std::size_t>(t * h), static_cast<std::size_t>(h)), w_up, w_down,
        i);
  }
};

struct Result {
  std::vector<bf16> y;
  std::vector<std::int32_t> ids;
};

Result run(const Variant& variant, const Layer& layer, cudaStream_t stream = nullptr) {
  const MoeConfig& c = layer.config;
  kc::DeviceBuffer<unsigned char> workspace(kc::ch10::moe_workspace_bytes(c, layer.tokens));
  workspace.fill_bytes(kc::test::kPoisonByte);
  kc::test::GuardedOutput<bf16> y(static_cast<std::size_t>(layer.tokens * c.hidden));
  variant.launch(c, layer.tokens, layer.d_x->data(), layer.weights(), y.data(), workspace.data(), workspace.size(),
                 stream);
  kc::check(cudaStreamSynchronize(stream));
  EXPECT_EQ(y.guard_damage(), 0u) << variant.name << " wrote past y";
  Result r;
  r.y = y.to_host();
  const kc::ch10::MoeRoutingView view = kc::ch10::moe_routing_in(c, layer.tokens, workspace.data());
  r.ids.resize(static_cast<std::size_t>(layer.tokens * c.k));
  kc::check(cudaMemcpy(r.ids.data(), view.ids, r.ids.size() * 4, cudaMemcpyDeviceToHost));
  return r;
}

// Chapter 4's routing reference on the fp64 logits rounded to bf16, as the router GEMM rounds them:
// only a sum landing on a rounding boundary can route a token differently.
kc::ch04::GatingReference routing_reference(const Layer& layer) {
  const MoeConfig& c = layer.config;
  std::vector<double> logits = kc::ch10::logits_reference(layer.x, layer.router, c.hidden);
  for (double& l : logits) l = kc::to_double(__float2bfloat16(static_cast<float>(l)));
  std::vector<double> bias(layer.bias.begin(), layer.bias.end());
  if (c.scoring != kc::ch04::Scoring::deepseek_v3) bias.clear();
  return kc::ch04::gating_reference(kc::ch10::gating_params(c, layer.tokens), logits, bias);
}

// Routing first (the same set of experts per token), then y for the @p checked tokens that agree
// (all of them when empty), against fp64: the weighted experts plus the shared ones (weight 1).
void expect_matches_reference(const Layer& layer, const Result& got, const std::string& what,
                              std::vector<std::int64_t> checked = {}) {
  const MoeConfig& c = layer.config;
  const kc::ch04::GatingReference want = routing_reference(layer);
  if (checked.empty()) {
    for (std::int64_t t = 0; t < layer.tokens; ++t) checked.push_back(t);
  }
  std::int64_t agree = 0;
  std::vector<bf16> sampled;
  std::vector<double> expected;
  const auto k = static_cast<std::size_t>(c.k);
  for (std::int64_t t = 0; t < layer.tokens; ++t) {
    std::vector<std::int32_t> a(got.ids.begin() + t * c.k, got.ids.begin() + (t + 1) * c.k);
    std::vector<std::int32_t> b(want.ids.begin() + t * c.k, want.ids.begin() + (t + 1) * c.k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) continue;
    ++agree;
    if (std::find(checked.begin(), checked.end(), t) == checked.end()) continue;
    std::vector<double> y(static_cast<std::size_t>(c.hidden), 0.0);
    for (std::size_t j = 0; j < k + static_cast<std::size_t>(c.shared_experts); ++j) {
      const bool routed = j < k;
      const std::int64_t e =
          routed ? want.ids[static_cast<std::size_t>(t) * k + j] : c.experts + static_cast<std::int64_t>(j - k);
      const double w = routed ? want.weights[static_cast<std::size_t>(t) * k + j] : 1.0;
      const std::vector<double> out = layer.expert_output(t, e);
      for (std::size_t col = 0; col < y.size(); ++col) y[col] += w * out[col];
    }
    for (std::int64_t col = 0; col < c.hidden; ++col) {
      sampled.push_back(got.y[static_cast<std::size_t>(t * c.hidden + col)]);
      expected.push_back(y[static_cast<std::size_t>(col)]);
    }
  }
  // A logit summed in another order can round to the other bf16 neighbour and flip a near-tie: rare.
  EXPECT_GE(agree * 10, layer.tokens * 9) << what << ": " << agree << " of " << layer.tokens << " tokens routed alike";
  ASSERT_FALSE(expected.empty()) << what << ": no checked token routed alike";
  // Up to five roundings to bf16 between x and y (logits, gate_up, h, expert rows, y): 2e-2.
  kc::test::expect_close(kc::compare<bf16>(sampled, expected, kc::test::kPoisonByte), 2e-2, what + " vs fp64");
}

TEST_F(MoeLayerGpu, EveryVariantMatchesFp64) {
  const std::uint64_t seed = kc::test::test_seed();
  for (const MoeConfig& c : small_configs()) {
    for (std::int64_t tokens : {1, 7, 64, 300}) {
      if (tokens > 64 && kc::test::small_tests_only()) continue;  // compute-sanitizer runs: the smaller ones
      const Layer layer(c, tokens, seed + static_cast<std::uint64_t>(tokens));
      for (const Variant& v : variants()) {
        const std::string what = c.name + " T=" + std::to_string(tokens) + " " + v.name;
        SCOPED_TRACE(what);
        expect_matches_reference(layer, run(v, layer), what);
      }
    }
  }
}

// The real models at T = 64 (DeepSeek-V3's 22.6 GB of experts filled on the device): the routing of
// every token, the output of a few sampled ones, for before and after.
TEST_F(MoeLayerGpu, ModelsMatchFp64OnSampledTokens) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: the real models' layers";
  const std::uint64_t seed = kc::test::test_seed();
  for (const MoeConfig& c : {kc::ch10::deepseek_v3(), kc::ch10::mixtral_8x7b(), kc::ch10::qwen3_30b_a3b()}) {
    const Layer layer(c, 64, seed, true);
    for (const Variant& v : variants()) {
      if (v.name != "before" && v.name != "after") continue;
      const std::string what = c.name + " T=64 " + v.name;
      SCOPED_TRACE(what);
      expect_matches_reference(layer, run(v, layer), what, {0, 63});
    }
  }
}

// One expert (Mixtral's) or eight (Qwen3's) take every token, the others none: router rows pointing
// along x (all positive) win for every token. Then two router rows made equal: exact ties, which the
// GPU and the reference break alike (the lower expert id first).
TEST_F(MoeLayerGpu, EmptyAndOverloadedExpertsAndTies) {
  const std::uint64_t seed = kc::test::test_seed();
  for (const MoeConfig& c : {small_configs()[0], small_configs()[1]}) {
    Layer layer(c, 300, seed);
    for (bf16& v : layer.x) v = __float2bfloat16(std::fabs(__bfloat162float(v)));
    for (int e = 0; e < c.k; ++e) {
      for (std::int64_t col = 0; col < c.hidden; ++col) {
        layer.router[static_cast<std::size_t>(e * c.hidden + col)] =
            __float2bfloat16(0.5f - 0.03f * static_cast<float>(e));
      }
    }
    layer.upload_inputs();
    for (const Variant& v : variants()) {
      const std::string what = c.name + " overloaded " + v.name;
      SCOPED_TRACE(what);
      const Result got = run(v, layer);
      for (std::int32_t id : got.ids) ASSERT_LT(id, c.k) << "every token routes to experts 0 .. k - 1";
      expect_matches_reference(layer, got, what);
    }
    Layer ties(c, 300, seed + 1);
    std::copy_n(ties.router.begin() + 2 * c.hidden, c.hidden, ties.router.begin() + 5 * c.hidden);
    ties.upload_inputs();
    for (const Variant& v : variants()) {
      const std::string what = c.name + " ties " + v.name;
      SCOPED_TRACE(what);
      expect_matches_reference(ties, run(v, ties), what);
    }
  }
}

// A NaN in one token's x reaches no other token: every other row of y is bitwise the clean run's.
TEST_F(MoeLayerGpu, NanStaysInItsToken) {
  for (const MoeConfig& c : small_configs()) {
    Layer layer(c, 64, kc::test::test_seed());
    for (const Variant& v : variants()) {
      SCOPED_TRACE(c.name + " " + v.name);
      layer.x[static_cast<std::size_t>(5 * c.hidden + 3)] = __float2bfloat16(1.0f);
      layer.upload_inputs();
      const Result clean = run(v, layer);
      layer.x[static_cast<std::size_t>(5 * c.hidden + 3)] = __float2bfloat16(NAN);
      layer.upload_inputs();
      const Result poisoned = run(v, layer);
      for (std::int64_t t = 0; t < layer.tokens; ++t) {
        if (t == 5) continue;
        const auto row = static_cast<std::size_t>(t * c.hidden);
        ASSERT_TRUE(std::equal(clean.y.begin() + row, clean.y.begin() + row + c.hidden, poisoned.y.begin() + row,
                               [](bf16 a, bf16 b) { return bits(a) == bits(b); }))
            << "token " << t << " changed";
      }
    }
  }
}

// The router's decode kernel (after's router at T <= 8) against fp64 at DeepSeek-V3's size and an odd
// one: each logit within its bf16 rounding and the fp32 sum's error. Two equal router rows give equal
// bits; a NaN in one token's x reaches that token's logits only; nothing is written past [T, E].
TEST_F(MoeLayerGpu, RouterDecodeMatchesFp64) {
  const std::uint64_t seed = kc::test::test_seed();
  for (const auto& [experts, hidden] : {std::pair<int, std::int64_t>{256, 7168}, {5, 296}}) {
    for (std::int64_t tokens = 1; tokens <= kc::ch10::detail::kRouterDecodeTokens; ++tokens) {
      SCOPED_TRACE("E=" + std::to_string(experts) + " H=" + std::to_string(hidden) + " T=" + std::to_string(tokens));
      std::vector<bf16> x(static_cast<std::size_t>(tokens * hidden)),
          router(static_cast<std::size_t>(experts * hidden));
      kc::fill_uniform(std::span<bf16>(x), seed + static_cast<std::uint64_t>(tokens), -1.0, 1.0);
      kc::fill_uniform(std::span<bf16>(router), seed + 100, -0.05, 0.05);
      std::copy_n(router.begin() + hidden, hidden, router.begin() + (experts - 1) * hidden);  // rows 1 and E-1 tie
      const kc::DeviceBuffer<bf16> d_router(router);
      kc::DeviceBuffer<bf16> d_x(x);
      kc::test::GuardedOutput<bf16> logits(static_cast<std::size_t>(tokens * experts));
      const auto launch = [&] {
        logits.poison();
        kc::ch10::detail::router_logits_decode(tokens, experts, hidden, d_x.data(), d_router.data(), logits.data(),
                                               nullptr);
        kc::check(cudaDeviceSynchronize());
        EXPECT_EQ(logits.guard_damage(), 0u);
        return logits.to_host();
      };
      const std::vector<bf16> got = launch();
      const std::vector<double> want = kc::ch10::logits_reference(x, router, hidden);
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (int e = 0; e < experts; ++e) {
          double magnitude = 0.0;  // the sum of |x · w| bounds the fp32 sum's error
          for (std::int64_t i = 0; i < hidden; ++i) {
            magnitude += std::fabs(kc::to_double(x[static_cast<std::size_t>(t * hidden + i)]) *
                                   kc::to_double(router[static_cast<std::size_t>(e * hidden + i)]));
          }
          const auto at = static_cast<std::size_t>(t * experts + e);
          const double ref = want[at];
          ASSERT_NEAR(kc::to_double(got[at]), ref, std::fabs(ref) * 0x1p-8 + magnitude * 1e-5)
              << "token " << t << " expert " << e;
        }
        ASSERT_EQ(bits(got[static_cast<std::size_t>(t * experts + 1)]),
                  bits(got[static_cast<std::size_t>(t * experts + experts - 1)]))
            << "equal router rows, token " << t;
      }
      const std::vector<bf16> again = launch();
      EXPECT_TRUE(std::equal(again.begin(), again.end(), got.begin(), [](bf16 a, bf16 b) {
        return bits(a) == bits(b);
      })) << "a rerun changed the logits";
      // A NaN in the last token's x: its logits are NaN, every other token's are the same bits.
      x[static_cast<std::size_t>((tokens - 1) * hidden + 3)] = __float2bfloat16(NAN);
      d_x = kc::DeviceBuffer<bf16>(x);
      const std::vector<bf16> poisoned = launch();
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (int e = 0; e < experts; ++e) {
          const auto at = static_cast<std::size_t>(t * experts + e);
          if (t == tokens - 1) {
            ASSERT_TRUE(std::isnan(kc::to_double(poisoned[at]))) << "expert " << e;
          } else {
            ASSERT_EQ(bits(poisoned[at]), bits(got[at])) << "token " << t << " expert " << e;
          }
        }
      }
    }
  }
}

// combine_rows against sum_slot_rows on the host, bit for bit: odd sizes, dropped slots, T = 0, and a
// rejected call that writes nothing.
TEST_F(MoeLayerGpu, CombineRowsIsTheSlotOrderSum) {
  const std::int64_t tokens = 37, hidden = 136;
  const int slots = 9;
  std::vector<bf16> rows(static_cast<std::size_t>(tokens * slots * hidden));
  kc::fill_uniform(std::span<bf16>(rows), kc::test::test_seed(), -4.0, 4.0);
  std::vector<std::int32_t> row_of_pair(static_cast<std::size_t>(tokens * slots));
  for (std::size_t p = 0; p < row_of_pair.size(); ++p) {
    row_of_pair[p] = p % 7 == 3 ? -1 : static_cast<std::int32_t>((p * 131) % row_of_pair.size());
  }
  const kc::DeviceBuffer<bf16> d_rows(rows);
  const kc::DeviceBuffer<std::int32_t> d_rop(row_of_pair);
  kc::test::GuardedOutput<bf16> y(static_cast<std::size_t>(tokens * hidden));
  kc::ch10::combine_rows(tokens, slots, hidden, d_rows.data(), d_rop.data(), y.data());
  kc::check(cudaDeviceSynchronize());
  EXPECT_EQ(y.guard_damage(), 0u);
  const std::vector<bf16> got = y.to_host();
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t col = 0; col < hidden; col += 8) {
      const kc::ch10::Columns8 want =
          kc::ch10::sum_slot_rows(row_of_pair.data() + t * slots, slots, [&](std::int32_t r) {
            kc::ch10::Columns8 v;
            for (int i = 0; i < 8; ++i) v.v[i] = __bfloat162float(rows[static_cast<std::size_t>(r * hidden + col + i)]);
            return v;
          });
      for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(bits(got[static_cast<std::size_t>(t * hidden + col + i)]), bits(__float2bfloat16(want.v[i])))
            << "token " << t << " column " << col + i;
      }
    }
  }
  kc::ch10::combine_rows(0, slots, hidden, nullptr, nullptr, nullptr);  // nothing to do
  y.poison();
  kc::test::expect_invalid_argument(
      [&] { kc::ch10::combine_rows(tokens, slots, 130, d_rows.data(), d_rop.data(), y.data()); }, "hidden (130)");
  kc::check(cudaDeviceSynchronize());
  const std::vector<bf16> after_reject = y.to_host();
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(after_reject), kc::test::kPoisonByte), after_reject.size())
      << "a rejected call wrote";
}

// No allocation, no synchronisation: a CUDA graph captures the whole layer (global capture mode, so a
// host synchronisation anywhere on the path fails it); reruns are bitwise identical.
TEST_F(MoeLayerGpu, GraphCapturableAndRepeatable) {
  for (const MoeConfig& c : small_configs()) {
    const Layer layer(c, 40, kc::test::test_seed());
    for (const Variant& v : variants()) {
      SCOPED_TRACE(c.name + " " + v.name);
      kc::DeviceBuffer<unsigned char> workspace(kc::ch10::moe_workspace_bytes(c, layer.tokens));
      kc::DeviceBuffer<bf16> y(static_cast<std::size_t>(layer.tokens * c.hidden));
      const auto launch = [&](cudaStream_t stream) {
        v.launch(c, layer.tokens, layer.d_x->data(), layer.weights(), y.data(), workspace.data(), workspace.size(),
                 stream);
      };
      launch(nullptr);  // the first call per device sets the kernels' attributes: outside the capture
      kc::check(cudaDeviceSynchronize());
      const kc::test::LaunchUnderTest under_test{launch, [&] { y.fill_bytes(kc::test::kPoisonByte); },
                                                 [&] { return kc::test::grouped::bytes_of(y); }};
      kc::test::expect_graph_capturable(under_test);
      kc::test::expect_bitwise_repeatable(under_test);
      // A rejected launch (a workspace one byte short) writes nothing.
      y.fill_bytes(kc::test::kPoisonByte);
      kc::test::expect_invalid_argument(
          [&] {
            v.launch(c, layer.tokens, layer.d_x->data(), layer.weights(), y.data(), workspace.data(),
                     workspace.size() - 1, nullptr);
          },
          "(moe_workspace_bytes)");
      kc::check(cudaDeviceSynchronize());
      for (unsigned char b : kc::test::grouped::bytes_of(y)) ASSERT_EQ(b, kc::test::kPoisonByte);
    }
  }
}

}  // namespace
