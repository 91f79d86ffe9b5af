/// @file ragged_map.hpp
/// @brief Step 3's store map of C, in plain numbers (so the CPU tests check every field), and its
/// encoding. grouped_tiles.hpp ("Step 3's rank-3 store map") says how its coordinates end each expert.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <array>
#include <cstdint>

namespace kc::ch08 {

/// The rank-3 map of C [M_total, n_out] that step 3 stores through. Dimensions innermost first.
struct RaggedMapSpec {
  std::uint64_t global_address = 0;              ///< c - 2^30 rows, modulo 2^64 (a base below C)
  std::array<std::uint64_t, 3> global_dim{};     ///< {n_out, 2^30, 2^31 - 1}
  std::array<std::uint64_t, 2> global_stride{};  ///< bytes per step of dimensions 1 and 2: one row each
  std::array<std::uint32_t, 3> box_dim{};        ///< {64, 64, 1}: one staged 64 × 64 box of C
};

/// The ragged map of C at @p c with @p n_out columns. Host-only arithmetic, no check.
RaggedMapSpec ragged_store_map(const __nv_bfloat16* c, std::int64_t n_out);

/// The byte address the map gives element (@p col, @p x, @p y), as TMA computes it (64-bit wrap).
constexpr std::uint64_t ragged_address(const RaggedMapSpec& spec, std::uint64_t col, std::uint64_t x, std::uint64_t y) {
  return spec.global_address + y * spec.global_stride[1] + x * spec.global_stride[0] + col * 2;
}

/// Encodes @p spec (bf16, 128-byte swizzle, the layout the staged C boxes have) with the driver's
/// cuTensorMapEncodeTiled. Throws kc::InvalidArgument when n_out is not a multiple of 8 or the
/// address is not 16-byte aligned (TMA's rules), std::runtime_error when the driver rejects it.
CUtensorMap encode_ragged_store_map(const RaggedMapSpec& spec);

}  // namespace kc::ch08
