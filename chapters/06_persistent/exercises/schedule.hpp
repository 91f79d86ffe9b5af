// EXERCISE: schedule.hpp with its key lines replaced by TODOs. Fill them in here.
// Generated from ../schedule.hpp by tools/exercises.py (do not edit the solution's copy).
// Build and test this file in place of the solution:
//   cmake --preset exercises && cmake --build --preset exercises && ctest --preset exercises -L ch06
// Until every TODO is done the chapter's tests fail; the lesson (README.md) explains the solution.

/// @file schedule.hpp
/// @brief Chapter 6's schedulers as pure `__host__ __device__` functions: the wave arithmetic, the
/// static round-robin and dynamic (atomic ticket) persistent schedules, and the Stream-K plan that
/// splits the last waves' tiles along K. The kernels call exactly these functions and the CPU tests
/// check them: every tile done exactly once, every split tile's K slices exactly once and in whole
/// 64-wide slices, for any tile count, grid and K.
///
/// Vocabulary. A *tile* is one 128 × 128 block tile of C (Chapter 5's linear tile ids, in the
/// grouped order). *Slots* are the blocks that can run at once: SMs × blocks per SM. A *wave* is one
/// round of slots; with equal tiles, ceil(tiles / slots) waves run, the last one with
/// tiles − (waves − 1) · slots tiles. A *k-slice* (iteration) is one 64-wide step of the main loop;
/// a tile has k_tiles = ceil(K / 64) of them.
///
/// Stream-K with a data-parallel head ("data-parallel + one Stream-K wave"):
///
///     tiles  0 ...................... dp_tiles-1 | dp_tiles ............. tiles-1
///            whole tiles, block b takes b,      | the last wave's (remainder) tiles, their
///            b + grid, b + 2·grid, ...          | k-slices laid end to end and cut into
///                                               | sk_blocks equal ranges, one per block
///
///     e.g. 192 tiles, 132 blocks, 112 slices per tile (K = 7168): dp_tiles = 132 (one whole
///     wave), sk_tiles = 60, 6720 slices, block b gets slices [b·6720/132, (b+1)·6720/132): 50 or
///     51 slices, so each Stream-K tile is shared by 3 or 4 consecutive blocks.
///     Below one wave (tiles < grid) every tile is a Stream-K tile.
///
/// Why not the paper's "two-tile" hybrid (Stream-K over the last remainder + grid tiles, each block
/// 1–2 tiles' worth)? Measured on the tail_G4 case: it spread all 192 tiles'
/// slices over the blocks, so blocks sharing a W tile read it at k offsets ~50 slices apart, L2 lost
/// the reuse (2.4 × the DRAM reads of Chapter 5's kernel) and it ran no faster than two waves. Here the
/// whole tiles run in lockstep as in Chapter 5, and only the last wave's few tiles are split.
///
/// A tile covered by one block's range is computed whole and stored directly. A tile split among
/// blocks ("contributors", consecutive block ids, lowest id = lowest k) is owned by its last
/// contributor: every other contributor ("partner") stores its part as an fp32 partial and counts
/// itself on the tile's arrival counters; the owner keeps its part in registers, waits for the
/// partners, adds their partials in contributor order and stores. The order of the additions is
/// fixed, so the result is the same bits whatever the arrival order. A block's range is at most one
/// tile long, so it holds at most two split units, and it runs them in decreasing tile order: first
/// its part of the later tile (a partner part: that tile's first slices), then its part of the
/// earlier one (that tile's last slices: the owner part). So a partner part never waits, and an owner
/// waits only for partner parts of lower plan blocks. The kernel claims the tail's ranges in ticket
/// order, so those are ranges taken before its own by blocks already running: no wait can deadlock,
/// even with blocks not all resident.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kc::ch06 {

/// The wave arithmetic of @p tiles equal tiles on @p slots slots.
struct Waves {
  std::int64_t tiles = 0;            ///< tiles of the launch
  std::int64_t slots = 0;            ///< blocks that run at once (SMs × blocks per SM)
  std::int64_t waves = 0;            ///< ceil(tiles / slots)
  std::int64_t full_waves = 0;       ///< floor(tiles / slots)
  std::int64_t last_wave_tiles = 0;  ///< tiles in the last wave (slots when it is full; 0 for no tiles)
  double last_wave_utilisation = 0;  ///< last_wave_tiles / slots
  double efficiency = 0;             ///< tiles / (waves · slots): the best any one-tile-per-slot schedule does
};

/// Waves of @p tiles equal tiles on @p slots slots (@p slots >= 1, @p tiles >= 0).
__host__ __device__ constexpr Waves waves_of(std::int64_t tiles, std::int64_t slots) {
  Waves w;
  w.tiles = tiles;
  w.slots = slots;
  if (tiles <= 0 || slots <= 0) return w;
  w.waves = (tiles + slots - 1) / slots;
  w.full_waves = tiles / slots;
  w.last_wave_tiles = tiles - (w.waves - 1) * slots;
  w.last_wave_utilisation = static_cast<double>(w.last_wave_tiles) / static_cast<double>(slots);
  w.efficiency = static_cast<double>(tiles) / static_cast<double>(w.waves * slots);
  return w;
}

// ------------------------------------------------------------------------------------ persistent

/// Static round-robin: block @p block of @p grid takes tiles block, block + grid, ... This many.
__host__ __device__ constexpr int static_tile_count(int tiles, int grid, int block) {
  return block < tiles ? (tiles - 1 - block) / grid + 1 : 0;
}

/// Static round-robin: the @p i-th tile of block @p block.
__host__ __device__ constexpr int static_tile(int grid, int block, int i) { return block + i * grid; }

/// Dynamic: every block first takes tile blockIdx.x, then claims tickets 0, 1, 2, ... from one
/// atomic counter (zeroed before the launch); ticket t names tile grid + t. A block stops at the
/// first claimed tile >= tiles. Which block gets which tile depends on timing; that each tile is
/// claimed exactly once does not (the counter hands out each ticket once).
__host__ __device__ constexpr int dynamic_tile_of_ticket(int grid, int ticket) { return grid + ticket; }

/// Tickets the dynamic scheduler draws in one launch of @p tiles tiles: one after every tile a
/// block finishes, so exactly @p tiles. The thread that draws the last one sets the counter back to
/// zero, so the next launch finds it zeroed without a kernel or a memset in front.
__host__ __device__ constexpr int dynamic_tickets(int tiles) { return tiles > 0 ? tiles : 0; }

// -------------------------------------------------------------------------------------- Stream-K

/// The Stream-K schedule of one launch: which tiles are whole, which are shared along K.
struct StreamKPlan {
  int tiles = 0;              ///< all tiles
  int k_tiles = 0;            ///< 64-wide k-slices per tile
  int grid = 0;               ///< blocks of the persistent grid
  int dp_tiles = 0;           ///< tiles [0, dp_tiles): whole, round-robin (static_tile)
  int sk_tiles = 0;           ///< tiles [dp_tiles, tiles): their k-slices shared by sk_blocks blocks
  int sk_blocks = 0;          ///< blocks [0, sk_blocks) share the Stream-K slices: min(grid, sk_iters)
  std::int64_t sk_iters = 0;  ///< sk_tiles · k_tiles
};

/// The plan for @p tiles tiles of @p k_tiles slices on @p grid blocks. No Stream-K (all tiles whole)
/// when the tiles fill whole waves, when a tile has a single slice, or when the last wave is
/// already more than @p max_tail_percent % full (the fix-up would cost more than the idle slots).
/// Otherwise the Stream-K region is the last wave's tiles (the remainder), or all tiles when there
/// is less than one wave: whole waves first, then every block shares the remainder's slices.
__host__ __device__ constexpr StreamKPlan stream_k_plan(int tiles, int k_tiles, int grid, int max_tail_percent) {
  StreamKPlan p;
  p.tiles = tiles > 0 ? tiles : 0;
  p.k_tiles = k_tiles;
  p.grid = grid;
  p.dp_tiles = p.tiles;
  if (p.tiles == 0 || grid < 1 || k_tiles < 2) return p;
  // TODO 1: Split the last wave. No Stream-K when the tiles fill whole waves or the last wave is
  // more than max_tail_percent % full; otherwise the remainder tiles (all tiles below
  // one wave) are the Stream-K tiles, their k-slices shared by min(grid, sk_iters) blocks.
  (void)max_tail_percent;
  return p;
}

/// The split-K variant of the same plan (Chapter 6's step 3): the same whole waves and the same
/// remainder tiles, but each remainder tile is cut into s = min(floor(grid / sk_tiles), k_tiles)
/// equal K pieces, one per block, on s · sk_tiles blocks (the rest idle). With that many blocks the
/// even split of plan.sk_iters lands exactly on tile boundaries (block s·t + j gets slices
/// [t·k + floor(j·k / s), t·k + floor((j + 1)·k / s)) with k = k_tiles), so every block has a single
/// unit: one pipeline fill, one partial, s contributors per tile. Stream-K instead uses every block
/// and lets ranges straddle tiles: less idle time, up to two units per block. Which costs less is a
/// measurement (the chapter's benchmark has both). s = 1 (more remainder tiles than half the grid)
/// splits nothing: the remainder runs as whole tiles.
__host__ __device__ constexpr StreamKPlan split_k_tail_plan(int tiles, int k_tiles, int grid, int max_tail_percent) {
  StreamKPlan p = stream_k_plan(tiles, k_tiles, grid, max_tail_percent);
  if (p.sk_tiles == 0) return p;
  int pieces = grid / p.sk_tiles;
  if (pieces > k_tiles) pieces = k_tiles;
  if (pieces < 1) pieces = 1;
  p.sk_blocks = pieces * p.sk_tiles;
  return p;
}

/// First Stream-K slice of block @p block: block · sk_iters / sk_blocks (sk_iters for blocks
/// without a range). Ranges are [sk_begin(b), sk_begin(b + 1)), each at least one slice long.
__host__ __device__ constexpr std::int64_t sk_begin(const StreamKPlan& p, int block) {
  return block >= p.sk_blocks ? p.sk_iters : static_cast<std::int64_t>(block) * p.sk_iters / p.sk_blocks;
}

/// The block whose range holds Stream-K slice @p iter (0 <= iter < sk_iters): the largest b with
/// sk_begin(b) <= iter, i.e. ((iter + 1) · sk_blocks − 1) / sk_iters.
__host__ __device__ constexpr int sk_owner(const StreamKPlan& p, std::int64_t iter) {
  return static_cast<int>(((iter + 1) * p.sk_blocks - 1) / p.sk_iters);
}

/// One piece of work: k-slices [k_begin, k_end) of tile @p tile.
struct WorkUnit {
  int tile = 0;     ///< linear tile id (Chapter 5's order)
  int k_begin = 0;  ///< first 64-wide k-slice
  int k_end = 0;    ///< one past the last
};

/// Units of block @p block: its whole data-parallel tiles, then one unit per tile its Stream-K
/// range touches.
__host__ __device__ constexpr int units_of_block(const StreamKPlan& p, int block) {
  const int dp = static_tile_count(p.dp_tiles, p.grid, block);
  const std::int64_t begin = sk_begin(p, block), end = sk_begin(p, block + 1);
  const int sk = begin < end ? static_cast<int>((end - 1) / p.k_tiles - begin / p.k_tiles + 1) : 0;
  return dp + sk;
}

/// The @p u-th unit of block @p block (0 <= u < units_of_block). The Stream-K units come in
/// decreasing tile order: a range that straddles two tiles first does its part of the later tile
/// (the part holding that tile's first slices: a partner part), then its part of the earlier one
/// (that tile's last slices: the owner part). See the file comment for why.
__host__ __device__ constexpr WorkUnit unit_of_block(const StreamKPlan& p, int block, int u) {
  const int dp = static_tile_count(p.dp_tiles, p.grid, block);
  if (u < dp) return WorkUnit{static_tile(p.grid, block, u), 0, p.k_tiles};
  // TODO 2: The block's Stream-K range is slices [sk_begin(block), sk_begin(block + 1)) of the
  // Stream-K tiles laid end to end (k_tiles each). Unit u - dp is its part of one tile,
  // counted from the range's last tile down; clip the range to that tile's slices.
  return WorkUnit{p.dp_tiles, 0, p.k_tiles};
}

/// True when @p unit is a whole tile (stored directly); false when it is one contributor's part.
__host__ __device__ constexpr bool is_whole(const StreamKPlan& p, const WorkUnit& unit) {
  return unit.k_begin == 0 && unit.k_end == p.k_tiles;
}

/// First (lowest k) contributor of Stream-K tile @p sk_tile (counted from dp_tiles).
__host__ __device__ constexpr int first_contributor(const StreamKPlan& p, int sk_tile) {
  return sk_owner(p, static_cast<std::int64_t>(sk_tile) * p.k_tiles);
}

/// Last (highest k) contributor of Stream-K tile @p sk_tile. Contributors are the consecutive
/// blocks first … last (every Stream-K block's range is non-empty).
__host__ __device__ constexpr int last_contributor(const StreamKPlan& p, int sk_tile) {
  return sk_owner(p, static_cast<std::int64_t>(sk_tile + 1) * p.k_tiles - 1);
}

/// True when block @p block owns the split unit @p unit (it holds the tile's last slices; see the
/// file comment). Only for units that are not whole.
__host__ __device__ constexpr bool owns(const StreamKPlan& p, int block, const WorkUnit& unit) {
  return block == last_contributor(p, unit.tile - p.dp_tiles);
}

/// The partial-tile slot of block @p block: a block stores at most one partial (its partner part),
/// so slot b is block b's.
__host__ __device__ constexpr int partial_slot(int block) { return block; }

/// Partial-tile slots a launch on @p grid blocks may use (one per block).
__host__ __device__ constexpr int partial_slots(int grid) { return grid; }

/// Arrival counters per Stream-K tile: one per warp of the 128 × 128 block tile (8 warps). A
/// partner's warp w counts itself on its tile's counter w once its part of the partial is stored,
/// and the owner's warp w waits on that counter alone (Fp32Partial).
inline constexpr int kArrivalsPerTile = 8;

/// Arrival counters a launch on @p grid blocks may use: kArrivalsPerTile per Stream-K tile
/// (fewer than 2 · grid tiles).
__host__ __device__ constexpr int arrival_counters(int grid) { return 2 * grid * kArrivalsPerTile; }

/// Tickets a claimed tail draws in one launch (the blocks claim the tail's ranges as they finish
/// their whole tiles): one per tail range (ticket r names plan block r's range), plus one per block
/// that finds none left and stops. The thread that draws the last one sets the counter back to zero.
__host__ __device__ constexpr int claimed_tail_tickets(const StreamKPlan& p) { return p.sk_blocks + p.grid; }

/// The largest grid a workspace is laid out for. Its counters (the ticket counter, then the arrival
/// counters) come first in every workspace, always this many words, so that launches of any shape
/// and grid on one workspace use the same words, and no launch ever writes anything else there.
inline constexpr int kMaxPersistentGrid = 4096;

/// Counter words at the start of every workspace: 1 + arrival_counters(kMaxPersistentGrid).
__host__ __device__ constexpr int counter_words() { return 1 + arrival_counters(kMaxPersistentGrid); }

}  // namespace kc::ch06
