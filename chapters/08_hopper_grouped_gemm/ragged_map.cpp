// Step 3's store map: the numbers, then the driver call (through Chapter 7's entry point).
#include "ragged_map.hpp"

#include <stdexcept>
#include <string>

// Angle brackets: the exercise build puts the skeleton's grouped_tiles.hpp first on the include path.
#include <grouped_tiles.hpp>

#include "kc/check.hpp"
#include "tensor_map.hpp"  // Chapter 7: driver_encode_tiled

namespace kc::ch08 {

RaggedMapSpec ragged_store_map(const __nv_bfloat16* c, std::int64_t n_out) {
  const auto row_bytes = static_cast<std::uint64_t>(n_out) * sizeof(__nv_bfloat16);
  RaggedMapSpec spec;
  // Unsigned arithmetic wraps modulo 2^64: the base may lie "below" address 0.
  spec.global_address = reinterpret_cast<std::uintptr_t>(c) - static_cast<std::uint64_t>(kRaggedRows) * row_bytes;
  spec.global_dim = {static_cast<std::uint64_t>(n_out), static_cast<std::uint64_t>(kRaggedRows),
                     static_cast<std::uint64_t>(kRaggedEnds)};
  spec.global_stride = {row_bytes, row_bytes};
  spec.box_dim = {static_cast<std::uint32_t>(ch07::kStoreBoxCols), static_cast<std::uint32_t>(ch07::kStoreBoxRows), 1};
  return spec;
}

CUtensorMap encode_ragged_store_map(const RaggedMapSpec& spec) {
  if (spec.global_stride[0] % 16 != 0) {
    throw InvalidArgument("c's ragged tensor map: a row (" + std::to_string(spec.global_stride[0]) +
                          " bytes) must be a multiple of 16 bytes (n_out a multiple of 8)");
  }
  if (spec.global_address % 16 != 0) {
    throw InvalidArgument("c's ragged tensor map: c must be 16-byte aligned (TMA)");
  }
  CUtensorMap map{};
  const cuuint64_t dims[3] = {spec.global_dim[0], spec.global_dim[1], spec.global_dim[2]};
  const cuuint64_t strides[2] = {spec.global_stride[0], spec.global_stride[1]};
  const cuuint32_t box[3] = {spec.box_dim[0], spec.box_dim[1], spec.box_dim[2]};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = ch07::driver_encode_tiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, reinterpret_cast<void*>(spec.global_address), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error("c's ragged tensor map: cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(static_cast<int>(result)));
  }
  return map;
}

}  // namespace kc::ch08
