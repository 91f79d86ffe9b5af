// Test problems of the dense bf16 GEMM chapters (2 and 7, both C = A · Wᵀ with A [M, K] and W [N, K]
// row-major): random inputs, a printable shape, and the fp64 check of a result. Both chapters test
// against the same definitions, so a shape means the same thing in each.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gemm_shape.hpp"
#include "kc/compare.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/test_support.hpp"

namespace kc::test::bf16_gemm {

using bf16 = __nv_bfloat16;
using kc::ch02::GemmShape;

// Random A and W (uniform in [-1, 1), rounded to bf16).
struct Inputs {
  std::vector<bf16> a, w;
};

inline Inputs random_inputs(GemmShape s, std::uint64_t seed) {
  Inputs in{std::vector<bf16>(static_cast<std::size_t>(s.m * s.k)),
            std::vector<bf16>(static_cast<std::size_t>(s.n * s.k))};
  kc::fill_uniform(std::span<bf16>(in.a), seed);
  kc::fill_uniform(std::span<bf16>(in.w), seed + 1);
  return in;
}

// "MxNxK", for traces and test names.
inline std::string shape_name(GemmShape s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

// C against the fp64 reference of the bf16 inputs: every element when the reference is cheap (m·n·k
// up to 2^26 multiply-adds), otherwise 2000 elements drawn from @p seed plus the four corners, which
// the boundary masks decide. Poisoned elements count as failures.
inline kc::Comparison compare_with_reference(const Inputs& in, std::span<const bf16> c, GemmShape s,
                                             std::uint64_t seed) {
  const std::vector<double> a = kc::ref::widen(std::span<const bf16>(in.a));
  const std::vector<double> w = kc::ref::widen(std::span<const bf16>(in.w));
  const auto m = static_cast<std::size_t>(s.m), n = static_cast<std::size_t>(s.n), k = static_cast<std::size_t>(s.k);
  if (m * n * k <= (std::size_t{1} << 26)) {
    return kc::compare<bf16>(c, kc::ref::matmul_nt(a, w, m, n, k), kc::test::kPoisonByte);
  }
  std::vector<std::size_t> picks = {0, n - 1, (m - 1) * n, m * n - 1};
  for (std::uint64_t i = 0; i < 2000; ++i) picks.push_back(kc::splitmix64(seed ^ (i + 0x5EED)) % (m * n));
  std::vector<bf16> got;
  std::vector<double> ref;
  for (std::size_t idx : picks) {
    got.push_back(c[idx]);
    ref.push_back(kc::ref::matmul_nt_element(a, w, k, idx / n, idx % n));
  }
  return kc::compare<bf16>(got, ref, kc::test::kPoisonByte);
}

}  // namespace kc::test::bf16_gemm
