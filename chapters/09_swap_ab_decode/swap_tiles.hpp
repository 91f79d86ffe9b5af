/// @file swap_tiles.hpp
/// @brief Chapter 9's tile and index arithmetic, as constexpr `__host__ __device__` functions that the
/// kernel calls and the CPU tests check: the swapped tile and its shared memory, which weight rows a
/// tile puts on wgmma's M side (the operand swap), the work of a persistent block's i-th tile, and
/// where each accumulator lands in C (the transposed store).
///
/// A tile is 128 weight rows of one expert (two consumer warpgroups of 64: wgmma's M) times up to
/// kTokens of its tokens (wgmma's N). Its accumulators are a 128 × kTokens block of Cᵀ: accumulator
/// row r of consumer g is column 64 · g + r of the tile's columns of C, accumulator column t is the
/// tile's token t, a row of C.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "hopper_tiles.hpp"  // Chapter 7: kBlockK, the accumulator layout, the shared-memory limit
#include "swap_ab.hpp"       // the epilogue kinds
#include "tile_map.hpp"      // Chapter 5: the tile prefix, the expert lookup, the grouped order

namespace kc::ch09 {

/// Weight rows of one tile: two consumer warpgroups of 64 (wgmma's M is 64 per warpgroup).
inline constexpr int kWRows = 128;
/// Weight rows of one box: each consumer warpgroup's 64 rows, loaded as one TMA box.
inline constexpr int kWBoxRows = 64;
/// Bytes of one weight box: 64 rows × 64 bf16 of K.
inline constexpr int kWBoxBytes = kWBoxRows * ch07::kBlockK * 2;
/// Threads of a block: a producer warpgroup and two consumer warpgroups.
inline constexpr int kSwapThreads = 3 * ch07::kWarpgroupThreads;
/// Threads that run the epilogue: the two consumer warpgroups.
inline constexpr int kEpilogueThreads = 2 * ch07::kWarpgroupThreads;
/// Floats per token row of the epilogue's staging buffer: the tile's 128 columns and 4 of padding,
/// so the 32 lanes of a warp writing one register (8 columns × 4 token pairs) hit 32 different banks.
inline constexpr int kStagingPitch = kWRows + 4;
/// Band height of the tile order inside an expert, in token tiles: an expert's token tiles of one
/// n-tile run next to each other and share its weight box in L2.
inline constexpr int kSwapGroupM = ch07::kGroupM;

/// The tile of one kernel: the token tile (wgmma's N: 8, 16, 32 or 64) and the pipeline depth.
struct SwapTile {
  int tokens;  ///< tokens per tile (wgmma's N)
  int stages;  ///< shared-memory stages in the pipeline

  /// Bytes of one token box: tokens rows × 64 bf16 of K.
  __host__ __device__ constexpr int token_box_bytes() const { return tokens * ch07::kBlockK * 2; }
  /// Bytes one stage receives: two weight boxes and a token box (out-of-bounds zeros included).
  __host__ __device__ constexpr int stage_bytes() const { return 2 * kWBoxBytes + token_box_bytes(); }
  /// Bytes of the epilogue's staging buffer: the tile's fp32 accumulators, one padded row per token.
  __host__ __device__ constexpr int staging_bytes() const { return tokens * kStagingPitch * 4; }
  /// Bytes after the stages and the staging buffer: a full and an empty barrier per stage, then the
  /// block's tile prefix (E + 1 ints, E <= 1024) and the 32 chunk sums of its scan.
  __host__ __device__ constexpr int tail_bytes() const { return stages * 2 * 8 + (ch05::kMaxExperts + 1) * 4 + 32 * 4; }
  /// Dynamic shared memory: the alignment slack, the stages, the staging buffer, the tail.
  __host__ __device__ constexpr std::size_t smem_bytes() const {
    return static_cast<std::size_t>(ch07::kSwizzleAtomBytes) + static_cast<std::size_t>(stages) * stage_bytes() +
           static_cast<std::size_t>(staging_bytes()) + static_cast<std::size_t>(tail_bytes());
  }
};

/// The most stages of a @p tokens token tile that fit an sm_90 block, at most 16.
__host__ __device__ constexpr int swap_stages_that_fit(int tokens) {
  const SwapTile none{tokens, 0};
  const std::size_t fixed = ch07::kSwizzleAtomBytes + static_cast<std::size_t>(none.staging_bytes()) +
                            static_cast<std::size_t>(none.tail_bytes());
  const std::size_t per_stage = static_cast<std::size_t>(none.stage_bytes()) + 2 * 8;
  const int fit = static_cast<int>((ch07::kSm90SmemPerBlock - fixed) / per_stage);
  return fit < 16 ? fit : 16;
}

/// Step 1's stages: Chapter 8's pipeline depth.
inline constexpr int kStep1Stages = 4;
/// The widest token tile, steps 1 and 2's.
inline constexpr int kMaxTokenTile = 64;

/// n-tiles of an expert: plain, ceil(N / 128) tiles of 128 columns; SwiGLU, ceil((N / 2) / 64) tiles
/// of 64 output columns (64 gate rows and the 64 matching up rows of W).
__host__ __device__ constexpr int swap_tiles_n(int n, EpilogueKind kind) {
  return kind == EpilogueKind::swiglu ? ch05::ceil_div_int(n / 2, kWBoxRows) : ch05::ceil_div_int(n, kWRows);
}

/// Columns of C one tile writes: 128 plain, 64 SwiGLU.
__host__ __device__ constexpr int swap_out_cols(EpilogueKind kind) {
  return kind == EpilogueKind::swiglu ? kWBoxRows : kWRows;
}

/// The rows of W (as one [E · N, K] matrix) of a tile's two weight boxes, consumer 0's and consumer 1's.
struct SwapWRows {
  int first;   ///< consumer 0's 64 rows (plain: columns n0 ..; SwiGLU: gate rows j0 ..)
  int second;  ///< consumer 1's 64 rows (plain: columns n0 + 64 ..; SwiGLU: up rows N / 2 + j0 ..)
};

/// The weight rows of n-tile @p n_tile of @p expert (@p n rows per expert): the operand swap puts them
/// on wgmma's M side. Rows past the expert's N belong to the next expert (or lie past W, read as
/// zeros): they feed only columns that are never stored.
__host__ __device__ constexpr SwapWRows swap_w_rows(int expert, int n_tile, int n, EpilogueKind kind) {
  const int base = expert * n;  // E · N <= 2^31 - 256 (Chapter 8's rule)
  // exercise 1: The operand swap. Each consumer warpgroup multiplies 64 weight rows (wgmma's M side)
  // exercise 1: by the tile's tokens. Plain: the n-tile's 128 columns of C are rows n0 .. n0 + 127
  // exercise 1: of the expert's W, 64 per consumer. SwiGLU: consumer 0 takes the 64 gate rows of the
  // exercise 1: tile's output columns j0 .., consumer 1 the matching up rows, N / 2 further down.
  // stub: (void)kind;
  // stub: return {base + n_tile * kWRows, base + n_tile * kWRows};
  if (kind == EpilogueKind::swiglu) {
    const int j0 = n_tile * kWBoxRows;
    return {base + j0, base + n / 2 + j0};
  }
  const int n0 = n_tile * kWRows;
  return {base + n0, base + n0 + kWBoxRows};
  // end exercise 1
}

/// What one tile of a launch is.
struct SwapWork {
  int expert = 0;  ///< the expert owning the tile
  int row0 = 0;    ///< the tile's first token: a row of A and C
  int tokens = 0;  ///< the tile's tokens, in [1, tile tokens]: rows row0 .. row0 + tokens - 1
  int n_tile = 0;  ///< n-tile, in [0, tiles_n)
};

/// The work of tile @p tile, in [0, tile_prefix[E] · @p tiles_n): Chapter 5's grouped order inside
/// each expert over token tiles of @p block_tokens rows, then locate() for the rows.
/// @param tile the tile's id in launch order
/// @param offsets [E + 1] row offsets (clamped into [0, m_total], as Chapter 5 does)
/// @param tile_prefix [E + 1] token-tile prefix over experts (tiles of @p block_tokens rows)
/// @param experts E
/// @param m_total rows of A and C
/// @param tiles_n n-tiles (swap_tiles_n)
/// @param block_tokens tokens per tile
/// @param group_m band height in token tiles
__host__ __device__ inline SwapWork swap_work(int tile, const std::int32_t* offsets, const std::int32_t* tile_prefix,
                                              int experts, int m_total, int tiles_n, int block_tokens,
                                              int group_m = kSwapGroupM) {
  const ch05::TileCoord at = ch05::expert_grouped_tile(tile, tile_prefix, experts, tiles_n, group_m);
  const ch05::TileRows rows = ch05::locate(offsets, tile_prefix, experts, m_total, block_tokens, at.m_tile);
  SwapWork work;
  work.expert = rows.expert;
  work.row0 = rows.row0;
  work.tokens = rows.rows_left < block_tokens ? rows.rows_left : block_tokens;
  work.n_tile = at.n_tile;
  return work;
}

/// Where an accumulator goes in the staging buffer: a token (a row of C) and a column of the tile.
struct TransposedSlot {
  int token;   ///< 0 .. tile tokens - 1
  int column;  ///< 0 .. 127: 64 · consumer + the accumulator's row
};

/// The slot of accumulator register @p i of thread @p thread (0..127) of consumer warpgroup
/// @p consumer: the wgmma's accumulator layout (Chapter 7's accumulator_position) read transposed.
__host__ __device__ constexpr TransposedSlot transposed_slot(int consumer, int thread, int i) {
  const ch07::FragmentPosition at = ch07::accumulator_position(thread, i);
  // exercise 2: The transposed store. The accumulator's row is a weight row, i.e. a column of C
  // exercise 2: (this consumer's 64 follow the other's), and its column is a token, i.e. a row of C.
  // stub: return {at.row, 64 * consumer + at.col};
  return {at.col, kWBoxRows * consumer + at.row};
  // end exercise 2
}

/// Offset in floats of (@p token, @p column) in the staging buffer.
__host__ __device__ constexpr int staging_offset(int token, int column) { return token * kStagingPitch + column; }

}  // namespace kc::ch09
