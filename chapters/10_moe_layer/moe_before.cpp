// Before: the MoE layer as the chain of the earlier chapters' kernels, one stage after another, every
// intermediate in HBM (moe_layer.hpp). Host code only: each stage is an earlier chapter's launch.
#include "fused_epilogue.hpp"  // Chapter 3: silu_and_mul, add_residual
#include "grouped_gemm.hpp"    // Chapter 5: permute_tokens, unpermute_combine
#include "moe_layer.hpp"
#include "moe_stages.hpp"
#include "moe_workspace.hpp"
#include "swap_ab.hpp"  // Chapter 9: the grouped GEMM for any token count

namespace kc::ch10 {

namespace detail {

void enqueue_before(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                    __nv_bfloat16* y, const MoeWorkspace& at, cudaStream_t stream, std::string_view only) {
  auto stage = [only](std::string_view name) { return only.empty() || only == name; };
  const std::int64_t pairs = tokens * config.k, hidden = config.hidden, inter = config.intermediate;
  if (stage("router") || stage("routing")) route(config, tokens, x, weights, at, stream, only);
  // The token copies in expert order, and where each (token, slot) went (Chapter 5).
  if (stage("permute")) {
    ch05::permute_tokens({tokens, config.k, config.experts, hidden}, at.ids, x,
                         {at.counts, at.offsets, at.row_of_pair, at.token_of_row, at.a}, at.permute_scratch,
                         at.permute_scratch_bytes, stream);
  }
  // Up, SiLU · up, down: the grouped GEMMs (Chapter 9's dispatch) and Chapter 3's elementwise pass.
  const ch08::GroupedEpilogue plain{ch08::EpilogueKind::plain};
  if (stage("up")) {
    ch09::grouped_gemm_decode({pairs, 2 * inter, hidden, config.experts}, at.a, weights.up, at.gate_up, at.offsets,
                              plain, at.grouped_scratch, at.grouped_scratch_bytes, stream);
  }
  if (stage("swiglu")) ch03::silu_and_mul(at.gate_up, at.h, pairs, inter, stream);
  if (stage("down")) {
    ch09::grouped_gemm_decode({pairs, hidden, inter, config.experts}, at.h, weights.down, at.expert_out, at.offsets,
                              plain, at.grouped_scratch, at.grouped_scratch_bytes, stream);
  }
  // Each token's k rows, weighted and summed in slot order (Chapter 5's combine).
  if (stage("combine")) {
    ch05::unpermute_combine(tokens, config.k, hidden, at.expert_out, at.route_weights, at.row_of_pair, y, stream);
  }
  // The shared experts: every token, weight 1, dense (Chapters 7 and 3), each added to y.
  if (stage("shared")) add_dense_shared_experts(config, tokens, x, weights, y, at, stream);
}

}  // namespace detail

void moe_layer_before(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                      __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  validate_moe_layer(config, tokens, x, weights, y, workspace, workspace_bytes);
  if (tokens == 0) return;
  detail::enqueue_before(config, tokens, x, weights, y, detail::MoeWorkspace(config, tokens, workspace), stream);
}

}  // namespace kc::ch10
