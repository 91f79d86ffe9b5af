/// @file vendor_cublas.hpp
/// @brief cuBLAS in the chapter's layouts: the `vendor` baseline of the benchmark and the
/// all-elements reference of the large tests.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm_shape.hpp"

namespace kc::ch02 {

/// Owns a cuBLAS handle. Creating one allocates and takes milliseconds: make it once, outside any
/// timed region or CUDA graph capture.
class CublasHandle {
 public:
  CublasHandle();
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  /// The raw handle.
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// C = A·B in fp32 on CUDA cores (TF32 tensor-core math off: CUBLAS_DEFAULT_MATH), all row-major:
/// A [M,K], B [K,N], C [M,N]. cuBLAS is column-major, so this computes Cᵀ = Bᵀ·Aᵀ, which has the
/// same bytes as row-major C.
void cublas_sgemm(const CublasHandle& handle, const float* a, const float* b, float* c, GemmShape shape,
                  cudaStream_t stream = nullptr);

/// C = A·Wᵀ with bf16 inputs and output and fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F):
/// A [M,K], W [N,K], C [M,N], all row-major. In cuBLAS's column-major view this is
/// Cᵀ[N,M] = W·Aᵀ, the "TN" GEMM.
void cublas_gemm_bf16(const CublasHandle& handle, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                      GemmShape shape, cudaStream_t stream = nullptr);

}  // namespace kc::ch02
