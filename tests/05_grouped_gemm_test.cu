// Chapter 5 tests: the grouped GEMM's index map and launch orders, the permutation, argument
// rules and the lesson's arithmetic on the CPU; on a GPU, the loop, the one launch in both orders
// and the cuBLAS baselines against fp64 (sampled) and cuBLAS (all elements), the permutation and
// combine kernels against their references, poisoned outputs, graph capture and repeatability.
//
// Tolerance: 1e-2 relative Frobenius (the course's bf16 rule: bf16 operands, fp32 accumulation,
// one rounding per output, about 2^-9 relative). A row given to the wrong expert or a tile computed
// twice with the wrong rows gives errors of order 1; a tile never computed stays poisoned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "grouped_gemm.hpp"
#include "grouped_gemm_problems.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"
#include "tile_map.hpp"
#include "vendor_grouped.hpp"

namespace {

using namespace kc::test::grouped;  // the problems, sizes and checks Chapters 5 and 6 share
using kc::ch05::GroupedGemmOptions;
using kc::ch05::GroupedGemmShape;
using kc::ch05::GroupedTile;
using kc::ch05::TileOrder;
using kc::test::expect_invalid_argument;

// ---------------------------------------------------------------- CPU: tile map

TEST(GroupedTileMap, PrefixMatchesTheDrawing) {
  // tile_map.hpp's drawing: sizes 300, 0, 128, 1 at BM = 128 → tile_prefix 0 3 3 4 5.
  const std::vector<std::int32_t> offsets = kc::ch05::offsets_of_sizes(std::vector<std::int32_t>{300, 0, 128, 1});
  std::vector<std::int32_t> prefix(5);
  kc::ch05::tile_prefix_of(offsets.data(), 4, 429, 128, prefix.data());
  EXPECT_EQ(prefix, (std::vector<std::int32_t>{0, 3, 3, 4, 5}));
  const auto t2 = kc::ch05::locate(offsets.data(), prefix.data(), 4, 429, 128, 2);
  EXPECT_EQ(t2.expert, 0);
  EXPECT_EQ(t2.row0, 256);
  EXPECT_EQ(t2.rows_left, 44);
  const auto t3 = kc::ch05::locate(offsets.data(), prefix.data(), 4, 429, 128, 3);
  EXPECT_EQ(t3.expert, 2) << "the empty expert 1 owns no tile";
  EXPECT_EQ(t3.row0, 300);
  EXPECT_EQ(t3.rows_left, 128);
  const auto t4 = kc::ch05::locate(offsets.data(), prefix.data(), 4, 429, 128, 4);
  EXPECT_EQ(t4.expert, 3);
  EXPECT_EQ(t4.row0, 428);
  EXPECT_EQ(t4.rows_left, 1);
}

TEST(GroupedTileMap, GroupedOrderMatchesTheDrawing) {
  // tile_map.hpp's drawing: m_tiles = 5, tiles_n = 4, group_m = 2.
  const int want[5][4] = {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}, {16, 17, 18, 19}};
  for (int m = 0; m < 5; ++m) {
    for (int n = 0; n < 4; ++n) {
      const auto c = kc::ch05::grouped_tile(want[m][n], 5, 4, 2);
      EXPECT_EQ(c.m_tile, m) << "id " << want[m][n];
      EXPECT_EQ(c.n_tile, n) << "id " << want[m][n];
      const auto r = kc::ch05::row_major_tile(m * 4 + n, 4);
      EXPECT_EQ(r.m_tile, m);
      EXPECT_EQ(r.n_tile, n);
    }
  }
}

// tile_map.hpp's second drawing: experts of 1, 3 and 2 m-tiles, tiles_n = 3, group_m = 2. The
// grouped order walks each expert's m-tiles on their own; over the global m-tiles it would not.
TEST(GroupedTileMap, ExpertGroupedOrderMatchesTheDrawing) {
  const std::vector<std::int32_t> prefix = {0, 1, 4, 6};
  const int by_expert[6][3] = {{0, 1, 2}, {3, 5, 7}, {4, 6, 8}, {9, 10, 11}, {12, 14, 16}, {13, 15, 17}};
  const int over_all[6][3] = {{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}, {12, 14, 16}, {13, 15, 17}};
  for (int m = 0; m < 6; ++m) {
    for (int n = 0; n < 3; ++n) {
      const auto c = kc::ch05::tile_in_order(TileOrder::grouped, by_expert[m][n], prefix.data(), 3, 3, 2);
      EXPECT_EQ(c.m_tile, m) << "id " << by_expert[m][n];
      EXPECT_EQ(c.n_tile, n) << "id " << by_expert[m][n];
      const auto g = kc::ch05::grouped_tile(over_all[m][n], 6, 3, 2);
      EXPECT_EQ(g.m_tile, m) << "id " << over_all[m][n];
      EXPECT_EQ(g.n_tile, n) << "id " << over_all[m][n];
    }
  }
}

// Random m-tile counts per expert (zeros included): their exclusive prefix.
std::vector<std::int32_t> random_tile_prefix(std::mt19937_64& rng, int experts, int most_m_tiles) {
  std::vector<std::int32_t> prefix(static_cast<std::size_t>(experts) + 1, 0);
  for (int e = 0; e < experts; ++e) {
    const int tiles = rng() % 4 == 0 ? 0 : static_cast<int>(rng() % static_cast<std::uint64_t>(most_m_tiles + 1));
    prefix[static_cast<std::size_t>(e) + 1] = prefix[static_cast<std::size_t>(e)] + tiles;
  }
  return prefix;
}

// Both orders are bijections of [0, m_tiles × tiles_n) for every distribution of m-tiles over
// experts and every band height; both give expert e exactly the ids [prefix[e], prefix[e+1]) ×
// tiles_n (so a grouped band never crosses an expert); and with at most one m-tile per expert
// the grouped order is row-major (an expert's n-tiles adjacent).
TEST(GroupedTileMap, OrdersAreBijectiveAndKeepExpertsApart) {
  const std::uint64_t seed = kc::test::test_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    const int experts = 1 + static_cast<int>(rng() % 40);
    const int most_m_tiles = trial % 4 == 0 ? 1 : 1 + static_cast<int>(rng() % 12);
    const std::vector<std::int32_t> prefix = random_tile_prefix(rng, experts, most_m_tiles);
    const int m_tiles = prefix.back();
    if (m_tiles == 0) continue;
    for (int tiles_n : {1, 2, 5, 13, 32}) {
      for (int group_m : {1, 2, 3, 8, 64, 1 << 30}) {
        for (TileOrder order : {TileOrder::row_major, TileOrder::grouped}) {
          std::vector<int> seen(static_cast<std::size_t>(m_tiles * tiles_n), 0);
          for (int t = 0; t < m_tiles * tiles_n; ++t) {
            const auto c = kc::ch05::tile_in_order(order, t, prefix.data(), experts, tiles_n, group_m);
            ASSERT_GE(c.m_tile, 0);
            ASSERT_LT(c.m_tile, m_tiles);
            ASSERT_GE(c.n_tile, 0);
            ASSERT_LT(c.n_tile, tiles_n);
            ++seen[static_cast<std::size_t>(c.m_tile * tiles_n + c.n_tile)];
            ASSERT_EQ(kc::ch05::expert_of_m_tile(prefix.data(), experts, c.m_tile),
                      kc::ch05::expert_of_m_tile(prefix.data(), experts, t / tiles_n))
                << "id " << t << " left its expert's ids; seed " << seed;
            if (most_m_tiles == 1) {
              ASSERT_EQ(c.m_tile, t / tiles_n);
              ASSERT_EQ(c.n_tile, t % tiles_n);
            }
          }
          ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }))
              << "experts " << experts << " tiles_n " << tiles_n << " group_m " << group_m << " seed " << seed;
        }
      }
    }
  }
}

// The whole map, as the kernel runs it: for random group sizes (zeros, ones, skew), every
// (expert, local m-tile, n-tile) of every non-empty expert exactly once, rows inside the expert,
// no tile for an empty expert, and the grid bound never below the real count.
TEST(GroupedTileMap, EveryTileExactlyOnce) {
  const std::uint64_t seed = kc::test::test_seed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    const int experts = 1 + static_cast<int>(rng() % 70);
    const int block_m = trial % 3 == 0 ? 128 : 1 + static_cast<int>(rng() % 9);
    const std::vector<std::int32_t> sizes = random_sizes(rng, experts, 3 * block_m);
    const std::vector<std::int32_t> offsets = kc::ch05::offsets_of_sizes(sizes);
    const int m_total = offsets.back() + static_cast<int>(rng() % 5);  // rows past offsets[E] allowed
    std::vector<std::int32_t> prefix(static_cast<std::size_t>(experts) + 1);
    kc::ch05::tile_prefix_of(offsets.data(), experts, m_total, block_m, prefix.data());
    const int m_tiles = prefix.back();
    ASSERT_LE(m_tiles, kc::ch05::max_m_tiles(m_total, experts, block_m)) << "the grid bound is an upper bound";
    const int tiles_n = 1 + static_cast<int>(rng() % 6);
    const int group_m = 1 + static_cast<int>(rng() % 10);
    for (TileOrder order : {TileOrder::row_major, TileOrder::grouped}) {
      std::map<std::tuple<int, int, int>, int> seen;  // (expert, row0, n) → times
      std::vector<int> rows_covered(static_cast<std::size_t>(m_total), 0);
      for (int t = 0; t < m_tiles * tiles_n; ++t) {
        const auto c = kc::ch05::tile_in_order(order, t, prefix.data(), experts, tiles_n, group_m);
        const auto r = kc::ch05::locate(offsets.data(), prefix.data(), experts, m_total, block_m, c.m_tile);
        ASSERT_GE(r.expert, 0);
        ASSERT_LT(r.expert, experts);
        ASSERT_GT(sizes[r.expert], 0) << "an empty expert got a tile";
        ASSERT_GE(r.row0, offsets[r.expert]);
        ASSERT_LT(r.row0, offsets[r.expert + 1]);
        ASSERT_EQ(r.rows_left, offsets[r.expert + 1] - r.row0);
        ASSERT_EQ((r.row0 - offsets[r.expert]) % block_m, 0);
        ++seen[{r.expert, r.row0, c.n_tile}];
        if (c.n_tile == 0) {
          for (int row = r.row0; row < r.row0 + std::min(block_m, r.rows_left); ++row) ++rows_covered[row];
        }
      }
      for (const auto& [key, times] : seen) ASSERT_EQ(times, 1);
      int expected = 0;
      for (int s : sizes) expected += kc::ch05::m_tiles_of(s, block_m) * tiles_n;
      ASSERT_EQ(static_cast<int>(seen.size()), expected) << "seed " << seed;
      for (int row = 0; row < m_total; ++row) {
        ASSERT_EQ(rows_covered[row], row < offsets.back() ? 1 : 0) << "row " << row;
      }
    }
  }
}

TEST(GroupedTileMap, GridBoundIsTight) {
  EXPECT_EQ(kc::ch05::max_m_tiles(32768, 256, 128), 256 + 254);  // G256×128: 254 m-tiles of surplus
  EXPECT_EQ(kc::ch05::max_m_tiles(32768, 8, 128), 256 + 7);
  EXPECT_EQ(kc::ch05::max_m_tiles(3, 8, 128), 3) << "three rows: at most three non-empty experts";
  EXPECT_EQ(kc::ch05::max_m_tiles(0, 8, 128), 0);
  // The bound is reached: 255 experts of one row and one of the rest.
  std::vector<std::int32_t> sizes(256, 1);
  sizes[0] = 32768 - 255;
  const auto offsets = kc::ch05::offsets_of_sizes(sizes);
  std::vector<std::int32_t> prefix(257);
  kc::ch05::tile_prefix_of(offsets.data(), 256, 32768, 128, prefix.data());
  EXPECT_EQ(prefix.back(), 255 + 255);
  EXPECT_LE(prefix.back(), kc::ch05::max_m_tiles(32768, 256, 128));
}

// Offsets that break the rules are clamped into [0, m_total]: wrong numbers, never a bad address.
TEST(GroupedTileMap, BadOffsetsStayInside) {
  const std::vector<std::int32_t> offsets = {5, -3, 900, 40, 2000};  // offsets[0] != 0, decreasing, too large
  std::vector<std::int32_t> prefix(5);
  kc::ch05::tile_prefix_of(offsets.data(), 4, 100, 16, prefix.data());
  for (int t = 0; t < prefix.back(); ++t) {
    const auto r = kc::ch05::locate(offsets.data(), prefix.data(), 4, 100, 16, t);
    EXPECT_GE(r.row0, 0);
    EXPECT_GE(r.rows_left, 1);
    EXPECT_LE(r.row0 + r.rows_left, 100);
  }
  for (int e = 0; e < 4; ++e) EXPECT_LE(prefix[e], prefix[e + 1]);
}

// ---------------------------------------------------------------- CPU: permutation reference

TEST(GroupedPermuteReference, StableTiesEmptyAndInvalid) {
  // The drawing in permute.cu: T = 3, k = 2.
  const std::vector<std::int32_t> ids = {2, 0, 0, 2, 2, 1};
  const auto r = kc::ch05::permute_reference(ids, 2, 4);
  EXPECT_EQ(r.counts, (std::vector<std::int32_t>{2, 1, 3, 0}));
  EXPECT_EQ(r.offsets, (std::vector<std::int32_t>{0, 2, 3, 6, 6}));
  EXPECT_EQ(r.row_of_pair, (std::vector<std::int32_t>{3, 0, 1, 4, 5, 2}));
  EXPECT_EQ(r.token_of_row, (std::vector<std::int32_t>{0, 1, 2, 0, 1, 2}));
  // All tokens to one expert: the identity order.
  const auto one = kc::ch05::permute_reference(std::vector<std::int32_t>(10, 3), 1, 5);
  EXPECT_EQ(one.offsets, (std::vector<std::int32_t>{0, 0, 0, 0, 10, 10}));
  for (int p = 0; p < 10; ++p) EXPECT_EQ(one.row_of_pair[p], p);
  // Ids outside [0, E) are dropped.
  const auto bad = kc::ch05::permute_reference(std::vector<std::int32_t>{1, -1, 7, 0}, 2, 2);
  EXPECT_EQ(bad.offsets, (std::vector<std::int32_t>{0, 1, 2}));
  EXPECT_EQ(bad.row_of_pair, (std::vector<std::int32_t>{1, -1, -1, 0}));
  expect_invalid_argument([] { kc::ch05::permute_reference(std::vector<std::int32_t>(3, 0), 2, 4); },
                          "must be a multiple of k");
}

TEST(GroupedReference, ElementAndOffsets) {
  // Two experts, K = 2: rows 0-1 use W[0], row 2 uses W[1]; N = 1.
  const std::vector<double> a = {1, 2, 3, 4, 5, 6}, w = {1, 1, 10, -1};
  const std::vector<std::int32_t> offsets = {0, 2, 3};
  EXPECT_EQ(kc::ch05::grouped_gemm_reference_element(a, w, offsets, 1, 2, 0, 0), 3.0);
  EXPECT_EQ(kc::ch05::grouped_gemm_reference_element(a, w, offsets, 1, 2, 2, 0), 44.0);
  const auto c = kc::ch05::grouped_gemm_reference(a, w, offsets, 4, 1, 2);
  EXPECT_TRUE(std::isnan(c[3])) << "a row of no expert";
  EXPECT_EQ(kc::ch05::offsets_of_sizes(std::vector<std::int32_t>{0, 3, 0, 1}),
            (std::vector<std::int32_t>{0, 0, 3, 3, 4}));
  expect_invalid_argument(
      [] {
        kc::ch05::offsets_of_sizes(std::vector<std::int32_t>{1, -2});
      },
      "sizes[1] (-2) must be >= 0");
}

// The benchmark's distributions (tools/pytorch_baselines.py repeats them; its test checks the
// same values).
TEST(GroupedReference, BenchmarkGroupSizes) {
  using kc::ch05::GroupSizes;
  for (GroupSizes kind :
       {GroupSizes::uniform, GroupSizes::zipf, GroupSizes::one_hot, GroupSizes::quarter_empty, GroupSizes::ragged}) {
    for (int experts : {1, 3, 8, 256}) {
      for (std::int32_t rows : {0, 1, 100, 8192}) {
        const auto sizes = kc::ch05::group_sizes(kind, experts, rows);
        ASSERT_EQ(sizes.size(), static_cast<std::size_t>(experts));
        ASSERT_EQ(std::accumulate(sizes.begin(), sizes.end(), 0), rows);
        ASSERT_TRUE(std::all_of(sizes.begin(), sizes.end(), [](std::int32_t s) { return s >= 0; }));
      }
    }
  }
  const auto zipf = kc::ch05::group_sizes(GroupSizes::zipf, 256, 8192);
  EXPECT_EQ(zipf[0], 1338);  // floor(8192 / H_256) + 1 of the remainder, H_256 = 6.1243
  EXPECT_EQ(zipf[1], 669);
  EXPECT_EQ(zipf[255], 5);  // the remainder (129 rows) went to experts 0-128
  const auto hot = kc::ch05::group_sizes(GroupSizes::one_hot, 256, 8192);
  EXPECT_EQ(hot[0], 4096);
  EXPECT_EQ(hot[1], 17);  // 4096 = 255 × 16 + 16: experts 1-16 get 17
  EXPECT_EQ(hot[17], 16);
  const auto holes = kc::ch05::group_sizes(GroupSizes::quarter_empty, 256, 8192);
  EXPECT_EQ(holes[0], 0);
  EXPECT_EQ(holes[4], 0);
  EXPECT_EQ(holes[1], 43);  // 8192 = 192 × 42 + 128: the first 128 non-empty get 43
  EXPECT_EQ(holes[255], 42);
  EXPECT_EQ(std::count(holes.begin(), holes.end(), 0), 64);
  // 128 + d(e), d(e) = (37·e mod 39) - 19: expert 0 gets 109, less one of the surplus taken back one
  // each from expert 0 on; 125 of 256 experts pass 128 rows, as at DeepSeek-V3's prefill.
  const auto ragged = kc::ch05::group_sizes(GroupSizes::ragged, 256, 32768);
  EXPECT_EQ(ragged[0], 108);
  EXPECT_EQ(ragged[1], 145);
  EXPECT_EQ(ragged[255], 145);
  EXPECT_EQ(std::count_if(ragged.begin(), ragged.end(), [](std::int32_t s) { return s > 128; }), 125);
  expect_invalid_argument([] { kc::ch05::group_sizes(GroupSizes::uniform, 0, 10); }, "experts (0) must be in");
  // The benchmark's cases: the labels the committed results and tools/chapters.json read.
  std::vector<std::string> labels;
  for (const kc::ch05::GroupedCase& cs : kc::ch05::benchmark_cases()) {
    labels.push_back(cs.label);
    EXPECT_EQ(std::accumulate(cs.sizes.begin(), cs.sizes.end(), std::int64_t{0}), cs.shape.m_total) << cs.label;
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"G8xM4096_N4096_K7168", "G32xM256_N4096_K7168", "G256xM128_N4096_K7168",
                                              "E256_M8192_zipf_N4096_K7168", "E256_M8192_hot_N4096_K7168",
                                              "E256_M8192_empty25_N4096_K7168", "G8xM4096_N7168_K2048",
                                              "G8xM4096_N28672_K4096"}));
}

// ---------------------------------------------------------------- CPU: arguments

TEST(GroupedArguments, Rules) {
  HostBuffer a, w, c;
  std::int32_t offsets[9] = {};
  const GroupedGemmShape ok{4, 4, 8, 8};
  EXPECT_NO_THROW(kc::ch05::validate_grouped_gemm(ok, a.data, w.data, c.data, offsets));
  auto bad = [&](GroupedGemmShape s, const std::string& rule) {
    expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm(s, a.data, w.data, c.data, offsets); }, rule);
  };
  bad({4, 4, 12, 8}, "shape.k (12) must be a multiple of 8");
  bad({4, 4, 8, 0}, "shape.experts (0) must be in [1, 1024]");
  bad({4, 4, 8, 1025}, "shape.experts (1025) must be in [1, 1024]");
  bad({-1, 4, 8, 8}, "shape.m_total (-1) must be in [0, 2^31 - 1]");
  bad({4, 0, 8, 8}, "shape.n (0) must be in [1, 2^31 - 1]");
  bad({0x7FFFFFFF, 0x7FFFFFFF, 8, 8}, "must be at most 2^31 - 1 blocks");
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm(ok, nullptr, w.data, c.data, offsets); },
                          "a must not be null when shape.m_total > 0");
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm(ok, a.data + 1, w.data, c.data, offsets); },
                          "a must be 16-byte aligned");
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm(ok, a.data, w.data, c.data, nullptr); },
                          "offsets must not be null");
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm(ok, a.data, w.data, a.data + 8, offsets); },
                          "c must not overlap a");
  // Options and workspace.
  std::int32_t workspace[128];
  const std::size_t bytes = kc::ch05::grouped_gemm_workspace_bytes(ok);
  EXPECT_EQ(bytes, 256u);
  EXPECT_NO_THROW(kc::ch05::validate_grouped_gemm_options(ok, c.data, {}, workspace, bytes));
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm_options(ok, c.data, {}, workspace, bytes - 1); },
                          "workspace_bytes (255) must be >= 256");
  expect_invalid_argument(
      [&] {
        kc::ch05::validate_grouped_gemm_options(ok, c.data, {TileOrder::grouped, 0}, workspace, bytes);
      },
      "options.group_m (0) must be >= 1");
  expect_invalid_argument(
      [&] {
        kc::ch05::validate_grouped_gemm_options(ok, c.data, {static_cast<TileOrder>(7), 8}, workspace, bytes);
      },
      "options.order (7) is not a TileOrder");
  expect_invalid_argument(
      [&] {
        kc::ch05::validate_grouped_gemm_options(ok, c.data, {TileOrder::grouped, 8, static_cast<GroupedTile>(5)},
                                                workspace, bytes);
      },
      "options.tile (5) is not a GroupedTile");
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm_options(ok, c.data, {}, nullptr, bytes); },
                          "workspace must not be null");
  // Host offsets of the loop.
  const std::vector<std::int32_t> good = {0, 1, 1, 2, 3, 3, 3, 4, 4};
  EXPECT_NO_THROW(kc::ch05::validate_host_offsets(ok, good));
  expect_invalid_argument([&] { kc::ch05::validate_host_offsets(ok, std::span(good).first(8)); },
                          "host_offsets must hold experts + 1 (9) values, not 8");
  std::vector<std::int32_t> worse = good;
  worse[3] = 0;
  expect_invalid_argument([&] { kc::ch05::validate_host_offsets(ok, worse); },
                          "host_offsets[3] (0) must be >= host_offsets[2] (1)");
  worse = good;
  worse[8] = 5;
  expect_invalid_argument([&] { kc::ch05::validate_host_offsets(ok, worse); },
                          "host_offsets[E] (5) must be <= shape.m_total (4)");
}

// An empty problem (M_total = 0): A and C are empty tensors, whose data pointers may be null. It is
// valid, and grouped_gemm launches nothing (so no CUDA call at all: this runs without a GPU).
TEST(GroupedArguments, EmptyProblemAcceptsNullAAndC) {
  HostBuffer w;
  std::int32_t offsets[9] = {};
  std::int32_t workspace[128];
  const GroupedGemmShape empty{0, 4, 8, 8};
  EXPECT_NO_THROW(kc::ch05::validate_grouped_gemm(empty, nullptr, w.data, nullptr, offsets));
  EXPECT_NO_THROW(kc::ch05::grouped_gemm(empty, nullptr, w.data, nullptr, offsets, workspace, sizeof workspace));
  EXPECT_NO_THROW(kc::ch05::grouped_gemm_loop(empty, nullptr, w.data, nullptr, std::vector<std::int32_t>(9, 0)));
  // W and offsets are never empty (E >= 1, N >= 1, K >= 1): still required.
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm(empty, nullptr, nullptr, nullptr, offsets); },
                          "w must not be null");
  expect_invalid_argument([&] { kc::ch05::validate_grouped_gemm(empty, nullptr, w.data, nullptr, nullptr); },
                          "offsets must not be null");
  expect_invalid_argument(
      [&] {
        kc::ch05::validate_grouped_gemm({1, 4, 8, 8}, w.data, w.data + 256, nullptr, offsets);
      },
      "c must not be null when shape.m_total > 0");
}

// Launch functions validate before any CUDA call: without a GPU they throw InvalidArgument.
TEST(GroupedArguments, LaunchesRejectBeforeAnyCudaCall) {
  HostBuffer a, w, c;
  std::int32_t offsets[9] = {};
  std::int32_t workspace[128];
  expect_invalid_argument(
      [&] {
        kc::ch05::grouped_gemm({4, 4, 12, 8}, a.data, w.data, c.data, offsets, workspace, sizeof workspace);
      },
      "shape.k (12) must be a multiple of 8");
  expect_invalid_argument(
      [&] {
        kc::ch05::grouped_gemm({4, 4, 8, 8}, a.data, w.data, c.data, offsets, workspace, 4);
      },
      "workspace_bytes (4) must be >= 256");
  const std::vector<std::int32_t> host = {0, 1, 1, 2, 3, 3, 3, 4, 9};
  expect_invalid_argument(
      [&] {
        kc::ch05::grouped_gemm_loop({4, 4, 8, 8}, a.data, w.data, c.data, host);
      },
      "host_offsets[E] (9) must be <= shape.m_total (4)");
  std::int32_t ids[8] = {};
  kc::ch05::PermuteOutputs out{offsets, offsets, offsets, offsets, a.data};
  expect_invalid_argument(
      [&] {
        kc::ch05::permute_tokens({4, 2, 8, 12}, ids, w.data, out, workspace, sizeof workspace);
      },
      "shape.hidden (12) must be a multiple of 8");
  expect_invalid_argument(
      [&] {
        kc::ch05::permute_tokens({4, 33, 8, 8}, ids, w.data, out, workspace, sizeof workspace);
      },
      "shape.k (33) must be in [1, 32]");
  expect_invalid_argument(
      [&] {
        kc::ch05::permute_tokens({4, 2, 8, 8}, ids, a.data, out, workspace, sizeof workspace);
      },
      "out.a must not overlap x");
  expect_invalid_argument(
      [&] {
        kc::ch05::permute_tokens({4, 2, 8, 8}, ids, w.data, out, workspace, 8);
      },
      "workspace_bytes (8) must be >= 256");
  // T = 0: the per-token arrays are empty and may be null; counts and offsets are still written.
  const kc::ch05::PermuteOutputs empty_out{offsets, offsets, nullptr, nullptr, nullptr};
  EXPECT_NO_THROW(kc::ch05::validate_permute({0, 2, 8, 8}, nullptr, nullptr, empty_out));
  expect_invalid_argument(
      [&] {
        kc::ch05::validate_permute({1, 2, 8, 8}, nullptr, w.data, out);
      },
      "ids must not be null when shape.tokens > 0");
  // Without a, the index maps only: x is not read and may be null; with a, it may not.
  const kc::ch05::PermuteOutputs maps_only{offsets, offsets, offsets, offsets, nullptr};
  EXPECT_NO_THROW(kc::ch05::validate_permute({1, 2, 8, 8}, ids, nullptr, maps_only));
  expect_invalid_argument(
      [&] {
        kc::ch05::validate_permute({1, 2, 8, 8}, ids, nullptr, out);
      },
      "x must not be null when out.a is not");
  expect_invalid_argument(
      [&] {
        kc::ch05::validate_permute({0, 2, 8, 8}, nullptr, nullptr, {nullptr, offsets, nullptr, nullptr, nullptr});
      },
      "out.counts must not be null");
  expect_invalid_argument([&] { kc::ch05::unpermute_combine(4, 2, 8, c.data, nullptr, offsets, a.data); },
                          "weights must not be null");
}

// ---------------------------------------------------------------- CPU: the lesson's arithmetic

TEST(GroupedPrediction, CountsAndBounds) {
  const GroupedGemmShape g256{32768, 4096, 7168, 256};
  std::vector<std::int32_t> uniform(256, 128);
  const auto offsets = kc::ch05::offsets_of_sizes(uniform);
  EXPECT_DOUBLE_EQ(kc::ch05::grouped_gemm_flops(g256, offsets), 2.0 * 32768 * 4096 * 7168);
  EXPECT_DOUBLE_EQ(kc::ch05::grouped_gemm_min_bytes(g256, offsets),
                   2.0 * (32768.0 * 7168 + 256.0 * 4096 * 7168 + 32768.0 * 4096));
  // 25 % empty experts: their weights are not counted.
  std::vector<std::int32_t> holes(256, 0);
  for (int e = 0; e < 256; ++e) holes[e] = e % 4 == 0 ? 0 : 43;
  EXPECT_DOUBLE_EQ(kc::ch05::grouped_gemm_min_bytes(g256, kc::ch05::offsets_of_sizes(holes)),
                   2.0 * (8256.0 * 7168 + 192.0 * 4096 * 7168 + 8256.0 * 4096));
  EXPECT_EQ(kc::ch05::grouped_gemm_grid_blocks(g256), (256 + 254) * 32);
  EXPECT_EQ(kc::ch05::grouped_gemm_grid_blocks(g256, GroupedTile::wide_128x256), (256 + 254) * 16);
  EXPECT_EQ(kc::ch05::grouped_gemm_grid_blocks({1, 257, 8, 1}, GroupedTile::wide_128x256), 2);
  EXPECT_DOUBLE_EQ(kc::ch05::reread_bytes_bound(128.0 * 1000, 128), 1000.0);

  // Mixtral up, 8 × 4096 rows on 132 SMs, one block each: row-major re-reads each expert's W once
  // per m-tile (32×), grouped once per band of 8 (4×): ≥ 4× fewer DRAM bytes (the goal).
  const GroupedGemmShape mixtral{32768, 28672, 4096, 8};
  const double row = kc::ch05::predicted_dram_bytes(mixtral, 4096, TileOrder::row_major, 8, 132);
  const double grp = kc::ch05::predicted_dram_bytes(mixtral, 4096, TileOrder::grouped, 8, 132);
  const double w_expert = 2.0 * 28672 * 4096;  // 235 MB
  EXPECT_DOUBLE_EQ(row, 2.0 * 32768 * 4096 + 8 * 32 * w_expert + 2.0 * 32768 * 28672);
  EXPECT_DOUBLE_EQ(grp, 2.0 * 32768 * 4096 + 8 * 4 * w_expert + 2.0 * 32768 * 28672);
  EXPECT_GT(row / grp, 6.0);
  // DeepSeek-V3 up: 32 n-tiles, so 132 concurrent blocks already share each W tile among 4 m-tiles.
  const GroupedGemmShape dsv3{32768, 4096, 7168, 8};
  const double row3 = kc::ch05::predicted_dram_bytes(dsv3, 4096, TileOrder::row_major, 8, 132);
  const double grp3 = kc::ch05::predicted_dram_bytes(dsv3, 4096, TileOrder::grouped, 8, 132);
  EXPECT_LT(row3 / grp3, 2.0);
  // Either way far below what the math takes: 1.92 TFLOP at 500 TFLOP/s is 3.8 ms, 4.5 GB at
  // 4.25 TB/s is 1.1 ms.
  EXPECT_LT(row3 / 4.25e12, 0.5 * 2.0 * 32768 * 4096 * 7168 / 500e12);
}

// ---------------------------------------------------------------- GPU

enum class Path {
  loop,
  one_launch_row_major,
  one_launch_grouped,
  one_launch_wide,  // the chapter's `after`: grouped order, 128 x 256 tile
  cublas_loop,
  cublas_grouped
};

bool is_wide(Path path) { return path == Path::one_launch_wide; }

// The paths of this chapter's one-launch kernel that this GPU runs (the wide tile needs 144 KiB).
bool runs_here(Path path) { return !is_wide(path) || kc::ch05::grouped_tile_supported(GroupedTile::wide_128x256); }

const char* name_of(Path path) {
  switch (path) {
    case Path::loop: return "loop";
    case Path::one_launch_row_major: return "one_launch_row_major";
    case Path::one_launch_grouped: return "one_launch_grouped";
    case Path::one_launch_wide: return "one_launch_wide";
    case Path::cublas_loop: return "cublas_loop";
    case Path::cublas_grouped: return "cublas_grouped";
  }
  return "?";
}

// Runs `path` into a poisoned, guarded C and returns it.
std::vector<bf16> run_path(const Problem& p, Path path, kc::ch02::CublasHandle& cublas, int group_m = 8,
                           std::size_t* guard_damage = nullptr) {
  const DeviceProblem d(p);
  const bf16 *a = d.a.data(), *w = d.w.data();
  const std::int32_t* offsets = d.offsets.data();
  kc::DeviceBuffer<unsigned char> workspace(kc::ch05::grouped_gemm_workspace_bytes(p.shape));
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  switch (path) {
    case Path::loop: kc::ch05::grouped_gemm_loop(p.shape, a, w, c.data(), p.offsets); break;
    case Path::one_launch_row_major:
    case Path::one_launch_grouped:
    case Path::one_launch_wide: {
      const GroupedGemmOptions options{path == Path::one_launch_row_major ? TileOrder::row_major : TileOrder::grouped,
                                       group_m,
                                       is_wide(path) ? GroupedTile::wide_128x256 : GroupedTile::square_128x128};
      kc::ch05::grouped_gemm(p.shape, a, w, c.data(), offsets, workspace.data(), workspace.size(), options);
      break;
    }
    case Path::cublas_loop: kc::ch05::cublas_grouped_loop(cublas, p.shape, a, w, c.data(), p.offsets); break;
    case Path::cublas_grouped: {
      const kc::ch05::CublasGroupedGemm grouped(p.shape, a, w, c.data(), p.offsets);
      grouped.run(cublas);
      kc::check(cudaDeviceSynchronize());
      break;
    }
  }
  kc::check(cudaDeviceSynchronize());
  if (guard_damage != nullptr) *guard_damage = c.guard_damage();
  return c.to_host();
}

class GroupedGemmGpu : public kc::test::GpuTest {};

// Random group sizes of every kind, odd N and K, every path against fp64; the one launch in both
// orders and several band heights against cuBLAS on all elements.
TEST_F(GroupedGemmGpu, EveryPathMatchesFp64AndCublas) {
  const std::uint64_t seed = kc::test::test_seed();
  std::mt19937_64 rng(seed);
  kc::ch02::CublasHandle cublas;
  const int trials = kc::test::small_tests_only() ? 2 : 8;
  for (int trial = 0; trial < trials; ++trial) {
    const int experts = 1 + static_cast<int>(rng() % 24);
    const std::vector<std::int32_t> sizes = random_sizes(rng, experts, 300);
    const std::int64_t n = trial % 2 == 0 ? 136 : 1 + static_cast<std::int64_t>(rng() % 300);
    const std::int64_t k = 8 * (1 + static_cast<std::int64_t>(rng() % 40));
    const Problem p = random_problem(sizes, n, k, seed + static_cast<std::uint64_t>(trial), trial % 3);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": E=" + std::to_string(experts) +
                 " rows=" + std::to_string(p.offsets.back()) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
    if (p.shape.m_total == 0) continue;
    const std::vector<bf16> reference = run_path(p, Path::cublas_loop, cublas);
    const std::vector<double> reference_d = kc::ref::widen(std::span<const bf16>(reference));
    for (Path path : {Path::loop, Path::one_launch_row_major, Path::one_launch_grouped, Path::one_launch_wide,
                      Path::cublas_grouped}) {
      for (int group_m : {1, 3, 8}) {
        if (path != Path::one_launch_grouped && path != Path::one_launch_wide && group_m != 8) continue;
        if (!runs_here(path)) continue;
        SCOPED_TRACE(std::string(name_of(path)) + " group_m=" + std::to_string(group_m));
        std::size_t damage = 0;
        const std::vector<bf16> got = run_path(p, path, cublas, group_m, &damage);
        EXPECT_EQ(damage, 0u) << "wrote past the end of c";
        expect_matches_fp64(p, got, seed);
        const std::size_t rows_n = static_cast<std::size_t>(p.offsets.back() * n);
        kc::test::expect_close(
            kc::compare<bf16>(std::span<const bf16>(got).first(rows_n),
                              std::span<const double>(reference_d).first(rows_n), kc::test::kPoisonByte),
            kTolerance, "vs cuBLAS (all elements)");
      }
    }
    // The loop and the one launch run the same block code on the same rows: bit-identical, poison
    // included (rows past offsets[E] stay poisoned in both). Compared as bytes: the poison is a NaN
    // pattern, and NaN == NaN is false for bf16's operator==.
    const std::vector<bf16> looped = run_path(p, Path::loop, cublas);
    const std::vector<bf16> launched = run_path(p, Path::one_launch_grouped, cublas);
    ASSERT_EQ(looped.size(), launched.size());
    EXPECT_EQ(std::memcmp(looped.data(), launched.data(), looped.size() * sizeof(bf16)), 0)
        << "the loop and the one launch differ";
  }
}

// A goal-sized case, sampled against fp64 and entirely against cuBLAS: 64 experts, skewed.
TEST_F(GroupedGemmGpu, LargeSkewedCase) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  std::vector<std::int32_t> sizes(64);
  for (int e = 0; e < 64; ++e) sizes[e] = e % 4 == 0 ? 0 : 4096 / (e + 1) + (e == 1 ? 3000 : 0);
  const Problem p = random_problem(sizes, 4096, 1024, kc::test::test_seed());
  kc::ch02::CublasHandle cublas;
  const std::vector<bf16> reference = run_path(p, Path::cublas_loop, cublas);
  const std::vector<double> reference_d = kc::ref::widen(std::span<const bf16>(reference));
  for (Path path : {Path::one_launch_row_major, Path::one_launch_grouped, Path::one_launch_wide}) {
    SCOPED_TRACE(name_of(path));
    if (!runs_here(path)) continue;
    const std::vector<bf16> got = run_path(p, path, cublas);
    expect_matches_fp64(p, got, 7);
    kc::test::expect_close(kc::compare<bf16>(got, reference_d, kc::test::kPoisonByte), kTolerance, "vs cuBLAS");
  }
}

// Every expert empty: the one launch writes nothing (and must not fault).
TEST_F(GroupedGemmGpu, AllExpertsEmpty) {
  const Problem p = random_problem(std::vector<std::int32_t>(16, 0), 64, 64, 1, 40);
  kc::ch02::CublasHandle cublas;
  for (Path path : {Path::loop, Path::one_launch_grouped, Path::one_launch_wide, Path::cublas_grouped}) {
    if (!runs_here(path)) continue;
    expect_all_poisoned(run_path(p, path, cublas), name_of(path));
  }
}

// Rejected calls launch nothing: the poisoned output stays poisoned.
TEST_F(GroupedGemmGpu, BadArgumentsWriteNothing) {
  const Problem p = random_problem({5, 0, 7}, 32, 64, 3);
  const DeviceProblem d(p);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch05::grouped_gemm_workspace_bytes(p.shape));
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  expect_invalid_argument(
      [&] {
        kc::ch05::grouped_gemm(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), workspace.data(),
                               workspace.size(), {TileOrder::grouped, 0});
      },
      "options.group_m (0) must be >= 1");
  expect_invalid_argument(
      [&] {
        kc::ch05::grouped_gemm(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), c.data(), workspace.size());
      },
      "workspace must not overlap c");
  kc::check(cudaDeviceSynchronize());
  expect_all_poisoned(c.to_host(), "a rejected call wrote c");
}

// The one launch neither allocates nor synchronises, and repeats bit for bit, on both tiles.
TEST_F(GroupedGemmGpu, GraphCapturableAndRepeatable) {
  const Problem p = random_problem({130, 0, 1, 257, 64}, 200, 136, kc::test::test_seed());
  const DeviceProblem d(p);
  kc::DeviceBuffer<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  kc::DeviceBuffer<unsigned char> workspace(kc::ch05::grouped_gemm_workspace_bytes(p.shape));
  for (GroupedTile tile : {GroupedTile::square_128x128, GroupedTile::wide_128x256}) {
    if (!kc::ch05::grouped_tile_supported(tile)) continue;
    SCOPED_TRACE(tile == GroupedTile::wide_128x256 ? "wide tile (after)" : "square tile");
    const GroupedGemmOptions options{TileOrder::grouped, kc::ch05::kDefaultGroupM, tile};
    const auto launch = [&](cudaStream_t stream) {
      kc::ch05::grouped_gemm(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), workspace.data(),
                             workspace.size(), options, stream);
    };
    // The first call on a device sets the kernel's shared-memory attribute: outside the capture.
    launch(nullptr);
    kc::check(cudaDeviceSynchronize());
    const kc::test::LaunchUnderTest run{launch, [&] { c.fill_bytes(kc::test::kPoisonByte); },
                                        [&] { return bytes_of(c); }};
    kc::test::expect_graph_capturable(run);
    kc::test::expect_bitwise_repeatable(run);
  }
}

// The permutation kernels against the reference, then the combine against fp64: ties (repeated
// ids), empty experts, every token to one expert, invalid ids, T = 0, and chunk boundaries.
TEST_F(GroupedGemmGpu, PermuteAndCombineMatchReference) {
  const std::uint64_t seed = kc::test::test_seed();
  std::mt19937_64 rng(seed);
  struct Case {
    std::int64_t tokens;
    int k, experts;
    int kind;  // 0 random, 1 all to expert 3, 2 only even experts, 3 some invalid ids
  };
  const Case cases[] = {{0, 2, 8, 0},     {1, 1, 1, 0},   {37, 2, 8, 0},   {300, 8, 256, 0},
                        {1000, 6, 64, 2}, {129, 4, 8, 1}, {513, 2, 16, 3}, {4096, 8, 1024, 0}};
  for (const Case& cs : cases) {
    SCOPED_TRACE("T=" + std::to_string(cs.tokens) + " k=" + std::to_string(cs.k) + " E=" + std::to_string(cs.experts) +
                 " kind=" + std::to_string(cs.kind));
    const std::int64_t hidden = 72;
    const auto pairs = static_cast<std::size_t>(cs.tokens * cs.k);
    std::vector<std::int32_t> ids(pairs);
    for (std::size_t i = 0; i < pairs; ++i) {
      auto id = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(cs.experts));
      if (cs.kind == 1) id = 3 % cs.experts;
      if (cs.kind == 2) id = id / 2 * 2;
      if (cs.kind == 3 && rng() % 5 == 0) id = rng() % 2 == 0 ? -1 : cs.experts;
      ids[i] = id;
    }
    std::vector<bf16> x(static_cast<std::size_t>(cs.tokens * hidden));
    kc::fill_uniform(std::span<bf16>(x), seed);
    const kc::ch05::PermuteReference want = kc::ch05::permute_reference(ids, cs.k, cs.experts);

    kc::DeviceBuffer<std::int32_t> d_ids(ids);
    kc::DeviceBuffer<bf16> d_x(x);
    kc::test::GuardedOutput<std::int32_t> counts(static_cast<std::size_t>(cs.experts)),
        offsets(static_cast<std::size_t>(cs.experts) + 1), row_of_pair(pairs), token_of_row(pairs);
    kc::test::GuardedOutput<bf16> a(pairs * static_cast<std::size_t>(hidden));
    const kc::ch05::PermuteShape shape{cs.tokens, cs.k, cs.experts, hidden};
    kc::DeviceBuffer<unsigned char> workspace(kc::ch05::permute_workspace_bytes(shape));
    const kc::ch05::PermuteOutputs out{counts.data(), offsets.data(), row_of_pair.data(), token_of_row.data(),
                                       a.data()};
    kc::ch05::permute_tokens(shape, d_ids.data(), d_x.data(), out, workspace.data(), workspace.size());
    kc::check(cudaDeviceSynchronize());
    EXPECT_EQ(counts.to_host(), want.counts);
    EXPECT_EQ(offsets.to_host(), want.offsets);
    EXPECT_EQ(row_of_pair.to_host(), want.row_of_pair);
    std::vector<std::int32_t> got_tokens = token_of_row.to_host();
    got_tokens.resize(want.token_of_row.size());
    EXPECT_EQ(got_tokens, want.token_of_row);
    const std::vector<bf16> got_a = a.to_host();
    bool rows_ok = true;
    for (std::size_t r = 0; r < want.token_of_row.size() && rows_ok; ++r) {
      const auto t = static_cast<std::size_t>(want.token_of_row[r]);
      for (std::int64_t col = 0; col < hidden; ++col) {
        rows_ok &= std::memcmp(&got_a[r * hidden + col], &x[t * hidden + col], sizeof(bf16)) == 0;
      }
    }
    EXPECT_TRUE(rows_ok) << "A[r] must be X[token_of_row[r]]";
    EXPECT_EQ(counts.guard_damage() + offsets.guard_damage() + row_of_pair.guard_damage() + a.guard_damage(), 0u);

    // Combine: treat A itself as the experts' output (N = hidden), y[t] = Σ_j w_j · X[t] when all valid.
    if (cs.tokens == 0) continue;
    std::vector<float> weights(pairs);
    kc::fill_uniform(std::span<float>(weights), seed + 5, 0.0, 1.0);
    kc::DeviceBuffer<float> d_weights(weights);
    kc::test::GuardedOutput<bf16> y(static_cast<std::size_t>(cs.tokens * hidden));
    kc::ch05::unpermute_combine(cs.tokens, cs.k, hidden, a.data(), d_weights.data(), row_of_pair.data(), y.data());
    std::vector<double> y_want(static_cast<std::size_t>(cs.tokens * hidden), 0.0);
    for (std::int64_t t = 0; t < cs.tokens; ++t) {
      for (int j = 0; j < cs.k; ++j) {
        const std::size_t p = static_cast<std::size_t>(t * cs.k + j);
        if (want.row_of_pair[p] < 0) continue;
        for (std::int64_t col = 0; col < hidden; ++col) {
          y_want[static_cast<std::size_t>(t * hidden + col)] +=
              weights[p] * kc::to_double(x[static_cast<std::size_t>(t * hidden + col)]);
        }
      }
    }
    kc::test::expect_close(kc::compare<bf16>(y.to_host(), y_want, kc::test::kPoisonByte), kTolerance, "combine");
    EXPECT_EQ(y.guard_damage(), 0u);
  }
}

}  // namespace
