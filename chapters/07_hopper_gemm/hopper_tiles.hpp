/// @file hopper_tiles.hpp
/// @brief The tile of each step of Chapter 7's ladder, and the small index maps that the kernels and
/// the CPU tests share: where an accumulator register lands in C, how a shared-memory matrix
/// descriptor is encoded, which tile of C a block computes (and, for the persistent steps, in which
/// order, with which grid, and how many bytes a cluster CTA's stage receives). Everything here is
/// constexpr and `__host__ __device__`, so the CPU tests check exactly what the kernels use.
#pragma once

#include <cuda_runtime.h>  // __host__ __device__ (empty for the host compiler)

#include <cstddef>
#include <cstdint>

#include "schedule.hpp"  // Chapter 6: the Stream-K plan
#include "tile_map.hpp"  // Chapter 5: the grouped tile order

namespace kc::ch07 {

/// Shared memory an sm_90 block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin, 227 KiB).
inline constexpr std::size_t kSm90SmemPerBlock = 232448;
/// 128-byte swizzle repeats every 8 rows of 128 bytes: each tile buffer starts on a 1024-byte boundary,
/// so the swizzle phase TMA writes is the one wgmma reads. Dynamic
/// shared memory is only guaranteed 16-byte aligned, so every kernel asks for this much extra and
/// rounds its base up.
inline constexpr int kSwizzleAtomBytes = 1024;
/// One TMA box row with 128-byte swizzle spans at most 128 bytes: 64 bf16 of K.
inline constexpr int kBlockK = 64;
/// A warpgroup: four consecutive warps that issue one wgmma together.
inline constexpr int kWarpgroupThreads = 128;

/// A tile configuration: block tile, warpgroups and pipeline depth. The kernels read these
/// constants at compile time; hopper_step_info() reports them to the host.
struct TileConfig {
  int block_m;              ///< rows of C per block (64 per consumer warpgroup)
  int block_n;              ///< columns of C per block (the wgmma's N)
  int consumer_warpgroups;  ///< warpgroups that issue wgmma
  int producer_warpgroups;  ///< warpgroups that only issue TMA (0: a consumer thread issues it)
  int stages;               ///< shared-memory buffers in the pipeline
  int cluster_m = 1;        ///< CTAs per thread-block cluster, along M (they share each W tile by multicast)
  bool c_staging = false;   ///< the epilogue stages C in shared memory for TMA stores (step 6)
  int c_staging_parts = 1;  ///< the staging buffer holds 1 / c_staging_parts of the tile at a time

  /// Threads per block.
  __host__ __device__ constexpr int threads() const {
    return (consumer_warpgroups + producer_warpgroups) * kWarpgroupThreads;
  }
  /// Bytes of one A box (block_m rows × 64 bf16).
  __host__ __device__ constexpr int a_box_bytes() const { return block_m * kBlockK * 2; }
  /// Rows of one W box: the whole block_n, or with a cluster the slice one CTA loads and multicasts
  /// (block_n / cluster_m rows; the cluster's CTAs together bring the whole W tile to each of them).
  __host__ __device__ constexpr int w_box_rows() const { return block_n / cluster_m; }
  /// Bytes of one W box (w_box_rows() rows × 64 bf16).
  __host__ __device__ constexpr int w_box_bytes() const { return w_box_rows() * kBlockK * 2; }
  /// Bytes of the whole W tile of a stage (block_n rows × 64 bf16): cluster_m boxes.
  __host__ __device__ constexpr int w_tile_bytes() const { return block_n * kBlockK * 2; }
  /// Bytes one stage receives: what its full barrier expects (out-of-bounds zeros included).
  __host__ __device__ constexpr int stage_bytes() const { return a_box_bytes() + w_tile_bytes(); }
  /// Bytes of the epilogue's C staging buffer: the block tile in bf16 (or the 1 / c_staging_parts of
  /// its columns that is staged at a time) when c_staging, else 0.
  __host__ __device__ constexpr int c_staging_bytes() const {
    return c_staging ? block_m * block_n * 2 / c_staging_parts : 0;
  }
  /// Dynamic shared memory: the alignment slack, the stages, the C staging buffer (step 6), a full and
  /// an empty barrier per stage.
  __host__ __device__ constexpr std::size_t smem_bytes() const {
    return static_cast<std::size_t>(kSwizzleAtomBytes) + static_cast<std::size_t>(stages) * stage_bytes() +
           static_cast<std::size_t>(c_staging_bytes()) + static_cast<std::size_t>(stages) * 2 * sizeof(std::uint64_t);
  }
};

/// Stages of @p stage_bytes that fit next to the slack and barriers in an sm_90 block.
constexpr int stages_that_fit(int stage_bytes) {
  return static_cast<int>((kSm90SmemPerBlock - kSwizzleAtomBytes - 256) / static_cast<std::size_t>(stage_bytes));
}

/// Step 1: one warpgroup, a 64 × 128 tile, one buffer: load, wait, multiply, repeat.
inline constexpr TileConfig kStep1Tile{64, 128, 1, 0, 1};
/// Step 2: two warpgroups on a 128 × 128 tile and as many 32 KiB stages as fit (7); thread 0 also
/// issues the TMA loads.
inline constexpr TileConfig kStep2Tile{128, 128, 2, 0, stages_that_fit(2 * 128 * kBlockK * 2)};
/// Step 3: a producer warpgroup and two consumer warpgroups on a 128 × 256 tile, 4 stages of 48 KiB.
inline constexpr TileConfig kStep3Tile{128, 256, 2, 1, stages_that_fit((128 + 256) * kBlockK * 2)};

/// Step 4: step 3's tile and roles, on a persistent grid (one block per SM looping over tiles).
inline constexpr TileConfig kStep4Tile = kStep3Tile;
/// Step 5: step 4 in clusters of two CTAs along M; each CTA loads half of the W tile (128 rows) and
/// multicasts it to both.
inline constexpr TileConfig kStep5Tile{128, 256, 2, 1, kStep3Tile.stages, 2};
/// Step 6: step 5 with a TMA-store epilogue. It keeps step 5's 4 stages of 48 KiB, so the C staging
/// buffer gets the 32 KiB left: half of the 128 × 256 bf16 tile, stored in two rounds per tile (the
/// second waits until TMA has read the first).
inline constexpr TileConfig kStep6Tile{128, 256, 2, 1, 4, 2, true, 2};
static_assert(kStep2Tile.stages == 7 && kStep3Tile.stages == 4, "the lesson's stage counts");
static_assert(kStep1Tile.smem_bytes() <= kSm90SmemPerBlock && kStep2Tile.smem_bytes() <= kSm90SmemPerBlock &&
                  kStep3Tile.smem_bytes() <= kSm90SmemPerBlock && kStep5Tile.smem_bytes() <= kSm90SmemPerBlock &&
                  kStep6Tile.smem_bytes() <= kSm90SmemPerBlock,
              "every step fits an sm_90 block");
static_assert(TileConfig{128, 256, 2, 1, 4, 2, true}.smem_bytes() > kSm90SmemPerBlock,
              "a whole-tile C staging buffer leaves room for 3 stages only (step 6 stages half a tile)");
static_assert(kStep1Tile.a_box_bytes() % kSwizzleAtomBytes == 0 && kStep1Tile.w_box_bytes() % kSwizzleAtomBytes == 0 &&
                  kStep3Tile.a_box_bytes() % kSwizzleAtomBytes == 0 &&
                  kStep3Tile.w_box_bytes() % kSwizzleAtomBytes == 0 &&
                  kStep5Tile.w_box_bytes() % kSwizzleAtomBytes == 0,
              "boxes keep every buffer 1024-byte aligned (a multicast W slice too: the second lands 16 KiB in)");
static_assert(kStep3Tile.stage_bytes() < (1 << 20), "an mbarrier phase counts at most 2^20 - 1 bytes");
static_assert(kStep5Tile.stage_bytes() == kStep3Tile.stage_bytes() && kStep5Tile.block_n % kStep5Tile.cluster_m == 0,
              "step 5 keeps step 3's stage; its W slices split the tile evenly");

/// Where accumulator register @p i of thread @p thread (0..127 in its warpgroup) sits in the 64 × N
/// tile of a wgmma m64nNk16 with fp32 accumulators (PTX ISA "wgmma register fragment D"): warp w owns
/// rows 16w..16w+15; registers come in pairs of adjacent columns, four pairs per 8-column step.
struct FragmentPosition {
  int row;  ///< 0..63
  int col;  ///< 0..N-1
};

/// The position in the 64 × N tile of accumulator register @p i of warpgroup thread @p thread (see
/// FragmentPosition).
__host__ __device__ constexpr FragmentPosition accumulator_position(int thread, int i) {
  const int warp = thread / 32, lane = thread % 32;
  return {16 * warp + lane / 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)};
}

/// The 64-bit wgmma descriptor of a K-major bf16 tile in shared memory at byte address
/// @p smem_address, stored as TMA writes it with 128-byte swizzle: rows of 128 bytes (64 bf16 of K),
/// 8-row groups 1024 bytes apart. Fields (PTX ISA "matrix descriptor"): start address >> 4 in bits
/// 0-13, leading byte offset >> 4 in 16-29 (unused by swizzled K-major layouts; 16 by convention),
/// stride byte offset >> 4 in 32-45 (1024: the next 8 rows), swizzle mode in 62-63 (1 = 128 bytes).
/// The next k16 slice of the same rows starts 32 bytes further: add 2 to the descriptor.
__host__ __device__ constexpr std::uint64_t smem_descriptor_sw128(std::uint32_t smem_address) {
  constexpr std::uint64_t leading_byte_offset = 16, stride_byte_offset = 1024, swizzle_128b = 1;
  return ((smem_address & 0x3FFFFu) >> 4) | (leading_byte_offset >> 4) << 16 | (stride_byte_offset >> 4) << 32 |
         swizzle_128b << 62;
}

/// The first row and column of C that block @p block computes when tiles of @p block_m × @p block_n
/// are numbered row by row (@p tiles_n per row): consecutive blocks share A's rows in L2.
struct TileOrigin {
  int m0;  ///< first row of C
  int n0;  ///< first column of C
};

/// The tile of C that block @p block computes in steps 1-3, one block per tile (see TileOrigin).
__host__ __device__ constexpr TileOrigin tile_origin(int block, int tiles_n, int block_m, int block_n) {
  return {block / tiles_n * block_m, block % tiles_n * block_n};
}

// ------------------------------------------------------------------------------------------------
// Steps 4 and 5: persistent blocks that walk many tiles, in an order that shares operands in L2.

/// Band height, in m-tiles, of the grouped order. With ~132 blocks in flight and 128 × 256 tiles, a
/// band of 16 m-tiles keeps the tiles in flight near square in elements (16 · 128 rows of A against
/// about 132 / 16 · 256 rows of W), which minimises the distinct A and W bytes they read.
inline constexpr int kGroupM = 16;

/// One tile of C, as (m-tile, n-tile) indices: Chapter 5's.
using ch05::TileCoord;

// The order itself is Chapter 5's grouped order (ch05::grouped_tile): the m-tiles are cut into bands
// of group_m; within a band, ids walk down one column of tiles, then the next column. Blocks that run
// at the same time then share a few rows of A tiles and a few columns of W tiles instead of one row
// of A and every column of W:
//
//        row-major (steps 1-3)      grouped, group_m = 2
//         0  1  2  3                 0  2  4  6
//         4  5  6  7                 1  3  5  7
//         8  9 10 11                 8  9 10 11      (the last band is 1 m-tile high)

/// The tile CTA @p rank of a cluster of @p cluster_m CTAs (stacked along M) computes when its cluster
/// takes cluster tile @p cluster_tile: cluster tiles are cluster_m m-tiles high and walk the grouped
/// order over ceil(tiles_m / cluster_m) rows of them, with bands of group_m m-tiles. When tiles_m is
/// not a multiple of cluster_m, the last cluster row's higher ranks get an m-tile >= tiles_m: a tile
/// with no rows of C. Such a CTA still takes part in the cluster's barrier protocol (its peer
/// multicasts into it and waits for its releases) but loads no A, multiplies nothing, stores nothing.
__host__ __device__ constexpr TileCoord cluster_member_tile(int cluster_tile, int rank, int tiles_m, int tiles_n,
                                                            int group_m, int cluster_m) {
  const int cluster_rows = ch05::ceil_div_int(tiles_m, cluster_m);
  const int cluster_group = group_m / cluster_m > 0 ? group_m / cluster_m : 1;
  const TileCoord c = ch05::grouped_tile(cluster_tile, cluster_rows, tiles_n, cluster_group);
  return {c.m_tile * cluster_m + rank, c.n_tile};
}

/// Cluster tiles of a launch: ceil(tiles_m / cluster_m) · tiles_n.
__host__ __device__ constexpr std::int64_t cluster_tile_count(int tiles_m, int tiles_n, int cluster_m) {
  return static_cast<std::int64_t>(ch05::ceil_div_int(tiles_m, cluster_m)) * tiles_n;
}

/// Blocks of a persistent launch: one per SM (@p sms), or one per tile when there are fewer tiles.
/// Never 0 (a launch of 0 blocks is an error, and the validated shapes have at least one tile).
constexpr int persistent_grid(std::int64_t tiles, int sms) {
  const std::int64_t blocks = tiles < sms ? tiles : sms;
  return blocks > 1 ? static_cast<int>(blocks) : 1;
}

/// Blocks of a persistent cluster launch: @p resident_clusters clusters (what the GPU can hold at
/// once, cudaOccupancyMaxActiveClusters), or one per cluster tile when there are fewer, times
/// @p cluster_m. Always a multiple of cluster_m (a grid must be whole clusters) and at least one
/// cluster, whatever the query said.
constexpr int cluster_grid(int tiles_m, int tiles_n, int cluster_m, int resident_clusters) {
  const std::int64_t cluster_tiles = cluster_tile_count(tiles_m, tiles_n, cluster_m);
  const std::int64_t clusters = cluster_tiles < resident_clusters ? cluster_tiles : resident_clusters;
  return static_cast<int>(clusters > 1 ? clusters : 1) * cluster_m;
}

/// True when W slice @p rank of the tile starting at column @p n0 of C has a row inside W (N = @p n):
/// the slice starts at row n0 + rank · w_box_rows() (in 64 bits, so no n0 a caller passes can overflow).
__host__ __device__ constexpr bool w_slice_in_matrix(TileConfig t, int rank, int n0, int n) {
  return n0 + static_cast<std::int64_t>(rank) * t.w_box_rows() < n;
}

/// Bytes that land in one CTA's stage in a cluster step, what its full barrier must expect: its own
/// A box when its tile has rows of C (@p has_rows), and every W slice with a row inside W (see
/// w_slice_in_matrix). A box that lies wholly outside its matrix is not issued, so it does not count;
/// a CTA then computes from stale shared memory only columns it never stores (and, with no rows of
/// C, computes nothing).
__host__ __device__ constexpr int cluster_stage_bytes(TileConfig t, bool has_rows, int n0, int n) {
  int bytes = has_rows ? t.a_box_bytes() : 0;
  for (int r = 0; r < t.cluster_m; ++r) bytes += w_slice_in_matrix(t, r, n0, n) ? t.w_box_bytes() : 0;
  return bytes;
}

// ------------------------------------------------------------------------------------------------
// Stream-K on the last round: Chapter 6's plan (schedule.hpp), with clusters where Chapter 6 has
// blocks. A persistent grid of C clusters takes T cluster tiles round-robin: ceil(T / C) rounds, and
// when T % C = R is not 0 the last round keeps only R clusters busy. The plan keeps the first T - R
// tiles whole (ch06 dp_tiles) and shares the R last tiles' slices out evenly over every cluster
// (ch06 sk_tiles, sk_blocks = C): each takes ceil(R · k_tiles / C) slices at most instead of a whole
// tile's k_tiles. Each cluster takes its share in decreasing tile order, so a share spans at most two
// tiles: the head of tile j + 1 (stored at once as an fp32 partial) and then the tail of tile j, which
// the cluster owns and finishes after adding the partials of the clusters before it.

/// The split of a persistent cluster launch: Chapter 6's plan, with grid = clusters.
using ch06::StreamKPlan;

/// Slices a split must save on the busiest cluster (against a whole tile) to be worth its partial
/// tiles. Measured on the H200: saving 8 slices (4096³) lost 3 %, 13 slices came out level, 26 (6144³)
/// and 62 (8192³) won. Below this the partial store, the owner's reads and the pipeline restarts cost
/// about what the split saves.
inline constexpr int kStreamKMinSavedSlices = 16;

/// The plan for @p cluster_tiles cluster tiles of @p k_tiles slices on @p clusters clusters:
/// Chapter 6's Stream-K plan over the last round when there are more tiles than clusters, the last
/// round is not full, every cluster's share holds at least one slice (so every cluster from a split
/// tile's first to its owner stored a piece of it), and the busiest share is at least
/// kStreamKMinSavedSlices slices less than a tile; otherwise every tile whole (sk_tiles = 0).
__host__ __device__ constexpr StreamKPlan stream_k_plan(std::int64_t cluster_tiles, int clusters, int k_tiles) {
  const auto tiles = static_cast<int>(cluster_tiles);
  // A tail limit of 0 % splits nothing: every tile whole.
  const StreamKPlan whole = ch06::stream_k_plan(tiles, k_tiles, clusters, 0);
  if (cluster_tiles <= clusters) return whole;
  // A tail limit of 100 % splits any short last round.
  const StreamKPlan split = ch06::stream_k_plan(tiles, k_tiles, clusters, 100);
  if (split.sk_tiles == 0 || split.sk_iters < clusters) return whole;
  const std::int64_t largest_share = (split.sk_iters + clusters - 1) / clusters;
  return k_tiles - largest_share >= kStreamKMinSavedSlices ? split : whole;
}

/// The @p index-th (0 or 1) Stream-K piece of cluster @p cluster (Chapter 6's units after its whole
/// tiles, in decreasing tile order), with its tile counted among the split tiles (0 .. sk_tiles - 1);
/// an empty piece (k_begin = k_end) when the share has fewer. The piece holding a tile's last slice is
/// the owner's.
__host__ __device__ constexpr ch06::WorkUnit stream_k_piece(const StreamKPlan& plan, int cluster, int index) {
  const int whole = ch06::static_tile_count(plan.dp_tiles, plan.grid, cluster);
  if (whole + index >= ch06::units_of_block(plan, cluster)) return {};
  ch06::WorkUnit piece = ch06::unit_of_block(plan, cluster, whole + index);
  piece.tile -= plan.dp_tiles;
  return piece;
}

/// Where a pipeline is: the stage the next slice uses and the parity of that stage's current round.
/// Steps 4 and 5 keep one of these per role for the whole kernel, across tiles: the ring of stages
/// does not restart at a tile boundary, so the producer can fill stages for the next tile while the
/// consumers finish (and store) this one.
struct PipelineState {
  int stage = 0;            ///< 0 .. stages - 1
  std::uint32_t phase = 0;  ///< rounds completed through the ring, mod 2: round r waits for parity r & 1
  bool wrapped = false;     ///< the ring has been gone round once (from then on a stage is reused)

  /// Moves to the next slice: the next stage, flipping the phase when the ring wraps.
  __host__ __device__ constexpr void advance(int stages) {
    if (++stage == stages) {
      stage = 0;
      phase ^= 1u;
      wrapped = true;
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Step 6: the TMA-store epilogue. Each consumer warpgroup writes its 64 × block_n accumulators, as
// bf16, into its half of the C staging buffer with stmatrix; one thread then hands the staged boxes to
// TMA, which writes them to C (clipping at the matrix edges) while the warpgroup goes on to its next
// tile. The staging buffer holds, per consumer, block_n / 64 boxes of 64 rows × 64 columns, each laid
// out exactly as a TMA box with 128-byte swizzle: what the store's tensor map reads.

/// Columns of C in one staged box: 64 bf16 = 128 bytes, the span of the 128-byte swizzle.
inline constexpr int kStoreBoxCols = 64;
/// Rows of C in one staged box: a consumer warpgroup's 64 rows.
inline constexpr int kStoreBoxRows = 64;
/// Bytes of one staged box (8 KiB, a multiple of the 1024-byte swizzle atom).
inline constexpr int kStoreBoxBytes = kStoreBoxCols * kStoreBoxRows * 2;

/// The byte offset of element (@p row, @p col) of a consumer's 64 × N tile in its staging buffer: box
/// col / 64, then row · 128 bytes, then the 16-byte chunk (col % 64) / 8 XOR-ed with row % 8 (the
/// 128-byte swizzle: chunk bits 4-6 of the address XOR row bits 7-9, within 1024-byte-aligned boxes),
/// then 2 bytes per column within the chunk.
__host__ __device__ constexpr int c_staging_offset(int row, int col) {
  const int box = col / kStoreBoxCols, chunk = (col % kStoreBoxCols) / 8;
  return box * kStoreBoxBytes + row * 128 + ((chunk ^ (row % 8)) * 16) + (col % 8) * 2;
}

/// The row of C, and the first of its 8 columns, that lane @p lane of warp @p warp (0..3 in its
/// warpgroup) addresses in its @p step-th stmatrix .x4 (16 columns per step: columns 16 · step ..).
/// An .x4 stores four 8 × 8 matrices; lanes 8i .. 8i + 7 address the rows of matrix i, and register i
/// of every lane holds that lane's two elements of matrix i (row lane / 4, columns 2 · (lane % 4)):
///   matrix 0: rows 16w + 0..7, columns +0..7    registers acc[8·step + 0, 1]
///   matrix 1: rows 16w + 8..15, columns +0..7   registers acc[8·step + 2, 3]
///   matrix 2: rows 16w + 0..7, columns +8..15   registers acc[8·step + 4, 5]
///   matrix 3: rows 16w + 8..15, columns +8..15  registers acc[8·step + 6, 7]
/// which is the wgmma accumulator layout (accumulator_position), tested on the CPU.
__host__ __device__ constexpr FragmentPosition stmatrix_row(int warp, int lane, int step) {
  const int matrix = lane / 8;
  return {16 * warp + lane % 8 + 8 * (matrix & 1), 16 * step + 8 * (matrix >> 1)};
}

}  // namespace kc::ch07
