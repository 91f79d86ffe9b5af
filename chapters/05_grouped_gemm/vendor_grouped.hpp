/// @file vendor_grouped.hpp
/// @brief The vendor baselines of Chapter 5: a per-expert cuBLAS loop (cublasGemmEx, as Chapter 2's
/// vendor) and cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, bf16 in and out, fp32 compute).
/// Both need the group sizes on the host, like the "before" loop: cuBLAS's grouped API takes the
/// problem sizes (m, n, k per group) as host arrays and only the matrix pointers on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "grouped_gemm.hpp"
#include "vendor_cublas.hpp"

namespace kc::ch05 {

/// C = A · W[e]ᵀ per expert with one cublasGemmEx per non-empty expert (Chapter 2's
/// cublas_gemm_bf16 on the expert's rows). Validates like grouped_gemm_loop.
/// @param handle a cuBLAS handle made outside any timed region
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, N] output
/// @param host_offsets [E + 1] row offsets on the host
/// @param stream the stream to enqueue on
void cublas_grouped_loop(const ch02::CublasHandle& handle, const GroupedGemmShape& shape, const __nv_bfloat16* a,
                         const __nv_bfloat16* w, __nv_bfloat16* c, std::span<const std::int32_t> host_offsets,
                         cudaStream_t stream = nullptr);

/// One call of cublasGemmGroupedBatchedEx over the non-empty experts (one group of one problem
/// each). Its matrix pointers must be device arrays, built once here (this allocates and copies:
/// make the plan outside any timed region or capture); run() then only enqueues the call.
class CublasGroupedGemm {
 public:
  /// Validates like grouped_gemm_loop and builds the device pointer arrays for these buffers.
  /// @param shape sizes
  /// @param a [M_total, K] permuted tokens
  /// @param w [E, N, K] expert weights
  /// @param c [M_total, N] output
  /// @param host_offsets [E + 1] row offsets on the host
  CublasGroupedGemm(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                    std::span<const std::int32_t> host_offsets);
  ~CublasGroupedGemm();
  CublasGroupedGemm(const CublasGroupedGemm&) = delete;
  CublasGroupedGemm& operator=(const CublasGroupedGemm&) = delete;

  /// Enqueues the grouped GEMM on @p stream with @p handle.
  void run(const ch02::CublasHandle& handle, cudaStream_t stream = nullptr) const;

  /// Number of problems (non-empty experts).
  int problems() const { return problems_; }

 private:
  int problems_ = 0;
  std::int64_t n_ = 0;
  std::int64_t k_ = 0;
  std::vector<int> rows_;            // M_e of each problem
  const void** device_w_ = nullptr;  // [problems] W[e]
  const void** device_a_ = nullptr;  // [problems] A rows of e
  void** device_c_ = nullptr;        // [problems] C rows of e
};

}  // namespace kc::ch05
