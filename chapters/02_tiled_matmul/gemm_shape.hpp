/// @file gemm_shape.hpp
/// @brief The problem size shared by every matmul of Chapter 2 (and the chapters that reuse it).
#pragma once

#include <cstdint>
#include <string>

#include "kc/check.hpp"

namespace kc::ch02 {

/// C[M, N] = A[M, K] · B: M rows of output, N columns, K the reduction length.
struct GemmShape {
  std::int64_t m = 0;  ///< rows of A and C
  std::int64_t n = 0;  ///< columns of C
  std::int64_t k = 0;  ///< columns of A (the reduction length)
};

/// Throws kc::InvalidArgument unless M, N and K are each in [1, 2^31 - 1]. Kernels index memory
/// with 64-bit offsets, so only each dimension on its own is limited (by grid dimensions).
inline void validate_gemm_shape(const GemmShape& shape) {
  auto check_dim = [](const char* name, std::int64_t v) {
    if (v < 1 || v > 0x7FFFFFFF) {
      throw InvalidArgument(std::string("shape.") + name + " (" + std::to_string(v) + ") must be in [1, 2^31 - 1]");
    }
  };
  check_dim("m", shape.m);
  check_dim("n", shape.n);
  check_dim("k", shape.k);
}

}  // namespace kc::ch02
