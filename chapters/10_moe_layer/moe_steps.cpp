// The fused steps of the layer and `after` (moe_layer.hpp, MoeStep). Host code: each step changes
// which launches run, not what they compute.
//
//   before  route · permute (maps, copies) · up (plain) · SiLU · up · down (plain) · weighted combine ·
//           dense shared
//   step 1  route · permute (maps) · row-parallel copies · up (plain) · SiLU · up · down (plain) ·
//           weighted combine · dense shared
//   step 2  as step 1, up with SwiGLU in its epilogue, no SiLU · up pass
//   step 3  as step 2, row weights · down (× weight) · combine_rows (unweighted)
//   step 4  as step 3, shared slots before the permutation: the shared experts are experts
//           E .. E + S - 1 of the same grouped launches, no dense shared expert
//   step 5  as step 4, no copies: up gathers its rows from x (measured, and not kept)
//   after   step 4, the router at T <= kRouterDecodeTokens by its decode kernel
#include "fused_epilogue.hpp"  // Chapter 3: silu_and_mul
#include "grouped_gemm.hpp"    // Chapter 5: permute_tokens, unpermute_combine
#include "kc/check.hpp"
#include "moe_layer.hpp"
#include "moe_stages.hpp"
#include "moe_workspace.hpp"
#include "swap_ab.hpp"  // Chapter 9: the grouped GEMM for any token count

namespace kc::ch10 {

const char* to_string(MoeStep step) {
  switch (step) {
    case MoeStep::row_parallel_copy: return "step1_row_parallel_copy";
    case MoeStep::swiglu_epilogue: return "step2_swiglu_epilogue";
    case MoeStep::weight_in_down: return "step3_weight_in_down";
    case MoeStep::shared_as_expert: return "step4_shared_as_expert";
    case MoeStep::gather_in_up: return "step5_gather_in_up";
  }
  throw InvalidArgument("step must be a MoeStep");
}

namespace detail {

Fusions fusions_of(MoeStep step) {
  (void)to_string(step);  // a value that is no step is refused
  const auto n = static_cast<int>(step);
  Fusions f;
  f.swiglu_epilogue = n >= static_cast<int>(MoeStep::swiglu_epilogue);
  f.weight_in_down = n >= static_cast<int>(MoeStep::weight_in_down);
  f.shared_as_expert = n >= static_cast<int>(MoeStep::shared_as_expert);
  f.gather = step == MoeStep::gather_in_up;
  return f;
}

Fusions after_fusions() {
  Fusions f = fusions_of(MoeStep::shared_as_expert);
  f.router_decode = true;
  return f;
}

void enqueue_fused(const Fusions& fusions, const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                   const MoeWeights& weights, __nv_bfloat16* y, const MoeWorkspace& at, cudaStream_t stream,
                   std::string_view only) {
  auto stage = [only](std::string_view name) { return only.empty() || only == name; };
  // The shared experts as experts E .. E + S - 1: slots k + S over E + S experts.
  const int shared = fusions.shared_as_expert ? config.shared_experts : 0;
  const int slots = config.k + shared, experts = config.experts + shared;
  const std::int64_t rows = tokens * slots, hidden = config.hidden, inter = config.intermediate;

  if (stage("router") || stage("routing")) route(config, tokens, x, weights, at, stream, only, fusions.router_decode);
  if (stage("permute")) {
    const std::int32_t* ids = at.ids;
    if (shared > 0) {
      append_shared_slots(tokens, config.k, config.experts, shared, at.ids, at.slot_ids, stream);
      ids = at.slot_ids;
    }
    // The index maps; then the copies, row-parallel, unless up gathers the rows from x itself.
    ch05::permute_tokens({tokens, slots, experts, hidden}, ids, x,
                         {at.counts, at.offsets, at.row_of_pair, at.token_of_row, nullptr}, at.permute_scratch,
                         at.permute_scratch_bytes, stream);
    if (!fusions.gather) copy_token_rows(rows, hidden, x, at.token_of_row, at.offsets + experts, at.a, stream);
    // The weight of each permuted row, for the down projection's epilogue.
    if (fusions.weight_in_down) {
      scatter_row_weights(tokens, config.k, slots, at.route_weights, at.row_of_pair, at.weight_of_row, stream);
    }
  }
  if (stage("up")) {
    // Up: SiLU(gate) · up in the epilogue straight into h [rows, I], or the plain [rows, 2I] first.
    const ch08::GroupedEpilogue epilogue{fusions.swiglu_epilogue ? ch08::EpilogueKind::swiglu
                                                                 : ch08::EpilogueKind::plain};
    __nv_bfloat16* up_out = fusions.swiglu_epilogue ? at.h : at.gate_up;
    if (fusions.gather) {
      ch09::grouped_gemm_decode_gather({rows, 2 * inter, hidden, experts}, {x, tokens, at.token_of_row}, weights.up,
                                       up_out, at.offsets, epilogue, at.grouped_scratch, at.grouped_scratch_bytes,
                                       stream);
    } else {
      ch09::grouped_gemm_decode({rows, 2 * inter, hidden, experts}, at.a, weights.up, up_out, at.offsets, epilogue,
                                at.grouped_scratch, at.grouped_scratch_bytes, stream);
    }
  }
  if (!fusions.swiglu_epilogue && stage("swiglu")) ch03::silu_and_mul(at.gate_up, at.h, rows, inter, stream);
  if (stage("down")) {
    // Down, with each row's routing weight in its epilogue when the combine is a plain sum.
    const ch08::GroupedEpilogue epilogue = fusions.weight_in_down
                                               ? ch08::GroupedEpilogue{ch08::EpilogueKind::row_scale, at.weight_of_row}
                                               : ch08::GroupedEpilogue{ch08::EpilogueKind::plain};
    ch09::grouped_gemm_decode({rows, hidden, inter, experts}, at.h, weights.down, at.expert_out, at.offsets, epilogue,
                              at.grouped_scratch, at.grouped_scratch_bytes, stream);
  }
  if (stage("combine")) {
    if (fusions.weight_in_down) {
      combine_rows(tokens, slots, hidden, at.expert_out, at.row_of_pair, y, stream);
    } else {
      ch05::unpermute_combine(tokens, config.k, hidden, at.expert_out, at.route_weights, at.row_of_pair, y, stream);
    }
  }
  if (shared == 0 && stage("shared")) add_dense_shared_experts(config, tokens, x, weights, y, at, stream);
}

}  // namespace detail

void moe_layer_step(MoeStep step, const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                    const MoeWeights& weights, __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream) {
  const detail::Fusions fusions = detail::fusions_of(step);  // refuses a value that is no step
  validate_moe_layer(config, tokens, x, weights, y, workspace, workspace_bytes);
  if (tokens == 0) return;
  detail::enqueue_fused(fusions, config, tokens, x, weights, y, detail::MoeWorkspace(config, tokens, workspace),
                        stream);
}

void moe_layer_after(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                     __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  validate_moe_layer(config, tokens, x, weights, y, workspace, workspace_bytes);
  if (tokens == 0) return;
  detail::enqueue_fused(detail::after_fusions(), config, tokens, x, weights, y,
                        detail::MoeWorkspace(config, tokens, workspace), stream);
}

}  // namespace kc::ch10
