/// @file gemm_bf16.hpp
/// @brief Chapter 2, tensor cores: C = A · Wᵀ in bf16 with fp32 accumulation (mma.sync m16n8k16),
/// and the microbenchmark that measures the mma.sync peak it is judged against.
///
/// Layout (that of nn.Linear and of the MoE chapters): A is [M, K] row-major, W is [N, K] row-major
/// (one row per output feature), C is [M, N] row-major. Both operands are K-major, which is the
/// layout mma.sync's "row.col" operands want, so no transpose is needed anywhere.
///
/// Numerics: bf16 inputs, products and sums in fp32, one round-to-nearest-even to bf16 per output.
///
/// Rules (checked on the host before any CUDA call; kc::InvalidArgument names the broken one):
///   - every dimension of @p shape in [1, 2^31 - 1] (validate_gemm_shape);
///   - K a multiple of 8, and a and w 16-byte aligned: tiles are copied in 16-byte chunks (8 bf16)
///     with cp.async, so every row of A and W must start on a 16-byte boundary;
///   - a, w and c not null, c 2-byte aligned, and c not overlapping a or w (a and w may be the same).
/// Any M and N work: out-of-range rows and the K tail are zero-filled, stores are masked.
///
/// The launch functions neither allocate nor synchronise (CUDA-graph capturable). The first call
/// on a device queries it and raises the kernels' shared-memory limit once; later calls only read
/// that cache.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gemm_shape.hpp"

namespace kc::ch02 {

/// The block tiles of the bf16 GEMM, which choose_gemm_bf16_tile picks from (gemm_bf16_tile.cuh
/// holds their configurations). K advances 64 at a time through a cp.async pipeline of several
/// stages (each stage holds a 64-wide slice of A's and W's rows).
enum class GemmBf16Tile {
  /// 128×256, 8 warps of 64×64; 4 stages (192 KiB) where they fit (sm_90), else 3 (144 KiB, sm_80);
  /// C leaves through shared memory, a warp writing whole 256-byte rows (block::StagedStore)
  large,
  medium,  ///< 128×128, 8 warps of 64×32; 4 stages (128 KiB), or 3 (96 KiB) on the 99 KiB parts (sm_86, sm_89)
  small,   ///< 64×64, 4 warps of 32×32, 6 stages (96 KiB): many blocks, many bytes in flight, for small M or N
  /// 64×32, 4 warps of 16×32, 8 stages (96 KiB): twice the small tile's blocks for the decode and
  /// MoE shapes (M = 16 or 128, N = 4096), where the small tile leaves half the SMs idle while the
  /// GEMM streams W; more shared-memory reads per mma, which those memory-bound shapes can afford.
  narrow,
  /// The small tile with 12 stages (192 KiB, sm_90): chosen instead of small when the grid has at
  /// most one block per SM, so that the single wave keeps twice the bytes in flight.
  small_deep,
  /// The narrow tile with 16 stages (192 KiB, sm_90): chosen instead of narrow when the GPU has the
  /// shared memory (the narrow tile's grid is always a single wave).
  narrow_deep,
};

/// What one tile choice means on a given GPU.
struct GemmBf16TileInfo {
  int block_m = 0;             ///< rows of C per block
  int block_n = 0;             ///< columns of C per block
  int block_k = 0;             ///< K per pipeline stage
  int warps = 0;               ///< warps per block
  int stages = 0;              ///< shared-memory buffers in the cp.async pipeline
  std::size_t smem_bytes = 0;  ///< dynamic shared memory per block
  bool fits = false;           ///< smem_bytes <= the GPU's per-block opt-in limit
};

/// The shape of @p tile on a GPU whose blocks may opt in to @p smem_per_block_optin bytes of shared
/// memory (cudaDevAttrMaxSharedMemoryPerBlockOptin). Host-only, no CUDA call.
GemmBf16TileInfo gemm_bf16_tile_info(GemmBf16Tile tile, std::size_t smem_per_block_optin);

/// The tile gemm_bf16 uses: of large, medium and small, the largest one that
/// fits in shared memory and still gives every SM at least one block (grid >= @p sm_count); when
/// none does (small M or N), the small tile if it still keeps at least half the SMs busy, else the
/// narrow tile (twice the small tile's blocks). A small or narrow grid of at most @p sm_count
/// blocks (a single wave, one block per SM) takes the deep version of its tile where it fits.
/// Host-only, no CUDA call.
/// Throws kc::InvalidArgument for a bad @p shape or sm_count.
GemmBf16Tile choose_gemm_bf16_tile(GemmShape shape, int sm_count, std::size_t smem_per_block_optin);

/// Checks the rules in this file's description; throws kc::InvalidArgument naming the first one
/// broken, e.g. "shape.k (100) must be a multiple of 8 (16-byte rows for cp.async)". Host-only.
void validate_gemm_bf16(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape);

/// validate_gemm_bf16 for a C of @p c_columns columns instead of N (an epilogue that makes fewer
/// outputs than the GEMM has columns). Host-only.
void validate_gemm_bf16_operands(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c,
                                 GemmShape shape, std::int64_t c_columns);

/// C = A · Wᵀ on @p stream with the tile choose_gemm_bf16_tile picks for this GPU.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned
/// @param c [M, N] row-major output
/// @param shape M, N, K (K a multiple of 8)
/// @param stream the stream to enqueue on
void gemm_bf16(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
               cudaStream_t stream = nullptr);

/// gemm_bf16 with the tile chosen by the caller (tests, benchmarks, exercises). Throws
/// kc::InvalidArgument when @p tile does not fit this GPU's shared memory.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned
/// @param c [M, N] row-major output
/// @param shape M, N, K (K a multiple of 8)
/// @param tile the block tile to use
/// @param stream the stream to enqueue on
void gemm_bf16_with_tile(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                         GemmBf16Tile tile, cudaStream_t stream = nullptr);

/// The printable name of @p tile ("large", "medium", "small", "narrow", "small_deep", "narrow_deep").
const char* to_string(GemmBf16Tile tile);

/// The mma.sync peak microbenchmark: every warp issues back-to-back mma.sync m16n8k16 bf16 on
/// operands held in registers, into @p accumulators_per_warp independent accumulator tiles (so the
/// tensor core never waits for the previous result of the same tile), and touches memory only to
/// store one checksum per thread at the end (so the compiler cannot drop the work). The default
/// runs 8 warps × 4 blocks = 32 warps per SM, 8 independent accumulators each.
struct MmaPeakConfig {
  int warps_per_block = 8;        ///< warps per block, in [1, 32]
  int blocks_per_sm = 4;          ///< blocks launched per SM (the grid is sm_count × this)
  int accumulators_per_warp = 8;  ///< independent m16n8 accumulator tiles per warp: 1, 2, 4, 8 or 16
  int iterations = 4096;          ///< mma.sync per accumulator, >= 1
};

/// Throws kc::InvalidArgument naming the first broken rule of @p config (see MmaPeakConfig), of
/// @p sm_count (>= 1) or of @p sink (not null). Host-only.
void validate_mma_peak(const MmaPeakConfig& config, int sm_count, const float* sink);

/// Launches the microbenchmark on @p stream over sm_count × config.blocks_per_sm blocks.
/// @param config the launch and work per warp
/// @param sm_count the GPU's SM count (kc::DeviceInfo::sm_count)
/// @param sink one float per thread of the grid (mma_peak_sink_elements); each gets a finite checksum
/// @param stream the stream to enqueue on
void mma_peak(const MmaPeakConfig& config, int sm_count, float* sink, cudaStream_t stream = nullptr);

/// Number of floats @p sink must hold: one per thread of the grid. Validates like mma_peak.
std::int64_t mma_peak_sink_elements(const MmaPeakConfig& config, int sm_count);

/// FLOPs one launch performs: warps × accumulators × iterations × 2·16·8·16 (one m16n8k16 is 2048
/// multiply-adds). Validates like mma_peak.
double mma_peak_flops(const MmaPeakConfig& config, int sm_count);

}  // namespace kc::ch02
