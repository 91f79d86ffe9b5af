// Before: the MoE layer as the chain of the earlier chapters' kernels, one stage after another, every
// intermediate in HBM (moe_layer.hpp). Host code only: each stage is an earlier chapter's launch.
#include <string>

#include "fused_epilogue.hpp"  // Chapter 3: silu_and_mul, add_residual
#include "grouped_gemm.hpp"    // Chapter 5: permute_tokens, unpermute_combine
#include "hopper_gemm.hpp"     // Chapter 7: the dense GEMMs (router, shared expert)
#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "moe_layer.hpp"
#include "moe_workspace.hpp"
#include "swap_ab.hpp"  // Chapter 9: the grouped GEMM for any token count

namespace kc::ch10 {

namespace {

void require_weight(const void* p, const char* name) {
  if (p == nullptr) throw InvalidArgument(std::string(name) + " must not be null");
  if (!kc::aligned_to(p, 16)) throw InvalidArgument(std::string(name) + " must be 16-byte aligned");
}

}  // namespace

void validate_moe_layer(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                        const __nv_bfloat16* y, const void* workspace, std::size_t workspace_bytes) {
  moe_config_rules(config);
  if (tokens < 0 || tokens > 0x7FFFFFFF / config.k) {
    throw InvalidArgument("tokens (" + std::to_string(tokens) + ") must be in [0, 2^31 / k): T · k rows index an int");
  }
  if (tokens == 0) return;
  require_weight(x, "x");
  require_weight(y, "y");
  require_weight(weights.router, "weights.router");
  require_weight(weights.up, "weights.up");
  require_weight(weights.down, "weights.down");
  if (config.shared_intermediate > 0) {
    require_weight(weights.shared_up, "weights.shared_up");
    require_weight(weights.shared_down, "weights.shared_down");
  }
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

void moe_layer_before(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                      __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  validate_moe_layer(config, tokens, x, weights, y, workspace, workspace_bytes);
  if (tokens == 0) return;
  const detail::MoeWorkspace at(config, tokens, workspace);
  const std::int64_t pairs = tokens * config.k, hidden = config.hidden, inter = config.intermediate;
  // Router: logits [T, E] = x · routerᵀ (Chapter 7), then the routing (Chapter 4).
  ch07::gemm_bf16_hopper(x, weights.router, at.logits, {tokens, config.experts, hidden}, stream);
  ch04::gating_after(gating_params(config, tokens), at.logits, weights.correction_bias,
                     {at.route_weights, at.ids, nullptr}, stream);
  // The token copies in expert order, and where each (token, slot) went (Chapter 5).
  ch05::permute_tokens({tokens, config.k, config.experts, hidden}, at.ids, x,
                       {at.counts, at.offsets, at.row_of_pair, at.token_of_row, at.a}, at.permute_scratch,
                       at.permute_scratch_bytes, stream);
  // Up, SiLU · up, down: the grouped GEMMs (Chapter 9's dispatch) and Chapter 3's elementwise pass.
  const ch08::GroupedEpilogue plain{ch08::EpilogueKind::plain};
  ch09::grouped_gemm_decode({pairs, 2 * inter, hidden, config.experts}, at.a, weights.up, at.gate_up, at.offsets, plain,
                            at.grouped_scratch, at.grouped_scratch_bytes, stream);
  ch03::silu_and_mul(at.gate_up, at.h, pairs, inter, stream);
  ch09::grouped_gemm_decode({pairs, hidden, inter, config.experts}, at.h, weights.down, at.expert_out, at.offsets,
                            plain, at.grouped_scratch, at.grouped_scratch_bytes, stream);
  // Each token's k rows, weighted and summed in slot order (Chapter 5's combine).
  ch05::unpermute_combine(tokens, config.k, hidden, at.expert_out, at.route_weights, at.row_of_pair, y, stream);
  // The shared expert: every token, weight 1, dense (Chapters 7 and 3), added to y.
  if (config.shared_intermediate > 0) {
    const std::int64_t shared = config.shared_intermediate;
    ch07::gemm_bf16_hopper(x, weights.shared_up, at.shared_gate_up, {tokens, 2 * shared, hidden}, stream);
    ch03::silu_and_mul(at.shared_gate_up, at.shared_h, tokens, shared, stream);
    ch07::gemm_bf16_hopper(at.shared_h, weights.shared_down, at.shared_out, {tokens, hidden, shared}, stream);
    ch03::add_residual(y, at.shared_out, tokens, hidden, stream);
  }
}

}  // namespace kc::ch10
