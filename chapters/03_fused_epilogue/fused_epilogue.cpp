// Before (unfused): Chapter 2's GEMM, then the elementwise passes of elementwise_before.cu; and the
// chapter's host-side arithmetic. The fused path (after) is fused_gemm.cu.
#include "fused_epilogue.hpp"

#include <cstdint>
#include <string>

#include "gemm_bf16.hpp"
#include "kc/check.hpp"
#include "kc/validate.hpp"

namespace kc::ch03 {

void validate_linear_unfused(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                             const Epilogue& epilogue, const __nv_bfloat16* scratch) {
  // The same rules as the fused path: the two must accept exactly the same calls.
  validate_linear_fused(a, w, c, shape, epilogue);
  // The residual is read after the GEMM has written c, so residual == c would add the product to
  // itself. The fused kernel reads each residual element before storing it and allows it.
  if (epilogue.residual != nullptr && epilogue.residual == c) {
    throw InvalidArgument("epilogue.residual must not be c in the unfused path (the GEMM overwrites it first)");
  }
  if (!epilogue.swiglu) return;
  if (scratch == nullptr) throw InvalidArgument("scratch must not be null in SwiGLU mode (the GEMM's [M, N] output)");
  if (!aligned_to(scratch, 16)) throw InvalidArgument("scratch must be 16-byte aligned");
  const std::uint64_t bf16 = sizeof(__nv_bfloat16);
  const auto m = static_cast<std::uint64_t>(shape.m), n = static_cast<std::uint64_t>(shape.n);
  const auto k = static_cast<std::uint64_t>(shape.k);
  if (overlaps(scratch, m * n * bf16, a, m * k * bf16)) throw InvalidArgument("scratch must not overlap a");
  if (overlaps(scratch, m * n * bf16, w, n * k * bf16)) throw InvalidArgument("scratch must not overlap w");
  if (overlaps(scratch, m * n * bf16, c, m * n / 2 * bf16)) throw InvalidArgument("scratch must not overlap c");
  if (epilogue.bias != nullptr && overlaps(scratch, m * n * bf16, epilogue.bias, n * bf16)) {
    throw InvalidArgument("epilogue.bias must not overlap scratch");
  }
}

void linear_unfused(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                    const Epilogue& epilogue, __nv_bfloat16* scratch, cudaStream_t stream) {
  validate_linear_unfused(a, w, c, shape, epilogue, scratch);
  if (epilogue.swiglu) {
    ch02::gemm_bf16(a, w, scratch, shape, stream);
    // A bias on the stacked output is the first pass's job; silu goes into silu_and_mul.
    if (epilogue.bias != nullptr) bias_activation(scratch, epilogue.bias, shape.m, shape.n, Activation::none, stream);
    silu_and_mul(scratch, c, shape.m, shape.n / 2, stream);
    return;
  }
  ch02::gemm_bf16(a, w, c, shape, stream);
  if (epilogue.bias != nullptr || epilogue.activation != Activation::none) {
    bias_activation(c, epilogue.bias, shape.m, shape.n, epilogue.activation, stream);
  }
  if (epilogue.residual != nullptr) add_residual(c, epilogue.residual, shape.m, shape.n, stream);
}

double extra_pass_bytes(std::int64_t m, std::int64_t n) {
  return 2.0 * 2.0 * static_cast<double>(m) * static_cast<double>(n);
}

int extra_passes(const Epilogue& epilogue) {
  if (epilogue.swiglu) return 1;
  const int bias_act = epilogue.bias != nullptr || epilogue.activation != Activation::none ? 1 : 0;
  return bias_act + (epilogue.residual != nullptr ? 1 : 0);
}

double layer_min_bytes(GemmShape shape, const Epilogue& epilogue) {
  const auto m = static_cast<double>(shape.m), n = static_cast<double>(shape.n), k = static_cast<double>(shape.k);
  const double out_cols = epilogue.swiglu ? n / 2 : n;
  double elements = m * k + n * k + m * out_cols;
  if (epilogue.bias != nullptr) elements += n;
  if (epilogue.residual != nullptr) elements += m * out_cols;
  return 2.0 * elements;
}

}  // namespace kc::ch03
