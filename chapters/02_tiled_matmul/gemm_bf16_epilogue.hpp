/// @file gemm_bf16_epilogue.hpp
/// @brief The epilogue hook of the bf16 GEMM: C = epilogue(A · Wᵀ), applied in registers to the fp32
/// accumulators before the single bf16 store. Chapter 3 ("fused epilogue") is its user.
///
/// The kernel is Chapter 2's mma.sync kernel unchanged up to its last loop; there, each thread holds
/// pairs of neighbouring output columns (col, col+1) of one row, and the epilogue turns each pair
/// into what is stored. Two epilogues exist:
///   - bias + activation + residual: out[m, n] = act(acc[m, n] + bias[n]) + residual[m, n]
///     (bias and residual optional, each rounded to bf16 only once, at the end);
///   - SwiGLU (swiglu = true): W holds the gate and up rows of an MoE expert *interleaved*, row 2j
///     is gate row j and row 2j+1 is up row j, so a thread's pair (2j, 2j+1) is (gate_j, up_j) and
///     out[m, j] = silu(acc[m, 2j] + bias[2j]) · (acc[m, 2j+1] + bias[2j+1]). C is [M, N/2].
///
/// Rules, on top of validate_gemm_bf16's (checked before any CUDA call; kc::InvalidArgument names
/// the broken one):
///   - bias, when given, holds N elements, 2-byte aligned, and does not overlap c (other blocks
///     still read it while c is written);
///   - residual, when given, is [M, N] like c and either *is* c (same pointer: every element is read
///     and then written by the same thread, so `c += f(x)` in place is safe) or does not overlap it
///     at all (a shifted overlap would let one thread read what another already wrote);
///   - swiglu: N even, activation silu, no residual; c holds M × N/2 elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm_bf16.hpp"
#include "gemm_shape.hpp"

namespace kc::ch02 {

/// The activation an epilogue applies (to every output, or to the gate in SwiGLU mode).
enum class Activation {
  none,       ///< identity
  relu,       ///< max(x, 0)
  gelu_erf,   ///< x · Φ(x) = 0.5 · x · (1 + erf(x / √2)), PyTorch's gelu(approximate="none")
  gelu_tanh,  ///< 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))), PyTorch's gelu(approximate="tanh")
  silu,       ///< x · sigmoid(x) = x / (1 + e^-x), also called swish
};

/// The printable name of @p activation ("none", "relu", "gelu_erf", "gelu_tanh", "silu").
const char* to_string(Activation activation);

/// What the epilogue does. The default (all null, none, false) is Chapter 2's plain GEMM.
struct GemmBf16Epilogue {
  const __nv_bfloat16* bias = nullptr;       ///< [N], added before the activation; null for none
  Activation activation = Activation::none;  ///< applied after the bias (to the gate in SwiGLU mode)
  const __nv_bfloat16* residual = nullptr;   ///< [M, N] added after the activation; null for none; may be c
  bool swiglu = false;                       ///< W rows interleaved gate/up; c is [M, N/2] = silu(gate)·up
};

/// Number of output columns: N, or N/2 in SwiGLU mode. Does not validate.
inline std::int64_t epilogue_output_columns(GemmShape shape, const GemmBf16Epilogue& epilogue) {
  return epilogue.swiglu ? shape.n / 2 : shape.n;
}

/// Checks validate_gemm_bf16's rules (with c of M × output columns) and this file's. Host-only.
void validate_gemm_bf16_epilogue(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c,
                                 GemmShape shape, const GemmBf16Epilogue& epilogue);

/// c = epilogue(a · wᵀ) on @p stream with the tile choose_gemm_bf16_tile picks (the same as gemm_bf16).
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned (gate/up rows interleaved in SwiGLU mode)
/// @param c [M, N] row-major output ([M, N/2] in SwiGLU mode)
/// @param shape M, N, K of the GEMM (K a multiple of 8)
/// @param epilogue bias, activation, residual, SwiGLU mode
/// @param stream the stream to enqueue on
void gemm_bf16_epilogue(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                        const GemmBf16Epilogue& epilogue, cudaStream_t stream = nullptr);

/// gemm_bf16_epilogue with the tile chosen by the caller (tests: every tile must work). Throws
/// kc::InvalidArgument when @p tile does not fit this GPU's shared memory.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned
/// @param c [M, N] row-major output ([M, N/2] in SwiGLU mode)
/// @param shape M, N, K of the GEMM
/// @param epilogue bias, activation, residual, SwiGLU mode
/// @param tile the block tile to use
/// @param stream the stream to enqueue on
void gemm_bf16_epilogue_with_tile(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                                  const GemmBf16Epilogue& epilogue, GemmBf16Tile tile, cudaStream_t stream = nullptr);

}  // namespace kc::ch02
