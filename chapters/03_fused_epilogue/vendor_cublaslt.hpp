/// @file vendor_cublaslt.hpp
/// @brief The `vendor` baselines: cuBLASLt's GEMM with its GELU_BIAS epilogue, and plain.
///
/// cuBLASLt fuses bias + GELU into its GEMM (CUBLASLT_EPILOGUE_GELU_BIAS; its GELU is the tanh
/// approximation), but it has no "add a residual after the activation" epilogue: its beta·C term is
/// added before the epilogue. So for the cases with a residual, `vendor` is cuBLASLt GELU_BIAS plus
/// this chapter's residual pass, and `vendor_plain` is the plain cuBLASLt GEMM plus both passes.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "gemm_shape.hpp"

namespace kc::ch03 {

/// A cuBLASLt matmul plan for C = A · Wᵀ (+ bias, GELU-tanh) of one shape, bf16 in and out, fp32
/// accumulate. Creating it allocates the handle and a workspace and runs the algorithm heuristic:
/// do it once, outside timed regions and graph captures; run() then only enqueues the matmul.
class CublasLtLinear {
 public:
  /// Plans the product of @p shape; with @p gelu_bias the epilogue is GELU_BIAS (run needs a bias).
  CublasLtLinear(ch02::GemmShape shape, bool gelu_bias);
  ~CublasLtLinear();
  CublasLtLinear(const CublasLtLinear&) = delete;
  CublasLtLinear& operator=(const CublasLtLinear&) = delete;

  /// Enqueues c = a · wᵀ (then gelu_tanh(· + bias) when planned with gelu_bias) on @p stream.
  /// @param a [M, K] row-major
  /// @param w [N, K] row-major
  /// @param bias [N]; required with gelu_bias, ignored otherwise
  /// @param c [M, N] row-major output
  /// @param stream the stream to enqueue on
  void run(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* c,
           cudaStream_t stream = nullptr) const;

 private:
  ch02::GemmShape shape_;
  bool gelu_bias_ = false;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t w_layout_ = nullptr, a_layout_ = nullptr, c_layout_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

}  // namespace kc::ch03
