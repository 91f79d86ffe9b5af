// Chapter 3 tests: the fused epilogue (Chapter 2's GEMM with bias, activation, residual, SwiGLU),
// the unfused sequence, and cuBLASLt, against fp64 references. CPU tests (activations against known
// values, the references, argument rules, the layout helper, the lesson's arithmetic) run
// everywhere; GPU tests skip with a reason where there is no GPU.
//
// Tolerance: 1e-2 relative Frobenius (the course's bf16 rule). The fused path rounds once per output
// (2^-9 relative); the unfused path rounds after the GEMM and after each pass, and the activation is
// evaluated on a rounded input, so its error is a few times larger but still around 1e-3. A wrong
// activation (erf vs tanh GELU differ by up to ~1e-3 absolute, too little to see) is caught by the
// CPU tests of activate() instead; a missing bias or residual gives errors of order 1. A one-element
// output whose terms nearly cancel is measured against the terms instead (tolerance_for).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

// Angle brackets, as the chapter: the exercise build tests the skeleton's activation.cuh.
#include <activation.cuh>

#include "fused_epilogue.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"
#include "vendor_cublaslt.hpp"

namespace {

using bf16 = __nv_bfloat16;
using kc::ch02::GemmBf16Tile;
using kc::ch03::Activation;
using kc::ch03::Epilogue;
using kc::ch03::GemmShape;
using kc::test::expect_invalid_argument;

constexpr double kTolerance = 1e-2;  // see the top of the file
constexpr Activation kActivations[] = {Activation::none, Activation::relu, Activation::gelu_erf, Activation::gelu_tanh,
                                       Activation::silu};

struct alignas(16) HostBuffer {
  bf16 data[512];
};

// ---------------------------------------------------------------- CPU: references and activations

// Known values (computed independently: Φ(1) = 0.8413447460685429; tanh GELU and SiLU by hand).
TEST(FusedEpilogueReference, ActivationsAtKnownPoints) {
  EXPECT_DOUBLE_EQ(kc::ch03::activate_reference(-2.0, Activation::relu), 0.0);
  EXPECT_DOUBLE_EQ(kc::ch03::activate_reference(3.5, Activation::relu), 3.5);
  EXPECT_NEAR(kc::ch03::activate_reference(1.0, Activation::gelu_erf), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(kc::ch03::activate_reference(-1.0, Activation::gelu_erf), -0.15865525393145707, 1e-15);
  EXPECT_NEAR(kc::ch03::activate_reference(1.0, Activation::gelu_tanh), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(kc::ch03::activate_reference(1.0, Activation::silu), 0.7310585786300049, 1e-15);
  EXPECT_NEAR(kc::ch03::activate_reference(-1.0, Activation::silu), -0.2689414213699951, 1e-15);
  EXPECT_DOUBLE_EQ(kc::ch03::activate_reference(0.0, Activation::gelu_tanh), 0.0);
  EXPECT_DOUBLE_EQ(kc::ch03::activate_reference(0.25, Activation::none), 0.25);
  // The two GELUs differ, by a little: a kernel using the wrong one fails here, not in a GEMM test.
  EXPECT_GT(std::abs(kc::ch03::activate_reference(1.0, Activation::gelu_erf) -
                     kc::ch03::activate_reference(1.0, Activation::gelu_tanh)),
            1e-4);
}

// The fp32 activation the kernels run (activation.cuh, host side) against the fp64 reference, over
// [-10, 10]: within a few fp32 ulps relative, or 1e-6 absolute near zero.
TEST(FusedEpilogueReference, Fp32ActivationsMatchFp64) {
  for (Activation act : kActivations) {
    SCOPED_TRACE(kc::ch03::to_string(act));
    for (int i = -2000; i <= 2000; ++i) {
      const float x = static_cast<float>(i) * 0.005f;
      const double want = kc::ch03::activate_reference(x, act);
      const double got = kc::ch03::activate(x, act);
      ASSERT_NEAR(got, want, 1e-6 + 4e-7 * std::abs(want)) << "x = " << x;
    }
  }
  EXPECT_TRUE(std::isnan(kc::ch03::activate(std::numeric_limits<float>::quiet_NaN(), Activation::relu)))
      << "relu(NaN) is NaN, as in PyTorch";
  EXPECT_EQ(kc::ch03::activate(-200.0f, Activation::silu), 0.0f) << "e^200 overflows; silu must still give -0";
}

TEST(FusedEpilogueReference, LinearWithBiasAndResidual) {
  // A = [[1, 2]], W = [[1, 0], [0, 1], [1, 1]]: A·Wᵀ = [1, 2, 3].
  const std::vector<double> a = {1, 2}, w = {1, 0, 0, 1, 1, 1}, bias = {0.5, -3, 0}, res = {10, 20, 30};
  const auto plain = kc::ch03::linear_reference(a, w, {}, {}, Activation::none, 1, 3, 2);
  EXPECT_EQ(plain, (std::vector<double>{1, 2, 3}));
  const auto full = kc::ch03::linear_reference(a, w, bias, res, Activation::relu, 1, 3, 2);
  EXPECT_EQ(full, (std::vector<double>{11.5, 20, 33})) << "relu(1.5)+10, relu(-1)+20, relu(3)+30";
  expect_invalid_argument(
      [&] {
        kc::ch03::linear_reference(a, w, {bias.data(), 2}, {}, Activation::none, 1, 3, 2);
      },
      "bias must be empty or hold n elements");
}

TEST(FusedEpilogueReference, SwigluIsSiluGateTimesUp) {
  const std::vector<double> a = {1, -1}, wg = {2, 1}, wu = {3, 0}, bg = {0.5}, bu = {-1};
  const auto out = kc::ch03::swiglu_reference(a, wg, wu, bg, bu, 1, 1, 2);
  const double gate = 1.5, up = 2.0;
  EXPECT_NEAR(out[0], gate / (1 + std::exp(-gate)) * up, 1e-15);
}

TEST(FusedEpilogueLayout, InterleaveGateUp) {
  // Rows g0 g1 | u0 u1, k = 2 → g0 u0 g1 u1.
  const std::vector<int> halves = {1, 2, 3, 4, 10, 20, 30, 40};
  EXPECT_EQ(kc::ch03::interleave_gate_up<int>(halves, 2), (std::vector<int>{1, 2, 10, 20, 3, 4, 30, 40}));
  const std::vector<int> bias = {1, 2, 10, 20};
  EXPECT_EQ(kc::ch03::interleave_gate_up<int>(bias, 1), (std::vector<int>{1, 10, 2, 20}));
  expect_invalid_argument([&] { kc::ch03::interleave_gate_up<int>(std::span<const int>(halves.data(), 6), 2); },
                          "must hold an even number of rows");
}

// The lesson's arithmetic (README "The problem and its two numbers").
TEST(FusedEpiloguePrediction, ExtraPassBytes) {
  EXPECT_DOUBLE_EQ(kc::ch03::extra_pass_bytes(128, 4096), 4.0 * 128 * 4096);  // 2.1 MB
  HostBuffer b;
  Epilogue bias_gelu_res{b.data, Activation::gelu_tanh, b.data + 8, false};
  EXPECT_EQ(kc::ch03::extra_passes(bias_gelu_res), 2);
  EXPECT_EQ(kc::ch03::extra_passes({b.data, Activation::gelu_tanh, nullptr, false}), 1);
  EXPECT_EQ(kc::ch03::extra_passes({}), 0);
  EXPECT_EQ(kc::ch03::extra_passes({nullptr, Activation::silu, nullptr, true}), 1);
  // M = 128, N = 4096, K = 7168: W alone is 58.7 MB.
  const double bytes = kc::ch03::layer_min_bytes({128, 4096, 7168}, bias_gelu_res);
  EXPECT_DOUBLE_EQ(bytes, 2.0 * (128.0 * 7168 + 4096.0 * 7168 + 2 * 128.0 * 4096 + 4096));
  EXPECT_NEAR(kc::ch03::floor_seconds(bytes, 4.25e12) * 1e6, 14.74, 0.01);  // 62.7 MB at 4.25 TB/s
}

// ---------------------------------------------------------------- CPU: argument rules

TEST(FusedEpilogueArguments, ResidualAliasingRule) {
  HostBuffer a, w, c;
  const GemmShape s{4, 4, 8};  // c: 16 elements
  Epilogue e{nullptr, Activation::none, c.data, false};
  EXPECT_NO_THROW(kc::ch03::validate_linear_fused(a.data, w.data, c.data, s, e)) << "residual == c: allowed";
  e.residual = c.data + 1;
  expect_invalid_argument([&] { kc::ch03::validate_linear_fused(a.data, w.data, c.data, s, e); },
                          "epilogue.residual must be c itself or not overlap c at all");
  e.residual = c.data + 16;
  EXPECT_NO_THROW(kc::ch03::validate_linear_fused(a.data, w.data, c.data, s, e)) << "right after c: fine";
  // The unfused path cannot add c to itself: its GEMM overwrites c first.
  e.residual = c.data;
  expect_invalid_argument([&] { kc::ch03::validate_linear_unfused(a.data, w.data, c.data, s, e, nullptr); },
                          "epilogue.residual must not be c in the unfused path");
}

TEST(FusedEpilogueArguments, BiasAndActivationRules) {
  HostBuffer a, w, c;
  const GemmShape s{4, 4, 8};
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_fused(a.data, w.data, c.data, s, {c.data + 10, Activation::none, nullptr, false});
      },
      "epilogue.bias must not overlap c");
  const auto* odd = reinterpret_cast<const bf16*>(reinterpret_cast<const unsigned char*>(w.data) + 257);
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_fused(a.data, w.data, c.data, s, {odd, Activation::none, nullptr, false});
      },
      "epilogue.bias must be 2-byte aligned");
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_fused(a.data, w.data, c.data, s,
                                        {nullptr, static_cast<Activation>(9), nullptr, false});
      },
      "epilogue.activation (9) is not an Activation");
  // The GEMM's own rules still apply.
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_fused(a.data, w.data, c.data, {4, 4, 12}, {});
      },
      "shape.k (12) must be a multiple of 8");
}

TEST(FusedEpilogueArguments, SwigluRules) {
  HostBuffer a, w, c, scratch;
  const Epilogue swiglu{nullptr, Activation::silu, nullptr, true};
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_fused(a.data, w.data, c.data, {4, 5, 8}, swiglu);
      },
      "shape.n (5) must be even in SwiGLU mode");
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_fused(a.data, w.data, c.data, {4, 4, 8},
                                        {nullptr, Activation::gelu_tanh, nullptr, true});
      },
      "epilogue.activation (gelu_tanh) must be silu in SwiGLU mode");
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_fused(a.data, w.data, c.data, {4, 4, 8},
                                        {nullptr, Activation::silu, c.data + 64, true});
      },
      "epilogue.residual must be null in SwiGLU mode");
  // c holds M × N/2: c right after N/2 columns' worth of a is fine, one element earlier is not.
  EXPECT_NO_THROW(kc::ch03::validate_linear_fused(a.data, w.data, c.data, {4, 8, 8}, swiglu));
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_unfused(a.data, w.data, c.data, {4, 8, 8}, swiglu, nullptr);
      },
      "scratch must not be null in SwiGLU mode");
  expect_invalid_argument(
      [&] {
        kc::ch03::validate_linear_unfused(a.data, w.data, c.data, {4, 8, 8}, swiglu, scratch.data + 1);
      },
      "scratch must be 16-byte aligned");
  EXPECT_NO_THROW(kc::ch03::validate_linear_unfused(a.data, w.data, c.data, {4, 8, 8}, swiglu, scratch.data));
}

// Launch functions validate before any CUDA call: on a machine without a GPU they throw
// kc::InvalidArgument, not kc::CudaError.
TEST(FusedEpilogueArguments, LaunchesRejectBeforeAnyCudaCall) {
  HostBuffer a, w, c;
  const Epilogue e{nullptr, Activation::gelu_tanh, c.data + 1, false};
  expect_invalid_argument(
      [&] {
        kc::ch03::linear_fused(a.data, w.data, c.data, {4, 4, 8}, e);
      },
      "epilogue.residual must be c itself or not overlap c at all");
  expect_invalid_argument(
      [&] {
        kc::ch03::linear_unfused(a.data, w.data, c.data, {4, 4, 8}, e);
      },
      "epilogue.residual must be c itself or not overlap c at all");
  expect_invalid_argument([&] { kc::ch03::bias_activation(c.data, nullptr, 0, 4, Activation::relu); },
                          "m (0) must be >= 1");
  expect_invalid_argument([&] { kc::ch03::add_residual(c.data, nullptr, 4, 4); }, "residual must not be null");
  expect_invalid_argument([&] { kc::ch03::silu_and_mul(c.data, c.data + 4, 2, 4); }, "out must not overlap gate_up");
  expect_invalid_argument(
      [&] {
        kc::ch03::linear_fused_with_tile(a.data, w.data, c.data, {4, 5, 8}, {nullptr, Activation::silu, nullptr, true},
                                         GemmBf16Tile::small);
      },
      "shape.n (5) must be even");
}

// ---------------------------------------------------------------- GPU

struct Problem {
  GemmShape shape;
  std::vector<bf16> a, w, bias, residual;
};

Problem random_problem(GemmShape s, std::uint64_t seed) {
  Problem p{s, std::vector<bf16>(static_cast<std::size_t>(s.m * s.k)),
            std::vector<bf16>(static_cast<std::size_t>(s.n * s.k)), std::vector<bf16>(static_cast<std::size_t>(s.n)),
            std::vector<bf16>(static_cast<std::size_t>(s.m * s.n))};
  kc::fill_uniform(std::span<bf16>(p.a), seed);
  kc::fill_uniform(std::span<bf16>(p.w), seed + 1, -0.25, 0.25);  // keeps A·Wᵀ of order 1, where GELU bends
  kc::fill_uniform(std::span<bf16>(p.bias), seed + 2);
  kc::fill_uniform(std::span<bf16>(p.residual), seed + 3);
  return p;
}

std::vector<double> widen(const std::vector<bf16>& v) { return kc::ref::widen(std::span<const bf16>(v)); }

std::string name_of(GemmShape s, bool bias, Activation act, bool residual) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + (bias ? "_bias_" : "_") +
         kc::ch03::to_string(act) + (residual ? "_res" : "");
}

enum class Path { fused, unfused };

double frobenius(std::span<const double> v) {
  double sum = 0.0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

// The tolerance for an output that sums the product, the bias and the residual. Each term carries a
// rounding error of its own size (the unfused path stores bf16 between its passes; GELU(tanh) uses
// tanh.approx). Over many outputs those errors average out in the Frobenius norm and the course's
// 1e-2 rule holds with a wide margin. A handful of outputs does not average: where the terms of a
// one-element output (M = N = 1) nearly cancel, the output is small next to them and correct code
// can miss 1e-2. So below kAveragedOutputs elements the rule is measured against the size of the
// terms, ||A·Wᵀ|| + ||bias|| + ||residual||, when that exceeds the output's; larger outputs keep the
// plain 1e-2. A missing bias or residual, an error of order 1, fails either way.
constexpr std::size_t kAveragedOutputs = 64;

double tolerance_for(const Problem& p, bool use_bias, bool use_residual, std::span<const double> want) {
  if (want.size() >= kAveragedOutputs) return kTolerance;
  const GemmShape s = p.shape;
  const std::vector<double> product =
      kc::ch03::linear_reference(widen(p.a), widen(p.w), {}, {}, Activation::none, s.m, s.n, s.k);
  double terms = frobenius(product);
  if (use_bias) terms += std::sqrt(static_cast<double>(s.m)) * frobenius(widen(p.bias));
  if (use_residual) terms += frobenius(widen(p.residual));
  const double output = frobenius(want);
  return output > 0.0 ? kTolerance * std::max(1.0, terms / output) : kTolerance;
}

// One launch of `path` with the given options on a poisoned, guarded output, checked against fp64.
void check_linear(const Problem& p, bool use_bias, Activation act, bool use_residual, Path path,
                  const GemmBf16Tile* tile = nullptr) {
  const GemmShape s = p.shape;
  SCOPED_TRACE(name_of(s, use_bias, act, use_residual) + (path == Path::fused ? " fused" : " unfused"));
  kc::DeviceBuffer<bf16> a(p.a), w(p.w), bias(p.bias), residual(p.residual);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  const Epilogue e{use_bias ? bias.data() : nullptr, act, use_residual ? residual.data() : nullptr, false};
  if (path == Path::unfused) {
    kc::ch03::linear_unfused(a.data(), w.data(), c.data(), s, e);
  } else if (tile != nullptr) {
    kc::ch03::linear_fused_with_tile(a.data(), w.data(), c.data(), s, e, *tile);
  } else {
    kc::ch03::linear_fused(a.data(), w.data(), c.data(), s, e);
  }
  const std::vector<bf16> got = c.to_host();
  const std::vector<double> want =
      kc::ch03::linear_reference(widen(p.a), widen(p.w), use_bias ? widen(p.bias) : std::vector<double>{},
                                 use_residual ? widen(p.residual) : std::vector<double>{}, act, s.m, s.n, s.k);
  kc::test::expect_close(kc::compare<bf16>(got, want, kc::test::kPoisonByte),
                         tolerance_for(p, use_bias, use_residual, want), "vs fp64");
  EXPECT_EQ(c.guard_damage(), 0u) << "wrote past the end of c";
}

class FusedEpilogueGpu : public kc::test::GpuTest {};

// Every activation × bias present/absent × residual present/absent, both paths, on odd shapes.
TEST_F(FusedEpilogueGpu, EveryOptionMatchesFp64) {
  const std::uint64_t seed = kc::test::test_seed();
  for (GemmShape s : {GemmShape{1, 1, 8}, GemmShape{67, 131, 72}, GemmShape{130, 264, 200}}) {
    const Problem p = random_problem(s, seed);
    for (Activation act : kActivations) {
      for (bool bias : {false, true}) {
        for (bool res : {false, true}) {
          check_linear(p, bias, act, res, Path::fused);
          check_linear(p, bias, act, res, Path::unfused);
        }
      }
    }
  }
}

// The fused path on every tile this GPU fits: M = 16 and 128 take the small tile on a big GPU,
// 4096² the large one; each must apply the epilogue at its own edges.
TEST_F(FusedEpilogueGpu, EveryTile) {
  const std::uint64_t seed = kc::test::test_seed();
  for (GemmBf16Tile tile : {GemmBf16Tile::large, GemmBf16Tile::medium, GemmBf16Tile::small, GemmBf16Tile::narrow,
                            GemmBf16Tile::small_deep, GemmBf16Tile::narrow_deep}) {
    if (!kc::ch02::gemm_bf16_tile_info(tile, device().smem_per_block_optin).fits) continue;
    SCOPED_TRACE(kc::ch02::to_string(tile));
    for (GemmShape s : {GemmShape{33, 40, 56}, GemmShape{129, 257, 72}, GemmShape{300, 520, 200}}) {
      const Problem p = random_problem(s, seed);
      check_linear(p, true, Activation::gelu_tanh, true, Path::fused, &tile);
      check_linear(p, false, Activation::silu, false, Path::fused, &tile);
    }
  }
}

// The small-deep tile (the single-wave tile of M = 128 on sm_90) applies bias, activation and
// residual in registers, one kernel per activation: every activation with and without bias and
// residual, on partial tiles. Bias and residual are copied once the last K slice is issued, which
// for the 12-stage pipeline (11 slices in the prologue) puts them: after the loop's waits (K = 200,
// 4 slices: a barrier after the loop), in the last iteration's group (K = 704, 11 slices: the first
// part of the loop is empty), and between the loop's two parts (K = 1000, 16 slices). N = 130 is not
// a multiple of 8, so that call takes the staged epilogue's element loop instead.
TEST_F(FusedEpilogueGpu, SmallDeepRegisterEpilogueEveryOption) {
  const GemmBf16Tile tile = GemmBf16Tile::small_deep;
  if (!kc::ch02::gemm_bf16_tile_info(tile, device().smem_per_block_optin).fits) {
    GTEST_SKIP() << "the small-deep tile does not fit this GPU's shared memory per block";
  }
  const std::uint64_t seed = kc::test::test_seed();
  for (GemmShape s :
       {GemmShape{130, 264, 200}, GemmShape{70, 136, 704}, GemmShape{70, 136, 1000}, GemmShape{70, 130, 72}}) {
    const Problem p = random_problem(s, seed);
    for (Activation act : kActivations) {
      for (bool bias : {false, true}) {
        for (bool res : {false, true}) check_linear(p, bias, act, res, Path::fused, &tile);
      }
    }
  }
}

// The benchmark's memory-bound shape on both paths (its full fp64 reference is cheap enough).
TEST_F(FusedEpilogueGpu, MemoryBoundBenchmarkShape) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: large shape";
  const Problem p = random_problem({16, 4096, 7168}, kc::test::test_seed());
  check_linear(p, true, Activation::gelu_tanh, true, Path::fused);
  check_linear(p, true, Activation::gelu_tanh, true, Path::unfused);
}

// residual == c: the fused kernel reads each element before it overwrites it, so c = f(A·Wᵀ) + c.
// N = 130 takes the element-by-element loop; N = 136 the vector loop, which copies the residual
// rows into shared memory first (the large tile in two halves of rows).
TEST_F(FusedEpilogueGpu, ResidualMayBeCInPlace) {
  for (const std::int64_t n : {130, 136}) {
    const GemmShape s{200, n, 64};
    const Problem p = random_problem(s, kc::test::test_seed());
    const std::vector<double> want = kc::ch03::linear_reference(widen(p.a), widen(p.w), widen(p.bias),
                                                                widen(p.residual), Activation::gelu_erf, s.m, s.n, s.k);
    for (GemmBf16Tile tile : {GemmBf16Tile::large, GemmBf16Tile::medium, GemmBf16Tile::small, GemmBf16Tile::narrow,
                              GemmBf16Tile::small_deep, GemmBf16Tile::narrow_deep}) {
      if (!kc::ch02::gemm_bf16_tile_info(tile, device().smem_per_block_optin).fits) continue;
      SCOPED_TRACE(std::string(kc::ch02::to_string(tile)) + " n=" + std::to_string(n));
      kc::DeviceBuffer<bf16> a(p.a), w(p.w), bias(p.bias), c(p.residual);
      kc::ch03::linear_fused_with_tile(a.data(), w.data(), c.data(), s,
                                       {bias.data(), Activation::gelu_erf, c.data(), false}, tile);
      kc::test::expect_close(kc::compare<bf16>(c.to_host(), want), kTolerance, "in place");
    }
  }
}

// N is a multiple of 8, but bias, residual and c start 2 bytes past a 16-byte boundary: the
// epilogue must notice and take the element-by-element loop (cp.async needs 16-byte sources).
TEST_F(FusedEpilogueGpu, UnalignedPointersTakeTheElementLoop) {
  const GemmShape s{70, 136, 64};
  const Problem p = random_problem(s, kc::test::test_seed());
  const auto mn = static_cast<std::size_t>(s.m * s.n);
  std::vector<bf16> bias_shifted(p.bias.size() + 1), residual_shifted(mn + 1);
  std::copy(p.bias.begin(), p.bias.end(), bias_shifted.begin() + 1);
  std::copy(p.residual.begin(), p.residual.end(), residual_shifted.begin() + 1);
  kc::DeviceBuffer<bf16> a(p.a), w(p.w), bias(bias_shifted), residual(residual_shifted);
  kc::test::GuardedOutput<bf16> c(mn + 1);
  kc::ch03::linear_fused(a.data(), w.data(), c.data() + 1, s,
                         {bias.data() + 1, Activation::gelu_tanh, residual.data() + 1, false});
  std::vector<bf16> got = c.to_host();
  got.erase(got.begin());  // element 0 lies before c: it must still be poison
  const std::vector<double> want = kc::ch03::linear_reference(widen(p.a), widen(p.w), widen(p.bias), widen(p.residual),
                                                              Activation::gelu_tanh, s.m, s.n, s.k);
  kc::test::expect_close(kc::compare<bf16>(got, want, kc::test::kPoisonByte), kTolerance, "unaligned");
  EXPECT_EQ(c.guard_damage(), 0u) << "wrote past the end of c";
  const std::vector<bf16> all = c.to_host();
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(all.data(), 1), kc::test::kPoisonByte), 1u) << "wrote before c";
}

TEST_F(FusedEpilogueGpu, Swiglu) {
  const std::uint64_t seed = kc::test::test_seed();
  for (GemmShape s : {GemmShape{1, 2, 8}, GemmShape{67, 262, 72}, GemmShape{130, 512, 200}}) {
    for (bool use_bias : {false, true}) {
      SCOPED_TRACE(name_of(s, use_bias, Activation::silu, false) + " swiglu");
      const Problem p = random_problem(s, seed);  // w: [gate; up] halves, bias likewise
      const std::int64_t inter = s.n / 2;
      const std::vector<double> wd = widen(p.w), bd = widen(p.bias);
      const std::span<const double> wg(wd.data(), static_cast<std::size_t>(inter * s.k));
      const std::span<const double> wu(wd.data() + inter * s.k, static_cast<std::size_t>(inter * s.k));
      const std::span<const double> none;
      const std::vector<double> want = kc::ch03::swiglu_reference(
          widen(p.a), wg, wu, use_bias ? std::span<const double>(bd.data(), inter) : none,
          use_bias ? std::span<const double>(bd.data() + inter, inter) : none, s.m, inter, s.k);

      kc::DeviceBuffer<bf16> a(p.a), w_halves(p.w), bias_halves(p.bias);
      kc::DeviceBuffer<bf16> w_mixed(kc::ch03::interleave_gate_up<bf16>(p.w, s.k));
      kc::DeviceBuffer<bf16> bias_mixed(kc::ch03::interleave_gate_up<bf16>(p.bias, 1));
      kc::DeviceBuffer<bf16> scratch(static_cast<std::size_t>(s.m * s.n));
      kc::test::GuardedOutput<bf16> fused(static_cast<std::size_t>(s.m * inter)), unfused(fused.size());
      kc::ch03::linear_fused(a.data(), w_mixed.data(), fused.data(), s,
                             {use_bias ? bias_mixed.data() : nullptr, Activation::silu, nullptr, true});
      kc::ch03::linear_unfused(a.data(), w_halves.data(), unfused.data(), s,
                               {use_bias ? bias_halves.data() : nullptr, Activation::silu, nullptr, true},
                               scratch.data());
      kc::test::expect_close(kc::compare<bf16>(fused.to_host(), want, kc::test::kPoisonByte), kTolerance, "fused");
      kc::test::expect_close(kc::compare<bf16>(unfused.to_host(), want, kc::test::kPoisonByte), kTolerance, "unfused");
      EXPECT_EQ(fused.guard_damage(), 0u);
      EXPECT_EQ(unfused.guard_damage(), 0u);
    }
  }
}

// cuBLASLt: GELU_BIAS is tanh GELU after the bias; plain is the bare product.
TEST_F(FusedEpilogueGpu, CublasLtMatchesFp64) {
  const GemmShape s{130, 264, 200};
  const Problem p = random_problem(s, kc::test::test_seed());
  kc::DeviceBuffer<bf16> a(p.a), w(p.w), bias(p.bias);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  for (bool gelu : {false, true}) {
    SCOPED_TRACE(gelu ? "GELU_BIAS" : "plain");
    c.poison();
    const kc::ch03::CublasLtLinear lt(s, gelu);
    lt.run(a.data(), w.data(), bias.data(), c.data());
    const std::vector<double> want =
        kc::ch03::linear_reference(widen(p.a), widen(p.w), gelu ? widen(p.bias) : std::vector<double>{}, {},
                                   gelu ? Activation::gelu_tanh : Activation::none, s.m, s.n, s.k);
    kc::test::expect_close(kc::compare<bf16>(c.to_host(), want, kc::test::kPoisonByte), kTolerance, "cuBLASLt");
  }
}

// Rejected calls launch nothing: the poisoned output stays poisoned.
TEST_F(FusedEpilogueGpu, BadArgumentsWriteNothing) {
  const GemmShape s{32, 32, 64};
  kc::DeviceBuffer<bf16> a(static_cast<std::size_t>(s.m * s.k)), w(static_cast<std::size_t>(s.n * s.k));
  a.fill_bytes(0);
  w.fill_bytes(0);
  kc::test::GuardedOutput<bf16> c(static_cast<std::size_t>(s.m * s.n));
  expect_invalid_argument(
      [&] {
        kc::ch03::linear_fused(a.data(), w.data(), c.data(), s, {nullptr, Activation::relu, c.data() + 3, false});
      },
      "epilogue.residual must be c itself or not overlap c at all");
  expect_invalid_argument(
      [&] {
        kc::ch03::linear_unfused(a.data(), w.data(), c.data(), s, {nullptr, Activation::relu, c.data(), false});
      },
      "epilogue.residual must not be c in the unfused path");
  kc::check(cudaDeviceSynchronize());
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(c.to_host()), kc::test::kPoisonByte), c.size());
  EXPECT_EQ(c.guard_damage(), 0u);
}

// Both paths neither allocate nor synchronise, and give bitwise identical results run after run.
TEST_F(FusedEpilogueGpu, GraphCapturableAndRepeatable) {
  const GemmShape s{130, 264, 200};
  const Problem p = random_problem(s, kc::test::test_seed());
  kc::DeviceBuffer<bf16> a(p.a), w(p.w), bias(p.bias), residual(p.residual), c(static_cast<std::size_t>(s.m * s.n));
  const Epilogue e{bias.data(), Activation::gelu_tanh, residual.data(), false};
  for (Path path : {Path::fused, Path::unfused}) {
    SCOPED_TRACE(path == Path::fused ? "fused" : "unfused");
    const kc::test::LaunchUnderTest run{[&, path](cudaStream_t stream) {
                                          if (path == Path::fused) {
                                            kc::ch03::linear_fused(a.data(), w.data(), c.data(), s, e, stream);
                                          } else {
                                            kc::ch03::linear_unfused(a.data(), w.data(), c.data(), s, e, nullptr,
                                                                     stream);
                                          }
                                        },
                                        [&] { c.fill_bytes(kc::test::kPoisonByte); },
                                        [&] {
                                          const std::vector<bf16> h = c.to_host();
                                          const auto* bytes = reinterpret_cast<const unsigned char*>(h.data());
                                          return std::vector<unsigned char>(bytes, bytes + h.size() * sizeof(bf16));
                                        }};
    kc::test::expect_graph_capturable(run);
    kc::test::expect_bitwise_repeatable(run);
  }
}

}  // namespace
