// Chapter 10 on the GPU: the layer's `before` chain against the fp64 reference. The routing is
// compared first (the router's bf16 logits may break a near-tie the other way), then the output of
// every token whose experts agree: the weighted sum of its experts' fp64 outputs plus the shared
// expert's. Small configurations of each routing kind, T from 1 to 300; a CUDA graph capture and
// bitwise-identical reruns. Skipped off sm_90.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "grouped_gemm_problems.hpp"  // bytes_of
#include "hopper_gemm_checks.hpp"
#include "kc/check.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"
#include "moe_layer.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch10::MoeConfig;

class MoeLayerGpu : public kc::test::hopper::HopperGpuTest {};

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
  dsv3.shared_intermediate = 96;
  return {mixtral, qwen, dsv3};
}

// The layer's inputs on the device and on the host (the reference reads the host copies).
struct Layer {
  MoeConfig config;
  std::int64_t tokens;
  std::vector<bf16> x, router, up, down, shared_up, shared_down;
  std::vector<float> bias;
  std::optional<kc::DeviceBuffer<bf16>> d_x, d_router, d_up, d_down, d_shared_up, d_shared_down;
  std::optional<kc::DeviceBuffer<float>> d_bias;

  Layer(const MoeConfig& c, std::int64_t t, std::uint64_t seed)
      : config(c),
        tokens(t),
        x(static_cast<std::size_t>(t * c.hidden)),
        router(static_cast<std::size_t>(c.experts * c.hidden)),
        up(static_cast<std::size_t>(c.experts * 2 * c.intermediate * c.hidden)),
        down(static_cast<std::size_t>(c.experts * c.hidden * c.intermediate)),
        shared_up(static_cast<std::size_t>(2 * c.shared_intermediate * c.hidden)),
        shared_down(static_cast<std::size_t>(c.hidden * c.shared_intermediate)),
        bias(static_cast<std::size_t>(c.experts)) {
    // Weights scaled as a trained layer's are (about 1 / sqrt(fan-in)), so activations stay O(1).
    const double wx = 1.0, wr = 2.0 / std::sqrt(static_cast<double>(c.hidden));
    const double wu = 1.0 / std::sqrt(static_cast<double>(c.hidden));
    kc::fill_uniform(std::span<bf16>(x), seed, -wx, wx);
    kc::fill_uniform(std::span<bf16>(router), seed + 1, -wr, wr);
    kc::fill_uniform(std::span<bf16>(up), seed + 2, -wu, wu);
    kc::fill_uniform(std::span<bf16>(down), seed + 3, -2.0 * wu, 2.0 * wu);
    kc::fill_uniform(std::span<bf16>(shared_up), seed + 4, -wu, wu);
    kc::fill_uniform(std::span<bf16>(shared_down), seed + 5, -2.0 * wu, 2.0 * wu);
    kc::fill_uniform(std::span<float>(bias), seed + 6, -0.1, 0.1);
    d_x.emplace(x);
    d_router.emplace(router);
    d_up.emplace(up);
    d_down.emplace(down);
    d_shared_up.emplace(shared_up.empty() ? std::vector<bf16>(8) : shared_up);
    d_shared_down.emplace(shared_down.empty() ? std::vector<bf16>(8) : shared_down);
    d_bias.emplace(bias);
  }

  kc::ch10::MoeWeights weights() const {
    kc::ch10::MoeWeights w;
    w.router = d_router->data();
    w.up = d_up->data();
    w.down = d_down->data();
    if (config.scoring == kc::ch04::Scoring::deepseek_v3) w.correction_bias = d_bias->data();
    if (config.shared_intermediate > 0) {
      w.shared_up = d_shared_up->data();
      w.shared_down = d_shared_down->data();
    }
    return w;
  }

  // Token t's output in fp64 for the experts @p ids with the weights @p weights, plus the shared expert.
  std::vector<double> token_reference(std::int64_t t, std::span<const std::int32_t> ids,
                                      std::span<const double> weights) const {
    const std::int64_t h = config.hidden, i = config.intermediate;
    const std::span<const bf16> row(x.data() + t * h, static_cast<std::size_t>(h));
    std::vector<double> y(static_cast<std::size_t>(h), 0.0);
    for (std::size_t j = 0; j < ids.size(); ++j) {
      const std::size_t e = static_cast<std::size_t>(ids[j]);
      const std::vector<double> out = kc::ch10::expert_reference(
          row, std::span<const bf16>(up).subspan(e * 2 * i * h, static_cast<std::size_t>(2 * i * h)),
          std::span<const bf16>(down).subspan(e * h * i, static_cast<std::size_t>(h * i)), i);
      for (std::size_t c = 0; c < y.size(); ++c) y[c] += weights[j] * out[c];
    }
    if (config.shared_intermediate > 0) {
      const std::vector<double> out =
          kc::ch10::expert_reference(row, shared_up, shared_down, config.shared_intermediate);
      for (std::size_t c = 0; c < y.size(); ++c) y[c] += out[c];
    }
    return y;
  }
};

struct Result {
  std::vector<bf16> y;
  std::vector<std::int32_t> ids;
};

Result run_before(const Layer& layer, cudaStream_t stream = nullptr) {
  const MoeConfig& c = layer.config;
  kc::DeviceBuffer<unsigned char> workspace(kc::ch10::moe_workspace_bytes(c, layer.tokens));
  kc::test::GuardedOutput<bf16> y(static_cast<std::size_t>(layer.tokens * c.hidden));
  kc::ch10::moe_layer_before(c, layer.tokens, layer.d_x->data(), layer.weights(), y.data(), workspace.data(),
                             workspace.size(), stream);
  kc::check(cudaStreamSynchronize(stream));
  EXPECT_EQ(y.guard_damage(), 0u) << "wrote past y";
  Result r;
  r.y = y.to_host();
  const kc::ch10::MoeRoutingView view = kc::ch10::moe_routing_in(c, layer.tokens, workspace.data());
  r.ids.resize(static_cast<std::size_t>(layer.tokens * c.k));
  kc::check(cudaMemcpy(r.ids.data(), view.ids, r.ids.size() * 4, cudaMemcpyDeviceToHost));
  return r;
}

// Routing first (the same set of experts per token, from the fp64 logits rounded to bf16 as the router
// GEMM rounds them), then y for the tokens that agree, against fp64.
void expect_matches_reference(const Layer& layer, const Result& got) {
  const MoeConfig& c = layer.config;
  // The router GEMM writes bf16 logits and the routing reads those: round the fp64 logits the same
  // way, so that only a sum landing on a rounding boundary can route a token differently.
  std::vector<double> logits = kc::ch10::logits_reference(layer.x, layer.router, c.hidden);
  for (double& l : logits) l = kc::to_double(__float2bfloat16(static_cast<float>(l)));
  std::vector<double> bias(layer.bias.begin(), layer.bias.end());
  if (c.scoring != kc::ch04::Scoring::deepseek_v3) bias.clear();
  const kc::ch04::GatingReference want =
      kc::ch04::gating_reference(kc::ch10::gating_params(c, layer.tokens), logits, bias);
  std::int64_t agree = 0;
  std::vector<bf16> sampled;
  std::vector<double> expected;
  for (std::int64_t t = 0; t < layer.tokens; ++t) {
    const auto k = static_cast<std::size_t>(c.k);
    std::vector<std::int32_t> a(got.ids.begin() + t * c.k, got.ids.begin() + (t + 1) * c.k);
    std::vector<std::int32_t> b(want.ids.begin() + t * c.k, want.ids.begin() + (t + 1) * c.k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) continue;
    ++agree;
    const std::vector<double> y = layer.token_reference(t, std::span<const std::int32_t>(want.ids).subspan(t * k, k),
                                                        std::span<const double>(want.weights).subspan(t * k, k));
    for (std::int64_t col = 0; col < c.hidden; ++col) {
      sampled.push_back(got.y[static_cast<std::size_t>(t * c.hidden + col)]);
      expected.push_back(y[static_cast<std::size_t>(col)]);
    }
  }
  // A logit summed in another order can round to the other bf16 neighbour and flip a near-tie: rare.
  EXPECT_GE(agree * 10, layer.tokens * 9) << agree << " of " << layer.tokens << " tokens routed alike";
  // Five roundings to bf16 between x and y (logits, A is exact, gate_up, h, expert rows, y): 2e-2.
  kc::test::expect_close(kc::compare<bf16>(sampled, expected, kc::test::kPoisonByte), 2e-2, c.name + " vs fp64");
}

TEST_F(MoeLayerGpu, BeforeMatchesFp64) {
  const std::uint64_t seed = kc::test::test_seed();
  for (const MoeConfig& c : small_configs()) {
    for (std::int64_t tokens : {1, 7, 64, 300}) {
      SCOPED_TRACE(c.name + " T=" + std::to_string(tokens));
      const Layer layer(c, tokens, seed + static_cast<std::uint64_t>(tokens));
      expect_matches_reference(layer, run_before(layer));
    }
  }
}

// No allocation, no synchronisation: a CUDA graph captures the whole chain (global capture mode, so a
// host synchronisation anywhere on the path fails it); reruns are bitwise identical.
TEST_F(MoeLayerGpu, GraphCapturableAndRepeatable) {
  for (const MoeConfig& c : small_configs()) {
    SCOPED_TRACE(c.name);
    const Layer layer(c, 40, kc::test::test_seed());
    kc::DeviceBuffer<unsigned char> workspace(kc::ch10::moe_workspace_bytes(c, layer.tokens));
    kc::DeviceBuffer<bf16> y(static_cast<std::size_t>(layer.tokens * c.hidden));
    const auto launch = [&](cudaStream_t stream) {
      kc::ch10::moe_layer_before(c, layer.tokens, layer.d_x->data(), layer.weights(), y.data(), workspace.data(),
                                 workspace.size(), stream);
    };
    launch(nullptr);  // the first call per device sets the kernels' attributes: outside the capture
    kc::check(cudaDeviceSynchronize());
    const kc::test::LaunchUnderTest under_test{launch, [&] { y.fill_bytes(kc::test::kPoisonByte); },
                                               [&] { return kc::test::grouped::bytes_of(y); }};
    kc::test::expect_graph_capturable(under_test);
    kc::test::expect_bitwise_repeatable(under_test);
  }
}

}  // namespace
