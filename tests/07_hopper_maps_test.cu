// Chapter 7's CPU tests of the index maps the kernels use: accumulator positions, shared-memory
// descriptors, the staging layout, tile origins, the persistent steps' tile order (Chapter 5's),
// grids, cluster byte counts, the pipeline counters and the Stream-K plan (Chapter 6's, over clusters).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hopper_gemm.hpp"
#include "hopper_gemm_checks.hpp"
#include "hopper_launch.hpp"
#include "hopper_tiles.hpp"
#include "tensor_map.hpp"

namespace {

using namespace kc::test::hopper;  // NOLINT: the chapter's test vocabulary

// ---------------------------------------------------------------- CPU: the maps the kernels use

// Every (row, col) of a 64 × N wgmma tile is held by exactly one (thread, register) pair, the pairs
// (i, i + 1) with even i are adjacent columns (so one bf16x2 store each), and warp w holds rows
// 16w..16w+15 (the PTX ISA's fragment figure).
TEST(HopperFragments, AccumulatorPositionsCoverTheTileOnce) {
  for (int n : {128, 256}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    std::set<std::pair<int, int>> seen;
    for (int thread = 0; thread < 128; ++thread) {
      for (int i = 0; i < n / 2; ++i) {
        const auto at = kc::ch07::accumulator_position(thread, i);
        ASSERT_GE(at.row, 0);
        ASSERT_LT(at.row, 64);
        ASSERT_GE(at.col, 0);
        ASSERT_LT(at.col, n);
        EXPECT_EQ(at.row / 16, thread / 32) << "warp " << thread / 32 << " owns 16 rows";
        EXPECT_TRUE(seen.insert({at.row, at.col}).second) << "(" << at.row << ", " << at.col << ") twice";
        if (i % 2 == 1) {
          const auto left = kc::ch07::accumulator_position(thread, i - 1);
          EXPECT_EQ(left.row, at.row);
          EXPECT_EQ(left.col + 1, at.col);
          EXPECT_EQ(left.col % 2, 0) << "pairs start on even columns: 4-byte aligned when N is even";
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(64 * n));
  }
  // Spot values from the fragment figure: thread 0 holds (0,0), (0,1), (8,0), (8,1), (0,8), ...
  EXPECT_EQ(kc::ch07::accumulator_position(0, 2).row, 8);
  EXPECT_EQ(kc::ch07::accumulator_position(0, 4).col, 8);
  EXPECT_EQ(kc::ch07::accumulator_position(5, 0).row, 1);
  EXPECT_EQ(kc::ch07::accumulator_position(5, 0).col, 2);
}

TEST(HopperFragments, SharedMemoryDescriptorFields) {
  const std::uint32_t address = 0x1C400;  // a 1024-byte-aligned shared-memory address
  const std::uint64_t d = kc::ch07::smem_descriptor_sw128(address);
  EXPECT_EQ(d & 0x3FFF, address >> 4) << "start address >> 4 in bits 0-13";
  EXPECT_EQ((d >> 16) & 0x3FFF, 1u) << "leading byte offset 16 >> 4";
  EXPECT_EQ((d >> 32) & 0x3FFF, 64u) << "stride byte offset 1024 >> 4: the next 8 rows of 128 bytes";
  EXPECT_EQ((d >> 49) & 0x7, 0u) << "base offset 0: tiles are 1024-byte aligned";
  EXPECT_EQ(d >> 62, 1u) << "layout type 1: 128-byte swizzle";
  // The k16 slices of a 64-wide row are 32 bytes apart: +2 in the address field.
  EXPECT_EQ(kc::ch07::smem_descriptor_sw128(address + 32), d + 2);
  // Only the 18 bits of a shared-memory address take part.
  EXPECT_EQ(kc::ch07::smem_descriptor_sw128(address | 0xFFFC0000u), d);
}

// Step 6's staging: c_staging_offset lays a 64 × 256 tile out as four 64 × 64 boxes with 128-byte
// swizzle (each element once, inside the 32 KiB buffer, chunks permuted within their own row), and the
// stmatrix rows each lane addresses are the accumulator layout (register i of lane l of matrix j sits
// where accumulator_position puts acc[8 · step + 2j], acc[8 · step + 2j + 1]), with no bank conflict
// among the 8 rows of one matrix.
TEST(HopperFragments, StagingLayoutIsTheSwizzledBoxAndMatchesTheAccumulators) {
  constexpr int kN = 256;
  std::set<int> offsets;
  for (int row = 0; row < 64; ++row) {
    for (int col = 0; col < kN; ++col) {
      const int at = kc::ch07::c_staging_offset(row, col);
      ASSERT_GE(at, 0);
      ASSERT_LT(at, 64 * kN * 2);
      EXPECT_EQ(at % 2, 0);
      EXPECT_TRUE(offsets.insert(at).second) << "(" << row << ", " << col << ") shares a byte";
      const int box = col / 64;
      EXPECT_EQ(at / kc::ch07::kStoreBoxBytes, box) << "box col / 64";
      EXPECT_EQ(at % kc::ch07::kStoreBoxBytes / 128, row) << "rows of 128 bytes within the box";
      // The swizzle: chunk bits (4-6) XOR row bits (7-9) give the unswizzled chunk back.
      const int in_box = at % kc::ch07::kStoreBoxBytes;
      EXPECT_EQ(((in_box >> 4) & 7) ^ ((in_box >> 7) & 7), (col % 64) / 8);
    }
  }
  EXPECT_EQ(kc::ch07::c_staging_offset(0, 0), 0);
  EXPECT_EQ(kc::ch07::c_staging_offset(1, 0), 128 + 16) << "row 1's first chunk moves to chunk 1";
  EXPECT_EQ(kc::ch07::c_staging_offset(0, 64), 8192) << "the second box";

  for (int warp = 0; warp < 4; ++warp) {
    for (int step = 0; step < kN / 16; ++step) {
      for (int matrix = 0; matrix < 4; ++matrix) {
        std::set<int> chunks;
        for (int row_lane = 0; row_lane < 8; ++row_lane) {
          const auto row = kc::ch07::stmatrix_row(warp, 8 * matrix + row_lane, step);
          EXPECT_EQ(row.col % 8, 0);
          chunks.insert(kc::ch07::c_staging_offset(row.row, row.col) / 16 % 8);
        }
        EXPECT_EQ(chunks.size(), 8u) << "8 rows in 8 different 16-byte chunks: all 32 banks, no conflict";
        // Register `matrix` of thread t holds acc[8·step + 2·matrix] and the next: (row lane/4,
        // column 2·(lane%4)) of the matrix whose rows lanes 8·matrix.. address.
        for (int lane = 0; lane < 32; ++lane) {
          const int thread = 32 * warp + lane;
          const auto want = kc::ch07::stmatrix_row(warp, 8 * matrix + lane / 4, step);
          const auto got = kc::ch07::accumulator_position(thread, 8 * step + 2 * matrix);
          EXPECT_EQ(got.row, want.row) << "warp " << warp << " lane " << lane << " step " << step << " matrix "
                                       << matrix;
          EXPECT_EQ(got.col, want.col + 2 * (lane % 4));
        }
      }
    }
  }
}

TEST(HopperFragments, TileOriginsWalkRows) {
  // 3 tiles per row: blocks 0, 1, 2 share rows 0..127; block 3 starts the next row of tiles.
  EXPECT_EQ(kc::ch07::tile_origin(0, 3, 128, 256).m0, 0);
  EXPECT_EQ(kc::ch07::tile_origin(2, 3, 128, 256).n0, 512);
  EXPECT_EQ(kc::ch07::tile_origin(3, 3, 128, 256).m0, 128);
  EXPECT_EQ(kc::ch07::tile_origin(3, 3, 128, 256).n0, 0);
  EXPECT_EQ(kc::ch07::tile_origin(7, 3, 64, 128).m0, 128);
  EXPECT_EQ(kc::ch07::tile_origin(7, 3, 64, 128).n0, 128);
}

// ---------------------------------------------------------------- CPU: the persistent steps' maps

// The persistent steps walk Chapter 5's grouped order (its tests check the order itself) with their
// own band of 16 m-tiles. At 4096³ with 128 × 256 tiles (32 × 16) the first 132 tiles (one per SM)
// cover 16 m-tiles and 9 n-tiles, not the 9 m-tiles and 16 n-tiles of the row-major order.
TEST(HopperPersistent, GroupedOrderKeepsTheTilesInFlightNearSquare) {
  std::set<int> ms, ns;
  for (int t = 0; t < 132; ++t) {
    const kc::ch07::TileCoord c = kc::ch05::grouped_tile(t, 32, 16, kc::ch07::kGroupM);
    ms.insert(c.m_tile);
    ns.insert(c.n_tile);
  }
  EXPECT_EQ(ms.size(), 16u);
  EXPECT_EQ(ns.size(), 9u);
}

// Step 5: the cluster's CTAs together cover every tile once; the only member tiles past the last
// m-tile are rank 1's in the last cluster row when tiles_m is odd (one per n-tile).
TEST(HopperPersistent, ClusterMembersCoverEveryTileOnce) {
  constexpr int kClusterM = kc::ch07::kStep5Tile.cluster_m;
  for (int tiles_m : {1, 2, 3, 15, 16, 17, 33, 64}) {
    for (int tiles_n : {1, 3, 16, 28}) {
      SCOPED_TRACE(std::to_string(tiles_m) + " x " + std::to_string(tiles_n));
      const std::int64_t cluster_tiles = kc::ch07::cluster_tile_count(tiles_m, tiles_n, kClusterM);
      EXPECT_EQ(cluster_tiles, static_cast<std::int64_t>((tiles_m + 1) / 2) * tiles_n);
      std::vector<int> seen(static_cast<std::size_t>(tiles_m * tiles_n), 0);
      int without_rows = 0;
      for (int ct = 0; ct < cluster_tiles; ++ct) {
        const auto upper = kc::ch07::cluster_member_tile(ct, 0, tiles_m, tiles_n, kc::ch07::kGroupM, kClusterM);
        const auto lower = kc::ch07::cluster_member_tile(ct, 1, tiles_m, tiles_n, kc::ch07::kGroupM, kClusterM);
        EXPECT_EQ(upper.n_tile, lower.n_tile) << "both CTAs need the same W tile: that is what they share";
        EXPECT_EQ(upper.m_tile % 2, 0);
        EXPECT_EQ(lower.m_tile, upper.m_tile + 1);
        ASSERT_LT(upper.m_tile, tiles_m) << "rank 0 always has rows of C";
        ++seen[static_cast<std::size_t>(upper.m_tile * tiles_n + upper.n_tile)];
        if (lower.m_tile < tiles_m) {
          ++seen[static_cast<std::size_t>(lower.m_tile * tiles_n + lower.n_tile)];
        } else {
          ++without_rows;
          EXPECT_EQ(lower.m_tile, tiles_m) << "only the row just past the end";
        }
      }
      for (int count : seen) ASSERT_EQ(count, 1);
      EXPECT_EQ(without_rows, tiles_m % 2 == 1 ? tiles_n : 0);
    }
  }
}

TEST(HopperPersistent, Grids) {
  // Step 4: one block per SM, fewer when there are fewer tiles, never none.
  EXPECT_EQ(kc::ch07::persistent_grid(512, 132), 132);
  EXPECT_EQ(kc::ch07::persistent_grid(128, 132), 128);
  EXPECT_EQ(kc::ch07::persistent_grid(1, 132), 1);
  EXPECT_EQ(kc::ch07::persistent_grid(std::int64_t{1} << 40, 132), 132);
  EXPECT_EQ(kc::ch07::persistent_grid(10, 0), 1) << "a device query of 0 still launches a block";
  // Step 5: whole clusters, at most the resident ones, at most one per cluster tile, never none.
  EXPECT_EQ(kc::ch07::cluster_grid(32, 16, 2, 66), 132) << "4096³: 256 cluster tiles, 66 resident clusters";
  EXPECT_EQ(kc::ch07::cluster_grid(32, 16, 2, 64), 128) << "a GPC with an odd SM left over: fewer clusters";
  EXPECT_EQ(kc::ch07::cluster_grid(1, 1, 2, 66), 2) << "one tile: one cluster, rank 1 without rows";
  EXPECT_EQ(kc::ch07::cluster_grid(3, 5, 2, 66), 20) << "ceil(3 / 2) · 5 = 10 cluster tiles";
  EXPECT_EQ(kc::ch07::cluster_grid(16, 8, 2, 0), 2) << "a query of 0 still launches one cluster";
  for (int tiles_m = 1; tiles_m < 40; ++tiles_m) {
    for (int resident : {1, 7, 66}) {
      const int grid = kc::ch07::cluster_grid(tiles_m, 3, 2, resident);
      EXPECT_EQ(grid % 2, 0) << "a grid is whole clusters";
      EXPECT_GE(grid, 2);
      EXPECT_LE(grid / 2, resident);
      EXPECT_LE(grid / 2, kc::ch07::cluster_tile_count(tiles_m, 3, 2)) << "no cluster without a tile";
    }
  }
}

// Step 5's full barrier: what each CTA expects must equal what lands in it. The bytes that land are
// simulated here sender by sender (its own A box; each rank's W slice, multicast to both), the
// expectation is the kernel's cluster_stage_bytes.
TEST(HopperPersistent, ClusterStageBytesMatchWhatLands) {
  constexpr auto tile = kc::ch07::kStep5Tile;
  // A 128 × 128 cluster tile: W slices of 64 rows.
  constexpr kc::ch07::TileConfig small{128, 128, 2, 1, 6, 2, true, 1};
  EXPECT_EQ(small.w_box_rows(), 64);
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(small, true, 0, 4096), 32768) << "the small tile: A + both 64-row halves";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(small, true, 128, 192), 16384 + 8192) << "its second half starts at row N";
  EXPECT_EQ(tile.w_box_rows(), 128);
  EXPECT_EQ(tile.w_box_bytes(), 16384);
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 0, 4096), 49152) << "an inner tile: A + both W halves";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 0, 8), 32768) << "N = 8: the second W half lies outside W";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, false, 0, 4096), 32768) << "no rows of C: W only, no A";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, false, 512, 520), 16384) << "neither A nor the second half";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 512, 641), 49152) << "one row of the second half is in W";
  EXPECT_EQ(kc::ch07::cluster_stage_bytes(tile, true, 512, 640), 32768) << "the second half starts at row N";
  // The last n-tile of the largest N (2^31 - 1): its second half starts at row 0x7FFFFF80.
  EXPECT_FALSE(kc::ch07::w_slice_in_matrix(tile, 1, 0x7FFFFF00, 0x7FFFFF80));
  EXPECT_TRUE(kc::ch07::w_slice_in_matrix(tile, 1, 0x7FFFFF00, 0x7FFFFFFF));
  for (const kc::ch07::TileConfig& t : {tile, small}) {
    for (int n : {1, 8, 64, 65, 129, 255, 256, 257, 300, 520, 1000}) {
      for (int n_tile = 0; n_tile * t.block_n < n; ++n_tile) {
        const int n0 = n_tile * t.block_n;
        int w_landing = 0;  // sent by each rank whose slice starts inside W, to both CTAs
        for (int rank = 0; rank < t.cluster_m; ++rank) {
          if (n0 + rank * t.w_box_rows() < n) w_landing += t.w_box_rows() * kc::ch07::kBlockK * 2;
        }
        for (bool has_rows : {true, false}) {
          EXPECT_EQ(kc::ch07::cluster_stage_bytes(t, has_rows, n0, n), (has_rows ? t.a_box_bytes() : 0) + w_landing)
              << "block_n " << t.block_n << ", n " << n << ", n0 " << n0 << ", has_rows " << has_rows;
        }
      }
    }
  }
}

// The pipeline counters the persistent kernels carry across tiles: after i slices, stage i mod S,
// parity (i / S) mod 2, and "wrapped" (a stage is being reused) from slice S on.
TEST(HopperPersistent, PipelineStateWrapsAndFlipsPhase) {
  for (int stages : {1, 4, 7}) {
    kc::ch07::PipelineState p;
    for (int i = 0; i < 10 * stages + 3; ++i) {
      ASSERT_EQ(p.stage, i % stages) << "slice " << i;
      ASSERT_EQ(p.phase, static_cast<std::uint32_t>((i / stages) & 1)) << "slice " << i;
      ASSERT_EQ(p.wrapped, i >= stages) << "slice " << i;
      p.advance(stages);
    }
  }
}

// The plan's rule, on the shapes of the benchmark with the H200's 66 clusters: Stream-K where the
// last round is short, whole tiles where it is full, where there is one round or less, or where
// the split would save too little.
TEST(HopperStreamK, PlanRule) {
  using kc::ch07::stream_k_plan;
  const auto expect_plan = [](kc::ch07::StreamKPlan p, int whole, int split) {
    EXPECT_EQ(p.dp_tiles, whole);
    EXPECT_EQ(p.sk_tiles, split);
  };
  expect_plan(stream_k_plan(256, 66, 64), 256, 0);     // 4096³: shares of 57 slices save 7, not split
  expect_plan(stream_k_plan(576, 66, 96), 528, 48);    // 6144³: 48 / 66, split
  expect_plan(stream_k_plan(1024, 66, 128), 990, 34);  // 8192³
  expect_plan(stream_k_plan(896, 66, 32), 896, 0);     // 8192 × 7168 × 2048: shares of 19 of 32 save 13
  expect_plan(stream_k_plan(64, 66, 32), 64, 0);       // 2048³: one round, not even full
  expect_plan(stream_k_plan(132, 66, 64), 132, 0);     // two full rounds
  expect_plan(stream_k_plan(131, 66, 64), 131, 0);     // 65 of 66: too full (and a share would save nothing)
  expect_plan(stream_k_plan(115, 66, 64), 66, 49);     // shares of 48 save 16: split
  expect_plan(stream_k_plan(116, 66, 64), 116, 0);     // shares of 49 save 15: not split
  expect_plan(stream_k_plan(67, 66, 64), 67, 0);       // 64 slices for 66 clusters: shares would be empty
  expect_plan(stream_k_plan(67, 66, 200), 66, 1);      // 200 slices for 66 clusters, none empty
  expect_plan(stream_k_plan(67, 66, 8), 67, 0);        // 8 slices for 66 clusters: shares would be empty
}

// Every split slice lies in exactly one piece; a share has at most two pieces, in decreasing tile
// order, of which at most one is stored as a partial; each split tile has one owner, whose piece is
// the last of its share; and the clusters from Chapter 6's first_contributor up to the owner are
// exactly the ones holding pieces of the tile (the owner reads their partials). Every cluster takes
// part (sk_blocks = clusters) and none has an empty share.
TEST(HopperStreamK, PiecesCoverEverySliceOnceAndOwnersComeLast) {
  for (const int clusters : {1, 2, 7, 60, 66}) {
    for (const std::int64_t tiles : {3, 67, 100, 133, 256, 1000}) {
      for (const int k_tiles : {1, 4, 17, 64, 128}) {
        const kc::ch07::StreamKPlan plan = kc::ch07::stream_k_plan(tiles, clusters, k_tiles);
        SCOPED_TRACE("tiles " + std::to_string(tiles) + ", clusters " + std::to_string(clusters) + ", k_tiles " +
                     std::to_string(k_tiles));
        ASSERT_EQ(plan.dp_tiles + plan.sk_tiles, tiles);
        ASSERT_EQ(plan.grid, clusters);
        ASSERT_EQ(plan.k_tiles, k_tiles);
        if (plan.sk_tiles == 0) continue;
        EXPECT_LT(plan.sk_tiles, clusters);
        EXPECT_EQ(plan.dp_tiles % clusters, 0) << "the whole tiles fill their rounds";
        EXPECT_EQ(plan.sk_blocks, clusters) << "every cluster shares the split tiles";
        std::vector<int> covered(static_cast<std::size_t>(plan.sk_iters), 0);
        std::vector<int> owner(static_cast<std::size_t>(plan.sk_tiles), -1);
        std::vector<std::set<int>> holders(static_cast<std::size_t>(plan.sk_tiles));
        for (int c = 0; c < clusters; ++c) {
          int stored = 0, previous_tile = plan.sk_tiles;
          bool owned_seen = false;
          for (int i = 0; i < 2; ++i) {
            const kc::ch06::WorkUnit piece = kc::ch07::stream_k_piece(plan, c, i);
            if (piece.k_begin == piece.k_end) continue;
            ASSERT_FALSE(owned_seen) << "cluster " << c << ": a piece after the one it owns";
            ASSERT_LT(piece.tile, previous_tile) << "cluster " << c << ": pieces in decreasing tile order";
            previous_tile = piece.tile;
            ASSERT_GE(piece.tile, 0);
            ASSERT_GE(piece.k_begin, 0);
            ASSERT_LE(piece.k_end, k_tiles);
            for (int k = piece.k_begin; k < piece.k_end; ++k) {
              ++covered[static_cast<std::size_t>(piece.tile) * k_tiles + k];
            }
            holders[piece.tile].insert(c);
            if (piece.k_end == k_tiles) {
              ASSERT_EQ(owner[piece.tile], -1) << "tile " << piece.tile << " has two owners";
              owner[piece.tile] = c;
              owned_seen = true;
            } else {
              ++stored;
            }
          }
          EXPECT_LE(stored, 1) << "cluster " << c << " stores more than one partial";
          EXPECT_LT(kc::ch06::sk_begin(plan, c), kc::ch06::sk_begin(plan, c + 1)) << "cluster " << c << ": empty share";
        }
        for (std::size_t slice = 0; slice < covered.size(); ++slice) {
          ASSERT_EQ(covered[slice], 1) << "split slice " << slice;
        }
        for (int t = 0; t < plan.sk_tiles; ++t) {
          ASSERT_GE(owner[t], 0) << "tile " << t << " has no owner";
          EXPECT_EQ(owner[t], kc::ch06::last_contributor(plan, t)) << "tile " << t;
          std::set<int> expected;
          for (int c = kc::ch06::first_contributor(plan, t); c <= owner[t]; ++c) expected.insert(c);
          EXPECT_EQ(holders[t], expected) << "tile " << t;
        }
      }
    }
  }
}

}  // namespace
