/// @file validate.hpp
/// @brief Small checks that every chapter's argument validation shares: overlapping byte ranges and
/// pointer alignment.
#pragma once

#include <cstdint>

namespace kc {

/// True when the byte ranges [@p x, @p x + @p x_bytes) and [@p y, @p y + @p y_bytes) share at least
/// one byte. An empty range overlaps nothing, so an empty tensor's pointer (often null) never
/// conflicts with another argument.
inline bool overlaps(const void* x, std::uint64_t x_bytes, const void* y, std::uint64_t y_bytes) {
  const auto xs = reinterpret_cast<std::uintptr_t>(x);
  const auto ys = reinterpret_cast<std::uintptr_t>(y);
  return x_bytes > 0 && y_bytes > 0 && xs < ys + y_bytes && ys < xs + x_bytes;
}

/// True when @p p is a multiple of @p bytes (a power of two), e.g. 16 for a float4 or a TMA address.
inline bool aligned_to(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

}  // namespace kc
