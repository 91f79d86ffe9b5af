// Argument checks shared by the chapter's launch functions. Host code only, so the CPU tests
// exercise every rule without a GPU.
#include <cstdint>
#include <string>

#include "kc/check.hpp"
#include "kc/validate.hpp"
#include "vector_add.hpp"

namespace kc::ch01 {

namespace {
// The rule for c against a and b: the same array (an in-place add) or no shared element at all.
bool partly_overlaps(const float* x, const float* y, std::int64_t n) {
  const auto bytes = static_cast<std::uint64_t>(n) * sizeof(float);
  return x != y && overlaps(x, bytes, y, bytes);
}
}  // namespace

void validate_vector_add(const float* a, const float* b, const float* c, std::int64_t n) {
  if (n < 0) throw InvalidArgument("n (" + std::to_string(n) + ") must be >= 0");
  if (n == 0) return;
  if (a == nullptr) throw InvalidArgument("a must not be null when n > 0");
  if (b == nullptr) throw InvalidArgument("b must not be null when n > 0");
  if (c == nullptr) throw InvalidArgument("c must not be null when n > 0");
  auto aligned_for_float = [](const float* p) { return aligned_to(p, alignof(float)); };
  if (!aligned_for_float(a)) throw InvalidArgument("a must be 4-byte aligned (the alignment of float)");
  if (!aligned_for_float(b)) throw InvalidArgument("b must be 4-byte aligned (the alignment of float)");
  if (!aligned_for_float(c)) throw InvalidArgument("c must be 4-byte aligned (the alignment of float)");
  if (partly_overlaps(c, a, n)) throw InvalidArgument("c must be the same array as a or not overlap it at all");
  if (partly_overlaps(c, b, n)) throw InvalidArgument("c must be the same array as b or not overlap it at all");
}

void validate_vectorized_config(const VectorizedConfig& config) {
  const int t = config.threads_per_block;
  if (t < 32 || t > 1024 || t % 32 != 0) {
    throw InvalidArgument("config.threads_per_block (" + std::to_string(t) +
                          ") must be a multiple of 32 in [32, 1024]");
  }
  const int u = config.unroll;
  if (u != 1 && u != 2 && u != 4) throw InvalidArgument("config.unroll (" + std::to_string(u) + ") must be 1, 2 or 4");
  if (config.blocks_per_sm < 1) {
    throw InvalidArgument("config.blocks_per_sm (" + std::to_string(config.blocks_per_sm) + ") must be >= 1");
  }
}

}  // namespace kc::ch01
