/// @file grouped_tiles.hpp
/// @brief Chapter 8's tile and index arithmetic, as constexpr `__host__ __device__` functions that the
/// kernels call and the CPU tests check: the tile, which W rows a tile reads (plain or SwiGLU), which
/// columns of C it writes, the work of a persistent block's i-th tile, and the coordinates of the
/// rank-3 "ragged" store map.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hopper_grouped_gemm.hpp"
#include "hopper_tiles.hpp"  // Chapter 7: TileConfig, the stage layout, the staged C boxes
#include "tile_map.hpp"      // Chapter 5: tile prefix, expert lookup, grouped order

namespace kc::ch08 {

using ch07::TileConfig;

/// The tile of every step: 128 × 256 (two consumer warpgroups of 64 rows, one producer warpgroup),
/// 4 stages of 48 KiB, and for the TMA-store steps a 32 KiB staging buffer (half the tile's columns
/// at a time). Chapter 7's step 6 tile, without the cluster.
inline constexpr TileConfig kTile{128, 256, 2, 1, 4, 1, true, 2};
/// Rows of one W box: a stage loads its 256 W rows as two boxes of 128 (for SwiGLU one box of gate
/// rows and one of up rows).
inline constexpr int kWBoxRows = 128;
/// Band height of the grouped order inside an expert, in m-tiles (Chapter 7's).
inline constexpr int kGroupM = ch07::kGroupM;
static_assert(kTile.block_m == ch05::kBlockM, "the tile prefix counts m-tiles of Chapter 5's 128 rows");
static_assert(kTile.block_n == 2 * kWBoxRows, "two W boxes make the tile's columns");
static_assert(kTile.smem_bytes() <= ch07::kSm90SmemPerBlock, "the tile fits an sm_90 block");

/// n-tiles of C's columns: ceil(N / 256) plain; SwiGLU ceil((N / 2) / 128), as each tile reads 128
/// gate and 128 up rows of W and writes 128 columns.
__host__ __device__ constexpr int grouped_tiles_n(int n, EpilogueKind kind) {
  return kind == EpilogueKind::swiglu ? ch05::ceil_div_int(n / 2, kWBoxRows) : ch05::ceil_div_int(n, kTile.block_n);
}

/// Columns of C one tile writes: 256 plain, 128 SwiGLU.
__host__ __device__ constexpr int output_tile_cols(EpilogueKind kind) {
  return kind == EpilogueKind::swiglu ? kWBoxRows : kTile.block_n;
}

/// The rows of W (as one [E · N, K] matrix) of the two boxes of n-tile @p n_tile of expert
/// @p expert: plain, the tile's 256 columns (rows n0 and n0 + 128 of the expert); SwiGLU, 128 gate
/// rows j0 .. and the matching 128 up rows N / 2 + j0 ... Rows past the expert's N belong to the next
/// expert (or lie past W, read as zeros): they feed only columns that are never stored.
struct WBoxRows {
  int first;   ///< row of the first box (plain: columns n0 ..; SwiGLU: gate)
  int second;  ///< row of the second box (plain: columns n0 + 128 ..; SwiGLU: up)
};

/// The W rows of n-tile @p n_tile of @p expert (see WBoxRows). @p n is W's rows per expert.
__host__ __device__ constexpr WBoxRows w_box_rows(int expert, int n_tile, int n, EpilogueKind kind) {
  const int base = expert * n;  // E · N <= 2^31 - 1 (a rule)
  if (kind == EpilogueKind::swiglu) {
    const int j0 = n_tile * kWBoxRows;
    return {base + j0, base + n / 2 + j0};
  }
  const int n0 = n_tile * kTile.block_n;
  return {base + n0, base + n0 + kWBoxRows};
}

/// What one tile of a launch is: its expert, its rows of A and C, its n-tile.
struct GroupedWork {
  int expert = 0;       ///< the expert owning the tile
  int row0 = 0;         ///< first row of the tile in A and C
  int row_end = 0;      ///< one past the expert's last row: rows >= row_end are not the tile's
  int expert_rows = 0;  ///< rows of the expert (row_end - its first row)
  int n_tile = 0;       ///< n-tile, in [0, tiles_n)
};

/// The work of tile @p tile, in [0, tile_prefix[E] · @p tiles_n): Chapter 5's grouped order inside each
/// expert (bands of kGroupM m-tiles walked column by column), then locate() for the rows.
/// @param tile the tile's id in launch order
/// @param offsets [E + 1] row offsets (clamped into [0, m_total], as Chapter 5 does)
/// @param tile_prefix [E + 1] m-tile prefix over experts
/// @param experts E
/// @param m_total rows of A and C
/// @param tiles_n n-tiles (grouped_tiles_n)
/// @param group_m band height in m-tiles (1: row by row)
__host__ __device__ inline GroupedWork grouped_work(int tile, const std::int32_t* offsets,
                                                    const std::int32_t* tile_prefix, int experts, int m_total,
                                                    int tiles_n, int group_m = kGroupM) {
  const ch05::TileCoord at = ch05::expert_grouped_tile(tile, tile_prefix, experts, tiles_n, group_m);
  // exercise 1: The tile's expert and rows. Chapter 5's locate() turns the global m-tile into its
  // exercise 1: expert and first row; the expert's offsets, clamped as Chapter 5 clamps them
  // exercise 1: (expert_rows), give the end row the store must stop at and the expert's size.
  // stub: (void)offsets;
  // stub: GroupedWork work;
  // stub: work.row0 = at.m_tile * kTile.block_m;
  // stub: work.row_end = m_total;
  // stub: work.expert_rows = m_total;
  // stub: work.n_tile = at.n_tile;
  // stub: return work;
  const ch05::TileRows rows = ch05::locate(offsets, tile_prefix, experts, m_total, kTile.block_m, at.m_tile);
  int begin = 0, end = 0;
  ch05::expert_rows(offsets, rows.expert, m_total, begin, end);
  GroupedWork work;
  work.expert = rows.expert;
  work.row0 = rows.row0;
  work.row_end = end;
  work.expert_rows = end - begin;
  work.n_tile = at.n_tile;
  return work;
  // end exercise 1
}

/// Rows of a tile each consumer warpgroup computes: warpgroup c takes rows row0 + 64 · c ...
inline constexpr int kWarpgroupRows = kTile.block_m / kTile.consumer_warpgroups;
static_assert(kWarpgroupRows == 64, "one wgmma m64 row block per consumer warpgroup");

/// Whether consumer warpgroup @p consumer of @p work's tile has no row of the tile's expert (its 64
/// rows start at or past the expert's end): it then issues no wgmma and stores nothing.
__host__ __device__ constexpr bool warpgroup_idle(const GroupedWork& work, int consumer) {
  return work.row0 + kWarpgroupRows * consumer >= work.row_end;
}

// ------------------------------------------------------------------------------------------------
// Step 3's rank-3 store map. C [M_total, n_out] is described to TMA as a tensor of three dimensions,
// innermost first: columns (n_out), rows (2^30), and an "end row" dimension (2^31 - 1 of them) whose
// stride is also one row, from a base 2^30 rows before C:
//
//     address(col, x, y) = c - 2^30 · row_bytes + y · row_bytes + x · row_bytes + col · 2
//
// A box stored at x = 2^30 - rows_e + (r - begin_e), y = end_e = begin_e + rows_e lands at row r of
// C, and TMA clips every box row whose x reaches 2^30, i.e. every row r >= end_e: the expert's end,
// enforced by the copy engine's own bounds check. The base lies below C (2^64 wraps), and no element
// below C is ever addressed: x + y >= 2^30 for every row written.

/// Rows of the ragged map's middle dimension: a group may have up to this many rows (M_total <= 2^30).
inline constexpr std::int64_t kRaggedRows = std::int64_t{1} << 30;
/// Size of the ragged map's outer dimension: any end row up to 2^31 - 1.
inline constexpr std::int64_t kRaggedEnds = 0x7FFFFFFF;

/// Coordinates (x, y) of the ragged map's dimensions 1 and 2 for row @p row of a group whose rows end
/// at @p group_end and number @p group_rows (so row is in [group_end - group_rows, group_end)).
struct RaggedCoord {
  int x;  ///< 2^30 - group_rows + (row - first row): below 2^30 exactly for the group's rows
  int y;  ///< group_end
};

/// The ragged map's (x, y) for @p row (see RaggedCoord).
__host__ __device__ constexpr RaggedCoord ragged_coord(int row, int group_end, int group_rows) {
  // exercise 2: The boundary tile's store. Place the row so that dimension 1 reaches 2^30
  // exercise 2: (kRaggedRows) exactly at the group's end: x counts from 2^30 - group_rows at the
  // exercise 2: group's first row, and y is the end row (the drawing above).
  // stub: (void)group_rows;
  // stub: return {row, group_end};
  return {static_cast<int>(kRaggedRows - group_rows + (row - (group_end - group_rows))), group_end};
  // end exercise 2
}

/// The row of C that the ragged map's (x, y) addresses: y + x - 2^30 (what TMA computes, in rows).
__host__ __device__ constexpr std::int64_t ragged_row(RaggedCoord at) {
  return static_cast<std::int64_t>(at.y) + at.x - kRaggedRows;
}

}  // namespace kc::ch08
