// Tensor maps: the host-side description, its rules, and the encoding through the driver entry
// point. The rules are cuda.h's documentation of cuTensorMapEncodeTiled (CUDA 13.0), checked here
// so a bad map is reported in the course's words before the driver answers CUDA_ERROR_INVALID_VALUE.
#include "tensor_map.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kc/check.hpp"
#include "kc/validate.hpp"

namespace kc::ch07 {

TensorMapSpec bf16_row_major_map(const __nv_bfloat16* base, std::int64_t rows, std::int64_t cols, int box_rows) {
  TensorMapSpec spec;
  spec.global_address = base;
  spec.global_dim = {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)};
  spec.row_stride_bytes = static_cast<std::uint64_t>(cols) * sizeof(__nv_bfloat16);
  spec.box_dim = {64, static_cast<std::uint32_t>(box_rows)};
  spec.element_bytes = sizeof(__nv_bfloat16);
  spec.swizzle = TensorMapSwizzle::bytes128;
  return spec;
}

void validate_tensor_map(const TensorMapSpec& spec, const std::string& name) {
  const std::string map = name + "'s tensor map: ";
  auto fail = [&](const std::string& rule) { throw InvalidArgument(map + rule); };
  if (spec.element_bytes != 1 && spec.element_bytes != 2 && spec.element_bytes != 4 && spec.element_bytes != 8) {
    fail("element_bytes (" + std::to_string(spec.element_bytes) + ") must be 1, 2, 4 or 8");
  }
  if (spec.global_address == nullptr) fail("global_address must not be null");
  if (!kc::aligned_to(spec.global_address, 16)) {
    fail("global_address must be 16-byte aligned (TMA)");
  }
  for (int d = 0; d < 2; ++d) {
    if (spec.global_dim[d] < 1 || spec.global_dim[d] > (std::uint64_t{1} << 32)) {
      fail("global_dim[" + std::to_string(d) + "] (" + std::to_string(spec.global_dim[d]) + ") must be in [1, 2^32]");
    }
  }
  if (spec.row_stride_bytes % 16 != 0) {
    fail("row_stride_bytes (" + std::to_string(spec.row_stride_bytes) +
         ") must be a multiple of 16 (TMA; for bf16 rows, a multiple of 8 elements)");
  }
  if (spec.row_stride_bytes < spec.global_dim[0] * spec.element_bytes) {
    fail("row_stride_bytes (" + std::to_string(spec.row_stride_bytes) + ") must be >= global_dim[0] * element_bytes (" +
         std::to_string(spec.global_dim[0] * spec.element_bytes) + "): rows must not overlap");
  }
  if (spec.row_stride_bytes >= (std::uint64_t{1} << 40)) {
    fail("row_stride_bytes (" + std::to_string(spec.row_stride_bytes) + ") must be < 2^40");
  }
  for (int d = 0; d < 2; ++d) {
    if (spec.box_dim[d] < 1 || spec.box_dim[d] > 256) {
      fail("box_dim[" + std::to_string(d) + "] (" + std::to_string(spec.box_dim[d]) + ") must be in [1, 256]");
    }
  }
  const std::uint32_t box_row_bytes = spec.box_dim[0] * spec.element_bytes;
  if (box_row_bytes % 16 != 0) {
    fail("box_dim[0] * element_bytes (" + std::to_string(box_row_bytes) + ") must be a multiple of 16");
  }
  if (const std::uint32_t span = swizzle_span_bytes(spec.swizzle); span != 0 && box_row_bytes > span) {
    fail("box_dim[0] * element_bytes (" + std::to_string(box_row_bytes) + ") must be <= the swizzle span (" +
         std::to_string(span) + " bytes)");
  }
}

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// Found once through the runtime (no -lcuda). Version 12000 asks for the 12.0 ABI of the function.
EncodeTiled driver_encode_tiled() {
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled (it needs a CUDA 12.0+ driver)");
    }
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

namespace {

CUtensorMapSwizzle to_driver(TensorMapSwizzle swizzle) {
  switch (swizzle) {
    case TensorMapSwizzle::bytes32: return CU_TENSOR_MAP_SWIZZLE_32B;
    case TensorMapSwizzle::bytes64: return CU_TENSOR_MAP_SWIZZLE_64B;
    case TensorMapSwizzle::bytes128: return CU_TENSOR_MAP_SWIZZLE_128B;
    case TensorMapSwizzle::none: break;
  }
  return CU_TENSOR_MAP_SWIZZLE_NONE;
}

CUtensorMapDataType data_type_of(std::uint32_t element_bytes) {
  switch (element_bytes) {
    case 1: return CU_TENSOR_MAP_DATA_TYPE_UINT8;
    case 4: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case 8: return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
    default: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  }
}

}  // namespace

CUtensorMap encode_tensor_map(const TensorMapSpec& spec, const std::string& name) {
  validate_tensor_map(spec, name);
  CUtensorMap map{};  // alignas(64) by its declaration, as the driver requires
  const cuuint64_t global_dim[2] = {spec.global_dim[0], spec.global_dim[1]};
  const cuuint64_t global_strides[1] = {spec.row_stride_bytes};  // rank - 1 entries: dimension 0 is contiguous
  const cuuint32_t box_dim[2] = {spec.box_dim[0], spec.box_dim[1]};
  const cuuint32_t element_strides[2] = {1, 1};  // every element of the box, no striding
  const CUresult result = driver_encode_tiled()(
      &map, data_type_of(spec.element_bytes), 2, const_cast<void*>(spec.global_address), global_dim, global_strides,
      box_dim, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, to_driver(spec.swizzle),
      // L2 promotion in 256-byte lines (the DeepGEMM setting); out-of-bounds elements read as zero
      // (OOB_FILL_NONE means "fill with zeros", the alternative being NaN).
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error(name + "'s tensor map: cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(static_cast<int>(result)));
  }
  return map;
}

}  // namespace kc::ch07
