// cuBLAS baselines of the grouped GEMM (see vendor_grouped.hpp). In cuBLAS's column-major view an
// expert's product is Cᵀ [N, M_e] = W[e] [N, K] · Aᵀ [K, M_e]: row-major W[e] is column-major
// [K, N], transposed; row-major A rows are column-major [K, M_e] as they are (the "TN" GEMM).
#include <stdexcept>
#include <string>
#include <vector>

#include "kc/check.hpp"
#include "vendor_grouped.hpp"

namespace kc::ch05 {

namespace {
void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusString(status));
  }
}
}  // namespace

void cublas_grouped_loop(const ch02::CublasHandle& handle, const GroupedGemmShape& shape, const __nv_bfloat16* a,
                         const __nv_bfloat16* w, __nv_bfloat16* c, std::span<const std::int32_t> host_offsets,
                         cudaStream_t stream) {
  validate_host_offsets(shape, host_offsets);
  validate_grouped_gemm(shape, a, w, c, host_offsets.data());
  for (int e = 0; e < shape.experts; ++e) {
    const std::int64_t row0 = host_offsets[e];
    const std::int64_t rows = host_offsets[e + 1] - row0;
    if (rows == 0) continue;
    ch02::cublas_gemm_bf16(handle, a + row0 * shape.k, w + static_cast<std::int64_t>(e) * shape.n * shape.k,
                           c + row0 * shape.n, ch02::GemmShape{rows, shape.n, shape.k}, stream);
  }
}

CublasGroupedGemm::CublasGroupedGemm(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                                     __nv_bfloat16* c, std::span<const std::int32_t> host_offsets)
    : n_(shape.n), k_(shape.k) {
  validate_host_offsets(shape, host_offsets);
  validate_grouped_gemm(shape, a, w, c, host_offsets.data());
  std::vector<const void*> ws, as;
  std::vector<void*> cs;
  for (int e = 0; e < shape.experts; ++e) {
    const std::int64_t row0 = host_offsets[e];
    const std::int64_t rows = host_offsets[e + 1] - row0;
    if (rows == 0) continue;  // cuBLAS gets only real problems
    rows_.push_back(static_cast<int>(rows));
    ws.push_back(w + static_cast<std::int64_t>(e) * shape.n * shape.k);
    as.push_back(a + row0 * shape.k);
    cs.push_back(c + row0 * shape.n);
  }
  problems_ = static_cast<int>(rows_.size());
  if (problems_ == 0) return;
  const std::size_t bytes = sizeof(void*) * static_cast<std::size_t>(problems_);
  check(cudaMalloc(reinterpret_cast<void**>(&device_w_), bytes));
  check(cudaMalloc(reinterpret_cast<void**>(&device_a_), bytes));
  check(cudaMalloc(reinterpret_cast<void**>(&device_c_), bytes));
  check(cudaMemcpy(device_w_, ws.data(), bytes, cudaMemcpyHostToDevice));
  check(cudaMemcpy(device_a_, as.data(), bytes, cudaMemcpyHostToDevice));
  check(cudaMemcpy(device_c_, cs.data(), bytes, cudaMemcpyHostToDevice));
}

CublasGroupedGemm::~CublasGroupedGemm() {
  cudaFree(device_w_);
  cudaFree(device_a_);
  cudaFree(device_c_);
}

void CublasGroupedGemm::run(const ch02::CublasHandle& handle, cudaStream_t stream) const {
  if (problems_ == 0) return;
  const auto count = static_cast<std::size_t>(problems_);
  // One group per problem (group_size 1): every group has its own m, n, k. Host arrays.
  const std::vector<cublasOperation_t> trans_w(count, CUBLAS_OP_T), trans_a(count, CUBLAS_OP_N);
  const std::vector<int> m(count, static_cast<int>(n_)), k(count, static_cast<int>(k_));
  const std::vector<int> ld_k(count, static_cast<int>(k_)), ld_c(count, static_cast<int>(n_)), ones(count, 1);
  const std::vector<float> alpha(count, 1.0f), beta(count, 0.0f);
  check_cublas(cublasSetStream(handle.get(), stream), "cublasSetStream");
  check_cublas(cublasGemmGroupedBatchedEx(handle.get(), trans_w.data(), trans_a.data(), m.data(), rows_.data(),
                                          k.data(), alpha.data(), device_w_, CUDA_R_16BF, ld_k.data(), device_a_,
                                          CUDA_R_16BF, ld_k.data(), beta.data(), device_c_, CUDA_R_16BF, ld_c.data(),
                                          problems_, ones.data(), CUBLAS_COMPUTE_32F),
               "cublasGemmGroupedBatchedEx");
}

}  // namespace kc::ch05
