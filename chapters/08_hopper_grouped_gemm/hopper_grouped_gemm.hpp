/// @file hopper_grouped_gemm.hpp
/// @brief Chapter 8: the grouped GEMM of an MoE layer's experts on Hopper (sm_90a): Chapter 7's TMA,
/// wgmma and warp-specialized pipeline over Chapter 5's layout, with the experts' boundaries found
/// and enforced on the device.
///
/// Layout (Chapter 5's, grouped_gemm.hpp): A [M_total, K] bf16, rows grouped by expert without
/// padding; offsets [E + 1] int32 on the device (never read on the host), expert e owning rows
/// [offsets[e], offsets[e+1]); W [E, N, K] bf16; C [M_total, n_out] bf16 with fp32 accumulation and one
/// rounding per output. Rows from offsets[E] to M_total belong to no expert and are not written.
///
/// The epilogue (GroupedEpilogue) says what a row of C is, with acc = A[r] · W[e]ᵀ (N values):
///   - plain:      C[r] = acc                                  (n_out = N)
///   - swiglu:     C[r][j] = silu(acc[j]) · acc[N/2 + j]       (n_out = N / 2; W[e] is [gate; up])
///   - row_scale:  C[r] = row_scale[r] · acc                   (n_out = N; the routing weight)
///
/// The steps (each its own kernel and benchmark variant): the first three are the ways of stopping a
/// tile at its expert's last row, the fourth what the L2 keeps, the fifth when tiles that share a W
/// box run; all share the warp-specialized kernel (grouped_kernel.cuh):
///   1. step1_masked_store.cu       one tensor map over A and one over W; a tile's loads may run past its
///                                  expert (harmless), and its stores go from registers, masked.
///   2. step2_device_tensor_maps.cu a store map per expert, written on the device by the prefix kernel
///                                  (tensormap.replace, proxy fences): TMA clips the store at the expert's end.
///   3. step3_ragged_tensor_map.cu  one rank-3 store map whose extra dimension makes TMA's own bounds
///                                  check end each expert (no device writes, no fences).
///   4. step4_a_evict_last.cu       step 3, with the A rows of experts of one m-tile loaded evict-last
///                                  in L2, so the weights streaming past do not push them out.
///   5. step5_block_per_tile.cu     step 4's kernel with a block per tile instead of a persistent grid:
///                                  the GPU starts the blocks in tile order as SMs free up.
/// The chapter's `after` (grouped_gemm_hopper) runs step 4 or step 5, whichever after_step picks for
/// the shape.
///
/// Rules (checked on the host before any CUDA call; kc::InvalidArgument names the broken one):
///   - Chapter 5's (validate_grouped_gemm): M_total in [0, 2^31 - 1], N and K in [1, 2^31 - 1], K a
///     multiple of 8, E in [1, 1024], a and w 16-byte aligned, c and offsets not overlapping the rest;
///   - M_total at most 2^30 (the rank-3 store map counts rows below 2^30) and E · N at most 2^31 - 256
///     (W is read as one [E · N, K] matrix, with int row coordinates);
///   - swiglu: N a multiple of 2;
///   - the TMA-store steps (2, 3 and `after`), when M_total > 0: n_out a multiple of 8 and c 16-byte
///     aligned (TMA writes rows of a multiple of 16 bytes from a 16-byte-aligned base);
///   - row_scale: row_scale not null when M_total > 0, 4-byte aligned, not overlapping c;
///   - a workspace of grouped_gemm_hopper_workspace_bytes(shape) bytes, 128-byte aligned, overlapping
///     none of a, w, c, offsets and (row_scale) the scales.
/// With M_total = 0 nothing is launched (a and c may then be null).
///
/// GPU: sm_90 exactly (wgmma, setmaxnreg). On any other GPU, or in a build without a 90 entry in
/// CMAKE_CUDA_ARCHITECTURES, the launch functions throw kc::ch07::UnsupportedGpu after validating.
///
/// Launch paths neither allocate nor synchronise (CUDA-graph capturable): two kernels, the prefix kernel
/// (tile prefix over experts, and for step 2 the experts' store maps) and the GEMM. The first call on a
/// device queries it and raises the kernels' shared-memory limits: call once outside a capture first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "grouped_gemm.hpp"  // Chapter 5: GroupedGemmShape, validate_grouped_gemm, the loop's rules
#include "hopper_gemm.hpp"   // Chapter 7: UnsupportedGpu

namespace kc::ch08 {

using ch05::GroupedGemmShape;
using ch07::UnsupportedGpu;

/// What a row of C is (see the file's description).
enum class EpilogueKind {
  plain,      ///< C = A · Wᵀ
  swiglu,     ///< C = silu(gate) · up, gate and up the two halves of A · Wᵀ's columns
  row_scale,  ///< C = row_scale[r] · (A · Wᵀ)
};

/// The epilogue of a launch: its kind and, for row_scale, the device array of M_total fp32 scales.
struct GroupedEpilogue {
  EpilogueKind kind = EpilogueKind::plain;  ///< what a row of C is
  const float* row_scale = nullptr;         ///< [M_total] on the device (row_scale only)
};

/// The steps of the chapter: steps 1-3 are the ways of ending a tile at its expert's last row; step 4
/// keeps step 3's store and changes what the L2 keeps.
enum class GroupedStep {
  masked_store,        ///< step 1: stores from registers, masked at the expert's end
  device_tensor_maps,  ///< step 2: TMA stores through per-expert maps written on the device
  ragged_tensor_map,   ///< step 3: TMA stores through one rank-3 map that clips at each expert's end
  a_evict_last,        ///< step 4: step 3, with the A rows of one-m-tile experts loaded evict-last in L2
  block_per_tile,      ///< step 5: step 4, a block per tile (the GPU's block order) instead of a persistent grid
};

/// Every step, in order.
inline constexpr GroupedStep kGroupedSteps[] = {GroupedStep::masked_store, GroupedStep::device_tensor_maps,
                                                GroupedStep::ragged_tensor_map, GroupedStep::a_evict_last,
                                                GroupedStep::block_per_tile};

/// The step grouped_gemm_hopper runs for @p shape: step 5 when the experts average fewer than two
/// m-tiles of rows (M_total < 2 · 128 · E), step 4 otherwise. With so few rows per expert most W boxes
/// have one or two reader tiles and the weight stream sets the pace: what counts is that the two
/// readers of a box run together (step 5). With more rows each W box serves several m-tiles that the
/// grouped tile order already puts in one round, the math sets the pace, and the persistent loop's
/// overlap of a tile's epilogue with the next tile's loads counts more (step 4). Steps 4 and 5 have
/// the same rules.
constexpr GroupedStep after_step(const GroupedGemmShape& shape) {
  return shape.m_total < std::int64_t{2} * ch05::kBlockM * shape.experts ? GroupedStep::block_per_tile
                                                                         : GroupedStep::a_evict_last;
}

/// The benchmark variant name of @p step: "step1_masked_store", "step2_device_tensor_maps",
/// "step3_ragged_tensor_map", "step4_a_evict_last", "step5_block_per_tile". Throws kc::InvalidArgument
/// for a value that is not a GroupedStep.
const char* to_string(GroupedStep step);

/// True when @p step stores C through TMA (and so needs n_out a multiple of 8 and c 16-byte aligned).
__host__ __device__ constexpr bool uses_tma_store(GroupedStep step) { return step != GroupedStep::masked_store; }

/// True when @p step stores through step 3's rank-3 ragged map.
__host__ __device__ constexpr bool uses_ragged_map(GroupedStep step) {
  return step == GroupedStep::ragged_tensor_map || step == GroupedStep::a_evict_last ||
         step == GroupedStep::block_per_tile;
}

/// Columns of C: N, or N / 2 for swiglu.
__host__ __device__ constexpr std::int64_t output_columns(std::int64_t n, EpilogueKind kind) {
  return kind == EpilogueKind::swiglu ? n / 2 : n;
}

/// Bytes of device workspace a launch needs: the tile prefix (E + 1 int32, rounded up to 128 bytes)
/// and one 128-byte store map per expert (step 2 writes them; the other steps leave them alone). The
/// prefix kernel rewrites all it uses on every launch: the workspace needs no initialisation, and its
/// content after a launch is unspecified. Throws kc::InvalidArgument for a bad shape.experts. Host-only.
std::size_t grouped_gemm_hopper_workspace_bytes(const GroupedGemmShape& shape);

/// Checks every rule in this file's description for a launch of @p step except the workspace's; throws
/// kc::InvalidArgument naming the first one broken: for a kernel that takes no workspace. The default
/// step's rules are `after`'s for every shape (steps 4 and 5 share them). Host-only.
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, n_out] output
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale
/// @param step the step whose store rules apply
/// @param a_rows rows of the matrix at @p a for the overlap checks (a gathered A's x_rows); -1: M_total
void validate_grouped_gemm_hopper_operands(const GroupedGemmShape& shape, const __nv_bfloat16* a,
                                           const __nv_bfloat16* w, const __nv_bfloat16* c, const std::int32_t* offsets,
                                           const GroupedEpilogue& epilogue,
                                           GroupedStep step = GroupedStep::a_evict_last, std::int64_t a_rows = -1);

/// Checks every rule in this file's description for a launch of @p step; throws kc::InvalidArgument
/// naming the first one broken, e.g. "the columns of C (770, shape.n / 2) must be a multiple of 8 for
/// step3_ragged_tensor_map's TMA store (rows of a multiple of 16 bytes)". Host-only. @p a_rows as in
/// validate_grouped_gemm_hopper_operands.
void validate_grouped_gemm_hopper(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                                  const __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                                  const void* workspace, std::size_t workspace_bytes,
                                  GroupedStep step = GroupedStep::a_evict_last, std::int64_t a_rows = -1);

/// After: every expert in one launch (after the prefix kernel), of the step after_step(shape) picks.
/// @param shape sizes (N is W's rows per expert; C has output_columns(N, epilogue.kind) columns)
/// @param a [M_total, K] permuted tokens, 16-byte aligned
/// @param w [E, N, K] expert weights, 16-byte aligned
/// @param c [M_total, n_out] output, 16-byte aligned
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale (with its scales)
/// @param workspace device scratch of grouped_gemm_hopper_workspace_bytes(shape), 128-byte aligned
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void grouped_gemm_hopper(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                         __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                         void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// grouped_gemm_hopper with the kernel of @p step (tests, benchmark). Same rules; step 1 also takes a
/// c that is only 2-byte aligned and any n_out.
/// @param step the step
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, n_out] output
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale
/// @param workspace device scratch of grouped_gemm_hopper_workspace_bytes(shape)
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void grouped_gemm_hopper_step(GroupedStep step, const GroupedGemmShape& shape, const __nv_bfloat16* a,
                              const __nv_bfloat16* w, __nv_bfloat16* c, const std::int32_t* offsets,
                              const GroupedEpilogue& epilogue, void* workspace, std::size_t workspace_bytes,
                              cudaStream_t stream = nullptr);

/// A whose rows are gathered from another matrix: row r of A is row rows[r] of x. An MoE layer's
/// permuted tokens are such an A (x the tokens, rows the permutation's token_of_row): a kernel that
/// loads them from x needs no permuted copy.
struct GatheredA {
  const __nv_bfloat16* x = nullptr;    ///< [x_rows, K] on the device, 16-byte aligned
  std::int64_t x_rows = 0;             ///< rows of x, in [1, 2^31 - 1]
  const std::int32_t* rows = nullptr;  ///< [M_total] on the device: rows[r] in [0, x_rows) for r < offsets[E]
};

/// Checks a gathered A's rules besides grouped_gemm_hopper's (where a.x, of a.x_rows rows, stands for
/// A): when M_total > 0, a.x_rows in [1, 2^31 - 1], a.rows not null, 4-byte aligned and not
/// overlapping c. Throws kc::InvalidArgument naming the first rule broken. Host-only. (A row index
/// outside [0, x_rows) is device data, not checked: TMA reads zeros for it.)
/// @param shape sizes
/// @param a the gathered A
/// @param c [M_total, n_out] output
/// @param n_out columns of C
void validate_gathered_a(const GroupedGemmShape& shape, const GatheredA& a, const __nv_bfloat16* c, std::int64_t n_out);

/// grouped_gemm_hopper (step 4's kernel) with A gathered: the producer loads each row of a tile as a
/// one-row TMA box of x, at a.rows[r]. Same rules as grouped_gemm_hopper with a.x as A, plus
/// validate_gathered_a's.
/// @param shape sizes
/// @param a the gathered A
/// @param w [E, N, K] expert weights
/// @param c [M_total, n_out] output
/// @param offsets [E + 1] device row offsets
/// @param epilogue plain, swiglu or row_scale
/// @param workspace device scratch of grouped_gemm_hopper_workspace_bytes(shape)
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void grouped_gemm_hopper_gather(const GroupedGemmShape& shape, const GatheredA& a, const __nv_bfloat16* w,
                                __nv_bfloat16* c, const std::int32_t* offsets, const GroupedEpilogue& epilogue,
                                void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// Before: what a framework's loop over experts does, with Chapter 7's `after` (gemm_bf16_hopper, no
/// workspace) launched once per non-empty expert on its rows of A and C and its W. It needs the group
/// sizes on the host (@p host_offsets, validated exactly as ch05::validate_host_offsets does): a real
/// framework pays a device → host copy and a synchronisation for them; the benchmark pays it outside
/// the timing. Plain epilogue only. Chapter 7's rules apply to every expert's launch.
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, N] output
/// @param host_offsets [E + 1] row offsets, on the host
/// @param stream the stream to enqueue on
void grouped_gemm_hopper_loop(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                              __nv_bfloat16* c, std::span<const std::int32_t> host_offsets,
                              cudaStream_t stream = nullptr);

}  // namespace kc::ch08
