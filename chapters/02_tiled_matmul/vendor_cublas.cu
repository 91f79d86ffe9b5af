#include <string>

#include "kc/check.hpp"
#include "vendor_cublas.hpp"

namespace kc::ch02 {

namespace {
void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusString(status));
  }
}
}  // namespace

CublasHandle::CublasHandle() {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  // Plain fp32 FMA math: no TF32 tensor cores, so cublasSgemm is the true fp32 baseline.
  check_cublas(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

void cublas_sgemm(const CublasHandle& handle, const float* a, const float* b, float* c, GemmShape shape,
                  cudaStream_t stream) {
  validate_gemm_shape(shape);
  const float alpha = 1.0f, beta = 0.0f;
  const auto m = static_cast<int>(shape.m), n = static_cast<int>(shape.n), k = static_cast<int>(shape.k);
  check_cublas(cublasSetStream(handle.get(), stream), "cublasSetStream");
  // Column-major Cᵀ [N,M] = Bᵀ [N,K] · Aᵀ [K,M]: row-major B and A are exactly those matrices.
  check_cublas(cublasSgemm(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, n, a, k, &beta, c, n),
               "cublasSgemm");
}

void cublas_gemm_bf16(const CublasHandle& handle, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                      GemmShape shape, cudaStream_t stream) {
  validate_gemm_shape(shape);
  const float alpha = 1.0f, beta = 0.0f;
  const auto m = static_cast<int>(shape.m), n = static_cast<int>(shape.n), k = static_cast<int>(shape.k);
  check_cublas(cublasSetStream(handle.get(), stream), "cublasSetStream");
  // Row-major W [N,K] is column-major [K,N]; transposed it is the [N,K] left operand. Row-major A
  // [M,K] is column-major [K,M], the right operand as is. Result: column-major [N,M] = row-major C.
  check_cublas(cublasGemmEx(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, a, CUDA_R_16BF,
                            k, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace kc::ch02
