// Chapter 6 tests: the schedulers (static, dynamic, Stream-K) and the wave arithmetic on the CPU,
// argument rules and workspace sizes; on a GPU, every scheduler against fp64 (sampled) and
// Chapter 5's kernel (all elements: bitwise for static and dynamic, which add K in the same order;
// 1e-2 relative for Stream-K, whose split tiles add fp32 partials), random group sizes with zeros,
// ones and skew, poisoned outputs, bad arguments, graph capture and bitwise repeatability.
//
// Tolerance: 1e-2 relative Frobenius (the course's bf16 rule: bf16 operands, fp32 accumulation, one
// rounding per output). Stream-K changes only the order of fp32 additions: a few ulps of fp32, far
// below one bf16 rounding; a slice added twice or missed gives errors of order 1 / k_tiles or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grouped_gemm.hpp"
#include "grouped_gemm_problems.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"
#include "persistent_gemm.hpp"
#include "schedule.hpp"

namespace {

using namespace kc::test::grouped;  // the problems, sizes and checks Chapters 5 and 6 share

using bf16 = __nv_bfloat16;
using kc::ch06::GroupedGemmShape;
using kc::ch06::PersistentOptions;
using kc::ch06::Scheduler;
using kc::ch06::StreamKPlan;
using kc::test::expect_invalid_argument;

// ---------------------------------------------------------------- CPU: wave arithmetic

TEST(PersistentWaves, Arithmetic) {
  const auto w = kc::ch06::waves_of(144, 132);
  EXPECT_EQ(w.waves, 2);
  EXPECT_EQ(w.full_waves, 1);
  EXPECT_EQ(w.last_wave_tiles, 12);
  EXPECT_NEAR(w.last_wave_utilisation, 12.0 / 132, 1e-12);
  EXPECT_NEAR(w.efficiency, 144.0 / 264, 1e-12);
  const auto full = kc::ch06::waves_of(264, 132);
  EXPECT_EQ(full.waves, 2);
  EXPECT_EQ(full.last_wave_tiles, 132);
  EXPECT_EQ(full.last_wave_utilisation, 1.0);
  const auto none = kc::ch06::waves_of(0, 132);
  EXPECT_EQ(none.waves, 0);
  EXPECT_EQ(none.last_wave_tiles, 0);
  const auto small = kc::ch06::waves_of(5, 132);
  EXPECT_EQ(small.waves, 1);
  EXPECT_EQ(small.last_wave_tiles, 5);
}

// The benchmark's cases on an H200 (132 SMs, one 128 KiB block per SM): the numbers the lesson's
// table shows. Prints the table (README.md, "Wave quantization") from wave_table_row.
TEST(PersistentWaves, BenchmarkCasesOn132Slots) {
  struct Want {
    const char* label;
    std::int64_t tiles, waves, last;
  };
  const Want want[] = {{"G8xM4096_N4096_K7168", 8192, 63, 8},        {"G32xM256_N4096_K7168", 2048, 16, 68},
                       {"G256xM128_N4096_K7168", 8192, 63, 8},       {"E256_M8192_zipf_N4096_K7168", 9056, 69, 80},
                       {"E256_M8192_hot_N4096_K7168", 9184, 70, 76}, {"E256_M8192_empty25_N4096_K7168", 6144, 47, 72},
                       {"G8xM4096_N7168_K2048", 14336, 109, 80},     {"G8xM4096_N28672_K4096", 57344, 435, 56},
                       {"tail_G3xM384_N2048_K7168", 144, 2, 12},     {"tail_G4xM384_N2048_K7168", 192, 2, 60}};
  const auto cases = kc::ch06::benchmark_cases();
  ASSERT_EQ(cases.size(), std::size(want));
  std::cout << "| Case | Tiles | Waves | Last wave | Last-wave use | Efficiency | Ideal Stream-K gain |\n"
            << "|---|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(cases[i].label, want[i].label);
    const auto offsets = kc::ch05::offsets_of_sizes(cases[i].sizes);
    const std::int64_t tiles = kc::ch06::grouped_tiles(cases[i].shape, offsets);
    const auto w = kc::ch06::waves_of(tiles, 132);
    EXPECT_EQ(tiles, want[i].tiles) << want[i].label;
    EXPECT_EQ(w.waves, want[i].waves) << want[i].label;
    EXPECT_EQ(w.last_wave_tiles, want[i].last) << want[i].label;
    std::cout << kc::ch06::wave_table_row(cases[i], 132) << "\n";
    for (std::size_t j = 0; j < cases.size(); ++j) {
      if (i != j) EXPECT_FALSE(cases[j].label.starts_with(cases[i].label)) << "a label is a prefix of another";
    }
  }
  // The goal cases: the tails run 2 waves of which the last is 9 % and 45 % full.
  EXPECT_LT(kc::ch06::waves_of(144, 132).last_wave_utilisation, 0.1);
  EXPECT_LT(kc::ch06::waves_of(192, 132).last_wave_utilisation, 0.5);
}

// ---------------------------------------------------------------- CPU: schedulers

TEST(PersistentSchedule, StaticCoversEveryTileOnce) {
  for (int tiles : {0, 1, 5, 131, 132, 133, 1000}) {
    for (int grid : {1, 7, 132, 264}) {
      std::vector<int> seen(static_cast<std::size_t>(tiles), 0);
      for (int b = 0; b < grid; ++b) {
        for (int i = 0; i < kc::ch06::static_tile_count(tiles, grid, b); ++i) {
          const int t = kc::ch06::static_tile(grid, b, i);
          ASSERT_GE(t, 0);
          ASSERT_LT(t, tiles);
          ++seen[static_cast<std::size_t>(t)];
        }
      }
      ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }))
          << "tiles " << tiles << " grid " << grid;
    }
  }
}

// The dynamic scheduler's protocol, simulated with random interleavings of the blocks: each block
// does its first tile, then claims a ticket; every tile exactly once whatever the order.
TEST(PersistentSchedule, DynamicCoversEveryTileOnceInAnyOrder) {
  std::mt19937_64 rng(kc::test::test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    const int tiles = static_cast<int>(rng() % 600), grid = 1 + static_cast<int>(rng() % 140);
    std::vector<int> seen(static_cast<std::size_t>(tiles), 0), current(static_cast<std::size_t>(grid));
    for (int b = 0; b < grid; ++b) current[b] = b;
    int counter = 0;
    std::vector<int> running;
    for (int b = 0; b < grid; ++b) {
      if (current[b] < tiles) running.push_back(b);
    }
    while (!running.empty()) {
      const std::size_t pick = rng() % running.size();
      const int b = running[pick];
      ++seen[static_cast<std::size_t>(current[b])];
      current[b] = kc::ch06::dynamic_tile_of_ticket(grid, counter++);
      if (current[b] >= tiles) running.erase(running.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }))
        << "tiles " << tiles << " grid " << grid;
    ASSERT_EQ(counter, kc::ch06::dynamic_tickets(tiles)) << "the last ticket resets the counter";
  }
}

// Stream-K: every (tile, k-slice) exactly once; units in whole slices inside [0, k_tiles); whole
// tiles only where no other block touches the tile; split tiles' contributors are exactly the
// blocks that hold a part, consecutive, in k order. The owner (last contributor) of a split tile
// waits for its partners, so: a block's owner part is its last unit and a partner part its first
// Stream-K unit (no block waits on a waiting block), the partners are lower blocks than the owner,
// and a block stores at most one partial, in its own slot.
// Both plans (Stream-K and the split-K tail) go through the same checks; the split-K plan must
// also give every block at most one unit.
void check_stream_k(int tiles, int k_tiles, int grid, int max_tail_percent, bool split_k = false) {
  const StreamKPlan p = split_k ? kc::ch06::split_k_tail_plan(tiles, k_tiles, grid, max_tail_percent)
                                : kc::ch06::stream_k_plan(tiles, k_tiles, grid, max_tail_percent);
  SCOPED_TRACE("tiles " + std::to_string(tiles) + " k_tiles " + std::to_string(k_tiles) + " grid " +
               std::to_string(grid) + " tail% " + std::to_string(max_tail_percent) + (split_k ? " split-K" : ""));
  ASSERT_EQ(p.dp_tiles + p.sk_tiles, tiles);
  ASSERT_LT(p.sk_tiles, kc::ch06::arrival_counters(grid) + 1);
  const auto w = kc::ch06::waves_of(tiles, grid);
  if (p.sk_tiles > 0) {
    ASSERT_GE(p.sk_blocks, 1);
    ASSERT_LE(p.sk_blocks, grid);
    ASSERT_EQ(p.dp_tiles % grid, 0) << "the data-parallel part is whole waves";
    ASSERT_LE(p.sk_tiles, 2 * grid - 1);
    ASSERT_LE(w.last_wave_tiles * 100, static_cast<std::int64_t>(max_tail_percent) * grid);
  }
  std::vector<std::vector<int>> slices(static_cast<std::size_t>(tiles), std::vector<int>(k_tiles, 0));
  std::vector<std::vector<int>> parts(static_cast<std::size_t>(tiles));  // blocks holding a split part
  std::vector<int> slot_use(static_cast<std::size_t>(kc::ch06::partial_slots(grid)), 0);
  for (int b = 0; b < grid; ++b) {
    const int units = kc::ch06::units_of_block(p, b);
    int split_units = 0, partner_units = 0;
    for (int u = 0; u < units; ++u) {
      const auto unit = kc::ch06::unit_of_block(p, b, u);
      ASSERT_GE(unit.tile, 0);
      ASSERT_LT(unit.tile, tiles);
      ASSERT_GE(unit.k_begin, 0);
      ASSERT_LT(unit.k_begin, unit.k_end);
      ASSERT_LE(unit.k_end, k_tiles);
      for (int s = unit.k_begin; s < unit.k_end; ++s) ++slices[unit.tile][s];
      if (!kc::ch06::is_whole(p, unit)) {
        ASSERT_GE(unit.tile, p.dp_tiles) << "only Stream-K tiles are split";
        parts[unit.tile].push_back(b);
        ++split_units;
        if (kc::ch06::owns(p, b, unit)) {
          ASSERT_EQ(u, units - 1) << "block " << b << ": an owner part is the block's last unit";
          ASSERT_EQ(b, kc::ch06::last_contributor(p, unit.tile - p.dp_tiles)) << "partners are lower blocks";
        } else {
          ASSERT_EQ(u, kc::ch06::static_tile_count(p.dp_tiles, grid, b))
              << "block " << b << ": a partner part is the block's first Stream-K unit";
          ++partner_units;
          const int slot = kc::ch06::partial_slot(b);
          ASSERT_GE(slot, 0);
          ASSERT_LT(slot, kc::ch06::partial_slots(grid));
          ++slot_use[static_cast<std::size_t>(slot)];
        }
      }
    }
    ASSERT_LE(split_units, 2);
    ASSERT_LE(partner_units, 1) << "block " << b << " would store two partials";
    if (split_k) ASSERT_LE(units - kc::ch06::static_tile_count(p.dp_tiles, grid, b), 1) << "one tail unit a block";
  }
  for (int t = 0; t < tiles; ++t) {
    for (int s = 0; s < k_tiles; ++s) ASSERT_EQ(slices[t][s], 1) << "tile " << t << " slice " << s;
    if (parts[t].empty()) continue;
    const int sk = t - p.dp_tiles;
    const int first = kc::ch06::first_contributor(p, sk), last = kc::ch06::last_contributor(p, sk);
    ASSERT_GE(parts[t].size(), 2u) << "a split tile has at least two contributors";
    ASSERT_EQ(parts[t].front(), first);
    ASSERT_EQ(parts[t].back(), last);
    ASSERT_EQ(static_cast<int>(parts[t].size()), last - first + 1) << "consecutive contributors";
    // Contributor order is k order: each later contributor starts where the previous one ended.
    int k_next = 0;
    for (int b : parts[t]) {
      for (int u = 0; u < kc::ch06::units_of_block(p, b); ++u) {
        const auto unit = kc::ch06::unit_of_block(p, b, u);
        if (unit.tile != t) continue;
        ASSERT_EQ(unit.k_begin, k_next);
        k_next = unit.k_end;
      }
    }
    ASSERT_EQ(k_next, k_tiles);
  }
  for (int use : slot_use) ASSERT_LE(use, 1) << "two split units share a partial slot";
}

TEST(PersistentSchedule, StreamKEverySliceExactlyOnce) {
  for (int tiles : {0, 1, 2, 12, 131, 132, 133, 144, 192, 263, 264, 265, 1000}) {
    for (int k_tiles : {1, 2, 3, 7, 32, 112}) {
      for (int grid : {1, 2, 5, 132, 264}) {
        for (int tail : {0, 50, 90, 100}) {
          check_stream_k(tiles, k_tiles, grid, tail);
          check_stream_k(tiles, k_tiles, grid, tail, true);
        }
      }
    }
  }
}

TEST(PersistentSchedule, StreamKRandomShapes) {
  std::mt19937_64 rng(kc::test::test_seed());
  for (int trial = 0; trial < 300; ++trial) {
    check_stream_k(static_cast<int>(rng() % 3000), 1 + static_cast<int>(rng() % 130), 1 + static_cast<int>(rng() % 300),
                   static_cast<int>(rng() % 101), trial % 2 == 1);
  }
}

// The goal cases' plans on 132 blocks with K = 7168 (112 slices): one whole wave, then the last
// wave's 12 and 60 tiles shared by all 132 blocks (11 and 51 slices each), with at most 11 and 3
// contributors per tile.
TEST(PersistentSchedule, StreamKPlansOfTheTailCases) {
  struct Expect {
    int tiles, sk_tiles, most_slices, most_contributors;
  };
  for (const Expect& e : {Expect{144, 12, 11, 11}, Expect{192, 60, 51, 3}}) {
    const StreamKPlan p = kc::ch06::stream_k_plan(e.tiles, 112, 132, kc::ch06::kDefaultMaxTailPercent);
    EXPECT_EQ(p.dp_tiles, 132);
    EXPECT_EQ(p.sk_tiles, e.sk_tiles);
    EXPECT_EQ(p.sk_blocks, 132);
    std::int64_t most = 0;
    for (int b = 0; b < 132; ++b) most = std::max(most, kc::ch06::sk_begin(p, b + 1) - kc::ch06::sk_begin(p, b));
    EXPECT_EQ(most, e.most_slices);
    int most_contributors = 0;
    for (int s = 0; s < e.sk_tiles; ++s) {
      most_contributors =
          std::max(most_contributors, kc::ch06::last_contributor(p, s) - kc::ch06::first_contributor(p, s) + 1);
    }
    EXPECT_EQ(most_contributors, e.most_contributors);
  }
  // Below one wave every tile is shared: 100 tiles of 112 slices on 132 blocks, 85 slices each.
  const StreamKPlan small = kc::ch06::stream_k_plan(100, 112, 132, kc::ch06::kDefaultMaxTailPercent);
  EXPECT_EQ(small.dp_tiles, 0);
  EXPECT_EQ(small.sk_tiles, 100);
  // G256×128: 8192 tiles, 8 in the last wave: only those 8 are Stream-K.
  const StreamKPlan big = kc::ch06::stream_k_plan(8192, 112, 132, kc::ch06::kDefaultMaxTailPercent);
  EXPECT_EQ(big.sk_tiles, 8);
  EXPECT_EQ(big.dp_tiles, 8184);
  // A last wave fuller than the threshold, whole waves, or a single slice: no Stream-K.
  EXPECT_EQ(kc::ch06::stream_k_plan(132 + 125, 112, 132, 90).sk_tiles, 0);
  EXPECT_EQ(kc::ch06::stream_k_plan(264, 112, 132, 90).sk_tiles, 0);
  EXPECT_EQ(kc::ch06::stream_k_plan(144, 1, 132, 90).sk_tiles, 0);
  // The split-K tail: tail_G4's 60 tiles in 2 halves of 56 slices on 120 blocks (12 idle); tail_G3's
  // 12 tiles in 11 pieces on all 132; more remainder tiles than half the grid: no split at all.
  const StreamKPlan g4 = kc::ch06::split_k_tail_plan(192, 112, 132, kc::ch06::kDefaultMaxTailPercent);
  EXPECT_EQ(g4.sk_blocks, 120);
  EXPECT_EQ(kc::ch06::sk_begin(g4, 1) - kc::ch06::sk_begin(g4, 0), 56);
  EXPECT_EQ(kc::ch06::split_k_tail_plan(144, 112, 132, kc::ch06::kDefaultMaxTailPercent).sk_blocks, 132);
  const StreamKPlan unsplit = kc::ch06::split_k_tail_plan(132 + 100, 112, 132, kc::ch06::kDefaultMaxTailPercent);
  EXPECT_EQ(unsplit.sk_blocks, 100);
  for (int b = 0; b < 100; ++b) EXPECT_TRUE(kc::ch06::is_whole(unsplit, kc::ch06::unit_of_block(unsplit, b, 1)));
}

// ---------------------------------------------------------------- CPU: arguments

TEST(PersistentArguments, RulesAndWorkspace) {
  HostBuffer c;
  const GroupedGemmShape ok{4, 4, 8, 8};
  // The counters first, sized for the largest grid: round_up(4 · (1 + 2 · 4096 blocks · 8 warps)) =
  // 262400 bytes; then a 256-byte prefix row per block and one 64 KiB partial tile per block.
  EXPECT_EQ(kc::ch06::counter_words(), 1 + 2 * kc::ch06::kMaxPersistentGrid * 8);
  EXPECT_EQ(kc::ch06::workspace_counter_bytes(), 262400u);
  EXPECT_EQ(kc::ch06::workspace_prefix_row_bytes(4), 256u);   // 5 int32
  EXPECT_EQ(kc::ch06::workspace_prefix_row_bytes(63), 256u);  // 64 int32, exactly one row
  EXPECT_EQ(kc::ch06::workspace_prefix_row_bytes(64), 512u);  // 65 int32
  EXPECT_EQ(kc::ch06::workspace_prefix_row_bytes(300), 1280u);
  EXPECT_EQ(kc::ch06::persistent_workspace_bytes(ok, 132), 262400u + 132u * 256u + 132u * 65536u);
  EXPECT_EQ(kc::ch06::persistent_workspace_bytes({4, 4, 8, 300}, 1), 262400u + 1280u + 1u * 65536u);
  expect_invalid_argument([&] { kc::ch06::persistent_workspace_bytes(ok, 0); }, "grid (0) must be in [1, 4096]");
  expect_invalid_argument([&] { kc::ch06::persistent_workspace_bytes(ok, 4097); }, "grid (4097) must be in [1, 4096]");
  expect_invalid_argument(
      [&] {
        kc::ch06::persistent_workspace_bytes({4, 4, 8, 0}, 1);
      },
      "shape.experts (0) must be in [1, 1024]");
  std::vector<float4> workspace(kc::ch06::persistent_workspace_bytes(ok, 2) / sizeof(float4));
  const std::size_t bytes = workspace.size() * sizeof(float4);
  EXPECT_NO_THROW(kc::ch06::validate_persistent_options(ok, c.data, {}, workspace.data(), bytes, 2));
  auto bad = [&](PersistentOptions o, const std::string& rule) {
    expect_invalid_argument([&] { kc::ch06::validate_persistent_options(ok, c.data, o, workspace.data(), bytes, 2); },
                            rule);
  };
  bad({static_cast<Scheduler>(7)}, "options.scheduler (7) is not a Scheduler");
  bad({Scheduler::stream_k, 0}, "options.group_m (0) must be >= 1");
  bad({Scheduler::stream_k, 8, 101}, "options.stream_k_max_tail_percent (101) must be in [0, 100]");
  bad({Scheduler::stream_k, 8, -1}, "options.stream_k_max_tail_percent (-1) must be in [0, 100]");
  expect_invalid_argument(
      [&] { kc::ch06::validate_persistent_options(ok, c.data, {}, workspace.data(), bytes - 1, 2); },
      "workspace_bytes (" + std::to_string(bytes - 1) + ") must be >= " + std::to_string(bytes));
  expect_invalid_argument([&] { kc::ch06::validate_persistent_options(ok, c.data, {}, nullptr, bytes, 2); },
                          "workspace must not be null");
  expect_invalid_argument(
      [&] {
        kc::ch06::validate_persistent_options(ok, c.data, {}, reinterpret_cast<unsigned char*>(workspace.data()) + 4,
                                              bytes, 2);
      },
      "workspace must be 16-byte aligned");
  expect_invalid_argument(
      [&] {
        kc::ch06::validate_persistent_options(ok, reinterpret_cast<bf16*>(workspace.data()), {}, workspace.data(),
                                              bytes, 2);
      },
      "workspace must not overlap c");
  // Zeroing a new workspace: the same rules, and room for the counters at least.
  const std::size_t counters = kc::ch06::workspace_counter_bytes();
  EXPECT_NO_THROW(kc::ch06::validate_workspace_init(workspace.data(), counters));
  expect_invalid_argument([&] { kc::ch06::validate_workspace_init(nullptr, bytes); }, "workspace must not be null");
  expect_invalid_argument(
      [&] { kc::ch06::validate_workspace_init(reinterpret_cast<unsigned char*>(workspace.data()) + 4, bytes); },
      "workspace must be 16-byte aligned");
  expect_invalid_argument([&] { kc::ch06::validate_workspace_init(workspace.data(), counters - 1); },
                          "workspace_bytes (" + std::to_string(counters - 1) +
                              ") must be >= " + std::to_string(counters) + " (the counters)");
  // Tiles of host group sizes, with empty experts.
  const std::vector<std::int32_t> offsets = kc::ch05::offsets_of_sizes(std::vector<std::int32_t>{300, 0, 128, 1});
  EXPECT_EQ(kc::ch06::grouped_tiles({429, 200, 8, 4}, offsets), 5 * 2);
  expect_invalid_argument([&] { kc::ch06::grouped_tiles({10, 200, 8, 4}, offsets); }, "must be <= shape.m_total");
}

// The launch checks every rule that needs no device before it asks the device anything: bad options
// name their rule on a machine without a GPU (no CUDA error), and an empty problem (M_total = 0,
// null A and C) passes and launches nothing without a GPU.
TEST(PersistentArguments, OptionsCheckedBeforeAnyCudaCall) {
  HostBuffer a, w, c;
  std::int32_t offsets[9] = {};
  alignas(16) static unsigned char workspace[1 << 20];
  const GroupedGemmShape ok{4, 4, 8, 8};
  auto launch = [&](const GroupedGemmShape& shape, const bf16* a_ptr, bf16* c_ptr, PersistentOptions options) {
    kc::ch06::grouped_gemm_persistent(shape, a_ptr, w.data, c_ptr, offsets, workspace, sizeof workspace, options);
  };
  expect_invalid_argument([&] { launch(ok, a.data, c.data, {static_cast<Scheduler>(9)}); },
                          "options.scheduler (9) is not a Scheduler");
  expect_invalid_argument(
      [&] {
        launch(ok, a.data, c.data, {Scheduler::stream_k, 0});
      },
      "options.group_m (0) must be >= 1");
  expect_invalid_argument(
      [&] {
        launch(ok, a.data, c.data, {Scheduler::stream_k, 8, 101});
      },
      "options.stream_k_max_tail_percent (101) must be in [0, 100]");
  EXPECT_NO_THROW(kc::ch06::validate_persistent_options(PersistentOptions{}));
  EXPECT_EQ(kc::ch06::persistent_grid({0, 4, 8, 8}, Scheduler::stream_k), 1) << "no tile: no device query";
  EXPECT_NO_THROW(launch({0, 4, 8, 8}, nullptr, nullptr, {}));
}

// schedule.hpp's example, a plan written out by hand (so this test does not depend on
// stream_k_plan): 192 tiles, 132 blocks, 112 slices per tile. 6720 Stream-K slices, so block b's
// range is [b·6720/132, (b+1)·6720/132). Block 0 takes whole tile 0, then slices [0, 50) of tile
// 132; block 2 takes whole tile 2, then its range [101, 152) straddles two tiles: first its part of
// the later one (tile 133, slices [0, 40)), then the last slices of the earlier one (tile 132, [101, 112)).
TEST(PersistentSchedule, StreamKUnitsOfTheExample) {
  StreamKPlan p;
  p.tiles = 192;
  p.k_tiles = 112;
  p.grid = 132;
  p.dp_tiles = 132;
  p.sk_tiles = 60;
  p.sk_blocks = 132;
  p.sk_iters = 6720;
  struct Unit {
    int tile, k_begin, k_end;
  };
  const auto expect_units = [&](int block, std::vector<Unit> want) {
    ASSERT_EQ(kc::ch06::units_of_block(p, block), static_cast<int>(want.size())) << "block " << block;
    for (std::size_t u = 0; u < want.size(); ++u) {
      const kc::ch06::WorkUnit got = kc::ch06::unit_of_block(p, block, static_cast<int>(u));
      EXPECT_EQ(got.tile, want[u].tile) << "block " << block << " unit " << u;
      EXPECT_EQ(got.k_begin, want[u].k_begin) << "block " << block << " unit " << u;
      EXPECT_EQ(got.k_end, want[u].k_end) << "block " << block << " unit " << u;
    }
  };
  expect_units(0, {{0, 0, 112}, {132, 0, 50}});
  expect_units(1, {{1, 0, 112}, {132, 50, 101}});
  expect_units(2, {{2, 0, 112}, {133, 0, 40}, {132, 101, 112}});
  expect_units(131, {{131, 0, 112}, {191, 61, 112}});
}

// ---------------------------------------------------------------- GPU

const char* name_of(Scheduler s) {
  switch (s) {
    case Scheduler::static_round_robin: return "static";
    case Scheduler::dynamic_atomic: return "dynamic";
    case Scheduler::stream_k: return "stream_k";
    case Scheduler::split_k_tail: return "split_k_tail";
  }
  return "?";
}

constexpr Scheduler kAll[] = {Scheduler::static_round_robin, Scheduler::dynamic_atomic, Scheduler::stream_k,
                              Scheduler::split_k_tail};

// The schedulers that split tiles along K (and so match Chapter 5 within rounding, not bitwise).
bool splits_k(Scheduler s) { return s == Scheduler::stream_k || s == Scheduler::split_k_tail; }

// Runs Chapter 5's kernel (scheduler == nullptr) or the persistent one into a poisoned, guarded C.
std::vector<bf16> run_path(const Problem& p, const Scheduler* scheduler, std::size_t* guard_damage = nullptr,
                           int max_tail_percent = kc::ch06::kDefaultMaxTailPercent) {
  const DeviceProblem d(p);
  const bf16 *a = d.a.data(), *w = d.w.data();
  const std::int32_t* offsets = d.offsets.data();
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  if (scheduler == nullptr) {
    kc::DeviceBuffer<unsigned char> workspace(kc::ch05::grouped_gemm_workspace_bytes(p.shape));
    kc::ch05::grouped_gemm(p.shape, a, w, c.data(), offsets, workspace.data(), workspace.size());
  } else {
    kc::DeviceBuffer<unsigned char> workspace(kc::ch06::grouped_gemm_persistent_workspace_bytes(p.shape));
    kc::ch06::grouped_gemm_persistent_workspace_init(workspace.data(), workspace.size());
    kc::ch06::grouped_gemm_persistent(p.shape, a, w, c.data(), offsets, workspace.data(), workspace.size(),
                                      {*scheduler, kc::ch05::kDefaultGroupM, max_tail_percent});
  }
  kc::check(cudaDeviceSynchronize());
  if (guard_damage != nullptr) *guard_damage = c.guard_damage();
  return c.to_host();
}

class PersistentGpu : public kc::test::GpuTest {};

// Random group sizes of every kind, odd N and K: every scheduler against fp64 and Chapter 5.
TEST_F(PersistentGpu, EverySchedulerMatchesFp64AndChapter5) {
  const std::uint64_t seed = kc::test::test_seed();
  std::mt19937_64 rng(seed);
  const int trials = kc::test::small_tests_only() ? 2 : 8;
  for (int trial = 0; trial < trials; ++trial) {
    const int experts = 1 + static_cast<int>(rng() % 24);
    const std::vector<std::int32_t> sizes = random_sizes(rng, experts, 300);
    const std::int64_t n = trial % 2 == 0 ? 136 : 1 + static_cast<std::int64_t>(rng() % 300);
    const std::int64_t k = 8 * (1 + static_cast<std::int64_t>(rng() % 60));
    const Problem p = random_problem(sizes, n, k, seed + static_cast<std::uint64_t>(trial), trial % 3);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": E=" + std::to_string(experts) +
                 " rows=" + std::to_string(p.offsets.back()) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
    if (p.shape.m_total == 0) continue;
    const std::vector<bf16> chapter5 = run_path(p, nullptr);
    const std::vector<double> chapter5_d = kc::ref::widen(std::span<const bf16>(chapter5));
    const std::size_t rows_n = static_cast<std::size_t>(p.offsets.back() * n);
    for (Scheduler s : kAll) {
      for (int tail : {kc::ch06::kDefaultMaxTailPercent, 100}) {  // 100: Stream-K whenever there is a tail
        if (!splits_k(s) && tail == 100) continue;
        SCOPED_TRACE(std::string(name_of(s)) + " tail% " + std::to_string(tail));
        std::size_t damage = 0;
        const std::vector<bf16> got = run_path(p, &s, &damage, tail);
        EXPECT_EQ(damage, 0u) << "wrote past the end of c";
        expect_matches_fp64(p, got, seed);
        if (splits_k(s)) {
          kc::test::expect_close(
              kc::compare<bf16>(std::span<const bf16>(got).first(rows_n),
                                std::span<const double>(chapter5_d).first(rows_n), kc::test::kPoisonByte),
              kTolerance, "vs Chapter 5 (all elements)");
        } else {
          EXPECT_EQ(std::memcmp(got.data(), chapter5.data(), got.size() * sizeof(bf16)), 0)
              << "same tiles, same K order: bitwise Chapter 5";
        }
      }
    }
  }
}

// A tail case of the benchmark's kind, smaller K: 144 tiles, so Stream-K splits on any GPU with
// fewer than 144 slots; all elements against Chapter 5.
TEST_F(PersistentGpu, TailCaseMatchesChapter5) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  const Problem p = random_problem({384, 384, 384}, 2048, 1024, kc::test::test_seed());
  const std::vector<bf16> chapter5 = run_path(p, nullptr);
  const std::vector<double> chapter5_d = kc::ref::widen(std::span<const bf16>(chapter5));
  for (Scheduler s : kAll) {
    SCOPED_TRACE(name_of(s));
    const std::vector<bf16> got = run_path(p, &s, nullptr, 100);
    expect_matches_fp64(p, got, 11);
    kc::test::expect_close(kc::compare<bf16>(got, chapter5_d, kc::test::kPoisonByte), kTolerance, "vs Chapter 5");
  }
}

// A launch leaves every counter it used at zero (the last ticket's drawer and each owner warp reset
// theirs), so one workspace, zeroed once when new, serves launches of any shape and grid in a row:
// here the tail case (every block in a split tile's range), a small problem (a grid of a few
// blocks) and a mid-sized one, every scheduler, in turns. Each
// result matches Chapter 5, and the counters read back all zero after every launch.
TEST_F(PersistentGpu, CountersComeBackZero) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  const std::uint64_t seed = kc::test::test_seed();
  const Problem problems[] = {random_problem({384, 384, 384, 384}, 2048, 1024, seed),
                              random_problem({5, 0, 130}, 136, 520, seed + 1),
                              random_problem({300, 1, 0, 257, 64}, 1000, 776, seed + 2)};
  std::size_t bytes = 0;
  for (const Problem& p : problems) bytes = std::max(bytes, kc::ch06::grouped_gemm_persistent_workspace_bytes(p.shape));
  kc::DeviceBuffer<std::int32_t> workspace(bytes / sizeof(std::int32_t));
  kc::ch06::grouped_gemm_persistent_workspace_init(workspace.data(), workspace.bytes());
  const std::size_t counter_words = kc::ch06::workspace_counter_bytes() / sizeof(std::int32_t);
  std::vector<std::vector<double>> chapter5;  // each problem's C from Chapter 5, computed once
  for (const Problem& p : problems) chapter5.push_back(kc::ref::widen(std::span<const bf16>(run_path(p, nullptr))));
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < std::size(problems); ++i) {
      const Problem& p = problems[i];
      const std::vector<double>& chapter5_d = chapter5[i];
      kc::DeviceBuffer<bf16> a(p.a), w(p.w);
      kc::DeviceBuffer<std::int32_t> offsets(p.offsets);
      for (Scheduler s : kAll) {
        SCOPED_TRACE(std::string(name_of(s)) + " E=" + std::to_string(p.shape.experts) + " round " +
                     std::to_string(round));
        kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
        kc::ch06::grouped_gemm_persistent(p.shape, a.data(), w.data(), c.data(), offsets.data(), workspace.data(),
                                          workspace.bytes(), {s, kc::ch05::kDefaultGroupM, 100});
        kc::check(cudaDeviceSynchronize());
        const std::vector<bf16> got = c.to_host();
        kc::test::expect_close(kc::compare<bf16>(got, chapter5_d, kc::test::kPoisonByte), kTolerance, "vs Chapter 5");
        const std::vector<std::int32_t> words = workspace.to_host();
        EXPECT_EQ(std::count(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(counter_words), 0),
                  static_cast<std::ptrdiff_t>(counter_words))
            << "a counter was left non-zero";
      }
    }
  }
}

TEST_F(PersistentGpu, AllExpertsEmpty) {
  const Problem p = random_problem(std::vector<std::int32_t>(16, 0), 64, 64, 1, 40);
  for (Scheduler s : kAll) {
    expect_all_poisoned(run_path(p, &s), name_of(s));
  }
}

TEST_F(PersistentGpu, BadArgumentsWriteNothing) {
  const Problem p = random_problem({5, 0, 7}, 32, 64, 3);
  const DeviceProblem d(p);
  const bf16 *a = d.a.data(), *w = d.w.data();
  const std::int32_t* offsets = d.offsets.data();
  kc::DeviceBuffer<unsigned char> workspace(kc::ch06::grouped_gemm_persistent_workspace_bytes(p.shape));
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  expect_invalid_argument(
      [&] {
        kc::ch06::grouped_gemm_persistent(p.shape, a, w, c.data(), offsets, workspace.data(), workspace.size(),
                                          {Scheduler::stream_k, 0});
      },
      "options.group_m (0) must be >= 1");
  expect_invalid_argument(
      [&] {
        kc::ch06::grouped_gemm_persistent(p.shape, a, w, c.data(), offsets, workspace.data(), workspace.size() - 256);
      },
      "must be >= ");
  expect_invalid_argument(
      [&] {
        kc::ch06::grouped_gemm_persistent({p.shape.m_total, p.shape.n, 12, 3}, a, w, c.data(), offsets,
                                          workspace.data(), workspace.size());
      },
      "shape.k (12) must be a multiple of 8");
  kc::check(cudaDeviceSynchronize());
  expect_all_poisoned(c.to_host(), "a rejected call wrote c");
}

// Every scheduler neither allocates nor synchronises, and repeats bit for bit (Stream-K included:
// each split tile's owner adds its partners' partials in a fixed order whoever finishes first).
TEST_F(PersistentGpu, GraphCapturableAndBitwiseRepeatable) {
  const Problem p = random_problem({130, 0, 1, 257, 64, 384, 384}, 1000, 520, kc::test::test_seed());
  const DeviceProblem d(p);
  kc::DeviceBuffer<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  kc::DeviceBuffer<unsigned char> workspace(kc::ch06::grouped_gemm_persistent_workspace_bytes(p.shape));
  kc::ch06::grouped_gemm_persistent_workspace_init(workspace.data(), workspace.size());
  for (Scheduler s : kAll) {
    SCOPED_TRACE(name_of(s));
    const PersistentOptions options{s, kc::ch05::kDefaultGroupM, 100};
    const auto launch = [&](cudaStream_t stream) {
      kc::ch06::grouped_gemm_persistent(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), workspace.data(),
                                        workspace.size(), options, stream);
    };
    // The first call on a device sets the attributes and queries occupancy: outside the capture.
    launch(nullptr);
    kc::check(cudaDeviceSynchronize());
    const kc::test::LaunchUnderTest run{launch, [&] { c.fill_bytes(kc::test::kPoisonByte); },
                                        [&] { return bytes_of(c); }};
    kc::test::expect_graph_capturable(run);
    kc::test::expect_bitwise_repeatable(run, 5);
  }
}

}  // namespace
