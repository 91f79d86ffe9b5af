// Chapter 2 at full size: every kernel at 4096³ against cuBLAS on all 16.8 M elements, and against
// the fp64 CPU reference on a sample of elements (the full fp64 product would take minutes on a CPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gemm_bf16.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"
#include "sgemm.hpp"
#include "vendor_cublas.hpp"

namespace {

using kc::ch02::GemmShape;

constexpr std::int64_t kSize = 4096;
constexpr int kSamples = 2000;

// Sampled (row, col) positions, always including the four corners (edges of the last tiles).
std::vector<std::pair<std::int64_t, std::int64_t>> sample_positions(std::uint64_t seed, std::int64_t m,
                                                                    std::int64_t n) {
  std::vector<std::pair<std::int64_t, std::int64_t>> at = {{0, 0}, {0, n - 1}, {m - 1, 0}, {m - 1, n - 1}};
  for (int s = 0; s < kSamples; ++s) {
    at.emplace_back(static_cast<std::int64_t>(kc::uniform01(seed, 2 * s) * m),
                    static_cast<std::int64_t>(kc::uniform01(seed, 2 * s + 1) * n));
  }
  return at;
}

class SgemmVersusCublas : public kc::test::GpuTest, public ::testing::WithParamInterface<kc::ch02::SgemmStep> {};

// Tolerance 1e-5: both sides accumulate 4096 fp32 products in different orders; the difference is a
// few ulp of fp32 (2^-24 ≈ 6e-8) times sqrt(K), far below 1e-5, while any indexing bug is O(1).
TEST_P(SgemmVersusCublas, AllElementsAt4096Cubed) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: skipping the 4096³ product";
  const GemmShape shape{kSize, kSize, kSize};
  const std::uint64_t seed = kc::test::test_seed();
  std::vector<float> a(kSize * kSize), b(kSize * kSize);
  kc::fill_uniform(std::span<float>(a), seed);
  kc::fill_uniform(std::span<float>(b), seed + 1);
  kc::DeviceBuffer<float> da(a), db(b), vendor(kSize * kSize);
  kc::test::GuardedOutput<float> dc(kSize * kSize);

  kc::ch02::CublasHandle cublas;
  kc::ch02::cublas_sgemm(cublas, da.data(), db.data(), vendor.data(), shape);
  kc::ch02::sgemm(GetParam(), da.data(), db.data(), dc.data(), shape);
  kc::check(cudaDeviceSynchronize());

  const std::vector<float> got = dc.to_host();
  const std::vector<float> want = vendor.to_host();
  const std::vector<double> want_wide(want.begin(), want.end());
  kc::test::expect_close(kc::compare<float>(got, want_wide, kc::test::kPoisonByte), 1e-5, "versus cuBLAS SGEMM");
  EXPECT_EQ(dc.guard_damage(), 0u);

  std::vector<float> sampled_got;
  std::vector<double> sampled_ref;
  for (auto [row, col] : sample_positions(seed + 2, kSize, kSize)) {
    double sum = 0.0;
    for (std::int64_t p = 0; p < kSize; ++p) sum += static_cast<double>(a[row * kSize + p]) * b[p * kSize + col];
    sampled_got.push_back(got[row * kSize + col]);
    sampled_ref.push_back(sum);
  }
  kc::test::expect_close(kc::compare<float>(sampled_got, sampled_ref), 1e-5, "versus the fp64 reference (sampled)");
}

INSTANTIATE_TEST_SUITE_P(Steps, SgemmVersusCublas,
                         ::testing::Values(kc::ch02::SgemmStep::kNaive, kc::ch02::SgemmStep::kCoalesced,
                                           kc::ch02::SgemmStep::kSharedTiled, kc::ch02::SgemmStep::kBlocktile1d,
                                           kc::ch02::SgemmStep::kBlocktile2d, kc::ch02::SgemmStep::kVectorized,
                                           kc::ch02::SgemmStep::kWarptiled),
                         [](const ::testing::TestParamInfo<kc::ch02::SgemmStep>& info) {
                           return std::string(kc::ch02::sgemm_step_name(info.param));
                         });

class GemmBf16VersusCublas : public kc::test::GpuTest {};

// Tolerance 1e-2: both round the fp32 sum to bf16 (8 bits of mantissa, 2^-9 relative); sums taken in
// different orders can round to neighbouring bf16 values, a relative difference up to 2^-8.
TEST_F(GemmBf16VersusCublas, AllElementsAt4096Cubed) {
  if (kc::test::small_tests_only()) GTEST_SKIP() << "KC_SMALL_TESTS is set: skipping the 4096³ product";
  const GemmShape shape{kSize, kSize, kSize};
  const std::uint64_t seed = kc::test::test_seed();
  std::vector<__nv_bfloat16> a(kSize * kSize), w(kSize * kSize);
  kc::fill_uniform(std::span<__nv_bfloat16>(a), seed);
  kc::fill_uniform(std::span<__nv_bfloat16>(w), seed + 1);
  kc::DeviceBuffer<__nv_bfloat16> da(a), dw(w), vendor(kSize * kSize);
  kc::test::GuardedOutput<__nv_bfloat16> dc(kSize * kSize);

  kc::ch02::CublasHandle cublas;
  kc::ch02::cublas_gemm_bf16(cublas, da.data(), dw.data(), vendor.data(), shape);
  kc::ch02::gemm_bf16(da.data(), dw.data(), dc.data(), shape);
  kc::check(cudaDeviceSynchronize());

  const std::vector<__nv_bfloat16> got = dc.to_host();
  const std::vector<__nv_bfloat16> want = vendor.to_host();
  std::vector<double> want_wide(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) want_wide[i] = kc::to_double(want[i]);
  kc::test::expect_close(kc::compare<__nv_bfloat16>(got, want_wide, kc::test::kPoisonByte), 1e-2,
                         "versus cuBLAS GemmEx");
  EXPECT_EQ(dc.guard_damage(), 0u);

  std::vector<__nv_bfloat16> sampled_got;
  std::vector<double> sampled_ref;
  for (auto [row, col] : sample_positions(seed + 2, kSize, kSize)) {
    double sum = 0.0;
    for (std::int64_t p = 0; p < kSize; ++p)
      sum += kc::to_double(a[row * kSize + p]) * kc::to_double(w[col * kSize + p]);
    sampled_got.push_back(got[row * kSize + col]);
    sampled_ref.push_back(sum);
  }
  kc::test::expect_close(kc::compare<__nv_bfloat16>(sampled_got, sampled_ref), 1e-2,
                         "versus the fp64 reference (sampled)");
}

}  // namespace
