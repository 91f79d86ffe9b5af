// The stages every variant of the layer shares: the router and the routing, and the shared experts
// run dense (moe_stages.hpp). Host code: each is an earlier chapter's launch, except `after`'s router
// at decode sizes (router_decode.cu).
#include "moe_stages.hpp"

#include "fused_epilogue.hpp"  // Chapter 3: silu_and_mul, add_residual
#include "hopper_gemm.hpp"     // Chapter 7: the dense GEMMs

namespace kc::ch10::detail {

void route(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
           const MoeWorkspace& at, cudaStream_t stream, std::string_view only, bool decode_router) {
  if (only.empty() || only == "router") {
    if (decode_router && tokens <= kRouterDecodeTokens) {
      router_logits_decode(tokens, config.experts, config.hidden, x, weights.router, at.logits, stream);
    } else {
      ch07::gemm_bf16_hopper(x, weights.router, at.logits, {tokens, config.experts, config.hidden}, stream);
    }
  }
  if (only.empty() || only == "routing") {
    ch04::gating_after(gating_params(config, tokens), at.logits, weights.correction_bias,
                       {at.route_weights, at.ids, nullptr}, stream);
  }
}

void add_dense_shared_experts(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                              const MoeWeights& weights, __nv_bfloat16* y, const MoeWorkspace& at,
                              cudaStream_t stream) {
  const std::int64_t hidden = config.hidden, inter = config.intermediate;
  for (int s = 0; s < config.shared_experts; ++s) {
    const std::int64_t expert = config.experts + s;
    ch07::gemm_bf16_hopper(x, weights.up + expert * 2 * inter * hidden, at.shared_gate_up, {tokens, 2 * inter, hidden},
                           stream);
    ch03::silu_and_mul(at.shared_gate_up, at.shared_h, tokens, inter, stream);
    ch07::gemm_bf16_hopper(at.shared_h, weights.down + expert * hidden * inter, at.shared_out, {tokens, hidden, inter},
                           stream);
    ch03::add_residual(y, at.shared_out, tokens, hidden, stream);
  }
}

}  // namespace kc::ch10::detail
