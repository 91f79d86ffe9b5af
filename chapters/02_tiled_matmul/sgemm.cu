// The fp32 ladder's front door: argument checks (host code only, so the CPU tests cover every
// rule without a GPU) and the dispatch from SgemmStep to each step's launch function.
#include <cstdint>
#include <ostream>
#include <string>

#include "kc/check.hpp"
#include "sgemm.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02 {

namespace {

// True when [x, x + x_bytes) and [y, y + y_bytes) share a byte. Written with differences, not
// sums, so that no end address can wrap around (M * N * 4 alone can approach 2^64).
bool overlaps(const void* x, std::uint64_t x_bytes, const void* y, std::uint64_t y_bytes) {
  const auto xs = reinterpret_cast<std::uintptr_t>(x);
  const auto ys = reinterpret_cast<std::uintptr_t>(y);
  return xs <= ys ? ys - xs < x_bytes : xs - ys < y_bytes;
}

std::uint64_t bytes_of(std::int64_t rows, std::int64_t cols) {
  return static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) * sizeof(float);
}

void validate_step(SgemmStep step) {
  const int s = static_cast<int>(step);
  if (s < static_cast<int>(SgemmStep::kNaive) || s > static_cast<int>(SgemmStep::kWarptiled)) {
    throw InvalidArgument("step (" + std::to_string(s) + ") must be a SgemmStep, 1 to 7");
  }
}

}  // namespace

const char* sgemm_step_name(SgemmStep step) {
  validate_step(step);
  switch (step) {
    case SgemmStep::kNaive: return "step1_naive";
    case SgemmStep::kCoalesced: return "step2_coalesced";
    case SgemmStep::kSharedTiled: return "step3_shared_tiled";
    case SgemmStep::kBlocktile1d: return "step4_blocktile_1d";
    case SgemmStep::kBlocktile2d: return "step5_blocktile_2d";
    case SgemmStep::kVectorized: return "step6_vectorized";
    case SgemmStep::kWarptiled: return "step7_warptiled";
  }
  return "";  // unreachable: validate_step threw
}

std::ostream& operator<<(std::ostream& os, SgemmStep step) {
  const int s = static_cast<int>(step);
  if (s < static_cast<int>(SgemmStep::kNaive) || s > static_cast<int>(SgemmStep::kWarptiled)) {
    return os << "SgemmStep(" << s << ")";
  }
  return os << sgemm_step_name(step);
}

void validate_sgemm(const float* a, const float* b, const float* c, GemmShape shape) {
  validate_gemm_shape(shape);
  if (a == nullptr) throw InvalidArgument("a must not be null");
  if (b == nullptr) throw InvalidArgument("b must not be null");
  if (c == nullptr) throw InvalidArgument("c must not be null");
  auto aligned_for_float = [](const float* p) { return reinterpret_cast<std::uintptr_t>(p) % alignof(float) == 0; };
  if (!aligned_for_float(a)) throw InvalidArgument("a must be 4-byte aligned (the alignment of float)");
  if (!aligned_for_float(b)) throw InvalidArgument("b must be 4-byte aligned (the alignment of float)");
  if (!aligned_for_float(c)) throw InvalidArgument("c must be 4-byte aligned (the alignment of float)");
  // C is written while other blocks still read A and B: any shared byte gives a wrong product.
  const std::uint64_t c_bytes = bytes_of(shape.m, shape.n);
  if (overlaps(c, c_bytes, a, bytes_of(shape.m, shape.k))) {
    throw InvalidArgument("c must not overlap a (C [M, N] is written while A [M, K] is still being read)");
  }
  if (overlaps(c, c_bytes, b, bytes_of(shape.k, shape.n))) {
    throw InvalidArgument("c must not overlap b (C [M, N] is written while B [K, N] is still being read)");
  }
}

void sgemm(SgemmStep step, const float* a, const float* b, float* c, GemmShape shape, cudaStream_t stream) {
  validate_step(step);
  validate_sgemm(a, b, c, shape);
  switch (step) {
    case SgemmStep::kNaive: detail::sgemm_step1_naive(a, b, c, shape, stream); break;
    case SgemmStep::kCoalesced: detail::sgemm_step2_coalesced(a, b, c, shape, stream); break;
    case SgemmStep::kSharedTiled: detail::sgemm_step3_shared_tiled(a, b, c, shape, stream); break;
    case SgemmStep::kBlocktile1d: detail::sgemm_step4_blocktile_1d(a, b, c, shape, stream); break;
    case SgemmStep::kBlocktile2d: detail::sgemm_step5_blocktile_2d(a, b, c, shape, stream); break;
    case SgemmStep::kVectorized: detail::sgemm_step6_vectorized(a, b, c, shape, stream); break;
    case SgemmStep::kWarptiled: detail::sgemm_step7_warptiled(a, b, c, shape, stream); break;
  }
}

}  // namespace kc::ch02
