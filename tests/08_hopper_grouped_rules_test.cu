// Chapter 8's CPU tests: the tile and index arithmetic the kernels call (n-tiles, W boxes, the work
// of every tile of a launch, the ragged store map's coordinates and addresses), the workspace, the
// rules a launch checks and the order it checks them in. No CUDA call: they run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "grouped_gemm_problems.hpp"  // random_sizes
#include "grouped_launch.hpp"         // WorkspaceLayout
// Angle brackets: the exercise build puts the skeleton's grouped_tiles.hpp first on the include path.
#include <grouped_tiles.hpp>

#include "hopper_grouped_gemm.hpp"
#include "kc/check.hpp"
#include "kc/test_support.hpp"
#include "ragged_map.hpp"
#include "tile_map.hpp"

namespace {

using kc::ch05::GroupedGemmShape;
using kc::ch08::EpilogueKind;
using kc::ch08::GroupedEpilogue;
using kc::ch08::GroupedStep;
using kc::ch08::kTile;
using kc::test::expect_invalid_argument;
using bf16 = __nv_bfloat16;

constexpr auto& kAllSteps = kc::ch08::kGroupedSteps;
constexpr std::int64_t k2to30 = std::int64_t{1} << 30;

// A fake device address: validation and the map arithmetic only look at the number.
template <class T>
T* fake(std::uint64_t address) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address));
}

// ---------------------------------------------------------------- CPU: n-tiles and output columns

TEST(HopperGroupedTiles, NTilesAndOutputColumns) {
  EXPECT_EQ(kTile.block_m, 128);
  EXPECT_EQ(kTile.block_n, 256);
  EXPECT_EQ(kc::ch08::output_tile_cols(EpilogueKind::plain), 256);
  EXPECT_EQ(kc::ch08::output_tile_cols(EpilogueKind::row_scale), 256);
  EXPECT_EQ(kc::ch08::output_tile_cols(EpilogueKind::swiglu), 128) << "128 gate + 128 up rows make 128 columns";
  EXPECT_EQ(kc::ch08::output_columns(1544, EpilogueKind::plain), 1544);
  EXPECT_EQ(kc::ch08::output_columns(1544, EpilogueKind::row_scale), 1544);
  EXPECT_EQ(kc::ch08::output_columns(1544, EpilogueKind::swiglu), 772);
  // Exact values: N not a multiple of any tile, swiglu N / 2 not a multiple of 128.
  EXPECT_EQ(kc::ch08::grouped_tiles_n(1544, EpilogueKind::plain), 7);   // 6 · 256 = 1536 < 1544
  EXPECT_EQ(kc::ch08::grouped_tiles_n(1544, EpilogueKind::swiglu), 7);  // 6 · 128 = 768 < 772
  EXPECT_EQ(kc::ch08::grouped_tiles_n(1552, EpilogueKind::swiglu), 7);  // 776 columns
  EXPECT_EQ(kc::ch08::grouped_tiles_n(4096, EpilogueKind::plain), 16);
  EXPECT_EQ(kc::ch08::grouped_tiles_n(4096, EpilogueKind::swiglu), 16);
  EXPECT_EQ(kc::ch08::grouped_tiles_n(256, EpilogueKind::plain), 1);
  EXPECT_EQ(kc::ch08::grouped_tiles_n(257, EpilogueKind::plain), 2);
  EXPECT_EQ(kc::ch08::grouped_tiles_n(256, EpilogueKind::swiglu), 1);
  EXPECT_EQ(kc::ch08::grouped_tiles_n(258, EpilogueKind::swiglu), 2);  // 129 columns
  EXPECT_EQ(kc::ch08::grouped_tiles_n(1, EpilogueKind::plain), 1);
  EXPECT_EQ(kc::ch08::grouped_tiles_n(2, EpilogueKind::swiglu), 1);
  EXPECT_EQ(kc::ch08::grouped_tiles_n(0x7FFFFFFF, EpilogueKind::plain), 1 << 23) << "no overflow at N = 2^31 - 1";
  EXPECT_EQ(kc::ch08::grouped_tiles_n(0x7FFFFFFE, EpilogueKind::swiglu), 1 << 23);
  // Every N: the tiles cover n_out columns, and the last tile holds at least one of them.
  for (EpilogueKind kind : {EpilogueKind::plain, EpilogueKind::swiglu, EpilogueKind::row_scale}) {
    for (int n = 2; n <= 3000; n += 2) {
      const std::int64_t n_out = kc::ch08::output_columns(n, kind);
      const std::int64_t tiles = kc::ch08::grouped_tiles_n(n, kind), cols = kc::ch08::output_tile_cols(kind);
      ASSERT_GE(tiles * cols, n_out) << "n " << n << " kind " << static_cast<int>(kind);
      ASSERT_LT((tiles - 1) * cols, n_out) << "n " << n << " kind " << static_cast<int>(kind);
    }
  }
}

// Every output column j of every expert reads the right W rows: plain, W row e·N + j from one of the
// two 128-row boxes; SwiGLU, gate row e·N + j from the first box and up row e·N + N/2 + j from the
// second, at the same place in each box.
TEST(HopperGroupedTiles, WBoxRows) {
  EXPECT_EQ(kc::ch08::kWBoxRows, 128);
  struct Case {
    int n, experts;
  };
  for (const Case& cs : {Case{1544, 8}, Case{4096, 4}, Case{256, 3}, Case{1552, 5}, Case{770, 6}, Case{2, 7}}) {
    for (EpilogueKind kind : {EpilogueKind::plain, EpilogueKind::swiglu}) {
      SCOPED_TRACE("n " + std::to_string(cs.n) + (kind == EpilogueKind::swiglu ? " swiglu" : " plain"));
      const int cols = kc::ch08::output_tile_cols(kind);
      const int n_out = static_cast<int>(kc::ch08::output_columns(cs.n, kind));
      const int tiles_n = kc::ch08::grouped_tiles_n(cs.n, kind);
      for (int e = 0; e < cs.experts; ++e) {
        const int base = e * cs.n;
        for (int t = 0; t < tiles_n; ++t) {
          const kc::ch08::WBoxRows rows = kc::ch08::w_box_rows(e, t, cs.n, kind);
          if (kind == EpilogueKind::plain) {
            ASSERT_EQ(rows.first, base + t * 256) << "expert " << e << " tile " << t;
            ASSERT_EQ(rows.second, rows.first + 128) << "the boxes cover columns n0 .. n0 + 255";
          } else {
            ASSERT_EQ(rows.first, base + t * 128) << "gate rows j0 .., expert " << e << " tile " << t;
            ASSERT_EQ(rows.second, base + cs.n / 2 + t * 128) << "up rows N/2 + j0 .., expert " << e;
          }
        }
        for (int j = 0; j < n_out; ++j) {
          const int t = j / cols, local = j % cols;
          const kc::ch08::WBoxRows rows = kc::ch08::w_box_rows(e, t, cs.n, kind);
          if (kind == EpilogueKind::plain) {
            ASSERT_EQ(local < 128 ? rows.first + local : rows.second + local - 128, base + j) << "column " << j;
          } else {
            ASSERT_EQ(rows.first + local, base + j) << "gate of column " << j;
            ASSERT_EQ(rows.second + local, base + cs.n / 2 + j) << "up of column " << j;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- CPU: the work of every tile

// Walks every tile id of a launch over @p sizes (and @p extra_rows of no expert) and checks that the
// tiles give each (row, n-tile) of each expert to exactly one tile, and nothing else.
void expect_launch_covers_every_row_once(const std::vector<std::int32_t>& sizes, int tiles_n, int extra_rows,
                                         int group_m = kc::ch08::kGroupM) {
  const int experts = static_cast<int>(sizes.size());
  const std::vector<std::int32_t> offsets = kc::ch05::offsets_of_sizes(sizes);
  const int rows = offsets.back(), m_total = rows + extra_rows;
  std::vector<std::int32_t> prefix(sizes.size() + 1);
  kc::ch05::tile_prefix_of(offsets.data(), experts, m_total, kTile.block_m, prefix.data());
  int expected_m_tiles = 0;
  for (std::int32_t s : sizes) expected_m_tiles += (s + 127) / 128;
  ASSERT_EQ(prefix[experts], expected_m_tiles);

  std::vector<int> hits(static_cast<std::size_t>(m_total) * tiles_n, 0);
  const int tiles = prefix[experts] * tiles_n;
  for (int tile = 0; tile < tiles; ++tile) {
    const kc::ch08::GroupedWork w =
        kc::ch08::grouped_work(tile, offsets.data(), prefix.data(), experts, m_total, tiles_n, group_m);
    ASSERT_GE(w.expert, 0) << "tile " << tile;
    ASSERT_LT(w.expert, experts) << "tile " << tile;
    const int e = w.expert, begin = offsets[e], end = offsets[e + 1];
    ASSERT_GT(sizes[e], 0) << "tile " << tile << " given to empty expert " << e;
    ASSERT_GE(tile, prefix[e] * tiles_n) << "expert " << e << "'s tiles take consecutive ids";
    ASSERT_LT(tile, prefix[e + 1] * tiles_n) << "expert " << e << "'s tiles take consecutive ids";
    ASSERT_EQ(w.row_end, end) << "tile " << tile;
    ASSERT_EQ(w.expert_rows, sizes[e]) << "tile " << tile;
    ASSERT_GE(w.row0, begin) << "tile " << tile;
    ASSERT_LT(w.row0, end) << "tile " << tile;
    ASSERT_EQ((w.row0 - begin) % 128, 0) << "tile " << tile;
    ASSERT_GE(w.n_tile, 0) << "tile " << tile;
    ASSERT_LT(w.n_tile, tiles_n) << "tile " << tile;
    // The order is Chapter 5's grouped order with the band height asked for (Chapter 7's by default).
    const kc::ch05::TileCoord at = kc::ch05::expert_grouped_tile(tile, prefix.data(), experts, tiles_n, group_m);
    ASSERT_EQ(at.m_tile, prefix[e] + (w.row0 - begin) / 128) << "tile " << tile;
    ASSERT_EQ(at.n_tile, w.n_tile) << "tile " << tile;
    if (group_m == 1) {  // row by row: the n-tile runs fastest
      const int local = tile - prefix[e] * tiles_n;
      ASSERT_EQ(w.n_tile, local % tiles_n) << "tile " << tile;
      ASSERT_EQ((w.row0 - begin) / 128, local / tiles_n) << "tile " << tile;
    }
    // Each row is computed by one consumer warpgroup: one that is not idle has a row of the expert, and
    // an idle one none (the coverage below fails if it skipped a row).
    for (int consumer = 0; consumer < kTile.consumer_warpgroups; ++consumer) {
      const int first = w.row0 + kc::ch08::kWarpgroupRows * consumer;
      if (kc::ch08::warpgroup_idle(w, consumer)) continue;
      ASSERT_LT(first, w.row_end) << "tile " << tile << ": warpgroup " << consumer << " works on no row";
      const int last = std::min(first + kc::ch08::kWarpgroupRows, w.row_end);
      for (int r = first; r < last; ++r) ++hits[static_cast<std::size_t>(r) * tiles_n + w.n_tile];
    }
  }
  for (int r = 0; r < m_total; ++r) {
    for (int t = 0; t < tiles_n; ++t) {
      ASSERT_EQ(hits[static_cast<std::size_t>(r) * tiles_n + t], r < rows ? 1 : 0)
          << "row " << r << " n-tile " << t << (r < rows ? "" : " (a row of no expert)");
    }
  }
}

TEST(HopperGroupedTiles, WorkCoversEveryRowOfEveryExpertOnce) {
  const int tiles_plain = kc::ch08::grouped_tiles_n(1544, EpilogueKind::plain);
  const int tiles_swiglu = kc::ch08::grouped_tiles_n(4100, EpilogueKind::swiglu);  // 17
  const std::vector<std::int32_t> issue = {0, 0, 1, 63, 64, 65, 127, 128, 129, 0, 255, 256, 257, 1, 0};
  std::vector<std::int32_t> hot(16, 0);
  hot[5] = 5000;
  std::vector<std::int32_t> small(1024);
  for (int e = 0; e < 1024; ++e) small[e] = e % 3;
  const std::vector<std::pair<std::string, std::vector<std::int32_t>>> cases = {
      {"issue sizes", issue},
      {"256 experts x 1 row", std::vector<std::int32_t>(256, 1)},
      {"all empty", std::vector<std::int32_t>(8, 0)},
      {"one hot expert", hot},
      {"one expert", {1000}},
      {"1024 experts of 0..2 rows", small},
  };
  for (const auto& [name, sizes] : cases) {
    for (int tiles_n : {1, tiles_plain, tiles_swiglu, 3}) {
      for (int extra : {0, 37}) {
        SCOPED_TRACE(name + ", tiles_n " + std::to_string(tiles_n) + ", extra rows " + std::to_string(extra));
        expect_launch_covers_every_row_once(sizes, tiles_n, extra);
        if (HasFatalFailure()) return;
        expect_launch_covers_every_row_once(sizes, tiles_n, extra, 1);  // the row-major order of the benchmark
        if (HasFatalFailure()) return;
      }
    }
  }
  const std::uint64_t seed = kc::test::test_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    const int experts = std::vector<int>{1, 7, 64, 256}[trial % 4];
    const std::vector<std::int32_t> sizes = kc::test::grouped::random_sizes(rng, experts, 300);
    const int tiles_n = 1 + static_cast<int>(rng() % 9);
    SCOPED_TRACE("random trial " + std::to_string(trial) + ", experts " + std::to_string(experts) + ", seed " +
                 std::to_string(seed));
    expect_launch_covers_every_row_once(sizes, tiles_n, trial % 3 == 0 ? 5 : 0);
    if (HasFatalFailure()) return;
  }
}

// ---------------------------------------------------------------- CPU: the ragged store map

TEST(HopperGroupedRaggedMap, CoordinatesRoundTripAndClipAtTheGroupsEnd) {
  struct Group {
    int end, rows;
  };
  for (const Group& g : {Group{1, 1}, Group{64, 64}, Group{129, 65}, Group{1000, 257},
                         Group{static_cast<int>(k2to30), 300}, Group{static_cast<int>(k2to30), 129}}) {
    SCOPED_TRACE("group end " + std::to_string(g.end) + ", rows " + std::to_string(g.rows));
    const int begin = g.end - g.rows;
    for (int r = begin; r < g.end; ++r) {
      const kc::ch08::RaggedCoord at = kc::ch08::ragged_coord(r, g.end, g.rows);
      ASSERT_EQ(at.y, g.end);
      ASSERT_EQ(at.x, k2to30 - g.rows + (r - begin)) << "row " << r;
      ASSERT_GE(at.x, 0) << "row " << r;
      ASSERT_LT(at.x, k2to30) << "a row of the group is inside the map, row " << r;
      ASSERT_GE(static_cast<std::int64_t>(at.x) + at.y, k2to30) << "never below C, row " << r;
      ASSERT_EQ(kc::ch08::ragged_row(at), r) << "round trip";
    }
    // Each consumer's 64-row box of each tile: exactly the rows before the group's end are inside.
    for (int row0 = begin; row0 < g.end; row0 += 128) {
      for (int start : {row0, row0 + 64}) {
        if (start >= g.end) continue;  // the kernel skips a warpgroup with no row of the expert
        const kc::ch08::RaggedCoord at = kc::ch08::ragged_coord(start, g.end, g.rows);
        int inside = 0;
        for (int i = 0; i < 64; ++i) {
          const std::int64_t x = static_cast<std::int64_t>(at.x) + i;
          if (x < k2to30) {
            ++inside;
            ASSERT_LT(kc::ch08::ragged_row({static_cast<int>(x), at.y}), g.end);
          }
        }
        ASSERT_EQ(inside, std::min(64, g.end - start)) << "box at row " << start;
      }
    }
  }
  // The first and last row of a group of 2^30 rows (M_total = 2^30, the largest allowed).
  constexpr int kMax = static_cast<int>(k2to30);
  EXPECT_EQ(kc::ch08::ragged_coord(0, kMax, kMax).x, 0);
  EXPECT_EQ(kc::ch08::ragged_coord(kMax - 1, kMax, kMax).x, kMax - 1);
  EXPECT_EQ(kc::ch08::ragged_row(kc::ch08::ragged_coord(kMax - 1, kMax, kMax)), kMax - 1);
}

TEST(HopperGroupedRaggedMap, SpecAndAddresses) {
  EXPECT_EQ(kc::ch08::kRaggedRows, k2to30);
  EXPECT_EQ(kc::ch08::kRaggedEnds, 0x7FFFFFFF);
  // A high address, and one so low that the map's base wraps below 0.
  for (std::uint64_t c_address : {std::uint64_t{1} << 40, std::uint64_t{16}}) {
    for (std::int64_t n_out : {8, 64, 776, 7168}) {
      SCOPED_TRACE("c " + std::to_string(c_address) + ", n_out " + std::to_string(n_out));
      const auto* c = fake<const bf16>(c_address);
      const kc::ch08::RaggedMapSpec spec = kc::ch08::ragged_store_map(c, n_out);
      const auto row_bytes = static_cast<std::uint64_t>(n_out) * 2;
      EXPECT_EQ(spec.global_address, c_address - (std::uint64_t{1} << 30) * row_bytes) << "2^30 rows below c";
      EXPECT_EQ(spec.global_dim[0], static_cast<std::uint64_t>(n_out));
      EXPECT_EQ(spec.global_dim[1], std::uint64_t{1} << 30);
      EXPECT_EQ(spec.global_dim[2], std::uint64_t{0x7FFFFFFF});
      EXPECT_EQ(spec.global_stride[0], row_bytes);
      EXPECT_EQ(spec.global_stride[1], row_bytes);
      EXPECT_EQ(spec.box_dim[0], 64u);
      EXPECT_EQ(spec.box_dim[1], 64u);
      EXPECT_EQ(spec.box_dim[2], 1u);
      struct Group {
        int end, rows;
      };
      for (const Group& g : {Group{1, 1}, Group{300, 171}, Group{70000, 65}, Group{static_cast<int>(k2to30), 200}}) {
        for (int r = g.end - g.rows; r < g.end; ++r) {
          const kc::ch08::RaggedCoord at = kc::ch08::ragged_coord(r, g.end, g.rows);
          for (std::int64_t col : {std::int64_t{0}, std::int64_t{1}, n_out - 1}) {
            const std::uint64_t got =
                kc::ch08::ragged_address(spec, static_cast<std::uint64_t>(col), static_cast<std::uint64_t>(at.x),
                                         static_cast<std::uint64_t>(at.y));
            const std::uint64_t want = c_address + static_cast<std::uint64_t>(r * n_out + col) * 2;
            ASSERT_EQ(got, want) << "row " << r << " col " << col << " of group end " << g.end;
          }
        }
      }
    }
  }
}

// The encoder checks TMA's rules itself, before the driver (not available here) is asked.
TEST(HopperGroupedRaggedMap, EncodeRejectsBeforeTheDriver) {
  alignas(16) static bf16 c[64];
  for (std::int64_t n_out : {1, 12, 772, 1540}) {
    EXPECT_THROW(kc::ch08::encode_ragged_store_map(kc::ch08::ragged_store_map(c, n_out)), kc::InvalidArgument)
        << "n_out " << n_out;
  }
  expect_invalid_argument([] { kc::ch08::encode_ragged_store_map(kc::ch08::ragged_store_map(c, 12)); },
                          "a row (24 bytes) must be a multiple of 16 bytes (n_out a multiple of 8)");
  for (int shift : {1, 4}) {
    expect_invalid_argument([shift] { kc::ch08::encode_ragged_store_map(kc::ch08::ragged_store_map(c + shift, 64)); },
                            "c must be 16-byte aligned");
  }
}

// ---------------------------------------------------------------- CPU: the workspace

TEST(HopperGroupedWorkspace, BytesAndLayout) {
  using Layout = kc::ch08::detail::WorkspaceLayout;
  EXPECT_EQ(sizeof(CUtensorMap), 128u);
  const std::pair<int, std::size_t> want[] = {
      {1, 128 + 128}, {31, 128 + 31 * 128}, {32, 256 + 32 * 128}, {256, 1152 + 256 * 128}, {1024, 4224 + 1024 * 128}};
  for (const auto& [experts, bytes] : want) {
    EXPECT_EQ(kc::ch08::grouped_gemm_hopper_workspace_bytes({100, 64, 64, experts}), bytes) << "E " << experts;
  }
  for (int experts = 1; experts <= 1024; ++experts) {
    const std::size_t prefix = Layout::prefix_bytes(experts);
    ASSERT_EQ(prefix % 128, 0u) << "the maps after the prefix stay 128-byte aligned, E " << experts;
    ASSERT_GE(prefix, static_cast<std::size_t>(experts + 1) * 4) << "E " << experts;
    ASSERT_LT(prefix, static_cast<std::size_t>(experts + 1) * 4 + 128) << "E " << experts;
    ASSERT_EQ(Layout::bytes(experts), prefix + 128u * static_cast<std::size_t>(experts)) << "E " << experts;
    ASSERT_EQ(kc::ch08::grouped_gemm_hopper_workspace_bytes({0, 8, 8, experts}), Layout::bytes(experts));
  }
  for (int experts : {0, -3, 1025}) {
    expect_invalid_argument(
        [experts] {
          kc::ch08::grouped_gemm_hopper_workspace_bytes({100, 64, 64, experts});
        },
        "shape.experts (" + std::to_string(experts) + ") must be in [1, 1024]");
  }
}

// ---------------------------------------------------------------- CPU: the rules

// Host storage for the rule tests, each region at a known place (overlaps are decided from sizes).
struct alignas(128) Arena {
  alignas(128) bf16 a[512];
  alignas(128) bf16 w[16384];  // room for one expert of N = 1544
  alignas(128) bf16 c[2048];
  alignas(128) std::int32_t offsets[64];
  alignas(128) unsigned char workspace[4096];
  alignas(128) float scale[64];
};

// A valid plain launch: M_total 4, N 16, K 8, E 2 (A 64 bytes, W 512, C 128, workspace 384).
struct HopperGroupedRules : ::testing::Test {
  Arena m{};
  GroupedGemmShape shape{4, 16, 8, 2};
  GroupedEpilogue epilogue{};
  std::size_t bytes = kc::ch08::grouped_gemm_hopper_workspace_bytes(shape);
  void validate(GroupedStep step = GroupedStep::a_evict_last) const { validate_with(shape, m.c, m.workspace, step); }
  void validate_with_a(const bf16* a) const {
    kc::ch08::validate_grouped_gemm_hopper(shape, a, m.w, m.c, m.offsets, epilogue, m.workspace, bytes);
  }
  void validate_with(const GroupedGemmShape& s, const bf16* c, const void* workspace,
                     GroupedStep step = GroupedStep::a_evict_last) const {
    kc::ch08::validate_grouped_gemm_hopper(s, m.a, m.w, c, m.offsets, epilogue, workspace, bytes, step);
  }
};

TEST_F(HopperGroupedRules, AcceptsAValidLaunch) {
  EXPECT_EQ(bytes, 384u);
  for (GroupedStep step : kAllSteps) EXPECT_NO_THROW(validate(step)) << kc::ch08::to_string(step);
  epilogue = {EpilogueKind::swiglu, nullptr};
  for (GroupedStep step : kAllSteps) EXPECT_NO_THROW(validate(step)) << kc::ch08::to_string(step);
  epilogue = {EpilogueKind::row_scale, m.scale};
  for (GroupedStep step : kAllSteps) EXPECT_NO_THROW(validate(step)) << kc::ch08::to_string(step);
  EXPECT_NO_THROW(kc::ch08::validate_grouped_gemm_hopper({0, 16, 8, 2}, nullptr, m.w, nullptr, m.offsets,
                                                         {EpilogueKind::row_scale, nullptr}, m.workspace, bytes))
      << "M_total = 0: a, c and row_scale may be null";
}

TEST_F(HopperGroupedRules, TheOrderProbeNeedsABandOfAtLeastOneMTile) {
  for (int group_m : {0, -1}) {
    expect_invalid_argument(
        [&] {
          kc::ch08::detail::grouped_gemm_hopper_ordered(GroupedStep::a_evict_last, group_m, shape, m.a, m.w, m.c,
                                                        m.offsets, epilogue, m.workspace, bytes, nullptr);
        },
        "group_m (" + std::to_string(group_m) + ") must be at least 1");
  }
}

TEST_F(HopperGroupedRules, Chapter5RulesStillApply) {
  auto bad = [&](GroupedGemmShape s, const std::string& rule) {
    expect_invalid_argument([&] { validate_with(s, m.c, m.workspace); }, rule);
  };
  bad({4, 16, 12, 2}, "shape.k (12) must be a multiple of 8");
  bad({4, 16, 8, 0}, "shape.experts (0) must be in [1, 1024]");
  bad({4, 16, 8, 1025}, "shape.experts (1025) must be in [1, 1024]");
  bad({-1, 16, 8, 2}, "shape.m_total (-1) must be in [0, 2^31 - 1]");
  bad({4, 0, 8, 2}, "shape.n (0) must be in [1, 2^31 - 1]");
  expect_invalid_argument(
      [&] { kc::ch08::validate_grouped_gemm_hopper(shape, m.a + 1, m.w, m.c, m.offsets, {}, m.workspace, bytes); },
      "a must be 16-byte aligned");
  expect_invalid_argument(
      [&] { kc::ch08::validate_grouped_gemm_hopper(shape, m.a, m.w, m.c, nullptr, {}, m.workspace, bytes); },
      "offsets must not be null");
  expect_invalid_argument([&] { validate_with(shape, m.a + 8, m.workspace); }, "c must not overlap a");
}

TEST(HopperGroupedRulesLimits, MTotalAndExpertsTimesN) {
  // Far-apart fake addresses: the tensors of these shapes are gigabytes.
  const auto call = [](GroupedGemmShape s, GroupedStep step) {
    kc::ch08::validate_grouped_gemm_hopper(s, fake<const bf16>(1ull << 40), fake<const bf16>(2ull << 40),
                                           fake<const bf16>(3ull << 40), fake<const std::int32_t>(4ull << 40), {},
                                           fake<const void>(5ull << 40), 1 << 20, step);
  };
  EXPECT_NO_THROW(call({k2to30, 8, 8, 1}, GroupedStep::a_evict_last)) << "M_total = 2^30 is allowed";
  expect_invalid_argument(
      [&] {
        call({k2to30 + 1, 8, 8, 1}, GroupedStep::a_evict_last);
      },
      "shape.m_total (1073741825) must be at most 2^30");
  expect_invalid_argument(
      [&] {
        call({k2to30 + 1, 8, 8, 1}, GroupedStep::masked_store);
      },
      "shape.m_total (1073741825) must be at most 2^30");
  // A tile's second W box starts up to 128 rows past W's last row, at an int coordinate.
  EXPECT_NO_THROW(call({1, 0x7FFFFF00, 8, 1}, GroupedStep::a_evict_last)) << "E * N = 2^31 - 256";
  expect_invalid_argument(
      [&] {
        call({1, 0x7FFFFF08, 8, 1}, GroupedStep::a_evict_last);
      },
      "shape.experts * shape.n (2147483400) must be at most 2^31 - 256");
  expect_invalid_argument(
      [&] {
        call({1, 0x7FFFFFFF, 8, 1}, GroupedStep::masked_store);
      },
      "shape.experts * shape.n (2147483647) must be at most 2^31 - 256");
  expect_invalid_argument(
      [&] {
        call({1, k2to30, 8, 2}, GroupedStep::a_evict_last);
      },
      "shape.experts * shape.n (2147483648) must be at most 2^31 - 256");
  expect_invalid_argument(
      [&] {
        call({1, 0x10000000, 8, 9}, GroupedStep::masked_store);
      },
      "shape.experts * shape.n (2415919104) must be at most 2^31 - 256");
}

TEST_F(HopperGroupedRules, EpilogueAndStepValues) {
  for (int kind : {-1, 3, 42}) {
    epilogue.kind = static_cast<EpilogueKind>(kind);
    expect_invalid_argument([&] { validate(); }, "epilogue.kind (" + std::to_string(kind) + ") is not an EpilogueKind");
  }
  epilogue = {};
  for (int step : {-1, 5, 7}) {
    expect_invalid_argument([&] { validate(static_cast<GroupedStep>(step)); },
                            "step (" + std::to_string(step) + ") is not a GroupedStep");
  }
  epilogue.kind = EpilogueKind::swiglu;
  shape.n = 15;
  for (GroupedStep step : kAllSteps) {
    expect_invalid_argument([&] { validate(step); }, "shape.n (15) must be a multiple of 2 for swiglu");
  }
}

TEST_F(HopperGroupedRules, TmaStoreNeedsWholeRowsAndAlignedC) {
  // n_out not a multiple of 8: plain N = 12, swiglu N = 12 (6 columns) and N = 1544 (772).
  struct Case {
    EpilogueKind kind;
    std::int64_t n;
    std::string message;
  };
  for (const Case& cs :
       {Case{EpilogueKind::plain, 12, "the columns of C (12, shape.n) must be a multiple of 8"},
        Case{EpilogueKind::row_scale, 20, "the columns of C (20, shape.n) must be a multiple of 8"},
        Case{EpilogueKind::swiglu, 12, "the columns of C (6, shape.n / 2) must be a multiple of 8"},
        Case{EpilogueKind::swiglu, 1544, "the columns of C (772, shape.n / 2) must be a multiple of 8"}}) {
    const GroupedGemmShape s{1, cs.n, 8, 1};
    epilogue = {cs.kind, m.scale};
    for (GroupedStep step : {GroupedStep::device_tensor_maps, GroupedStep::ragged_tensor_map}) {
      expect_invalid_argument([&] { validate_with(s, m.c, m.workspace, step); },
                              cs.message + " for " + kc::ch08::to_string(step) + "'s TMA store");
    }
    EXPECT_NO_THROW(validate_with(s, m.c, m.workspace, GroupedStep::masked_store)) << "step 1 takes any n_out";
  }
  // c only 2-byte (or 8-byte) aligned.
  epilogue = {};
  for (int shift : {1, 4}) {
    for (GroupedStep step : {GroupedStep::device_tensor_maps, GroupedStep::ragged_tensor_map}) {
      expect_invalid_argument([&] { validate_with(shape, m.c + shift, m.workspace, step); },
                              std::string("c must be 16-byte aligned for ") + kc::ch08::to_string(step));
    }
    EXPECT_NO_THROW(validate_with(shape, m.c + shift, m.workspace, GroupedStep::masked_store));
  }
  EXPECT_NO_THROW(validate_with(shape, m.c + 8, m.workspace)) << "16 bytes in is aligned";
  // The default step is step 4, a TMA store, whose rules `after` obeys at every shape.
  expect_invalid_argument([&] { validate_with(shape, m.c + 1, m.workspace); }, "c must be 16-byte aligned");
}

TEST_F(HopperGroupedRules, RowScale) {
  epilogue = {EpilogueKind::row_scale, nullptr};
  expect_invalid_argument([&] { validate(); }, "epilogue.row_scale must not be null for row_scale");
  epilogue.row_scale = reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(m.scale) + 2);
  expect_invalid_argument([&] { validate(); }, "epilogue.row_scale must be 4-byte aligned");
  epilogue.row_scale = reinterpret_cast<const float*>(m.c + 62);  // its first 4 bytes are C's last 4
  expect_invalid_argument([&] { validate(); }, "c must not overlap epilogue.row_scale");
  epilogue.row_scale = reinterpret_cast<const float*>(m.c + 64);  // just past C
  EXPECT_NO_THROW(validate());
  epilogue.row_scale = reinterpret_cast<const float*>(m.c) - 4;  // ends where C begins
  EXPECT_NO_THROW(validate());
  epilogue.row_scale = reinterpret_cast<const float*>(m.workspace);  // the prefix kernel writes there
  expect_invalid_argument([&] { validate(); }, "workspace must not overlap epilogue.row_scale");
  epilogue = {EpilogueKind::plain, reinterpret_cast<const float*>(m.c)};
  EXPECT_NO_THROW(validate()) << "row_scale is ignored by the other epilogues";
}

// A gathered A: x's rows through an index (the gathering kernel's own rules; a.x plays A's part in
// the others).
TEST_F(HopperGroupedRules, GatheredA) {
  const kc::ch08::GatheredA good{m.a, 8, m.offsets};
  EXPECT_NO_THROW(kc::ch08::validate_gathered_a(shape, good, m.c, 16));
  EXPECT_NO_THROW(kc::ch08::validate_gathered_a({0, 16, 8, 2}, {}, nullptr, 16)) << "M_total = 0: nothing to read";
  expect_invalid_argument(
      [&] {
        kc::ch08::validate_gathered_a(shape, {m.a, 0, m.offsets}, m.c, 16);
      },
      "a.x_rows (0) must be in [1, 2^31 - 1]");
  expect_invalid_argument(
      [&] {
        kc::ch08::validate_gathered_a(shape, {m.a, 8, nullptr}, m.c, 16);
      },
      "a.rows must not be null when shape.m_total > 0");
  const auto* odd = reinterpret_cast<const std::int32_t*>(reinterpret_cast<const unsigned char*>(m.offsets) + 2);
  expect_invalid_argument(
      [&] {
        kc::ch08::validate_gathered_a(shape, {m.a, 8, odd}, m.c, 16);
      },
      "a.rows must be 4-byte aligned");
  // x is a.x_rows rows, not M_total: one row (16 bytes) just before C is clear of it, while four rows
  // there would overlap C. The launch passes a.x_rows to Chapter 8's overlap rules.
  const bf16* x_before_c = m.w + (sizeof m.w / sizeof(bf16)) - 8;  // W's last 16 bytes, right before C
  EXPECT_NO_THROW(kc::ch08::validate_grouped_gemm_hopper(shape, x_before_c, m.w, m.c, m.offsets, epilogue, m.workspace,
                                                         bytes, GroupedStep::a_evict_last, 1));
  expect_invalid_argument([&] { validate_with_a(x_before_c); }, "c must not overlap a");
  expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper_gather(shape, {m.c + 8, 8, m.offsets}, m.w, m.c, m.offsets, epilogue, m.workspace,
                                             bytes);
      },
      "c must not overlap a");
  expect_invalid_argument(
      [&] {
        kc::ch08::validate_gathered_a(shape, {m.a, 8, reinterpret_cast<const std::int32_t*>(m.c + 60)}, m.c, 16);
      },
      "c must not overlap a.rows");
  // The launch checks them before any CUDA call, as it does Chapter 8's.
  expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper_gather(shape, {m.a, 8, nullptr}, m.w, m.c, m.offsets, epilogue, m.workspace,
                                             bytes);
      },
      "a.rows must not be null");
}

// SwiGLU's C has N / 2 columns: an operand right after that narrower C does not overlap it.
TEST_F(HopperGroupedRules, SwigluCIsHalfAsWide) {
  epilogue = {EpilogueKind::swiglu, nullptr};
  // C [4, 8] bf16 is 64 bytes: A may start right after it, though a plain C [4, 16] would cover it.
  const bf16* a = m.c + 32;
  EXPECT_NO_THROW(kc::ch08::validate_grouped_gemm_hopper(shape, a, m.w, m.c, m.offsets, epilogue, m.workspace, bytes,
                                                         GroupedStep::masked_store));
  epilogue = {};
  expect_invalid_argument(
      [&] {
        kc::ch08::validate_grouped_gemm_hopper(shape, a, m.w, m.c, m.offsets, epilogue, m.workspace, bytes,
                                               GroupedStep::masked_store);
      },
      "c must not overlap a");
}

TEST_F(HopperGroupedRules, Workspace) {
  expect_invalid_argument([&] { validate_with(shape, m.c, nullptr); }, "workspace must not be null");
  for (int shift : {4, 16, 64}) {
    expect_invalid_argument([&] { validate_with(shape, m.c, m.workspace + shift); },
                            "workspace must be 128-byte aligned");
  }
  bytes = 383;
  expect_invalid_argument([&] { validate(); }, "workspace_bytes (383) must be >= 384");
  bytes = 4096;
  EXPECT_NO_THROW(validate()) << "a larger workspace is fine";
  expect_invalid_argument([&] { validate_with(shape, m.c, m.c); }, "workspace must not overlap c");
  const auto* before_c = reinterpret_cast<const unsigned char*>(m.c) - 128;  // the tail of w's array
  expect_invalid_argument([&] { validate_with(shape, m.c, before_c); }, "workspace must not overlap c");
  expect_invalid_argument([&] { validate_with(shape, m.c, m.a); }, "workspace must not overlap a");
  expect_invalid_argument([&] { validate_with(shape, m.c, m.w); }, "workspace must not overlap w");
  expect_invalid_argument([&] { validate_with(shape, m.c, m.offsets); }, "workspace must not overlap offsets");
  EXPECT_NO_THROW(validate_with(shape, m.c, m.w + 256)) << "W's 512 bytes end there";
}

// ---------------------------------------------------------------- CPU: names and launch order

TEST(HopperGroupedSteps, Names) {
  EXPECT_STREQ(kc::ch08::to_string(GroupedStep::masked_store), "step1_masked_store");
  EXPECT_STREQ(kc::ch08::to_string(GroupedStep::device_tensor_maps), "step2_device_tensor_maps");
  EXPECT_STREQ(kc::ch08::to_string(GroupedStep::ragged_tensor_map), "step3_ragged_tensor_map");
  EXPECT_STREQ(kc::ch08::to_string(GroupedStep::a_evict_last), "step4_a_evict_last");
  EXPECT_STREQ(kc::ch08::to_string(GroupedStep::block_per_tile), "step5_block_per_tile");
  EXPECT_FALSE(kc::ch08::uses_tma_store(GroupedStep::masked_store));
  EXPECT_TRUE(kc::ch08::uses_tma_store(GroupedStep::device_tensor_maps));
  EXPECT_TRUE(kc::ch08::uses_tma_store(GroupedStep::ragged_tensor_map));
  EXPECT_TRUE(kc::ch08::uses_tma_store(GroupedStep::a_evict_last));
  EXPECT_FALSE(kc::ch08::uses_ragged_map(GroupedStep::masked_store));
  EXPECT_FALSE(kc::ch08::uses_ragged_map(GroupedStep::device_tensor_maps));
  EXPECT_TRUE(kc::ch08::uses_ragged_map(GroupedStep::ragged_tensor_map));
  EXPECT_TRUE(kc::ch08::uses_ragged_map(GroupedStep::a_evict_last));
  EXPECT_TRUE(kc::ch08::uses_tma_store(GroupedStep::block_per_tile));
  EXPECT_TRUE(kc::ch08::uses_ragged_map(GroupedStep::block_per_tile));
  EXPECT_EQ(std::size(kc::ch08::kGroupedSteps), 5u);
  for (int step : {-1, 5, 100}) {
    expect_invalid_argument([step] { kc::ch08::to_string(static_cast<GroupedStep>(step)); },
                            "step (" + std::to_string(step) + ") is not a GroupedStep");
  }
}

// after_step: step 5 while the experts average fewer than two m-tiles of 128 rows, step 4 from two on.
TEST(HopperGroupedSteps, AfterPicksTheStepByRowsPerExpert) {
  using kc::ch08::after_step;
  EXPECT_EQ(after_step({0, 4096, 7168, 256}), GroupedStep::block_per_tile) << "no rows";
  EXPECT_EQ(after_step({32768, 4096, 7168, 256}), GroupedStep::block_per_tile) << "128 rows per expert";
  EXPECT_EQ(after_step({36864, 4096, 7168, 257}), GroupedStep::block_per_tile)
      << "DeepSeek-V3 prefill with its shared expert as expert 257";
  EXPECT_EQ(after_step({2 * 128 * 32 - 1, 4096, 7168, 32}), GroupedStep::block_per_tile) << "one row short of two";
  EXPECT_EQ(after_step({2 * 128 * 32, 4096, 7168, 32}), GroupedStep::a_evict_last) << "two m-tiles per expert";
  EXPECT_EQ(after_step({32768, 1536, 2048, 128}), GroupedStep::a_evict_last) << "Qwen3-30B-A3B prefill";
  EXPECT_EQ(after_step({8192, 28672, 4096, 8}), GroupedStep::a_evict_last) << "Mixtral prefill";
  EXPECT_EQ(after_step({std::int64_t{1} << 30, 8, 8, 1024}), GroupedStep::a_evict_last) << "the largest M_total";
  // Both have the same rules, so `after` validates as step 4 whichever it runs.
  EXPECT_EQ(kc::ch08::uses_tma_store(GroupedStep::a_evict_last), kc::ch08::uses_tma_store(GroupedStep::block_per_tile));
  EXPECT_EQ(kc::ch08::uses_ragged_map(GroupedStep::a_evict_last),
            kc::ch08::uses_ragged_map(GroupedStep::block_per_tile));
}

// The launch functions check every rule before any CUDA call: without a GPU a CUDA call would throw
// kc::CudaError or UnsupportedGpu, so kc::InvalidArgument here proves the order.
TEST_F(HopperGroupedRules, LaunchFunctionsRejectBeforeAnyCudaCall) {
  auto* c = m.c;
  auto* workspace = m.workspace;
  for (GroupedStep step : kAllSteps) {
    SCOPED_TRACE(kc::ch08::to_string(step));
    EXPECT_THROW(kc::ch08::grouped_gemm_hopper_step(step, {4, 16, 12, 2}, m.a, m.w, c, m.offsets, {}, workspace, bytes),
                 kc::InvalidArgument);
    expect_invalid_argument(
        [&] { kc::ch08::grouped_gemm_hopper_step(step, shape, m.a, m.w, c, m.offsets, {}, nullptr, bytes); },
        "workspace must not be null");
    expect_invalid_argument(
        [&] {
          kc::ch08::grouped_gemm_hopper_step(step, shape, m.a, m.w, c, m.offsets, {EpilogueKind::row_scale, nullptr},
                                             workspace, bytes);
        },
        "epilogue.row_scale must not be null");
  }
  expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper_step(static_cast<GroupedStep>(9), shape, m.a, m.w, c, m.offsets, {}, workspace,
                                           bytes);
      },
      "step (9) is not a GroupedStep");
  expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper({4, 12, 8, 2}, m.a, m.w, c, m.offsets, {}, workspace, bytes);
      },
      "the columns of C (12, shape.n) must be a multiple of 8");
  expect_invalid_argument(
      [&] { kc::ch08::grouped_gemm_hopper(shape, m.a, m.w, c + 1, m.offsets, {}, workspace, bytes); },
      "c must be 16-byte aligned");
  expect_invalid_argument(
      [&] { kc::ch08::grouped_gemm_hopper(shape, m.a, m.w, c, m.offsets, {}, workspace, bytes - 1); },
      "workspace_bytes (383) must be >= 384");
  // The loop: Chapter 5's host offsets and rules, before any expert's launch.
  const std::vector<std::int32_t> good = {0, 1, 4};
  expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper_loop(shape, m.a, m.w, c, std::vector<std::int32_t>{0, 1});
      },
      "host_offsets must hold experts + 1 (3) values, not 2");
  expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper_loop(shape, m.a, m.w, c, std::vector<std::int32_t>{0, 3, 2});
      },
      "host_offsets[2] (2) must be >= host_offsets[1] (3)");
  expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper_loop({4, 16, 12, 2}, m.a, m.w, c, good);
      },
      "shape.k (12) must be a multiple of 8");
  expect_invalid_argument([&] { kc::ch08::grouped_gemm_hopper_loop(shape, m.a, m.w, m.a, good); },
                          "c must not overlap a");
}

// M_total = 0: every rule holds with null a and c, and nothing is launched, so no CUDA call is made
// (no throw even without a GPU).
TEST_F(HopperGroupedRules, EmptyProblemMakesNoCudaCall) {
  const GroupedGemmShape empty{0, 16, 8, 2};
  EXPECT_NO_THROW(kc::ch08::grouped_gemm_hopper(empty, nullptr, m.w, nullptr, m.offsets, {}, m.workspace, bytes));
  for (GroupedStep step : kAllSteps) {
    for (EpilogueKind kind : {EpilogueKind::plain, EpilogueKind::swiglu, EpilogueKind::row_scale}) {
      EXPECT_NO_THROW(kc::ch08::grouped_gemm_hopper_step(step, empty, nullptr, m.w, nullptr, m.offsets, {kind, nullptr},
                                                         m.workspace, bytes))
          << kc::ch08::to_string(step) << " kind " << static_cast<int>(kind);
    }
  }
  EXPECT_NO_THROW(kc::ch08::grouped_gemm_hopper_loop(empty, nullptr, m.w, nullptr, std::vector<std::int32_t>(3, 0)));
  // Still checked when empty: W, offsets, the workspace.
  expect_invalid_argument(
      [&] { kc::ch08::grouped_gemm_hopper(empty, nullptr, nullptr, nullptr, m.offsets, {}, m.workspace, bytes); },
      "w must not be null");
  expect_invalid_argument(
      [&] { kc::ch08::grouped_gemm_hopper(empty, nullptr, m.w, nullptr, m.offsets, {}, nullptr, bytes); },
      "workspace must not be null");
}

}  // namespace
