// The fused steps of the layer and `after` (moe_layer.hpp, MoeStep). Host code: each step changes
// which launches run, not what they compute.
//
//   before  route · permute · up (plain) · SiLU · up · down (plain) · weighted combine · dense shared
//   step 1  route · permute · up (SwiGLU) ·            down (plain) · weighted combine · dense shared
//   step 2  route · permute · row weights · up (SwiGLU) · down (× weight) · combine_rows · dense shared
//   step 3  route · shared slots · permute · row weights · up (SwiGLU) · down (× weight) · combine_rows
//           (the shared experts are experts E .. E + S - 1 of the same grouped launches)
//   step 4  as step 3, with the permutation's index maps only and up gathering its rows from x
#include "grouped_gemm.hpp"  // Chapter 5: permute_tokens, unpermute_combine
#include "kc/check.hpp"
#include "moe_layer.hpp"
#include "moe_stages.hpp"
#include "moe_workspace.hpp"
#include "swap_ab.hpp"  // Chapter 9: the grouped GEMM for any token count

namespace kc::ch10 {

const char* to_string(MoeStep step) {
  switch (step) {
    case MoeStep::swiglu_epilogue: return "step1_swiglu_epilogue";
    case MoeStep::weight_in_down: return "step2_weight_in_down";
    case MoeStep::shared_as_expert: return "step3_shared_as_expert";
    case MoeStep::gather_in_up: return "step4_gather_in_up";
  }
  throw InvalidArgument("step must be a MoeStep");
}

namespace detail {

void enqueue_step(MoeStep step, const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                  const MoeWeights& weights, __nv_bfloat16* y, const MoeWorkspace& at, cudaStream_t stream,
                  std::string_view only) {
  auto stage = [only](std::string_view name) { return only.empty() || only == name; };
  const bool weight_in_down = step != MoeStep::swiglu_epilogue;
  const bool gather = step == MoeStep::gather_in_up;
  // Steps 3 and 4 route every token to the shared experts too: slots k + S over E + S experts.
  const int shared = step == MoeStep::shared_as_expert || gather ? config.shared_experts : 0;
  const int slots = config.k + shared, experts = config.experts + shared;
  const std::int64_t rows = tokens * slots, hidden = config.hidden, inter = config.intermediate;

  if (stage("router") || stage("routing")) route(config, tokens, x, weights, at, stream, only);
  if (stage("permute")) {
    const std::int32_t* ids = at.ids;
    if (shared > 0) {
      append_shared_slots(tokens, config.k, config.experts, shared, at.ids, at.slot_ids, stream);
      ids = at.slot_ids;
    }
    // Step 4: the index maps only; up reads the tokens' rows from x itself.
    ch05::permute_tokens({tokens, slots, experts, hidden}, ids, x,
                         {at.counts, at.offsets, at.row_of_pair, at.token_of_row, gather ? nullptr : at.a},
                         at.permute_scratch, at.permute_scratch_bytes, stream);
    // The weight of each permuted row, for the down projection's epilogue.
    if (weight_in_down) {
      scatter_row_weights(tokens, config.k, slots, at.route_weights, at.row_of_pair, at.weight_of_row, stream);
    }
  }
  // Up with SiLU(gate) · up in its epilogue: h [rows, I] straight from the accumulators.
  if (stage("up") && gather) {
    ch09::grouped_gemm_decode_gather({rows, 2 * inter, hidden, experts}, {x, tokens, at.token_of_row}, weights.up, at.h,
                                     at.offsets, {ch08::EpilogueKind::swiglu}, at.grouped_scratch,
                                     at.grouped_scratch_bytes, stream);
  } else if (stage("up")) {
    ch09::grouped_gemm_decode({rows, 2 * inter, hidden, experts}, at.a, weights.up, at.h, at.offsets,
                              {ch08::EpilogueKind::swiglu}, at.grouped_scratch, at.grouped_scratch_bytes, stream);
  }
  if (weight_in_down) {
    // Down with each row's routing weight in its epilogue, then the plain sum of each token's rows.
    if (stage("down")) {
      ch09::grouped_gemm_decode({rows, hidden, inter, experts}, at.h, weights.down, at.expert_out, at.offsets,
                                {ch08::EpilogueKind::row_scale, at.weight_of_row}, at.grouped_scratch,
                                at.grouped_scratch_bytes, stream);
    }
    if (stage("combine")) combine_rows(tokens, slots, hidden, at.expert_out, at.row_of_pair, y, stream);
  } else {
    if (stage("down")) {
      ch09::grouped_gemm_decode({rows, hidden, inter, experts}, at.h, weights.down, at.expert_out, at.offsets,
                                {ch08::EpilogueKind::plain}, at.grouped_scratch, at.grouped_scratch_bytes, stream);
    }
    if (stage("combine")) {
      ch05::unpermute_combine(tokens, config.k, hidden, at.expert_out, at.route_weights, at.row_of_pair, y, stream);
    }
  }
  if (shared == 0 && stage("shared")) add_dense_shared_experts(config, tokens, x, weights, y, at, stream);
}

}  // namespace detail

void moe_layer_step(MoeStep step, const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x,
                    const MoeWeights& weights, __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream) {
  (void)to_string(step);  // a value that is no step is refused before anything runs
  validate_moe_layer(config, tokens, x, weights, y, workspace, workspace_bytes);
  if (tokens == 0) return;
  detail::enqueue_step(step, config, tokens, x, weights, y, detail::MoeWorkspace(config, tokens, workspace), stream);
}

void moe_layer_after(const MoeConfig& config, std::int64_t tokens, const __nv_bfloat16* x, const MoeWeights& weights,
                     __nv_bfloat16* y, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  moe_layer_step(kMoeAfterStep, config, tokens, x, weights, y, workspace, workspace_bytes, stream);
}

}  // namespace kc::ch10
