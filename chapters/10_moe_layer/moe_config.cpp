// Chapter 10's configurations, their rules and two numbers, the workspace of the layer and the rules
// of a launch: host arithmetic, tested without a GPU.
#include <string>

#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "moe_layer.hpp"
#include "moe_workspace.hpp"

namespace kc::ch10 {

MoeConfig deepseek_v3() {
  MoeConfig c;
  c.name = "dsv3";
  c.hidden = 7168;
  c.intermediate = 2048;
  c.experts = 256;
  c.k = 8;
  c.scoring = ch04::Scoring::deepseek_v3;
  c.n_group = 8;
  c.topk_group = 4;
  c.routed_scaling_factor = 2.5f;
  c.shared_experts = 1;
  return c;
}

MoeConfig mixtral_8x7b() {
  MoeConfig c;
  c.name = "mixtral";
  c.hidden = 4096;
  c.intermediate = 14336;
  c.experts = 8;
  c.k = 2;
  c.scoring = ch04::Scoring::softmax_then_topk;
  c.renormalize = true;
  return c;
}

MoeConfig qwen3_30b_a3b() {
  MoeConfig c;
  c.name = "qwen3_30b_a3b";
  c.hidden = 2048;
  c.intermediate = 768;
  c.experts = 128;
  c.k = 8;
  c.scoring = ch04::Scoring::softmax_then_topk;
  c.renormalize = true;
  return c;
}

namespace {

void require_weight(const void* p, const char* name) {
  if (p == nullptr) throw InvalidArgument(std::string(name) + " must not be null");
  if (!kc::aligned_to(p, 16)) throw InvalidArgument(std::string(name) + " must be 16-byte aligned");
}

void require_width(std::int64_t value, const char* name) {
  if (value < 8 || value > 0x7FFFFFFF || value % 8 != 0) {
    throw InvalidArgument(std::string(name) + " (" + std::to_string(value) +
                          ") must be a multiple of 8 in [8, 2^31 - 1] (16-byte rows for TMA)");
  }
}

}  // namespace

void moe_config_rules(const MoeConfig& config) {
  require_width(config.hidden, "config.hidden");
  require_width(config.intermediate, "config.intermediate");
  if (config.shared_experts < 0 || config.shared_experts > kMaxSharedExperts) {
    throw InvalidArgument("config.shared_experts (" + std::to_string(config.shared_experts) + ") must be in [0, " +
                          std::to_string(kMaxSharedExperts) + "]");
  }
  if (config.experts > 0 && config.experts + config.shared_experts > ch05::kMaxExperts) {
    throw InvalidArgument("config.experts + config.shared_experts (" +
                          std::to_string(config.experts + config.shared_experts) + ") must be at most " +
                          std::to_string(ch05::kMaxExperts) + " (the grouped GEMMs' experts)");
  }
  ch04::GatingParams params = gating_params(config, 1);
  // Chapter 4's own rules on E, k and the groups for bf16 logits (the router GEMM's output). The
  // rules look at addresses only: stand-in addresses, aligned and far apart, leave the shape's.
  auto stand_in = [](std::uintptr_t address) { return reinterpret_cast<void*>(address); };
  ch04::validate_gating(
      params, stand_in(0x100000), nullptr,
      {static_cast<float*>(stand_in(0x200000)), static_cast<std::int32_t*>(stand_in(0x300000)), nullptr},
      sizeof(__nv_bfloat16));
}

ch04::GatingParams gating_params(const MoeConfig& config, std::int64_t tokens) {
  ch04::GatingParams params;
  params.num_tokens = tokens;
  params.num_experts = config.experts;
  params.k = config.k;
  params.scoring = config.scoring;
  params.renormalize = config.renormalize;
  params.n_group = config.n_group;
  params.topk_group = config.topk_group;
  params.routed_scaling_factor = config.routed_scaling_factor;
  return params;
}

double moe_min_bytes(const MoeConfig& config, std::int64_t tokens, std::span<const std::int32_t> counts) {
  if (counts.size() != static_cast<std::size_t>(config.experts)) {
    throw InvalidArgument("counts must hold E (" + std::to_string(config.experts) + ") sizes");
  }
  const double h = static_cast<double>(config.hidden);
  const double expert = 3.0 * static_cast<double>(config.intermediate) * h;  // [2I, H] and [H, I]
  double active = 0.0;
  for (std::int32_t count : counts) active += count > 0 ? 1.0 : 0.0;
  const double elements = 2.0 * static_cast<double>(tokens) * h + static_cast<double>(config.experts) * h +
                          (config.shared_experts + active) * expert;
  return 2.0 * elements + (config.scoring == ch04::Scoring::deepseek_v3 ? 4.0 * config.experts : 0.0);
}

double moe_flops(const MoeConfig& config, std::int64_t tokens) {
  const double t = static_cast<double>(tokens), h = static_cast<double>(config.hidden);
  return 2.0 * t * h * config.experts +
         2.0 * t * (config.k + config.shared_experts) * 3.0 * static_cast<double>(config.intermediate) * h;
}

void validate_moe_layer(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                        const __nv_bfloat16* y, const void* workspace, std::size_t workspace_bytes) {
  moe_config_rules(config);
  const int slots = config.k + config.shared_experts;
  if (tokens < 0 || tokens > 0x7FFFFFFF / slots) {
    throw InvalidArgument("tokens (" + std::to_string(tokens) +
                          ") must be in [0, 2^31 / (k + S)): T · (k + S) rows index an int");
  }
  if (tokens == 0) return;
  require_weight(x, "x");
  require_weight(y, "y");
  require_weight(weights.router, "weights.router");
  require_weight(weights.up, "weights.up");
  require_weight(weights.down, "weights.down");
  const std::uint64_t rows_bytes = static_cast<std::uint64_t>(tokens) * config.hidden * 2;
  if (kc::overlaps(x, rows_bytes, y, rows_bytes)) throw InvalidArgument("y must not overlap x");
  if (workspace == nullptr) throw InvalidArgument("workspace must not be null");
  if (!kc::aligned_to(workspace, 256)) throw InvalidArgument("workspace must be 256-byte aligned");
  const std::size_t need = detail::MoeWorkspace(config, tokens, nullptr).bytes;  // the rules above hold
  if (workspace_bytes < need) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) + ") must be at least " +
                          std::to_string(need) + " (moe_workspace_bytes)");
  }
}

std::size_t moe_workspace_bytes(const MoeConfig& config, std::int64_t tokens) {
  moe_config_rules(config);
  return detail::MoeWorkspace(config, tokens, nullptr).bytes;
}

MoeRoutingView moe_routing_in(const MoeConfig& config, std::int64_t tokens, const void* workspace) {
  const detail::MoeWorkspace at(config, tokens, const_cast<void*>(workspace));
  return {at.route_weights, at.ids, at.counts};
}

}  // namespace kc::ch10
