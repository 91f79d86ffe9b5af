// Chapter 9's host side: the rules, the tensor maps, the launch of every step, and the dispatch.
// Everything before the first CUDA call is host arithmetic, tested on machines without a GPU.
#include <string>

#include "dispatch.hpp"
#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "swap_ab.hpp"
#include "swap_launch.hpp"
#include "tensor_map.hpp"  // Chapter 7: the tensor maps of A and W
// Angle brackets: the exercise build puts the skeleton's swap_tiles.hpp first on the include path.
#include <swap_tiles.hpp>

namespace kc::ch09 {

const char* to_string(SwapStep step) {
  switch (step) {
    case SwapStep::swapped_operands: return "step1_swapped_operands";
    case SwapStep::deep_pipeline: return "step2_deep_pipeline";
    case SwapStep::token_tile: return "step3_token_tile";
  }
  throw InvalidArgument("step (" + std::to_string(static_cast<int>(step)) + ") is not a SwapStep");
}

void validate_swap_ab(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                      const __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                      std::int64_t a_rows) {
  // Chapter 8's rules on the operands and the epilogue (its masked step: no store rules), then the
  // transposed store's.
  ch08::validate_grouped_gemm_hopper_operands(shape, a, w, c, offsets, epilogue, ch08::GroupedStep::masked_store,
                                              a_rows);
  if (shape.m_total == 0) return;
  const std::int64_t n_out = ch08::output_columns(shape.n, epilogue.kind);
  if (n_out % 8 != 0) {
    throw InvalidArgument("the columns of C (" + std::to_string(n_out) +
                          (epilogue.kind == EpilogueKind::swiglu ? ", shape.n / 2" : ", shape.n") +
                          ") must be a multiple of 8 for the transposed store (16-byte rows of 8 columns)");
  }
  if (!kc::aligned_to(c, 16)) throw InvalidArgument("c must be 16-byte aligned for the transposed store");
}

namespace {

// A swapped launch whose arguments have passed validate_swap_ab, M_total > 0: the tensor maps' rules,
// the GPU, then the maps and the one kernel. With @p gather (step 3 only), the token rows are loaded
// from gather->x through gather->rows.
void enqueue_swapped(SwapStep step, const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                     __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                     cudaStream_t stream, const ch08::GatheredA* gather = nullptr) {
  const int tokens =
      step == SwapStep::token_tile ? decode_choice(shape.m_total, shape.experts).token_tile : kMaxTokenTile;
  const ch07::TensorMapSpec a_spec = gather != nullptr ? ch07::bf16_row_major_map(gather->x, gather->x_rows, shape.k, 1)
                                                       : ch07::bf16_row_major_map(a, shape.m_total, shape.k, tokens);
  const ch07::TensorMapSpec w_spec =
      ch07::bf16_row_major_map(w, static_cast<std::int64_t>(shape.experts) * shape.n, shape.k, kWBoxRows);
  ch07::validate_tensor_map(a_spec, "a");
  ch07::validate_tensor_map(w_spec, "w");
  ch07::require_hopper("Chapter 9", detail::kernels_built());
  const CUtensorMap a_map = ch07::encode_tensor_map(a_spec, "a");
  const CUtensorMap w_map = ch07::encode_tensor_map(w_spec, "w");
  detail::SwapArgs args;
  args.c = c;
  args.offsets = offsets;
  args.row_scale = epilogue.kind == EpilogueKind::row_scale ? epilogue.row_scale : nullptr;
  args.m_total = static_cast<int>(shape.m_total);
  args.n = static_cast<int>(shape.n);
  args.k = static_cast<int>(shape.k);
  args.experts = shape.experts;
  args.n_out = static_cast<int>(ch08::output_columns(shape.n, epilogue.kind));
  args.tiles_n = swap_tiles_n(args.n, epilogue.kind);
  args.gather_rows = gather != nullptr ? gather->rows : nullptr;
  const std::int64_t tile_bound = ch05::max_m_tiles(shape.m_total, shape.experts, tokens) * args.tiles_n;
  const bool swiglu = epilogue.kind == EpilogueKind::swiglu;
  if (gather != nullptr) {
    detail::launch_gather(tokens, swiglu, a_map, w_map, args, tile_bound, stream);
  } else {
    detail::launch_swapped(step, tokens, swiglu, a_map, w_map, args, tile_bound, stream);
  }
}

}  // namespace

void grouped_gemm_swap_ab(SwapStep step, const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                          __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                          cudaStream_t stream) {
  // Every rule, before any CUDA call.
  to_string(step);  // throws for a value that is no step
  validate_swap_ab(shape, a, w, c, offsets, epilogue);
  if (shape.m_total == 0) return;  // no rows: nothing to compute or write
  enqueue_swapped(step, shape, a, w, c, offsets, epilogue, stream);
}

void grouped_gemm_decode(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                         __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                         void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  // Both kernels' rules, whichever runs: a call is valid or not whatever its size.
  validate_swap_ab(shape, a, w, c, offsets, epilogue);
  ch08::validate_grouped_gemm_hopper(shape, a, w, c, offsets, epilogue, workspace, workspace_bytes);
  if (shape.m_total == 0) return;
  if (decode_choice(shape.m_total, shape.experts).swapped) {
    enqueue_swapped(SwapStep::token_tile, shape, a, w, c, offsets, epilogue, stream);
  } else {
    ch08::grouped_gemm_hopper(shape, a, w, c, offsets, epilogue, workspace, workspace_bytes, stream);
  }
}

void grouped_gemm_decode_gather(const GroupedGemmShape& shape, const ch08::GatheredA& a, const __nv_bfloat16* w,
                                __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                                void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  // a.x, of a.x_rows rows, plays A's part in both kernels' rules.
  ch08::validate_gathered_a(shape, a, c, ch08::output_columns(shape.n, epilogue.kind));
  validate_swap_ab(shape, a.x, w, c, offsets, epilogue, a.x_rows);
  ch08::validate_grouped_gemm_hopper(shape, a.x, w, c, offsets, epilogue, workspace, workspace_bytes,
                                     ch08::GroupedStep::a_evict_last, a.x_rows);
  if (shape.m_total == 0) return;
  if (decode_choice(shape.m_total, shape.experts).swapped) {
    enqueue_swapped(SwapStep::token_tile, shape, nullptr, w, c, offsets, epilogue, stream, &a);
  } else {
    ch08::grouped_gemm_hopper_gather(shape, a, w, c, offsets, epilogue, workspace, workspace_bytes, stream);
  }
}

}  // namespace kc::ch09
