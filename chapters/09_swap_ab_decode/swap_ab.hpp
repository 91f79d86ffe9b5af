/// @file swap_ab.hpp
/// @brief Chapter 9: the grouped GEMM of an MoE layer's experts at decode sizes (1 to 64 tokens per
/// expert) on Hopper (sm_90a). Swap-AB computes each expert's Cᵀ = W[e] · Aᵀ: the expert's weight rows
/// fill wgmma's 64-row M side, the few tokens sit in its N side (8 to 64), and the epilogue writes C
/// transposed back into Chapter 5's layout.
///
/// Layout and epilogues are Chapter 8's (hopper_grouped_gemm.hpp): A [M_total, K] bf16, rows grouped
/// by expert; offsets [E + 1] int32 on the device (never read on the host); W [E, N, K] bf16; C
/// [M_total, n_out] bf16, fp32 accumulation, one rounding per output; plain, swiglu ([gate; up] rows
/// of W, n_out = N / 2) or row_scale. Rows from offsets[E] to M_total belong to no expert and are not
/// written.
///
/// The steps (each its own kernel and benchmark variant), all one persistent warp-specialized kernel
/// (swap_kernel.cuh) in which each block first scans the expert offsets into its own tile prefix:
///   1. step1_swapped_operands.cu  the operand swap: tiles of 128 weight rows × 64 tokens, Chapter 8's
///                                 pipeline depth (4 stages), the transposed store.
///   2. step2_deep_pipeline.cu     as many stages as shared memory holds: more weight bytes in flight.
///   3. step3_token_tile.cu        the token tile (8, 16, 32 or 64) chosen from the launch's tokens per
///                                 expert: smaller token boxes leave room for more weight stages.
/// The chapter's `after` (grouped_gemm_decode) chooses between step 3 and Chapter 8's kernel from
/// M_total and E (decode_choice in dispatch.hpp), without reading anything from the device.
///
/// Rules (checked on the host before any CUDA call; kc::InvalidArgument names the broken one):
/// Chapter 8's (validate_grouped_gemm_hopper for its TMA-store steps), with this chapter's words for
/// the two the transposed store needs when M_total > 0: n_out a multiple of 8 and c 16-byte aligned
/// (each thread writes 8 columns of a row as one 16-byte store). grouped_gemm_decode also needs
/// Chapter 8's workspace (it may run Chapter 8's kernel); the swapped steps need none.
///
/// GPU: sm_90 exactly. On any other GPU, or in a build without a 90 entry in
/// CMAKE_CUDA_ARCHITECTURES, the launch functions throw kc::ch07::UnsupportedGpu after validating.
///
/// Launch paths neither allocate nor synchronise (CUDA-graph capturable): the swapped steps are one
/// kernel. The first call on a device raises the kernels' shared-memory limits: call once outside a
/// capture first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "hopper_grouped_gemm.hpp"  // Chapter 8: the layout, the epilogues, the unswapped kernel

namespace kc::ch09 {

using ch05::GroupedGemmShape;
using ch07::UnsupportedGpu;
using ch08::EpilogueKind;
using ch08::GroupedEpilogue;

/// The steps of the chapter's swapped kernel.
enum class SwapStep {
  swapped_operands,  ///< step 1: weights on wgmma's M side, 64-token tiles, 4 stages
  deep_pipeline,     ///< step 2: step 1 with as many stages as fit
  token_tile,        ///< step 3: the token tile chosen from the tokens per expert, stages to fit
};

/// The benchmark variant name of @p step: "step1_swapped_operands", "step2_deep_pipeline",
/// "step3_token_tile". Throws kc::InvalidArgument for a value that is not a SwapStep.
const char* to_string(SwapStep step);

/// Checks every rule of this file's description for a swapped launch; throws kc::InvalidArgument
/// naming the first one broken, e.g. "the columns of C (770, shape.n) must be a multiple of 8 for the
/// transposed store (16-byte rows of 8 columns)". Host-only.
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, n_out] output
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale
/// @param a_rows rows of the matrix at @p a for the overlap checks (a gathered A's x_rows); -1: M_total
void validate_swap_ab(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                      const __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                      std::int64_t a_rows = -1);

/// One step of the swapped kernel: every expert's tokens times its weights, in one launch.
/// @param step the step
/// @param shape sizes (N is W's rows per expert; C has ch08::output_columns(N, epilogue.kind) columns)
/// @param a [M_total, K] permuted tokens, 16-byte aligned
/// @param w [E, N, K] expert weights, 16-byte aligned
/// @param c [M_total, n_out] output, 16-byte aligned
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale (with its scales)
/// @param stream the stream to enqueue on
void grouped_gemm_swap_ab(SwapStep step, const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                          __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                          cudaStream_t stream = nullptr);

/// After: the grouped GEMM for any token count, swapped (step 3) where the tokens per expert are few
/// and Chapter 8's grouped_gemm_hopper otherwise (decode_choice). Same arguments and rules as
/// grouped_gemm_hopper.
/// @param shape sizes
/// @param a [M_total, K] permuted tokens, 16-byte aligned
/// @param w [E, N, K] expert weights, 16-byte aligned
/// @param c [M_total, n_out] output, 16-byte aligned
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale
/// @param workspace device scratch of ch08::grouped_gemm_hopper_workspace_bytes(shape), 128-byte aligned
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void grouped_gemm_decode(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                         __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                         void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// grouped_gemm_decode with A gathered (Chapter 8's GatheredA: row r of A is row a.rows[r] of a.x): the
/// same dispatch, to the gathering variant of step 3 or of Chapter 8's kernel
/// (grouped_gemm_hopper_gather). Same rules, with a.x as A, plus ch08::validate_gathered_a's.
/// @param shape sizes
/// @param a the gathered A
/// @param w [E, N, K] expert weights
/// @param c [M_total, n_out] output
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale
/// @param workspace device scratch of ch08::grouped_gemm_hopper_workspace_bytes(shape)
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void grouped_gemm_decode_gather(const GroupedGemmShape& shape, const ch08::GatheredA& a, const __nv_bfloat16* w,
                                __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                                void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

}  // namespace kc::ch09
