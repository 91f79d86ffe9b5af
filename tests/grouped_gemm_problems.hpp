// Test problems of the grouped-GEMM chapters (5 and 6, and later ones): random group sizes of the
// kinds the issues ask for, a random problem in the MoE layout, and the sampled fp64 check. Both
// chapters test against the same definitions, so a problem means the same thing in each.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grouped_gemm.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/test_support.hpp"

namespace kc::test::grouped {

using bf16 = __nv_bfloat16;

// bf16 operands, fp32 accumulation over K up to 7168: 1e-2 relative (DESIGN.md, Tests).
inline constexpr double kTolerance = 1e-2;

// A 16-byte aligned host array for argument tests that never reach the GPU.
struct alignas(16) HostBuffer {
  bf16 data[512];
};

// Group sizes of one of five kinds, picked at random: uniform with zeros, zeros and ones, a third
// of the experts empty, one hot expert, Zipf-like skew.
inline std::vector<std::int32_t> random_sizes(std::mt19937_64& rng, int experts, int max_rows) {
  std::vector<std::int32_t> sizes(static_cast<std::size_t>(experts));
  const int kind = static_cast<int>(rng() % 5);
  for (int e = 0; e < experts; ++e) {
    const auto r = static_cast<int>(rng() % static_cast<std::uint64_t>(max_rows + 1));
    switch (kind) {
      case 0: sizes[e] = r; break;                                                    // uniform random, zeros included
      case 1: sizes[e] = static_cast<int>(rng() % 3); break;                          // zeros and ones (and twos)
      case 2: sizes[e] = e % 3 == 0 ? 0 : r; break;                                   // a third empty
      case 3: sizes[e] = e == 0 ? max_rows * 4 : static_cast<int>(rng() % 2); break;  // one hot expert
      default: sizes[e] = static_cast<int>(max_rows / (e + 1)); break;                // Zipf-like skew
    }
  }
  return sizes;
}

// A problem in the MoE layout: A [m_total, K] (rows of no expert past offsets.back() when
// extra_rows > 0), W [E, N, K], host offsets.
struct Problem {
  kc::ch05::GroupedGemmShape shape;
  std::vector<std::int32_t> offsets;
  std::vector<bf16> a, w;
};

inline Problem random_problem(const std::vector<std::int32_t>& sizes, std::int64_t n, std::int64_t k,
                              std::uint64_t seed, std::int64_t extra_rows = 0) {
  Problem p;
  p.offsets = kc::ch05::offsets_of_sizes(sizes);
  p.shape = {p.offsets.back() + extra_rows, n, k, static_cast<int>(sizes.size())};
  p.a.resize(static_cast<std::size_t>(p.shape.m_total * k));
  p.w.resize(static_cast<std::size_t>(sizes.size() * n * k));
  kc::fill_uniform(std::span<bf16>(p.a), seed);
  kc::fill_uniform(std::span<bf16>(p.w), seed + 1);
  return p;
}

// A problem's inputs on the device.
struct DeviceProblem {
  kc::DeviceBuffer<bf16> a, w;
  kc::DeviceBuffer<std::int32_t> offsets;
  explicit DeviceProblem(const Problem& p) : a(p.a), w(p.w), offsets(p.offsets) {}
};

// The bytes of a device output, for the bitwise checks (bf16's NaN poison compares unequal as values).
inline std::vector<unsigned char> bytes_of(const kc::DeviceBuffer<bf16>& c) {
  const std::vector<bf16> h = c.to_host();
  const auto* bytes = reinterpret_cast<const unsigned char*>(h.data());
  return std::vector<unsigned char>(bytes, bytes + h.size() * sizeof(bf16));
}

// Every element of @p got still holds the poison: nothing was written.
inline void expect_all_poisoned(const std::vector<bf16>& got, const std::string& what) {
  EXPECT_EQ(kc::count_poisoned(std::span<const bf16>(got), kPoisonByte), got.size()) << what;
}

// C[row, col] in fp64 straight from the bf16 inputs: the sum grouped_gemm_reference_element adds,
// in the same order, without widening all of W first (64 experts of 4096 × 1024 are 2 GB as doubles).
inline double reference_element(const Problem& p, std::int64_t row, std::int64_t col) {
  const auto it = std::upper_bound(p.offsets.begin(), p.offsets.end(), static_cast<std::int32_t>(row));
  const std::int64_t e = (it - p.offsets.begin()) - 1;  // the last e with offsets[e] <= row
  const std::int64_t k = p.shape.k;
  const bf16* ar = p.a.data() + row * k;
  const bf16* wr = p.w.data() + (e * p.shape.n + col) * k;
  double sum = 0.0;
  for (std::int64_t i = 0; i < k; ++i) sum += kc::to_double(ar[i]) * kc::to_double(wr[i]);
  return sum;
}

// Sampled fp64 check: every row's first and last columns, plus random elements. Rows of no expert
// must still hold the poison.
inline void expect_matches_fp64(const Problem& p, const std::vector<bf16>& got, std::uint64_t seed) {
  std::vector<bf16> sampled;
  std::vector<double> want;
  std::mt19937_64 rng(seed);
  const std::int64_t rows = p.offsets.back(), n = p.shape.n;
  auto sample = [&](std::int64_t r, std::int64_t col) {
    sampled.push_back(got[static_cast<std::size_t>(r * n + col)]);
    want.push_back(reference_element(p, r, col));
  };
  for (std::int64_t r = 0; r < rows; ++r) {
    sample(r, 0);
    sample(r, n - 1);
  }
  for (int i = 0; i < 4000 && rows > 0; ++i) {
    sample(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(rows)),
           static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n)));
  }
  kc::test::expect_close(kc::compare<bf16>(sampled, want, kPoisonByte), kTolerance, "vs fp64 (sampled)");
  const std::span<const bf16> beyond(got.data() + rows * n, static_cast<std::size_t>((p.shape.m_total - rows) * n));
  EXPECT_EQ(kc::count_poisoned(beyond, kPoisonByte), beyond.size()) << "wrote rows of no expert";
}

}  // namespace kc::test::grouped
