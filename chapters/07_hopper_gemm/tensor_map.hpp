/// @file tensor_map.hpp
/// @brief TMA tensor maps, described on the host in plain numbers (so the CPU tests can check every
/// parameter and every rule), then encoded by the driver's cuTensorMapEncodeTiled, which the CUDA
/// runtime hands us through cudaGetDriverEntryPointByVersion: nothing links against libcuda.
///
/// A tensor map tells the copy engine (TMA) the shape of a matrix in global memory and the box one
/// copy moves into shared memory. For Chapter 7's bf16 row-major operands the description is:
///   global_dim  = {columns, rows}          innermost (contiguous) dimension first, in elements
///   row_stride  = columns · 2 bytes        the byte distance between rows (globalStrides[0])
///   box_dim     = {64, box_rows}           64 bf16 = 128 bytes: the whole span of the 128-byte swizzle
///   swizzle     = 128 bytes                the shared-memory layout wgmma reads without bank conflicts
/// Elements of a box outside the matrix (the edges in M, N and K) arrive as zeros.
#pragma once

#include <cuda.h>          // CUtensorMap and its enums: types only, no libcuda symbol is used
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_bf16.h>

#include <array>
#include <cstdint>
#include <string>

namespace kc::ch07 {

/// How TMA permutes 16-byte chunks within each row of a box in shared memory.
enum class TensorMapSwizzle {
  none,      ///< rows as they are
  bytes32,   ///< 32-byte swizzle (rows of at most 32 bytes)
  bytes64,   ///< 64-byte swizzle (rows of at most 64 bytes)
  bytes128,  ///< 128-byte swizzle (rows of at most 128 bytes): what wgmma's 128B layout wants
};

/// The bytes one box row may span under @p swizzle (0 for none: no limit beyond 256 elements).
constexpr std::uint32_t swizzle_span_bytes(TensorMapSwizzle swizzle) {
  switch (swizzle) {
    case TensorMapSwizzle::bytes32: return 32;
    case TensorMapSwizzle::bytes64: return 64;
    case TensorMapSwizzle::bytes128: return 128;
    case TensorMapSwizzle::none: break;
  }
  return 0;
}

/// Everything cuTensorMapEncodeTiled is told about a rank-2 tiled map, in plain numbers.
struct TensorMapSpec {
  const void* global_address = nullptr;                   ///< first element (16-byte aligned)
  std::array<std::uint64_t, 2> global_dim{};              ///< {columns, rows} in elements, innermost first
  std::uint64_t row_stride_bytes = 0;                     ///< bytes from one row to the next
  std::array<std::uint32_t, 2> box_dim{};                 ///< {columns, rows} one copy moves
  std::uint32_t element_bytes = 2;                        ///< 2 for bf16
  TensorMapSwizzle swizzle = TensorMapSwizzle::bytes128;  ///< shared-memory layout of the box

  /// Bytes one box occupies in shared memory, and the bytes its copy signals on the mbarrier
  /// (out-of-bounds elements count: they arrive as zeros).
  std::uint32_t box_bytes() const { return box_dim[0] * box_dim[1] * element_bytes; }
};

/// The map of a row-major bf16 matrix [@p rows, @p cols] at @p base, read in boxes of
/// @p box_rows rows × 64 columns with 128-byte swizzle. Host-only arithmetic, no CUDA call, no check
/// (validate_tensor_map checks).
TensorMapSpec bf16_row_major_map(const __nv_bfloat16* base, std::int64_t rows, std::int64_t cols, int box_rows);

/// Throws kc::InvalidArgument unless @p spec obeys cuTensorMapEncodeTiled's rules for a rank-2 map
/// (cuda.h): address 16-byte aligned; each global_dim in [1, 2^32]; row_stride_bytes a multiple of 16,
/// at least a row's bytes and below 2^40; each box_dim in [1, 256]; the box row a multiple of 16 bytes
/// and, with a swizzle, no wider than the swizzle span; element_bytes 1, 2, 4 or 8. The message names
/// the map (@p name, e.g. "a") and the rule, e.g. "a's tensor map: row_stride_bytes (2002) must be a
/// multiple of 16". Host-only.
void validate_tensor_map(const TensorMapSpec& spec, const std::string& name);

/// The driver's cuTensorMapEncodeTiled, asked of the runtime once (cudaGetDriverEntryPointByVersion,
/// version 12.0: the ABI PFN_cuTensorMapEncodeTiled_v12000 describes) and reused. Throws kc::CudaError
/// when the runtime has no driver to ask, std::runtime_error when the driver lacks the function.
PFN_cuTensorMapEncodeTiled_v12000 driver_encode_tiled();

/// Encodes @p spec with the driver's cuTensorMapEncodeTiled (validating it first, see
/// validate_tensor_map). Host-only and capture-safe: it talks to no GPU and no stream. The first call
/// asks the runtime for the driver entry point (cudaGetDriverEntryPointByVersion, version 12.0);
/// later calls reuse it. Throws kc::CudaError when the runtime has no driver to ask, and
/// std::runtime_error naming the map when the driver rejects it.
CUtensorMap encode_tensor_map(const TensorMapSpec& spec, const std::string& name);

}  // namespace kc::ch07
