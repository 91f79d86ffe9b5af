// Chapter 9's CPU tests: the swapped tile and its shared memory, the operand swap (which weight rows a
// tile reads), the transposed store's slots, the work of every tile of a launch, the dispatch rule,
// the benchmark cases, and the rules a launch checks. No CUDA call: they run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "decode_cases.hpp"
#include "dispatch.hpp"
#include "grouped_gemm_problems.hpp"  // random_sizes
#include "kc/check.hpp"
#include "kc/test_support.hpp"
#include "swap_ab.hpp"
// Angle brackets: the exercise build puts the skeleton's swap_tiles.hpp first on the include path.
#include <swap_tiles.hpp>

#include "tile_map.hpp"

namespace {

using kc::ch05::GroupedGemmShape;
using kc::ch09::EpilogueKind;
using kc::ch09::GroupedEpilogue;
using kc::ch09::SwapStep;
using kc::ch09::SwapTile;
using kc::test::expect_invalid_argument;
using bf16 = __nv_bfloat16;

constexpr int kTokenTiles[] = {8, 16, 32, 64};

// A fake device address: validation only looks at the number.
template <class T>
T* fake(std::uint64_t address) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address));
}

// ------------------------------------------------------------------- CPU: the tile and its memory

TEST(SwapTiles, SharedMemoryOfEveryTile) {
  for (int tokens : kTokenTiles) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    const int stages = kc::ch09::swap_stages_that_fit(tokens);
    const SwapTile tile{tokens, stages};
    EXPECT_EQ(tile.stage_bytes(), 16384 + 128 * tokens) << "two 8 KiB weight boxes and a token box";
    EXPECT_EQ(tile.stage_bytes() % 1024, 0) << "every box starts on a 1024-byte swizzle atom";
    EXPECT_EQ(tile.staging_bytes(), tokens * 132 * 4);
    EXPECT_LE(tile.smem_bytes(), kc::ch07::kSm90SmemPerBlock);
    const SwapTile one_more{tokens, stages + 1};
    if (stages < 16) EXPECT_GT(one_more.smem_bytes(), kc::ch07::kSm90SmemPerBlock) << "the most stages that fit";
  }
  EXPECT_EQ(kc::ch09::swap_stages_that_fit(8), 12);
  EXPECT_EQ(kc::ch09::swap_stages_that_fit(16), 11);
  EXPECT_EQ(kc::ch09::swap_stages_that_fit(32), 10);
  EXPECT_EQ(kc::ch09::swap_stages_that_fit(64), 7);
  EXPECT_LE((SwapTile{64, kc::ch09::kStep1Stages}.smem_bytes()), kc::ch07::kSm90SmemPerBlock);
}

TEST(SwapTiles, NTilesAndOutputColumns) {
  EXPECT_EQ(kc::ch09::swap_tiles_n(4096, EpilogueKind::plain), 32);
  EXPECT_EQ(kc::ch09::swap_tiles_n(4096, EpilogueKind::row_scale), 32);
  EXPECT_EQ(kc::ch09::swap_tiles_n(4096, EpilogueKind::swiglu), 32) << "2048 output columns, 64 per tile";
  EXPECT_EQ(kc::ch09::swap_tiles_n(1544, EpilogueKind::plain), 13);   // 12 · 128 = 1536 < 1544
  EXPECT_EQ(kc::ch09::swap_tiles_n(1544, EpilogueKind::swiglu), 13);  // 772 columns, 12 · 64 = 768
  EXPECT_EQ(kc::ch09::swap_tiles_n(8, EpilogueKind::plain), 1);
  EXPECT_EQ(kc::ch09::swap_out_cols(EpilogueKind::plain), 128);
  EXPECT_EQ(kc::ch09::swap_out_cols(EpilogueKind::swiglu), 64);
}

// The operand swap: consumer 0 and 1 read the tile's two halves of weight rows (plain), or the gate
// rows and the matching up rows (SwiGLU).
TEST(SwapTiles, WeightRowsOfATile) {
  const int n = 1536;
  for (int expert : {0, 1, 7}) {
    for (int n_tile : {0, 1, 11}) {
      const kc::ch09::SwapWRows plain = kc::ch09::swap_w_rows(expert, n_tile, n, EpilogueKind::plain);
      EXPECT_EQ(plain.first, expert * n + 128 * n_tile);
      EXPECT_EQ(plain.second, expert * n + 128 * n_tile + 64);
      const kc::ch09::SwapWRows swiglu = kc::ch09::swap_w_rows(expert, n_tile, n, EpilogueKind::swiglu);
      EXPECT_EQ(swiglu.first, expert * n + 64 * n_tile) << "gate rows";
      EXPECT_EQ(swiglu.second, expert * n + n / 2 + 64 * n_tile) << "up rows";
    }
  }
}

// The transposed store: over both consumers, every thread and every register, each (token, column)
// of a tile is written exactly once; a register's column is a weight row, its row a token.
TEST(SwapTiles, TransposedSlotsCoverTheTileOnce) {
  for (int tokens : kTokenTiles) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    std::vector<int> hits(static_cast<std::size_t>(tokens * 128), 0);
    for (int consumer = 0; consumer < 2; ++consumer) {
      for (int thread = 0; thread < 128; ++thread) {
        for (int i = 0; i < tokens / 2; ++i) {
          const kc::ch09::TransposedSlot slot = kc::ch09::transposed_slot(consumer, thread, i);
          ASSERT_GE(slot.token, 0);
          ASSERT_LT(slot.token, tokens);
          ASSERT_GE(slot.column, 64 * consumer);
          ASSERT_LT(slot.column, 64 * consumer + 64);
          ++hits[static_cast<std::size_t>(slot.token * 128 + slot.column)];
        }
      }
    }
    for (int h : hits) ASSERT_EQ(h, 1);
  }
  // Exact slots: lane 1's first register is the accumulator's (row 0, column 2): token 2, column 0;
  // lane 4's is (row 1, column 0): token 0, column 1; warp 1 starts at row 16; consumer 1 adds 64.
  EXPECT_EQ(kc::ch09::transposed_slot(0, 1, 0).token, 2);
  EXPECT_EQ(kc::ch09::transposed_slot(0, 1, 0).column, 0);
  EXPECT_EQ(kc::ch09::transposed_slot(0, 4, 0).token, 0);
  EXPECT_EQ(kc::ch09::transposed_slot(0, 4, 0).column, 1);
  EXPECT_EQ(kc::ch09::transposed_slot(0, 32, 2).column, 24) << "warp 1, second row block: row 16 + 8";
  EXPECT_EQ(kc::ch09::transposed_slot(1, 0, 5).token, 9) << "register 5: column 8 · 1 + 1";
  EXPECT_EQ(kc::ch09::transposed_slot(1, 0, 5).column, 64);
  EXPECT_EQ(kc::ch09::staging_offset(3, 5), 3 * 132 + 5);
}

// Every tile of a launch, for random group sizes and every token tile: each (token row, n-tile) of
// each expert exactly once, tokens in [1, tile], and an expert's token tiles of one n-tile adjacent.
TEST(SwapTiles, WorkCoversEveryTokenOnce) {
  std::mt19937_64 rng(kc::test::test_seed());
  for (int trial = 0; trial < 40; ++trial) {
    const int experts = 1 + static_cast<int>(rng() % 300);
    const std::vector<std::int32_t> sizes = kc::test::grouped::random_sizes(rng, experts, 90);
    const std::vector<std::int32_t> offsets = kc::ch05::offsets_of_sizes(sizes);
    const int m_total = offsets.back() + static_cast<int>(rng() % 3);
    const int tiles_n = 1 + static_cast<int>(rng() % 5);
    for (int tokens : kTokenTiles) {
      SCOPED_TRACE("trial " + std::to_string(trial) + " tokens " + std::to_string(tokens));
      std::vector<std::int32_t> prefix(static_cast<std::size_t>(experts + 1));
      kc::ch05::tile_prefix_of(offsets.data(), experts, m_total, tokens, prefix.data());
      const int tiles = prefix[static_cast<std::size_t>(experts)] * tiles_n;
      ASSERT_LE(tiles, kc::ch05::max_m_tiles(m_total, experts, tokens) * tiles_n);
      std::vector<int> seen(static_cast<std::size_t>(offsets.back() * tiles_n), 0);
      for (int t = 0; t < tiles; ++t) {
        const kc::ch09::SwapWork w =
            kc::ch09::swap_work(t, offsets.data(), prefix.data(), experts, m_total, tiles_n, tokens);
        ASSERT_GE(w.tokens, 1);
        ASSERT_LE(w.tokens, tokens);
        ASSERT_GE(w.row0, offsets[static_cast<std::size_t>(w.expert)]);
        ASSERT_LE(w.row0 + w.tokens, offsets[static_cast<std::size_t>(w.expert) + 1]);
        for (int r = w.row0; r < w.row0 + w.tokens; ++r) ++seen[static_cast<std::size_t>(r * tiles_n + w.n_tile)];
        if (t > 0 && w.row0 > offsets[static_cast<std::size_t>(w.expert)]) {
          const kc::ch09::SwapWork before =
              kc::ch09::swap_work(t - 1, offsets.data(), prefix.data(), experts, m_total, tiles_n, tokens);
          const int tiles_of_expert = kc::ch05::m_tiles_of(sizes[static_cast<std::size_t>(w.expert)], tokens);
          if (tiles_of_expert <= kc::ch09::kSwapGroupM) {
            EXPECT_EQ(before.n_tile, w.n_tile) << "an expert's token tiles of one n-tile run side by side";
          }
        }
      }
      for (int s : seen) ASSERT_EQ(s, 1);
    }
  }
}

// ----------------------------------------------------------------------------- CPU: the dispatch

TEST(SwapDispatch, TokenTileHoldsTheTokensPerExpert) {
  const std::vector<std::pair<std::int64_t, int>> want = {{0, 8},   {1, 8},   {8, 8},   {9, 16},  {16, 16},  {17, 32},
                                                          {32, 32}, {33, 64}, {64, 64}, {65, 64}, {1000, 64}};
  for (const auto& [tokens, tile] : want) EXPECT_EQ(kc::ch09::token_tile_for(tokens), tile) << tokens;
}

TEST(SwapDispatch, SwappedUpToTheCrossover) {
  const std::int64_t cross = kc::ch09::kSwapMaxTokensPerExpert;
  // DeepSeek-V3 decode: T tokens, top-8 of 256 experts.
  for (std::int64_t t : {1, 8, 32, 128}) {
    const kc::ch09::DecodeChoice choice = kc::ch09::decode_choice(8 * t, 256);
    EXPECT_TRUE(choice.swapped) << "T = " << t;
    EXPECT_EQ(choice.tokens, (8 * t + 255) / 256);
    EXPECT_EQ(choice.token_tile, kc::ch09::token_tile_for(choice.tokens));
  }
  EXPECT_EQ(kc::ch09::decode_choice(32 * 8, 32).token_tile, 8);
  EXPECT_EQ(kc::ch09::decode_choice(32 * 9, 32).token_tile, 16);
  EXPECT_TRUE(kc::ch09::decode_choice(32 * cross, 32).swapped);
  EXPECT_FALSE(kc::ch09::decode_choice(32 * cross + 1, 32).swapped) << "one token over on average";
  EXPECT_FALSE(kc::ch09::decode_choice(8 * 4096, 8).swapped) << "prefill runs Chapter 8's kernel";
  EXPECT_TRUE(kc::ch09::decode_choice(0, 5).swapped);
  EXPECT_EQ(kc::ch09::decode_choice(7, 1).tokens, 7);
}

// ------------------------------------------------------------------------------ CPU: the rules

TEST(SwapRules, StepNames) {
  EXPECT_STREQ(kc::ch09::to_string(SwapStep::swapped_operands), "step1_swapped_operands");
  EXPECT_STREQ(kc::ch09::to_string(SwapStep::deep_pipeline), "step2_deep_pipeline");
  EXPECT_STREQ(kc::ch09::to_string(SwapStep::token_tile), "step3_token_tile");
  expect_invalid_argument([] { kc::ch09::to_string(static_cast<SwapStep>(7)); }, "is not a SwapStep");
}

TEST(SwapRules, BadArgumentsNameTheRule) {
  const GroupedGemmShape shape{40, 264, 64, 3};
  const bf16* a = fake<const bf16>(0x100000);
  const bf16* w = fake<const bf16>(0x200000);
  bf16* c = fake<bf16>(0x900000);
  const std::int32_t* offsets = fake<const std::int32_t>(0xA00000);
  auto launch = [&](const GroupedGemmShape& s, bf16* out, const GroupedEpilogue& e, SwapStep step) {
    kc::ch09::grouped_gemm_swap_ab(step, s, a, w, out, offsets, e);
  };
  expect_invalid_argument([&] { launch(shape, c, {}, static_cast<SwapStep>(3)); }, "is not a SwapStep");
  expect_invalid_argument(
      [&] {
        launch({40, 260, 64, 3}, c, {}, SwapStep::token_tile);
      },
      "the columns of C (260, shape.n) must be a multiple of 8 for the transposed store");
  expect_invalid_argument(
      [&] {
        launch({40, 532, 64, 3}, c, {EpilogueKind::swiglu}, SwapStep::token_tile);
      },
      "the columns of C (266, shape.n / 2) must be a multiple of 8");
  expect_invalid_argument([&] { launch(shape, fake<bf16>(0x900008), {}, SwapStep::swapped_operands); },
                          "c must be 16-byte aligned for the transposed store");
  // Chapter 8's rules come first and keep their words.
  expect_invalid_argument([&] { launch({40, 264, 60, 3}, c, {}, SwapStep::token_tile); }, "multiple of 8");
  expect_invalid_argument(
      [&] {
        launch({40, 264, 64, 3}, c, {EpilogueKind::row_scale}, SwapStep::token_tile);
      },
      "epilogue.row_scale must not be null");
  expect_invalid_argument(
      [&] {
        launch({40, 263, 64, 3}, c, {EpilogueKind::swiglu}, SwapStep::token_tile);
      },
      "must be a multiple of 2 for swiglu");
  // The dispatch needs Chapter 8's workspace, whichever kernel it picks.
  expect_invalid_argument([&] { kc::ch09::grouped_gemm_decode(shape, a, w, c, offsets, {}, nullptr, 0); },
                          "workspace must not be null");
}

// No rows: no store rule applies (C may be null and of any width), and nothing is launched.
TEST(SwapRules, NoRowsLaunchesNothing) {
  const GroupedGemmShape empty{0, 260, 64, 3};
  EXPECT_NO_THROW(kc::ch09::validate_swap_ab(empty, nullptr, fake<const bf16>(0x200000), nullptr,
                                             fake<const std::int32_t>(0xA00000), {}));
}

// The routed decode cases: 8 rows per token over 256 experts, the same sizes from the same seed, one
// row on each of 8 experts for a single token (the routing picks 8 distinct experts), labels unique.
TEST(DecodeCases, RoutedCasesAreTheRoutingsCounts) {
  for (std::int64_t tokens : {1, 8, 32, 128}) {
    const kc::ch05::GroupedCase cs = kc::ch09::routed_decode_case(tokens);
    ASSERT_EQ(cs.sizes.size(), 256u);
    std::int64_t rows = 0, busiest = 0;
    for (std::int32_t size : cs.sizes) {
      rows += size;
      busiest = std::max<std::int64_t>(busiest, size);
    }
    EXPECT_EQ(rows, 8 * tokens);
    EXPECT_EQ(cs.shape.m_total, 8 * tokens);
    EXPECT_LE(busiest, tokens);  // an expert holds a token at most once
    EXPECT_EQ(cs.sizes, kc::ch09::routed_decode_case(tokens).sizes);
    if (tokens == 1) EXPECT_EQ(std::count(cs.sizes.begin(), cs.sizes.end(), 1), 8);
  }
  EXPECT_EQ(kc::ch09::routed_decode_case(32).label, "dsv3_decode_T32_E256_k8_N4096_K7168");
  EXPECT_NE(kc::ch09::routed_decode_case(32, 1).sizes, kc::ch09::routed_decode_case(32, 2).sizes);
  expect_invalid_argument([] { kc::ch09::routed_decode_case(0); }, "tokens must be at least 1");
  std::vector<std::string> labels;
  for (const kc::ch05::GroupedCase& cs : kc::ch09::decode_benchmark_cases()) {
    labels.push_back(cs.label);
    EXPECT_EQ(static_cast<std::int64_t>(cs.sizes.size()), cs.shape.experts) << cs.label;
  }
  EXPECT_EQ(labels.size(), 20u);
  for (const std::string& a : labels) {
    for (const std::string& b : labels) {
      if (&a != &b) EXPECT_FALSE(b.starts_with(a)) << a << " is a prefix of " << b;
    }
  }
}

}  // namespace
