/// @file grouped_gemm.hpp
/// @brief Chapter 5: the grouped GEMM of an MoE layer's experts, in the layout MoE frameworks use,
/// and the permutation that produces that layout from Chapter 4's routing.
///
/// Layout (PyTorch's and vLLM's): tokens are permuted so that each expert's rows are contiguous,
/// without padding. A [M_total, K] bf16; offsets [E + 1] int32 on the device, expert e owning rows
/// [offsets[e], offsets[e+1]) (offsets[0] = 0, non-decreasing, offsets[E] <= M_total); expert
/// weights W [E, N, K] bf16 (each expert an nn.Linear weight, K-major); C [M_total, N] bf16, with
/// C[r] = A[r] · W[e]ᵀ for every row r of expert e, fp32 accumulation, one rounding per output.
/// Groups may have any size, 0 included. Rows from offsets[E] to M_total belong to no expert and
/// are not written.
///
/// Offsets stay on the device: the one-launch path never reads them on the host. A rows or C
/// rows named by offsets that break the rules above are clamped into [0, M_total] (tile_map.hpp,
/// expert_rows), so bad offsets give wrong numbers, never an out-of-bounds access.
///
/// Rules (checked on the host before any CUDA call; kc::InvalidArgument names the broken one):
/// M_total in [0, 2^31 - 1], N and K in [1, 2^31 - 1], K a multiple of 8, E in [1, kMaxExperts];
/// w and offsets not null, a and c not null when M_total > 0 (an empty tensor's data pointer may be
/// null: with M_total = 0 there is nothing to compute, C has no element, and nothing is launched);
/// a and w 16-byte aligned, c 2-byte aligned, offsets 4-byte aligned; c overlapping none of a, w,
/// offsets (or the workspace).
///
/// Launch paths neither allocate nor synchronise (CUDA-graph capturable). The first call on a
/// device raises the kernel's shared-memory limit once (cudaFuncSetAttribute, not allowed during
/// capture): call once outside capture first, as Chapter 2 does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

// Angle brackets: the exercise build puts the skeleton's tile_map.hpp first on the include path.
#include <tile_map.hpp>

namespace kc::ch05 {

/// Largest number of experts (the prefix kernels scan one value per thread of one block).
inline constexpr int kMaxExperts = 1024;
/// The grouped order's default band height in m-tiles (Triton's matmul tutorial uses 8).
inline constexpr int kDefaultGroupM = 8;

/// The sizes of one grouped GEMM.
struct GroupedGemmShape {
  std::int64_t m_total = 0;  ///< rows of A and C (the permuted (token, slot) pairs)
  std::int64_t n = 0;        ///< columns of C, rows of each expert's W
  std::int64_t k = 0;        ///< columns of A and of W (the reduction length)
  int experts = 0;           ///< E
};

/// The block tile the one-launch kernel runs (Chapter 2's tiles).
enum class GroupedTile {
  /// Chapter 2's "medium" tile: 8 warps of 64 × 32, 128 KiB (96 KiB on 99 KiB parts); C stored
  /// from registers, as Chapter 2 stores this tile.
  square_128x128,
  /// Chapter 2's "large" tile: 8 warps of 64 × 64, 192 KiB (144 KiB on sm_80), not on 99 KiB parts;
  /// C stored through shared memory (Chapter 2's StagedStore), whole 256-byte rows per warp.
  wide_128x256,
};

/// How the one-launch kernel orders its tiles and which tile it runs. The chapter's `after` is
/// {grouped, 8, wide_128x256}; the default tile is the square one, which fits every GPU the course
/// supports (grouped_tile_supported() says whether the wide one fits this one).
struct GroupedGemmOptions {
  TileOrder order = TileOrder::grouped;            ///< launch order of the tiles
  int group_m = kDefaultGroupM;                    ///< grouped order's band height in m-tiles, >= 1
  GroupedTile tile = GroupedTile::square_128x128;  ///< block tile
};

/// Columns of C per block tile of @p tile (128 or 256; rows are always kBlockM).
constexpr int block_n_of(GroupedTile tile) { return tile == GroupedTile::wide_128x256 ? 256 : 128; }

/// The block tile of this chapter's kernels by default (GroupedTile::square_128x128), which the
/// loop and the tile maps' lesson use: Chapter 2's 128 × 128 "medium" tile (4 pipeline stages, or
/// 3 on the 99 KiB parts). Rows per block tile (for every GroupedTile):
inline constexpr int kBlockM = 128;
/// Columns per block tile.
inline constexpr int kBlockN = 128;

/// Checks the rules at the top of this file; throws kc::InvalidArgument naming the first broken
/// one, e.g. "shape.experts (0) must be in [1, 1024]". Host-only. @p c_columns is C's width for the
/// overlap checks when it is not N (an epilogue that narrows C); 0 means N. @p a_rows is the rows of
/// the matrix at @p a for the overlap checks when it is not M_total (a kernel that gathers A's rows
/// from another matrix through an index); -1 means M_total.
void validate_grouped_gemm(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                           const __nv_bfloat16* c, const std::int32_t* offsets, std::int64_t c_columns = 0,
                           std::int64_t a_rows = -1);

/// Checks what grouped_gemm() needs beyond validate_grouped_gemm(): options.order a TileOrder,
/// options.group_m >= 1, options.tile a GroupedTile, and a workspace of at least
/// grouped_gemm_workspace_bytes(shape) bytes, 4-byte aligned, not overlapping c. Host-only; throws kc::InvalidArgument.
void validate_grouped_gemm_options(const GroupedGemmShape& shape, const __nv_bfloat16* c,
                                   const GroupedGemmOptions& options, const void* workspace,
                                   std::size_t workspace_bytes);

/// Device workspace grouped_gemm() needs: the tile prefix, E + 1 int32, rounded up to 256 bytes.
/// Throws kc::InvalidArgument for a bad shape.experts.
std::size_t grouped_gemm_workspace_bytes(const GroupedGemmShape& shape);

/// Blocks the one-launch kernel starts: max_m_tiles(M_total, E, 128) × ceil(N / block_n), an
/// upper bound on the real tile count that needs no group size on the host (block_n from @p tile).
/// Host-only.
std::int64_t grouped_gemm_grid_blocks(const GroupedGemmShape& shape, GroupedTile tile = GroupedTile::square_128x128);

/// True when @p tile fits the current device's shared memory per block (the square tile fits every
/// GPU the course supports; the wide one needs sm_80 or sm_90). Host-only; the first call per
/// device sets the kernels' attributes, so make it outside graph capture.
bool grouped_tile_supported(GroupedTile tile);

/// After: all experts in one launch (plus a tiny prefix kernel before it). The prefix kernel turns
/// the device offsets into the m-tile prefix over experts (in @p workspace); the GEMM kernel's
/// blocks map their id to a tile in @p options.order, find its expert by binary search over the
/// prefix, and run Chapter 2's block tile on that expert's rows and weights. Surplus blocks exit.
/// With M_total = 0 it launches nothing (a and c may then be null).
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, N] output
/// @param offsets [E + 1] device row offsets
/// @param workspace device scratch of grouped_gemm_workspace_bytes(shape), 4-byte aligned
/// @param workspace_bytes its size
/// @param options tile order, band height and block tile
/// @param stream the stream to enqueue on
void grouped_gemm(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                  const std::int32_t* offsets, void* workspace, std::size_t workspace_bytes,
                  const GroupedGemmOptions& options = {}, cudaStream_t stream = nullptr);

/// Before: what a framework's loop over experts does: one Chapter 2 GEMM launch (128 × 128 tile)
/// per non-empty expert. It needs the group sizes on the host: @p host_offsets is a host copy of
/// the device offsets, which a real framework gets with a device → host copy and a
/// synchronisation (`offsets.tolist()`) before the loop; here the caller pays it (the benchmark
/// does so outside the timed region). Validates @p host_offsets exactly (0 = offsets[0] <= … <=
/// offsets[E] <= M_total).
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, N] output
/// @param host_offsets [E + 1] row offsets, on the host
/// @param stream the stream to enqueue on
void grouped_gemm_loop(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                       std::span<const std::int32_t> host_offsets, cudaStream_t stream = nullptr);

/// Throws kc::InvalidArgument unless @p host_offsets holds E + 1 values with 0 = offsets[0] <= …
/// <= offsets[E] <= M_total. Host-only.
void validate_host_offsets(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets);

/// FLOPs of the grouped GEMM: 2 · offsets[E] · N · K (the rows that belong to an expert).
double grouped_gemm_flops(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets);

/// Fewest bytes: A and C rows of the experts once, and the weights of non-empty experts once
/// (bf16): 2 · (rows · K + non-empty E · N · K + rows · N).
double grouped_gemm_min_bytes(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets);

// ------------------------------------------------------------------------------------ permutation

/// The sizes of one permutation: T tokens, each routed to k of E experts.
struct PermuteShape {
  std::int64_t tokens = 0;  ///< T >= 0
  int k = 0;                ///< experts per token, in [1, 32]
  int experts = 0;          ///< E, in [1, kMaxExperts]
  std::int64_t hidden = 0;  ///< K, columns of X and A, a multiple of 8
};

/// Where the permutation writes. Pair p = t·k + j is token t's j-th choice (ids[p]).
struct PermuteOutputs {
  std::int32_t* counts = nullptr;        ///< [E] pairs per expert
  std::int32_t* offsets = nullptr;       ///< [E + 1] exclusive scan of counts (offsets[E] = valid pairs)
  std::int32_t* row_of_pair = nullptr;   ///< [T·k] row of A holding pair p (-1 for an id outside [0, E))
  std::int32_t* token_of_row = nullptr;  ///< [T·k] token whose copy row r of A is (rows >= offsets[E]: untouched)
  __nv_bfloat16* a = nullptr;            ///< [T·k, K] permuted tokens: A[row_of_pair[t·k+j]] = X[t]; null: no copies
};

/// Checks the permutation's rules (T·k <= 2^31 - 1, k in [1, 32], E in [1, kMaxExperts], K >= 1 a
/// multiple of 8, counts and offsets never null, ids, row_of_pair and token_of_row not null when T > 0,
/// and when a is not null (a kernel that gathers its rows through token_of_row needs no copies): x
/// not null, x and a 16-byte aligned, a not overlapping x). T = 0 writes zero counts and offsets and nothing else.
/// Host-only.
void validate_permute(const PermuteShape& shape, const std::int32_t* ids, const __nv_bfloat16* x,
                      const PermuteOutputs& out);

/// Device workspace permute_tokens() needs: per-chunk expert counts, rounded up to 256 bytes.
std::size_t permute_workspace_bytes(const PermuteShape& shape);

/// Pairs per chunk of the permutation: one warp counts and scatters 256 consecutive pairs.
inline constexpr int kPairsPerChunk = 256;

/// Counts → offsets → scatter, in three small kernels, deterministic and stable: the rows of
/// expert e are its pairs in (token, slot) order, whatever the GPU's scheduling (no atomics decide
/// an order). Ids outside [0, E) are dropped (counted nowhere, row_of_pair = -1).
/// @param shape sizes
/// @param ids [T, k] expert ids (Chapter 4's output)
/// @param x [T, K] tokens
/// @param out where to write
/// @param workspace device scratch of permute_workspace_bytes(shape), 4-byte aligned
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void permute_tokens(const PermuteShape& shape, const std::int32_t* ids, const __nv_bfloat16* x,
                    const PermuteOutputs& out, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream = nullptr);

/// The inverse step (combine, "unpermute"): y[t] = Σ_j weights[t·k + j] · C[row_of_pair[t·k + j]]
/// in fp32, j in order, rounded once to bf16; pairs with row_of_pair < 0 add nothing.
/// @param tokens T
/// @param k experts per token
/// @param n columns of C and y
/// @param c [rows, N] expert outputs (rows >= every row_of_pair)
/// @param weights [T, k] routing weights (fp32, Chapter 4's output)
/// @param row_of_pair [T, k] from permute_tokens
/// @param y [T, N] output; must not be c (nor overlap it: not checked, c's row count is unknown here)
/// @param stream the stream to enqueue on
void unpermute_combine(std::int64_t tokens, int k, std::int64_t n, const __nv_bfloat16* c, const float* weights,
                       const std::int32_t* row_of_pair, __nv_bfloat16* y, cudaStream_t stream = nullptr);

// ------------------------------------------------------------------------------- fp64 references

/// The permutation's ground truth (host).
struct PermuteReference {
  std::vector<std::int32_t> counts;        ///< [E]
  std::vector<std::int32_t> offsets;       ///< [E + 1]
  std::vector<std::int32_t> row_of_pair;   ///< [T·k]
  std::vector<std::int32_t> token_of_row;  ///< [offsets[E]]
};

/// Counting sort of the pairs by expert, stable in (token, slot) order; ids outside [0, E) dropped.
/// Throws kc::InvalidArgument when @p experts or @p k is out of range or ids.size() is not a
/// multiple of k.
PermuteReference permute_reference(std::span<const std::int32_t> ids, int k, int experts);

/// One element of the grouped product in double: C[row, col] = A[row] · W[e][col]ᵀ, where e is
/// the expert owning @p row by @p host_offsets (throws kc::InvalidArgument if none does).
double grouped_gemm_reference_element(std::span<const double> a, std::span<const double> w,
                                      std::span<const std::int32_t> host_offsets, std::int64_t n, std::int64_t k,
                                      std::int64_t row, std::int64_t col);

/// The whole grouped product in double for small problems: [M_total, N], rows of no expert NaN.
std::vector<double> grouped_gemm_reference(std::span<const double> a, std::span<const double> w,
                                           std::span<const std::int32_t> host_offsets, std::int64_t m_total,
                                           std::int64_t n, std::int64_t k);

/// Row offsets [E + 1] (exclusive scan) of host group sizes. Throws kc::InvalidArgument on a
/// negative size or a total above 2^31 - 1.
std::vector<std::int32_t> offsets_of_sizes(std::span<const std::int32_t> sizes);

/// The group-size distributions of the benchmark (and of the PyTorch baseline, which repeats them).
enum class GroupSizes {
  uniform,        ///< rows / E each, the remainder one each to the first experts
  zipf,           ///< expert e gets floor(rows · (1/(e+1)) / H) with H = Σ 1/(e+1), remainder to the first
  one_hot,        ///< expert 0 gets half the rows, the others share the rest uniformly
  quarter_empty,  ///< every fourth expert (0, 4, 8, …) gets none, the others share the rows uniformly
  /// rows / E each plus d(e) = (37·e mod 39) − 19, so sizes spread ±19 rows (standard deviation 11)
  /// around the mean as a random top-8 routing spreads them at prefill (DeepSeek-V3 at T = 4096:
  /// 128 ± 11); clamped at 0, the difference to rows one each from expert 0 on
  ragged,
};

/// Host group sizes of @p kind for @p rows rows over @p experts experts; they sum to @p rows.
/// Throws kc::InvalidArgument for experts outside [1, kMaxExperts] or negative rows.
std::vector<std::int32_t> group_sizes(GroupSizes kind, int experts, std::int32_t rows);

/// One benchmark case (the benchmarks, the tests and the lessons share them).
struct GroupedCase {
  std::string label;                ///< e.g. "G256xM128_N4096_K7168"; never a prefix of another case's
  GroupedGemmShape shape;           ///< sizes
  std::vector<std::int32_t> sizes;  ///< rows per expert
};

/// @p experts experts of @p rows_per_expert rows each, labelled
/// `<prefix>G<experts>xM<rows_per_expert>_N<n>_K<k>`.
GroupedCase uniform_case(int experts, std::int32_t rows_per_expert, std::int64_t n, std::int64_t k,
                         const std::string& prefix = "");

/// @p rows rows over @p experts experts by @p kind (zipf, one_hot, quarter_empty or ragged), labelled
/// `E<experts>_M<rows>_<zipf|hot|empty25|ragged>_N<n>_K<k>`.
GroupedCase skewed_case(GroupSizes kind, int experts, std::int32_t rows, std::int64_t n, std::int64_t k);

/// The chapter's eight benchmark cases: DeepSeek-V3 up (N 4096, K 7168) as G8×4096, G32×256,
/// G256×128 and 256 experts over 8192 rows (Zipf, one hot, 25 % empty); DeepSeek-V3 down
/// G8×4096 (N 7168, K 2048); Mixtral up G8×4096 (N 28672, K 4096).
std::vector<GroupedCase> benchmark_cases();

// ---------------------------------------------------------------------- the lesson's arithmetic

/// The lesson's re-read bound: in the worst order every block reads its own K × BN slice of W
/// from DRAM, 2·BN·K bytes for 2·BM·BN·K FLOPs, so W re-read traffic is at most one byte per BM
/// FLOPs: @p flops / BM bytes.
double reread_bytes_bound(double flops, int block_m);

/// Predicted DRAM bytes of the one-launch kernel for uniform groups (E experts × @p rows rows) when
/// every W tile is re-read by each "wave" that needs it but reused inside one: A once, C once, and
/// W of each expert read ceil(m-tiles per expert / m-tiles a wave shares per W tile) times.
/// @p concurrent_blocks is how many blocks run at once (SMs × blocks per SM). For row-major order
/// a wave shares a W tile among max(1, concurrent / tiles_n) m-tiles; for grouped order among
/// min(group_m, m-tiles per expert). A model for the lesson's prediction, not a cache simulator.
double predicted_dram_bytes(const GroupedGemmShape& shape, int rows_per_expert, TileOrder order, int group_m,
                            int concurrent_blocks);

}  // namespace kc::ch05
