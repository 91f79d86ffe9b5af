/// @file tile_map.hpp
/// @brief Chapter 5's index arithmetic, as pure `__host__ __device__` functions: how many m-tiles
/// each expert needs, the prefix over them, which (expert, m-tile, n-tile) a block's linear id
/// names, and the two launch orders (row-major and grouped). The kernels call exactly these
/// functions and the CPU tests check them: every tile exactly once, bijective orders, empty
/// experts skipped, any distribution of group sizes, and the exact visiting order of the drawings
/// below. Later chapters reuse them.
///
/// Vocabulary. Expert e owns rows [offsets[e], offsets[e+1]) of A and C (its "group"). With block
/// tiles of BM rows, expert e needs ceil(M_e / BM) m-tiles; numbered one expert after another they
/// form the global m-tiles 0 … total_m_tiles - 1, where expert e's start at tile_prefix[e]:
///
///     expert       0 (300 rows)   1 (0)   2 (128)   3 (1)
///     m-tiles      0 1 2          -       3         4         (BM = 128; tile_prefix = 0 3 3 4 5)
///
/// A C tile is (global m-tile, n-tile); there are total_m_tiles × tiles_n of them. A launch order
/// maps a block's linear id in [0, total_m_tiles × tiles_n) to one of them; locate() turns the
/// global m-tile into (expert, first row, rows left). In both orders expert e's tiles take the
/// consecutive ids [tile_prefix[e] × tiles_n, tile_prefix[e+1] × tiles_n): the orders differ only in
/// how they walk one expert's tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kc::ch05 {

/// The order in which the one-launch kernel's blocks walk the tiles of C.
enum class TileOrder {
  /// Linear id t → m = t / tiles_n, n = t % tiles_n: n fastest, as Chapter 2 launches. Blocks that
  /// run at the same time share one row of A tiles and read many different W tiles.
  row_major,
  /// Triton's "grouped ordering", expert by expert: ids walk a band of group_m m-tiles of one
  /// expert down one n-column, then the next column. Blocks that run at the same time read group_m
  /// A tiles and about (blocks / group_m) W tiles, each W tile reused by group_m blocks while it is
  /// in L2. A band never holds m-tiles of two experts (expert_grouped_tile says why).
  grouped,
};

/// One tile of C in global m-tile coordinates.
struct TileCoord {
  int m_tile = 0;  ///< global m-tile (over all experts, empty ones need none)
  int n_tile = 0;  ///< n-tile, in [0, tiles_n)
};

/// Where a global m-tile lies: its expert and its rows.
struct TileRows {
  int expert = 0;     ///< the expert owning the tile
  int row0 = 0;       ///< first row of the tile in A and C (a row of the permuted token layout)
  int rows_left = 0;  ///< rows of that expert from row0 on (>= 1; the block uses min(rows_left, BM))
};

/// ceil(x / y) for x >= 0, y >= 1, without overflow for any int x.
__host__ __device__ constexpr int ceil_div_int(int x, int y) { return x / y + (x % y != 0 ? 1 : 0); }

/// m-tiles of an expert with @p rows rows (0 for an empty expert, or for a negative size).
__host__ __device__ constexpr int m_tiles_of(int rows, int block_m) {
  return rows > 0 ? ceil_div_int(rows, block_m) : 0;
}

/// The most global m-tiles any distribution of @p m_total rows over @p experts experts can need:
/// sum over non-empty experts of ceil(M_e / BM) <= (M_total + E'·(BM - 1)) / BM, E' = non-empty
/// experts <= min(E, M_total). The one-launch kernel sizes its grid with this bound (the host never
/// sees the real sizes) and blocks past the real tile count exit at once.
__host__ __device__ constexpr std::int64_t max_m_tiles(std::int64_t m_total, int experts, int block_m) {
  const std::int64_t nonempty = m_total < experts ? m_total : experts;
  return (m_total + nonempty * (block_m - 1)) / block_m;
}

/// Clamps expert @p e's offsets into a valid, non-decreasing range inside [0, m_total]: the row
/// range the kernels use, so that no offsets, however wrong, can make them read or write outside
/// A or C. For valid offsets (0 = offsets[0] <= … <= offsets[E] <= m_total) it is the identity.
/// @param offsets [E + 1] row offsets
/// @param e the expert
/// @param m_total rows of A and C
/// @param[out] begin first row of expert e
/// @param[out] end one past its last row (>= begin)
__host__ __device__ inline void expert_rows(const std::int32_t* offsets, int e, int m_total, int& begin, int& end) {
  int b = offsets[e], f = offsets[e + 1];
  b = b < 0 ? 0 : (b > m_total ? m_total : b);
  f = f < b ? b : (f > m_total ? m_total : f);
  begin = b;
  end = f;
}

/// The exclusive prefix of m-tiles over experts: tile_prefix[0] = 0, tile_prefix[e + 1] =
/// tile_prefix[e] + m_tiles_of(rows of e). What the one-launch path's tiny prefix kernel computes
/// on the device (there with a block-wide scan); the host version for the tests and the reference.
/// @param offsets [E + 1] row offsets
/// @param experts E
/// @param m_total rows of A and C (the offsets are clamped to it, see expert_rows)
/// @param block_m rows per block tile
/// @param[out] tile_prefix [E + 1]
__host__ __device__ inline void tile_prefix_of(const std::int32_t* offsets, int experts, int m_total, int block_m,
                                               std::int32_t* tile_prefix) {
  tile_prefix[0] = 0;
  for (int e = 0; e < experts; ++e) {
    int begin = 0, end = 0;
    expert_rows(offsets, e, m_total, begin, end);
    tile_prefix[e + 1] = tile_prefix[e] + m_tiles_of(end - begin, block_m);
  }
}

/// The expert that owns global m-tile @p m_tile: the last e with tile_prefix[e] <= m_tile <
/// tile_prefix[e + 1], found by binary search (log2(E) steps). Empty experts have tile_prefix[e] ==
/// tile_prefix[e + 1] and are never returned: they own no tile. Requires 0 <= m_tile <
/// tile_prefix[E].
__host__ __device__ inline int expert_of_m_tile(const std::int32_t* tile_prefix, int experts, int m_tile) {
  // exercise 1: Binary search for the last expert e with tile_prefix[e] <= m_tile, keeping the
  // exercise 1: invariant tile_prefix[lo] <= m_tile < tile_prefix[hi] from lo = 0, hi = experts.
  // exercise 1: Empty experts repeat the next expert's prefix value: "last" skips them.
  // stub: (void)tile_prefix;
  // stub: (void)experts;
  // stub: (void)m_tile;
  // stub: return 0;
  // Invariant: tile_prefix[lo] <= m_tile < tile_prefix[hi].
  int lo = 0, hi = experts;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (tile_prefix[mid] <= m_tile) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
  // end exercise 1
}

/// Expert, first row and rows left of global m-tile @p m_tile (0 <= m_tile < tile_prefix[E]).
/// @param offsets [E + 1] row offsets
/// @param tile_prefix [E + 1] from tile_prefix_of (or the device prefix kernel)
/// @param experts E
/// @param m_total rows of A and C
/// @param block_m rows per block tile
/// @param m_tile the global m-tile
__host__ __device__ inline TileRows locate(const std::int32_t* offsets, const std::int32_t* tile_prefix, int experts,
                                           int m_total, int block_m, int m_tile) {
  TileRows r;
  r.expert = expert_of_m_tile(tile_prefix, experts, m_tile);
  int begin = 0, end = 0;
  expert_rows(offsets, r.expert, m_total, begin, end);
  r.row0 = begin + (m_tile - tile_prefix[r.expert]) * block_m;
  r.rows_left = end - r.row0;
  return r;
}

/// Row-major order: n fastest. @p tile in [0, m_tiles × tiles_n).
__host__ __device__ constexpr TileCoord row_major_tile(int tile, int tiles_n) {
  return TileCoord{tile / tiles_n, tile % tiles_n};
}

/// Grouped order. Ids are cut into bands of group_m × tiles_n; inside a band, consecutive ids go
/// down the band's group_m m-tiles first (m fastest), then to the next n-tile. The last band may be
/// narrower (m_tiles % group_m rows) and is walked the same way. A bijection of
/// [0, m_tiles × tiles_n) onto the tiles for any group_m >= 1 (the CPU tests check it).
///
///     m_tiles = 5, tiles_n = 4, group_m = 2:  ids in tile position (row = m-tile, column = n-tile)
///        row-major            grouped
///       0  1  2  3          0  2  4  6
///       4  5  6  7          1  3  5  7
///       8  9 10 11          8 10 12 14
///      12 13 14 15          9 11 13 15
///      16 17 18 19         16 17 18 19     (the last band is 1 m-tile wide)
/// @param tile the id, in [0, m_tiles × tiles_n)
/// @param m_tiles the m-tiles walked (expert_grouped_tile passes one expert's)
/// @param tiles_n n-tiles
/// @param group_m band height in m-tiles, >= 1
__host__ __device__ constexpr TileCoord grouped_tile(int tile, int m_tiles, int tiles_n, int group_m) {
  // exercise 2: Cut the ids into bands of group_m × tiles_n (64-bit: that product can pass 2^31),
  // exercise 2: find the id's band and its place in it, and walk the band's m-tiles first (m
  // exercise 2: fastest), then the n-tiles. The last band holds only the m-tiles that are left.
  // stub: (void)m_tiles;
  // stub: (void)group_m;
  // stub: return TileCoord{tile / tiles_n, tile % tiles_n};
  // 64-bit band size: group_m × tiles_n can exceed int for a large group_m.
  const std::int64_t band_size = static_cast<std::int64_t>(group_m) * tiles_n;
  const int band = static_cast<int>(tile / band_size);
  const int within = static_cast<int>(tile - band * band_size);
  const int first_m = band * group_m;
  const int rows = m_tiles - first_m < group_m ? m_tiles - first_m : group_m;
  return TileCoord{first_m + within % rows, within / rows};
  // end exercise 2
}

/// Grouped order, expert by expert: expert e keeps the ids row-major order gives it, [tile_prefix[e]
/// × tiles_n, tile_prefix[e+1] × tiles_n), and walks its own m-tiles with grouped_tile(), so a band
/// never crosses into the next expert. Why: W belongs to one expert, so a band that held m-tiles
/// of two experts would share no W tile between them, and it would pull one expert's n-tiles apart
/// in time, long enough for the W stream to evict the expert's A rows from L2 in between (the
/// chapter's README, "Bands stop at an expert's last m-tile"). Here an expert with fewer than
/// group_m m-tiles is one band, and one m-tile makes its n-tiles adjacent:
///
///     experts of 1, 3 and 2 m-tiles, tiles_n = 3, group_m = 2:
///        row-major       grouped, over the global m-tiles      grouped, expert by expert
///       0  1  2           0  2  4                               0  1  2
///       3  4  5           1  3  5                               3  5  7
///       6  7  8           6  8 10                               4  6  8
///       9 10 11           7  9 11                               9 10 11      (a 1-m-tile band)
///      12 13 14          12 14 16                              12 14 16
///      15 16 17          13 15 17                              13 15 17
/// @param tile the block's linear id, in [0, tile_prefix[E] × tiles_n)
/// @param tile_prefix [E + 1] from tile_prefix_of (or the device prefix kernel)
/// @param experts E
/// @param tiles_n n-tiles
/// @param group_m band height in m-tiles, >= 1
__host__ __device__ inline TileCoord expert_grouped_tile(int tile, const std::int32_t* tile_prefix, int experts,
                                                         int tiles_n, int group_m) {
  const int expert = expert_of_m_tile(tile_prefix, experts, tile / tiles_n);
  const int first_m = tile_prefix[expert];
  const int local = tile - first_m * tiles_n;  // first_m × tiles_n <= tile: no overflow
  const TileCoord c = grouped_tile(local, tile_prefix[expert + 1] - first_m, tiles_n, group_m);
  return TileCoord{first_m + c.m_tile, c.n_tile};
}

/// The tile that linear id @p tile (in [0, tile_prefix[E] × tiles_n)) names in @p order.
__host__ __device__ inline TileCoord tile_in_order(TileOrder order, int tile, const std::int32_t* tile_prefix,
                                                   int experts, int tiles_n, int group_m) {
  return order == TileOrder::grouped ? expert_grouped_tile(tile, tile_prefix, experts, tiles_n, group_m)
                                     : row_major_tile(tile, tiles_n);
}

}  // namespace kc::ch05
