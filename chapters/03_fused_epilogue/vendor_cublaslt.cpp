// cuBLASLt in the chapter's layout. cuBLASLt is column-major: row-major C [M, N] = A · Wᵀ is
// column-major Cᵀ [N, M] = W · Aᵀ, where row-major W [N, K] read column-major is [K, N] (so op T
// makes it [N, K]) and row-major A [M, K] read column-major is Aᵀ [K, M] as it is. The bias is one
// value per row of the column-major result, i.e. per output feature n: what nn.Linear adds.
#include "vendor_cublaslt.hpp"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kc/check.hpp"

namespace kc::ch03 {

namespace {

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: " + cublasGetStatusString(status));
  }
}

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // what cuBLAS suggests for Hopper

}  // namespace

CublasLtLinear::CublasLtLinear(ch02::GemmShape shape, bool gelu_bias) : shape_(shape), gelu_bias_(gelu_bias) {
  ch02::validate_gemm_shape(shape);
  const auto m = static_cast<std::uint64_t>(shape.m), n = static_cast<std::uint64_t>(shape.n);
  const auto k = static_cast<std::uint64_t>(shape.k);
  check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
  check_lt(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)),
           "set TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)), "set TRANSB");
  const cublasLtEpilogue_t epilogue = gelu_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  check_lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
           "set EPILOGUE");
  check_lt(cublasLtMatrixLayoutCreate(&w_layout_, CUDA_R_16BF, k, n, static_cast<std::int64_t>(k)), "W layout");
  check_lt(cublasLtMatrixLayoutCreate(&a_layout_, CUDA_R_16BF, k, m, static_cast<std::int64_t>(k)), "A layout");
  check_lt(cublasLtMatrixLayoutCreate(&c_layout_, CUDA_R_16BF, n, m, static_cast<std::int64_t>(n)), "C layout");

  check(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  cublasLtMatmulPreference_t preference = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  check_lt(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                sizeof(workspace_bytes_)),
           "set MAX_WORKSPACE_BYTES");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, w_layout_, a_layout_, c_layout_,
                                                               c_layout_, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  check_lt(status, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) throw std::runtime_error("cublasLtMatmulAlgoGetHeuristic found no algorithm");
  algo_ = result.algo;
}

CublasLtLinear::~CublasLtLinear() {
  // No throw from a destructor: errors on the way out are ignored.
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (c_layout_ != nullptr) cublasLtMatrixLayoutDestroy(c_layout_);
  if (a_layout_ != nullptr) cublasLtMatrixLayoutDestroy(a_layout_);
  if (w_layout_ != nullptr) cublasLtMatrixLayoutDestroy(w_layout_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void CublasLtLinear::run(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* c,
                         cudaStream_t stream) const {
  if (a == nullptr || w == nullptr || c == nullptr) throw InvalidArgument("a, w and c must not be null");
  if (gelu_bias_) {
    if (bias == nullptr) throw InvalidArgument("bias must not be null with the GELU_BIAS epilogue");
    // Setting an attribute is host-only: legal inside a graph capture.
    check_lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
             "set BIAS_POINTER");
  }
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(handle_, desc_, &alpha, w, w_layout_, a, a_layout_, &beta, c, c_layout_, c, c_layout_, &algo_,
                          workspace_, workspace_bytes_, stream),
           "cublasLtMatmul");
}

}  // namespace kc::ch03
