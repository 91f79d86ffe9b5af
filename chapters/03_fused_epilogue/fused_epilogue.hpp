/// @file fused_epilogue.hpp
/// @brief Chapter 3: a linear layer with its epilogue, out = act(A · Wᵀ + bias) + residual, and the
/// SwiGLU of an MoE expert, out = silu(A · W_gateᵀ) · (A · W_upᵀ), unfused (before) and fused (after).
///
/// Layouts as in Chapter 2: A [M, K], W [N, K], C [M, N], all row-major bf16; bias [N]; residual
/// [M, N]. Numerics: fp32 accumulation; the fused path rounds to bf16 once per output, the unfused
/// one after the GEMM and after each elementwise pass.
///
/// SwiGLU weights: the gate and up matrices, each [I, K], are stacked into one [2I, K] matrix so
/// that one GEMM computes both. The unfused path takes them as two halves (rows 0..I-1 gate, I..2I-1
/// up: PyTorch's `chunk(2, -1)` and vLLM's silu_and_mul); the fused path takes them *interleaved*
/// (row 2j gate j, row 2j+1 up j), so that gate j and up j land in the same thread's registers.
/// interleave_gate_up converts once, when the weights are loaded.
///
/// Rules of the fused path (validate_linear_fused; checked before any CUDA call, kc::InvalidArgument
/// names the broken one), on top of Chapter 2's kc::ch02::validate_gemm_bf16:
///   - bias, when given, holds N elements, 2-byte aligned, and does not overlap c (other blocks
///     still read it while c is written);
///   - residual, when given, is [M, N] like c and either *is* c (same pointer: every element is read
///     and then written by the same thread, so `c += f(x)` in place is safe) or does not overlap it
///     at all (a shifted overlap would let one thread read what another already wrote);
///   - swiglu: N even, activation silu, no residual, bias 4-byte aligned; c holds M × N/2 elements.
/// The unfused path adds
/// a scratch buffer for SwiGLU's [M, N] GEMM output, and residual != c (the unfused GEMM overwrites
/// c before the residual pass could read it; only the fused kernel can add c to itself in place). All launches validate
/// first, neither allocate nor synchronise (CUDA-graph capturable), and check the launch error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gemm_bf16.hpp"
#include "gemm_shape.hpp"
#include "kc/check.hpp"

namespace kc::ch03 {

using ch02::GemmBf16Tile;
using ch02::GemmShape;

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

/// What the epilogue does: out = act(acc + bias) + residual, or, in SwiGLU mode (W holds the gate
/// and up rows of an MoE expert interleaved: row 2j gate j, row 2j+1 up j),
/// out[m, j] = silu(acc[m, 2j] + bias[2j]) · (acc[m, 2j+1] + bias[2j+1]), with C [M, N/2]. The
/// default (all null, none, false) is the plain GEMM.
struct Epilogue {
  const __nv_bfloat16* bias = nullptr;       ///< [N], added before the activation; null for none
  Activation activation = Activation::none;  ///< applied after the bias (to the gate in SwiGLU mode)
  const __nv_bfloat16* residual = nullptr;   ///< [M, N] added after the activation; null for none; may be c
  bool swiglu = false;                       ///< W rows interleaved gate/up; c is [M, N/2] = silu(gate)·up
};

/// Number of output columns: N, or N/2 in SwiGLU mode. Does not validate.
inline std::int64_t epilogue_output_columns(GemmShape shape, const Epilogue& epilogue) {
  return epilogue.swiglu ? shape.n / 2 : shape.n;
}

// ------------------------------------------------------------------------------------ after (fused)

/// Checks the fused path's rules (this file's description). Host-only.
void validate_linear_fused(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape,
                           const Epilogue& epilogue);

/// After: one GEMM whose epilogue applies bias, activation and residual (or SwiGLU) before the
/// single store (fused_gemm.cu), with the tile kc::ch02::choose_gemm_bf16_tile picks.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned; gate/up rows interleaved in SwiGLU mode
/// @param c [M, N] output ([M, N/2] in SwiGLU mode); may be epilogue.residual
/// @param shape M, N, K of the GEMM (K a multiple of 8)
/// @param epilogue what to apply
/// @param stream the stream to enqueue on
void linear_fused(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                  const Epilogue& epilogue, cudaStream_t stream = nullptr);

/// linear_fused with the tile chosen by the caller (tests: every tile must work). Throws
/// kc::InvalidArgument when @p tile does not fit this GPU's shared memory.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned; gate/up rows interleaved in SwiGLU mode
/// @param c [M, N] output ([M, N/2] in SwiGLU mode); may be epilogue.residual
/// @param shape M, N, K of the GEMM
/// @param epilogue what to apply
/// @param tile the block tile to use
/// @param stream the stream to enqueue on
void linear_fused_with_tile(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                            const Epilogue& epilogue, GemmBf16Tile tile, cudaStream_t stream = nullptr);

// ---------------------------------------------------------------------------------- before (unfused)

/// Checks the unfused path's rules: those of the fused path (with W's gate/up halves in SwiGLU
/// mode), residual != c, and, in SwiGLU mode, @p scratch: not null, 16-byte aligned, M × N elements, overlapping
/// none of a, w, c. Outside SwiGLU mode @p scratch is ignored. Throws kc::InvalidArgument. Host-only.
void validate_linear_unfused(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                             const Epilogue& epilogue, const __nv_bfloat16* scratch);

/// Before: Chapter 2's GEMM writes C, then one elementwise pass adds the bias and applies the
/// activation (skipped when there is neither), then another adds the residual (when given). In
/// SwiGLU mode the GEMM writes @p scratch [M, N] (W as gate/up halves) and silu_and_mul writes c.
/// @param a [M, K] row-major, 16-byte aligned
/// @param w [N, K] row-major, 16-byte aligned; gate rows then up rows in SwiGLU mode
/// @param c [M, N] output ([M, N/2] in SwiGLU mode); may be epilogue.residual
/// @param shape M, N, K of the GEMM
/// @param epilogue what to apply
/// @param scratch [M, N] for SwiGLU's GEMM output; null otherwise
/// @param stream the stream to enqueue on
void linear_unfused(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                    const Epilogue& epilogue, __nv_bfloat16* scratch = nullptr, cudaStream_t stream = nullptr);

/// The first elementwise pass, in place: c[i, j] = act(c[i, j] + bias[j]) for an [M, N] matrix,
/// 16 bytes (8 bf16) per thread and load where N % 8 == 0 and the pointers are 16-byte aligned.
/// @param c [M, N] row-major, read and written
/// @param bias [N], or null for none
/// @param m rows, >= 1
/// @param n columns, >= 1
/// @param activation the activation
/// @param stream the stream to enqueue on
void bias_activation(__nv_bfloat16* c, const __nv_bfloat16* bias, std::int64_t m, std::int64_t n, Activation activation,
                     cudaStream_t stream = nullptr);

/// The second elementwise pass, in place: c[i] += residual[i] for M × N elements, 16 bytes per
/// thread and load where possible. residual may equal c (then c doubles) but not overlap it otherwise.
/// @param c [M, N], read and written
/// @param residual [M, N]
/// @param m rows, >= 1
/// @param n columns, >= 1
/// @param stream the stream to enqueue on
void add_residual(__nv_bfloat16* c, const __nv_bfloat16* residual, std::int64_t m, std::int64_t n,
                  cudaStream_t stream = nullptr);

/// SwiGLU's elementwise pass: out[i, j] = silu(gate_up[i, j]) · gate_up[i, j + n_out], with
/// gate_up [M, 2·n_out] (gate half, then up half) and out [M, n_out]; 16 bytes per thread where
/// n_out % 8 == 0 and the pointers are 16-byte aligned. out must not overlap gate_up.
/// @param gate_up [M, 2·n_out] row-major
/// @param out [M, n_out] row-major
/// @param m rows, >= 1
/// @param n_out output columns, >= 1
/// @param stream the stream to enqueue on
void silu_and_mul(const __nv_bfloat16* gate_up, __nv_bfloat16* out, std::int64_t m, std::int64_t n_out,
                  cudaStream_t stream = nullptr);

// ------------------------------------------------------------------------------------ host helpers

/// Reorders stacked SwiGLU weights from halves (rows 0..I-1 gate, I..2I-1 up; @p halves has 2I rows
/// of @p k) to interleaved (row 2j gate j, row 2j+1 up j), the fused path's layout. Works as well
/// for a [2I] bias (k = 1). Throws kc::InvalidArgument when the sizes disagree.
template <typename T>
std::vector<T> interleave_gate_up(std::span<const T> halves, std::int64_t k) {
  const auto rows = k > 0 ? static_cast<std::int64_t>(halves.size()) / k : 0;
  if (k < 1 || rows * k != static_cast<std::int64_t>(halves.size()) || rows % 2 != 0) {
    throw InvalidArgument("halves (" + std::to_string(halves.size()) +
                          " elements) must hold an even number of rows of k (" + std::to_string(k) + ")");
  }
  const std::int64_t half = rows / 2;
  std::vector<T> out(halves.size());
  for (std::int64_t j = 0; j < half; ++j) {
    for (std::int64_t e = 0; e < k; ++e) {
      out[static_cast<std::size_t>((2 * j) * k + e)] = halves[static_cast<std::size_t>(j * k + e)];
      out[static_cast<std::size_t>((2 * j + 1) * k + e)] = halves[static_cast<std::size_t>((half + j) * k + e)];
    }
  }
  return out;
}

/// The bytes one extra elementwise pass over an [M, N] bf16 matrix moves beyond what the fused
/// kernel moves anyway: it reads C and writes it back, 2 × 2 bytes per element. (The bias and the
/// residual are read by the fused kernel too, so they are not extra.)
double extra_pass_bytes(std::int64_t m, std::int64_t n);

/// Number of extra passes the unfused path makes for @p epilogue: 1 for bias and/or activation, 1
/// for the residual; SwiGLU counts 1 (its GEMM writes [M, N] and silu_and_mul reads it back).
int extra_passes(const Epilogue& epilogue);

/// The fewest bytes of the whole layer (A, W, bias, residual read once; C written once): the
/// `min_bytes` of the benchmark, shared by all its variants of a case.
double layer_min_bytes(GemmShape shape, const Epilogue& epilogue);

/// Floor time in seconds of moving @p bytes at @p bytes_per_second (the lesson's arithmetic).
inline double floor_seconds(double bytes, double bytes_per_second) { return bytes / bytes_per_second; }

// ------------------------------------------------------------------------------- fp64 references

/// @p x through @p activation in double (erf and tanh GELU from the C++ standard library): the tests' ground truth.
double activate_reference(double x, Activation activation);

/// out = act(A · Wᵀ + bias) + residual in double, [M, N]. @p bias and @p residual may be empty
/// (none). A [M, K], W [N, K], all row-major.
std::vector<double> linear_reference(std::span<const double> a, std::span<const double> w, std::span<const double> bias,
                                     std::span<const double> residual, Activation activation, std::int64_t m,
                                     std::int64_t n, std::int64_t k);

/// out = silu(A · W_gateᵀ + b_gate) · (A · W_upᵀ + b_up) in double, [M, I], from separate gate and
/// up matrices [I, K] and biases [I] (empty: none).
std::vector<double> swiglu_reference(std::span<const double> a, std::span<const double> w_gate,
                                     std::span<const double> w_up, std::span<const double> b_gate,
                                     std::span<const double> b_up, std::int64_t m, std::int64_t i, std::int64_t k);

}  // namespace kc::ch03
