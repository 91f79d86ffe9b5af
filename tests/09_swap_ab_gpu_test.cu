// Chapter 9 on the GPU: every swapped step and the dispatching `after` against the fp64 reference from
// the bf16 inputs, and bitwise against Chapter 8's `after` (the same bf16 products summed by wgmma in
// the same K order). Every token count from 0 to 72 per expert, mixed sizes in one call, all experts
// empty, 256 experts of one token, 1024 experts, rows past offsets[E], NaN rows, the epilogues, graph
// capture, bitwise reruns, guard regions around C, and rejected calls that write nothing. Skipped off
// sm_90.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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
#include "swap_ab.hpp"

namespace {

using kc::ch09::EpilogueKind;
using kc::ch09::GroupedEpilogue;
using kc::ch09::SwapStep;
using kc::test::grouped::bf16;
using kc::test::grouped::bytes_of;
using kc::test::grouped::DeviceProblem;
using kc::test::grouped::expect_all_poisoned;
using kc::test::grouped::expect_matches_fp64;
using kc::test::grouped::kTolerance;
using kc::test::grouped::Problem;
using kc::test::grouped::random_problem;

constexpr SwapStep kSteps[] = {SwapStep::swapped_operands, SwapStep::deep_pipeline, SwapStep::token_tile};

// What a launch runs: a swapped step, the dispatching `after`, or Chapter 8's `after`.
enum class Kernel { step1, step2, step3, after, ch08_after };
constexpr Kernel kSwappedKernels[] = {Kernel::step1, Kernel::step2, Kernel::step3, Kernel::after};

std::string name_of(Kernel kernel) {
  switch (kernel) {
    case Kernel::step1: return kc::ch09::to_string(SwapStep::swapped_operands);
    case Kernel::step2: return kc::ch09::to_string(SwapStep::deep_pipeline);
    case Kernel::step3: return kc::ch09::to_string(SwapStep::token_tile);
    case Kernel::after: return "after";
    case Kernel::ch08_after: return "ch08 after";
  }
  return "?";
}

// One launch into a poisoned, guarded C.
struct Output {
  std::vector<bf16> c;
  std::size_t guard_damage = 0;
};

Output run(const Problem& p, Kernel kernel, const GroupedEpilogue& epilogue = {},
           const std::vector<float>* row_scale = nullptr) {
  const DeviceProblem d(p);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(p.shape));
  kc::DeviceBuffer<float> scale(row_scale != nullptr ? *row_scale : std::vector<float>(1));
  GroupedEpilogue e = epilogue;
  if (e.kind == EpilogueKind::row_scale) e.row_scale = scale.data();
  const std::int64_t n_out = kc::ch08::output_columns(p.shape.n, e.kind);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * n_out));
  switch (kernel) {
    case Kernel::step1:
    case Kernel::step2:
    case Kernel::step3:
      kc::ch09::grouped_gemm_swap_ab(kSteps[static_cast<int>(kernel)], p.shape, d.a.data(), d.w.data(), c.data(),
                                     d.offsets.data(), e);
      break;
    case Kernel::after:
      kc::ch09::grouped_gemm_decode(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), e, workspace.data(),
                                    workspace.size());
      break;
    case Kernel::ch08_after:
      kc::ch08::grouped_gemm_hopper(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), e, workspace.data(),
                                    workspace.size());
      break;
  }
  kc::check(cudaDeviceSynchronize());
  return {c.to_host(), c.guard_damage()};
}

bool same_bytes(const std::vector<bf16>& x, const std::vector<bf16>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(bf16)) == 0;
}

// Every swapped kernel on one problem: fp64 (sampled; rows past offsets[E] still poisoned), no guard
// damage, bitwise equal to Chapter 8's `after`.
void check_every_kernel(const Problem& p, std::uint64_t seed) {
  const std::vector<bf16> ch08 = run(p, Kernel::ch08_after).c;
  for (Kernel kernel : kSwappedKernels) {
    SCOPED_TRACE(name_of(kernel));
    const Output got = run(p, kernel);
    EXPECT_EQ(got.guard_damage, 0u) << "wrote past the end of c";
    expect_matches_fp64(p, got.c, seed);
    EXPECT_TRUE(same_bytes(got.c, ch08)) << "differs from Chapter 8's after";
  }
}

}  // namespace

class SwapAbGpu : public kc::test::hopper::HopperGpuTest {};

// Every token count from 0 to 72 per expert (three experts of it, and a fourth of one token), N not
// a multiple of 128 and K not a multiple of 64, two rows of no expert after them.
TEST_F(SwapAbGpu, EveryTokenCountUpTo72) {
  const std::uint64_t seed = kc::test::test_seed();
  const int step = kc::test::small_tests_only() ? 9 : 1;
  for (int m = 0; m <= 72; m += step) {
    SCOPED_TRACE("M=" + std::to_string(m));
    const Problem p = random_problem({m, m, 1, m}, 200, 136, seed + static_cast<std::uint64_t>(m), 2);
    check_every_kernel(p, seed);
  }
}

// The issue's mixed sizes in one call, with empty experts between them, at a DeepSeek-V3-like K.
TEST_F(SwapAbGpu, MixedSizesInOneCall) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::vector<std::int32_t> sizes = {0, 1, 7, 8, 9, 0, 15, 16, 17, 31, 32, 33, 63, 64, 65, 0, 2};
  const std::int64_t k = kc::test::small_tests_only() ? 264 : 7176;
  check_every_kernel(random_problem(sizes, 392, k, seed, 3), seed);
  // Past the crossover (165 tokens per expert on average) `after` runs Chapter 8's kernel.
  check_every_kernel(random_problem({300, 0, 129, 231}, 392, 264, seed + 1, 1), seed);
}

// Decode-like extremes: 256 experts of one token each, 1024 experts (the block's prefix scan over 32
// chunks) of zero to two tokens, and random sizes of every kind.
TEST_F(SwapAbGpu, ManyExpertsAndRandomSizes) {
  const std::uint64_t seed = kc::test::test_seed();
  check_every_kernel(random_problem(std::vector<std::int32_t>(256, 1), 256, 128, seed), seed);
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> many(1024);
  for (std::int32_t& s : many) s = static_cast<std::int32_t>(rng() % 3);
  check_every_kernel(random_problem(many, 136, 64, seed + 1, 1), seed);
  const int trials = kc::test::small_tests_only() ? 1 : 5;
  for (int trial = 0; trial < trials; ++trial) {
    const int experts = 1 + static_cast<int>(rng() % 60);
    const std::vector<std::int32_t> sizes = kc::test::grouped::random_sizes(rng, experts, 40);
    const std::int64_t n = 8 * (1 + static_cast<std::int64_t>(rng() % 60));
    const std::int64_t k = 8 * (1 + static_cast<std::int64_t>(rng() % 60));
    const Problem p = random_problem(sizes, n, k, seed + 2 + static_cast<std::uint64_t>(trial), trial % 3);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": E=" + std::to_string(experts) + " N=" + std::to_string(n) +
                 " K=" + std::to_string(k));
    if (p.offsets.back() > 0) check_every_kernel(p, seed);
  }
}

// Every expert empty: nothing written, by any kernel (and no hang: the kernel sees 0 tiles).
TEST_F(SwapAbGpu, AllExpertsEmpty) {
  const Problem p = random_problem(std::vector<std::int32_t>(16, 0), 64, 64, 1, 40);
  for (Kernel kernel : kSwappedKernels) expect_all_poisoned(run(p, kernel).c, name_of(kernel));
}

// A NaN in one row of A reaches that row of C only: the token is one column of the swapped product.
TEST_F(SwapAbGpu, NanStaysInItsRow) {
  Problem p = random_problem({5, 0, 9, 3}, 264, 200, kc::test::test_seed());
  const std::int64_t nan_row = 6;  // expert 2's second row
  p.a[static_cast<std::size_t>(nan_row * p.shape.k + 17)] = __float2bfloat16(NAN);
  for (Kernel kernel : kSwappedKernels) {
    SCOPED_TRACE(name_of(kernel));
    const std::vector<bf16> c = run(p, kernel).c;
    for (std::int64_t r = 0; r < p.offsets.back(); ++r) {
      int nans = 0;
      for (std::int64_t col = 0; col < p.shape.n; ++col) {
        nans += std::isnan(kc::to_double(c[static_cast<std::size_t>(r * p.shape.n + col)])) ? 1 : 0;
      }
      EXPECT_EQ(nans, r == nan_row ? p.shape.n : 0) << "row " << r;
    }
  }
}

// SwiGLU over [gate; up] and the per-row scale: bitwise equal to Chapter 8's (same formula, same
// accumulators) and close to fp64 (sampled), nothing written past the experts' rows.
TEST_F(SwapAbGpu, EpiloguesMatchChapter8AndFp64) {
  const std::uint64_t seed = kc::test::test_seed();
  const Problem p = random_problem({3, 0, 17, 64, 1, 40}, 528, 392, seed, 5);
  std::vector<float> scale(static_cast<std::size_t>(p.shape.m_total));
  std::mt19937_64 rng(seed);
  for (float& s : scale) s = 0.25f + static_cast<float>(rng() % 1000) / 1000.0f;
  for (EpilogueKind kind : {EpilogueKind::swiglu, EpilogueKind::row_scale}) {
    SCOPED_TRACE(kind == EpilogueKind::swiglu ? "swiglu" : "row_scale");
    const std::vector<bf16> ch08 = run(p, Kernel::ch08_after, {kind}, &scale).c;
    for (Kernel kernel : kSwappedKernels) {
      SCOPED_TRACE(name_of(kernel));
      const Output got = run(p, kernel, {kind}, &scale);
      EXPECT_EQ(got.guard_damage, 0u);
      EXPECT_TRUE(same_bytes(got.c, ch08)) << "differs from Chapter 8's after";
      kc::test::grouped::expect_epilogue_matches_fp64(p, kind, scale, got.c);
    }
  }
}

// No allocation, no synchronisation: a CUDA graph captures the launch; reruns are bitwise identical.
TEST_F(SwapAbGpu, GraphCapturableAndRepeatable) {
  const Problem p = random_problem({13, 0, 1, 70, 8}, 40 * 8, 136, kc::test::test_seed(), 2);
  const DeviceProblem d(p);
  kc::DeviceBuffer<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n));
  kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(p.shape));
  for (Kernel kernel : kSwappedKernels) {
    SCOPED_TRACE(name_of(kernel));
    const auto launch = [&](cudaStream_t stream) {
      if (kernel == Kernel::after) {
        kc::ch09::grouped_gemm_decode(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), {}, workspace.data(),
                                      workspace.size(), stream);
      } else {
        kc::ch09::grouped_gemm_swap_ab(kSteps[static_cast<int>(kernel)], p.shape, d.a.data(), d.w.data(), c.data(),
                                       d.offsets.data(), {}, stream);
      }
    };
    launch(nullptr);  // the first call per device sets the kernel's attributes: outside the capture
    kc::check(cudaDeviceSynchronize());
    const kc::test::LaunchUnderTest under_test{launch, [&] { c.fill_bytes(kc::test::kPoisonByte); },
                                               [&] { return bytes_of(c); }};
    kc::test::expect_graph_capturable(under_test);
    kc::test::expect_bitwise_repeatable(under_test);
  }
}

// Rejected calls launch nothing: the poisoned output stays poisoned.
TEST_F(SwapAbGpu, BadArgumentsWriteNothing) {
  const Problem p = random_problem({5, 0, 7}, 36, 64, 3);
  const DeviceProblem d(p);
  kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(p.shape));
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(p.shape.m_total * p.shape.n) + 8);
  kc::test::expect_invalid_argument(
      [&] {
        kc::ch09::grouped_gemm_swap_ab(SwapStep::token_tile, p.shape, d.a.data(), d.w.data(), c.data(),
                                       d.offsets.data(), {});
      },
      "must be a multiple of 8 for the transposed store");
  kc::test::expect_invalid_argument(
      [&] {
        kc::ch09::grouped_gemm_decode(p.shape, d.a.data(), d.w.data(), c.data(), d.offsets.data(), {}, workspace.data(),
                                      workspace.size());
      },
      "must be a multiple of 8");
  kc::check(cudaDeviceSynchronize());
  expect_all_poisoned(c.to_host(), "a rejected call wrote c");
}

// A gathered from another matrix (grouped_gemm_decode_gather: row r of A is row rows[r] of x, Chapter
// 10's fused permutation): bitwise what grouped_gemm_decode gives on the copied rows, through the
// swapped kernel (few tokens per expert) and Chapter 8's (many), plain and SwiGLU; rows past the
// tile's tokens and repeated source rows included.
TEST_F(SwapAbGpu, GatheredRowsMatchTheCopy) {
  const std::uint64_t seed = kc::test::test_seed();
  const std::vector<std::vector<std::int32_t>> size_sets = {
      {1, 0, 5, 2, 9}, {3, 40, 0, 64, 17}, {300, 0, 129, 1}};  // the last: Chapter 8's kernel
  for (const std::vector<std::int32_t>& sizes : size_sets) {
    for (EpilogueKind kind : {EpilogueKind::plain, EpilogueKind::swiglu}) {
      Problem p = random_problem(sizes, 272, 200, seed, 0);
      const std::int64_t x_rows = 37;
      std::vector<bf16> x(static_cast<std::size_t>(x_rows * p.shape.k));
      kc::fill_uniform(std::span<bf16>(x), seed + 7);
      std::vector<std::int32_t> rows(static_cast<std::size_t>(p.shape.m_total));
      std::mt19937 gen(static_cast<std::uint32_t>(seed));
      for (std::int32_t& r : rows) r = static_cast<std::int32_t>(gen() % x_rows);
      for (std::size_t r = 0; r < rows.size(); ++r) {
        std::copy_n(x.begin() + rows[r] * p.shape.k, p.shape.k, p.a.begin() + static_cast<std::int64_t>(r) * p.shape.k);
      }
      SCOPED_TRACE("M=" + std::to_string(p.shape.m_total) + (kind == EpilogueKind::swiglu ? " swiglu" : " plain"));
      const GroupedEpilogue e{kind};
      const std::vector<bf16> copied = run(p, Kernel::after, e).c;
      const DeviceProblem d(p);
      const kc::DeviceBuffer<bf16> d_x(x);
      const kc::DeviceBuffer<std::int32_t> d_rows(rows);
      kc::DeviceBuffer<unsigned char> workspace(kc::ch08::grouped_gemm_hopper_workspace_bytes(p.shape));
      kc::test::GuardedOutput<bf16> c(
          static_cast<std::size_t>(p.shape.m_total * kc::ch08::output_columns(p.shape.n, kind)));
      kc::ch09::grouped_gemm_decode_gather(p.shape, {d_x.data(), x_rows, d_rows.data()}, d.w.data(), c.data(),
                                           d.offsets.data(), e, workspace.data(), workspace.size());
      kc::check(cudaDeviceSynchronize());
      EXPECT_EQ(c.guard_damage(), 0u);
      EXPECT_TRUE(same_bytes(c.to_host(), copied)) << "the gathered rows differ from the copied ones";
      if (kind == EpilogueKind::plain) expect_matches_fp64(p, c.to_host(), seed);
    }
  }
}
