// Chapter 8 on the GPU: every step against the fp64 reference from the bf16 inputs, bitwise against
// each other and against the `before` loop (Chapter 7's kernel per expert: the same wgmma sequence
// over K), and against Chapter 5's one launch within tolerance (mma.sync sums in another order). The
// issue's group sizes, odd N and K, empty experts, rows past offsets[E], NaN rows, the epilogues,
// graph capture, bitwise reruns, and rejected calls that write nothing. Skipped off sm_90.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grouped_epilogue_checks.hpp"
#include "grouped_gemm_problems.hpp"
#include "hopper_gemm_checks.hpp"
#include "hopper_grouped_gemm.hpp"
#include "kc/check.hpp"
#include "kc/device_buffer.hpp"
#include "kc/test_support.hpp"

namespace {

using kc::ch08::EpilogueKind;
using kc::ch08::GroupedEpilogue;
using kc::ch08::GroupedStep;
using kc::test::grouped::bf16;
using kc::test::grouped::bytes_of;
using kc::test::grouped::DeviceProblem;
using kc::test::grouped::expect_all_poisoned;
using kc::test::grouped::expect_matches_fp64;
using kc::test::grouped::kTolerance;
using kc::test::grouped::Problem;
using kc::test::grouped::random_problem;

constexpr auto& kSteps = kc::ch08::kGroupedSteps;

// The sizes the issue names: empty experts between every boundary case of a 128-row tile.
const std::vector<std::int32_t> kIssueSizes = {0, 0, 1, 63, 64, 65, 127, 128, 129, 0, 255, 256, 257, 1, 0};

// One launch of a step (or `after` when step is empty) into a poisoned, guarded C; returns C.
struct StepRun {
  std::vector<bf16> c;
  std::size_t guard_damage = 0;
};

StepRun run_step(const Problem& p, std::optional<GroupedStep> step, const GroupedEpilogue& epilogue = {},
                 const std::vector<float>* row_scale = nullptr) {
  const DeviceProblem d(p);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(p.shape));
  kc::DeviceBuffer<float> scale(row_scale != nullptr ? *row_scale : std::vector<float>(1));
  GroupedEpilogue e = epilogue;
  if (e.kind == EpilogueKind::row_scale) e.row_scale = scale.data();
  const std::int64_t n_out = kc::ch08::output_columns(p.shape.n, e.kind);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * n_out));
  if (step) {
    kc::ch08::grouped_gemm_hopper_step(*step, p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), e,
                                       workspace.data(), workspace.size());
  } else {
    kc::ch08::grouped_gemm_hopper(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), e, workspace.data(),
                                  workspace.size());
  }
  kc::check(cudaDeviceSynchronize());
  return {c.to_host(), c.guard_damage()};
}

// Chapter 7's kernel per expert (the chapter's `before`), into a poisoned C.
std::vector<bf16> run_loop(const Problem& p) {
  const DeviceProblem d(p);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  kc::ch08::grouped_gemm_hopper_loop(p.shape, d.a.data(), d.w.data(), c.data(), p.offsets);
  kc::check(cudaDeviceSynchronize());
  return c.to_host();
}

// Chapter 5's `after` (mma.sync, wide tile) into a poisoned C.
std::vector<bf16> run_ch05(const Problem& p) {
  const DeviceProblem d(p);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch05::grouped_gemm_workspace_bytes(p.shape));
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  kc::ch05::grouped_gemm(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), workspace.data(),
                         workspace.size(),
                         {kc::ch05::TileOrder::grouped, kc::ch05::kDefaultGroupM, kc::ch05::GroupedTile::wide_128x256});
  kc::check(cudaDeviceSynchronize());
  return c.to_host();
}

bool same_bytes(const std::vector<bf16>& x, const std::vector<bf16>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(bf16)) == 0;
}

// Every step and `after` on one problem: fp64 (sampled, rows past offsets[E] still poisoned), no guard
// damage, every one bitwise equal to step 1 and to the loop, Chapter 5 within tolerance.
void check_every_step(const Problem& p, std::uint64_t seed) {
  const std::vector<bf16> loop = run_loop(p);
  const std::vector<bf16> ch05 = run_ch05(p);
  expect_matches_fp64(p, loop, seed);
  const std::vector<double> ch05_d = kc::ref::widen(std::span<const bf16>(ch05));
  std::vector<bf16> first;
  std::vector<std::optional<GroupedStep>> runs(std::begin(kSteps), std::end(kSteps));
  runs.push_back(std::nullopt);  // `after`: the step after_step picks
  for (const std::optional<GroupedStep>& step : runs) {
    SCOPED_TRACE(step ? kc::ch08::to_string(*step) : "after");
    const StepRun run = run_step(p, step);
    EXPECT_EQ(run.guard_damage, 0u) << "wrote past the end of c";
    expect_matches_fp64(p, run.c, seed);
    EXPECT_TRUE(same_bytes(run.c, loop)) << "differs from Chapter 7's kernel per expert";
    if (first.empty()) first = run.c;
    EXPECT_TRUE(same_bytes(run.c, first)) << "differs from step 1";
    const std::size_t rows_n = static_cast<std::size_t>(p.offsets.back() * p.shape.n);
    kc::test::expect_close(kc::compare<bf16>(std::span<const bf16>(run.c).first(rows_n),
                                             std::span<const double>(ch05_d).first(rows_n), kc::test::kPoisonByte),
                           kTolerance, "vs Chapter 5's one launch");
  }
}

}  // namespace

class HopperGroupedGpu : public kc::test::hopper::HopperGpuTest {};

// The issue's group sizes, with three rows of no expert after them, N not a multiple of any tile,
// and K not a multiple of the K tile; then the smallest K.
TEST_F(HopperGroupedGpu, IssueSizesEveryStep) {
  const std::uint64_t seed = kc::test::test_seed();
  for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{1544, 7176}, {136, 8}, {264, 520}}) {
    SCOPED_TRACE("N=" + std::to_string(n) + " K=" + std::to_string(k));
    check_every_step(random_problem(kIssueSizes, n, k, seed, 3), seed);
  }
}

// Random group sizes of every kind (zeros, ones, a hot expert, Zipf), random N (multiples of 8 for the
// TMA stores) and K.
TEST_F(HopperGroupedGpu, RandomSizesEveryStep) {
  const std::uint64_t seed = kc::test::test_seed();
  std::mt19937_64 rng(seed);
  const int trials = kc::test::small_tests_only() ? 2 : 6;
  for (int trial = 0; trial < trials; ++trial) {
    const int experts = 1 + static_cast<int>(rng() % 40);
    const std::vector<std::int32_t> sizes = kc::test::grouped::random_sizes(rng, experts, 300);
    const std::int64_t n = 8 * (1 + static_cast<std::int64_t>(rng() % 80));
    const std::int64_t k = 8 * (1 + static_cast<std::int64_t>(rng() % 100));
    const Problem p = random_problem(sizes, n, k, seed + static_cast<std::uint64_t>(trial), trial % 3);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": E=" + std::to_string(experts) +
                 " rows=" + std::to_string(p.offsets.back()) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
    if (p.offsets.back() == 0) continue;
    check_every_step(p, seed);
  }
}

// Decode-like and extreme shapes: one expert with one token, 256 experts with one token each, and a
// large skewed case (sampled).
TEST_F(HopperGroupedGpu, TinyAndLargeGroups) {
  const std::uint64_t seed = kc::test::test_seed();
  check_every_step(random_problem({1}, 256, 64, seed), seed);
  check_every_step(random_problem(std::vector<std::int32_t>(256, 1), 512, 256, seed), seed);
  if (kc::test::small_tests_only()) return;
  std::vector<std::int32_t> sizes(64);
  for (int e = 0; e < 64; ++e) sizes[e] = e % 4 == 0 ? 0 : 4096 / (e + 1) + (e == 1 ? 3000 : 0);
  check_every_step(random_problem(sizes, 4096, 1024, seed), seed);
}

// `after` on either side of its rule: fewer than 256 rows per expert on average (step 5), and more
// (step 4).
TEST_F(HopperGroupedGpu, AfterOnEitherSideOfItsRule) {
  const std::uint64_t seed = kc::test::test_seed();
  const Problem few = random_problem({130, 0, 1, 257, 64}, 136, 72, seed, 2);
  const Problem many = random_problem({300, 0, 513}, 136, 72, seed, 2);
  ASSERT_EQ(kc::ch08::after_step(few.shape), GroupedStep::block_per_tile);
  ASSERT_EQ(kc::ch08::after_step(many.shape), GroupedStep::a_evict_last);
  check_every_step(few, seed);
  check_every_step(many, seed);
}

// Every expert empty: nothing written, by any step (and no hang: the kernel sees 0 tiles).
TEST_F(HopperGroupedGpu, AllExpertsEmpty) {
  const Problem p = random_problem(std::vector<std::int32_t>(16, 0), 64, 64, 1, 40);
  for (GroupedStep step : kSteps) expect_all_poisoned(run_step(p, step).c, kc::ch08::to_string(step));
}

// A NaN in one row of A reaches that row of C only.
TEST_F(HopperGroupedGpu, NanStaysInItsRow) {
  Problem p = random_problem({70, 0, 200, 3}, 264, 200, kc::test::test_seed());
  const std::int64_t nan_row = 71;  // expert 2's second row
  p.a[static_cast<std::size_t>(nan_row * p.shape.k + 17)] = __float2bfloat16(NAN);
  for (GroupedStep step : kSteps) {
    SCOPED_TRACE(kc::ch08::to_string(step));
    const std::vector<bf16> c = run_step(p, step).c;
    for (std::int64_t r = 0; r < p.offsets.back(); ++r) {
      int nans = 0;
      for (std::int64_t col = 0; col < p.shape.n; ++col) {
        nans += std::isnan(kc::to_double(c[static_cast<std::size_t>(r * p.shape.n + col)])) ? 1 : 0;
      }
      EXPECT_EQ(nans, r == nan_row ? p.shape.n : 0) << "row " << r;
    }
  }
}

// SwiGLU over [gate; up] and the per-row scale, against fp64 from the bf16 inputs (sampled).
TEST_F(HopperGroupedGpu, EpiloguesMatchFp64) {
  const std::uint64_t seed = kc::test::test_seed();
  const Problem p = random_problem(kIssueSizes, 528, 392, seed, 5);
  std::vector<float> scale(static_cast<std::size_t>(p.shape.m_total));
  std::mt19937_64 rng(seed);
  for (float& s : scale) s = 0.25f + static_cast<float>(rng() % 1000) / 1000.0f;
  for (GroupedStep step : kSteps) {
    SCOPED_TRACE(kc::ch08::to_string(step));
    for (EpilogueKind kind : {EpilogueKind::swiglu, EpilogueKind::row_scale}) {
      SCOPED_TRACE(kind == EpilogueKind::swiglu ? "swiglu" : "row_scale");
      const StepRun run = run_step(p, step, {kind}, &scale);
      EXPECT_EQ(run.guard_damage, 0u);
      kc::test::grouped::expect_epilogue_matches_fp64(p, kind, scale, run.c);
    }
  }
}

// No allocation, no synchronisation: a CUDA graph captures the launch; reruns are bitwise identical.
TEST_F(HopperGroupedGpu, GraphCapturableAndRepeatable) {
  const Problem p = random_problem({130, 0, 1, 257, 64}, 200 * 8, 136, kc::test::test_seed(), 2);
  const DeviceProblem d(p);
  kc::DeviceBuffer<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(p.shape));
  for (GroupedStep step : kSteps) {
    SCOPED_TRACE(kc::ch08::to_string(step));
    const auto launch = [&](cudaStream_t stream) {
      kc::ch08::grouped_gemm_hopper_step(step, p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), {},
                                         workspace.data(), workspace.size(), stream);
    };
    launch(nullptr);  // the first call per device sets the kernel's attributes: outside the capture
    kc::check(cudaDeviceSynchronize());
    const kc::test::LaunchUnderTest run{launch, [&] { c.fill_bytes(kc::test::kPoisonByte); },
                                        [&] { return bytes_of(c); }};
    kc::test::expect_graph_capturable(run);
    kc::test::expect_bitwise_repeatable(run);
  }
}

// Rejected calls launch nothing: the poisoned output stays poisoned.
TEST_F(HopperGroupedGpu, BadArgumentsWriteNothing) {
  const Problem p = random_problem({5, 0, 7}, 36, 64, 3);
  const DeviceProblem d(p);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(p.shape));
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n) + 8);
  kc::test::expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), {}, workspace.data(),
                                      workspace.size());
      },
      "must be a multiple of 8");
  kc::test::expect_invalid_argument(
      [&] {
        kc::ch08::grouped_gemm_hopper_step(GroupedStep::masked_store, p.shape, d.a.data(), d.w.data(), c.data(),
                                           d.offsets.data(), {}, workspace.data(), workspace.size() - 1);
      },
      "workspace_bytes");
  kc::check(cudaDeviceSynchronize());
  expect_all_poisoned(c.to_host(), "a rejected call wrote c");
}
