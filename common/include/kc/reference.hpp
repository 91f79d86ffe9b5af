/// @file reference.hpp
/// @brief fp64 CPU references: the ground truth every kernel is compared with.
///
/// The pattern: widen the inputs to double, compute in double, and, when the kernel's output type
/// is narrower and its operation is correctly rounded (an fp32 add), round the reference once to
/// that type so an exact comparison is possible.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <span>
#include <vector>

#include "kc/compare.hpp"

namespace kc::ref {

/// Widens @p values to double.
template <typename T>
std::vector<double> widen(std::span<const T> values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = to_double(values[i]);
  return out;
}

/// Rounds every element of @p values to float and back: the reference for an fp32 operation that
/// is correctly rounded (add, multiply), where the double result rounded once is the exact answer.
std::vector<double> round_to_float(std::span<const double> values);

/// C = A · Wᵀ in double: A is [M, K] row-major, W is [N, K] row-major (the layout of nn.Linear and
/// of the MoE chapters), C is [M, N] row-major.
std::vector<double> matmul_nt(std::span<const double> a, std::span<const double> w, std::size_t m, std::size_t n,
                              std::size_t k);

/// C = A · B in double: A is [M, K] row-major, B is [K, N] row-major, C is [M, N] row-major.
std::vector<double> matmul_nn(std::span<const double> a, std::span<const double> b, std::size_t m, std::size_t n,
                              std::size_t k);

/// One element of A · Wᵀ (for sampled checks of large products): row @p row, column @p col.
double matmul_nt_element(std::span<const double> a, std::span<const double> w, std::size_t k, std::size_t row,
                         std::size_t col);

}  // namespace kc::ref
