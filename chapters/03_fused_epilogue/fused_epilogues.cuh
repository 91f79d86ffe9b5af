/// @file fused_epilogues.cuh
/// @brief The fused epilogues: what Chapter 2's main loop hands its fp32 accumulators to, so that
/// bias, activation, residual (BiasActivationResidual, BiasActivation) or SwiGLU (SwiGlu) are applied
/// before the single bf16 store. Device code only; fused_gemm.cu instantiates the kernel with them.
///
/// Staged: the accumulators go through shared memory to a short loop (gemm_bf16_store.cuh's
/// staged_store) that applies the epilogue four outputs at a time. Applying it to every one of a
/// thread's 128 accumulators in the kernel's last, fully unrolled loop instead is correct, but the
/// large tile's kernel grows from 2,560 to 18,048 instructions (a switch over five activations,
/// inlined 256 times), and straight-line code that runs once per tile comes from the instruction
/// cache cold: the 4096^3 GEMM takes about twice as long.
///
/// In registers (RegisterBiasActivationResidual), where staging loses: a single wave of one 4-warp
/// block per SM (M = 128, the small-deep tile). Per-block %globaltimer stamps put the staged
/// epilogue at about 2.2 us after the K loop against 0.8 us for the plain store, most of it with no
/// arithmetic at all: two barriers, the accumulators through shared memory, and a loop of dependent
/// steps that one warp a scheduler walks with nothing to hide them. So the small-deep tile finishes
/// in registers, where the plain store does, with the activation a template argument (one kernel
/// per activation, chosen on the host): each thread's 32 outputs are independent, fully unrolled
/// straight-line code that ptxas interleaves, so the latencies overlap.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

// Angle brackets: the exercise build puts the skeleton's activation.cuh first on the include path.
#include <activation.cuh>

#include "fused_epilogue.hpp"
#include "gemm_bf16_mainloop.cuh"
#include "gemm_bf16_store.cuh"

namespace kc::ch03 {

using ch02::block::BlockTile;
using ch02::block::copy_epilogue_inputs;
using ch02::block::for_each_pair;
using ch02::block::InputCopies;
using ch02::block::load4;
using ch02::block::Prefetch;
using ch02::block::staged_store;
using ch02::block::Staging;
using ch02::block::store4;

/// The activation of four values, with the switch outside the loop over them.
__device__ __forceinline__ void activate4(float (&x)[4], Activation activation) {
  switch (activation) {
    case Activation::none: break;
    case Activation::relu:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::relu);
      break;
    case Activation::gelu_erf:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::gelu_erf);
      break;
    case Activation::gelu_tanh:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::gelu_tanh);
      break;
    case Activation::silu:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::silu);
      break;
  }
}

/// out = act(acc + bias) + residual, rounded once. residual may be c itself: each element is read
/// (into shared memory, or by the thread that stores it) before it is stored.
struct BiasActivationResidual {
  static constexpr InputCopies input_copies = InputCopies::at_start;  ///< when vector and it fits
  static constexpr int outputs_per_group = 4;                         ///< C columns per 4 accumulators
  const __nv_bfloat16* bias;                                          ///< [n] or null
  const __nv_bfloat16* residual;                                      ///< [m, n] or null
  int n;                                                              ///< columns of C (and of the residual)
  Activation activation;                                              ///< applied after the bias
  bool vector;              ///< n % 8 == 0 and c, bias, residual 16-byte aligned: cp.async staging, 8-byte stores
  bool prefetched = false;  ///< vector, and the launch added Prefetch<Cfg>::bytes of shared memory

  /// Four outputs at (row, col..col+3) of C: @p bias4 the bias of those columns (read once per
  /// thread from shared memory), the residual already in shared memory.
  __device__ void finish4(float (&x)[4], const float (&bias4)[4], const __nv_bfloat16* residual4,
                          __nv_bfloat16* out) const {
    // exercise 2: out = act(x + bias) + residual for the four outputs, in fp32: add bias4 when there
    // exercise 2: is a bias, activate4, then add the residual (load4 from residual4) when there is one.
    // exercise 2: Round once, in the store below.
    // stub: (void)bias4;
    // stub: (void)residual4;
    if (bias != nullptr) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] += bias4[e];
    }
    activate4(x, activation);
    if (residual != nullptr) {
      float r[4];
      load4(r, residual4);
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] += r[e];
    }
    // end exercise 2
    store4(x, out);
  }

  /// The same, element by element from global memory, for the `count` outputs that exist.
  __device__ void finish_each(float (&x)[4], int count, std::int64_t row, int col, __nv_bfloat16* c) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < count && bias != nullptr) x[e] += __bfloat162float(bias[col + e]);
    }
    activate4(x, activation);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e >= count) break;
      const std::int64_t at = row * n + col + e;
      if (residual != nullptr) x[e] += __bfloat162float(residual[at]);
      c[at] = __float2bfloat16_rn(x[e]);
    }
  }

  /// Issues the copies of the tile's bias and residual rows (the epilogue hook, gemm_bf16_mainloop.cuh).
  template <class Cfg>
  __device__ void copy_inputs(unsigned char* smem, int block_row0, int block_col0, int rows_left, int cols_left) const {
    copy_epilogue_inputs<Cfg>(*this, smem, block_row0, block_col0, rows_left, cols_left);
  }

  /// Finishes and stores the block's tile through shared memory (the epilogue hook).
  template <class Cfg, class Acc>
  __device__ void store(const Acc& acc, const BlockTile& t, unsigned char* smem) const {
    staged_store<Cfg>(acc, *this, smem, t);
  }
};

/// BiasActivationResidual for a call whose residual is null: nothing is kept beside the staged
/// accumulators, so the large tile is staged whole, in one part (one barrier pair instead of two),
/// as StagedStore is. The launch picks it where that changes the part count (the large tiles).
struct BiasActivation : BiasActivationResidual {
  static constexpr bool residual_rows = false;  ///< Staging keeps no residual rows: residual is null

  /// Finishes and stores the block's tile through shared memory, staged whole (the epilogue hook).
  template <class Cfg, class Acc>
  __device__ void store(const Acc& acc, const BlockTile& t, unsigned char* smem) const {
    staged_store<Cfg>(acc, *this, smem, t);
  }
};

/// True when a residual's rows split Cfg's staged epilogue into two parts and no residual keeps it
/// whole (the 128 × 256 tiles): where BiasActivation is worth its own kernel.
template <class Cfg>
inline constexpr bool residual_rows_split_the_tile = (Staging<Cfg, true>::parts > Staging<Cfg, false>::parts);

/// SwiGLU on interleaved gate/up rows: accumulators (2j, 2j+1) are (gate_j, up_j), so 4 staged
/// accumulators give 2 outputs, out_j = silu(gate_j + bias_2j) · (up_j + bias_2j+1). n (even)
/// counts W's rows; C has n / 2 columns.
struct SwiGlu {
  static constexpr InputCopies input_copies = InputCopies::at_start;  ///< when vector and it fits
  static constexpr int outputs_per_group = 2;                         ///< C columns per 4 accumulators
  const __nv_bfloat16* bias;                                          ///< [n] interleaved like W, or null
  static constexpr bool residual_rows = false;  ///< no residual (validated): one part on every tile
  const __nv_bfloat16* residual = nullptr;      ///< never used (validated); keeps the staging code common
  int n;                                        ///< rows of W (columns of the GEMM); C has n / 2
  bool vector;                                  ///< n % 8 == 0 and c, bias 16-byte aligned
  bool prefetched = false;                      ///< vector, and the launch added Prefetch<Cfg>::bytes

  /// Two outputs from the accumulators of W columns col..col+3 (gate, up, gate, up), @p bias4 the
  /// bias of those columns; one 4-byte store at @p out.
  __device__ void finish4(float (&x)[4], const float (&bias4)[4], const __nv_bfloat16*, __nv_bfloat16* out) const {
    // exercise 3: SwiGLU's pairing: x holds (gate, up, gate, up) of two outputs. Add bias4 when there
    // exercise 3: is a bias, then store silu(gate) * up for both pairs as one bf16x2 at out.
    // stub: (void)bias4;
    // stub: *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(x[0], x[2]);
    if (bias != nullptr) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] += bias4[e];
    }
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(silu(x[0]) * x[1], silu(x[2]) * x[3]);
    // end exercise 3
  }

  /// `count` (even) W columns from col on exist; col is even.
  __device__ void finish_each(float (&x)[4], int count, std::int64_t row, int col, __nv_bfloat16* c) const {
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      if (2 * pair >= count) break;
      float gate = x[2 * pair], up = x[2 * pair + 1];
      if (bias != nullptr) {
        gate += __bfloat162float(bias[col + 2 * pair]);
        up += __bfloat162float(bias[col + 2 * pair + 1]);
      }
      c[row * (n / 2) + col / 2 + pair] = __float2bfloat16_rn(silu(gate) * up);
    }
  }

  /// Issues the copies of the tile's bias and residual rows (the epilogue hook, gemm_bf16_mainloop.cuh).
  template <class Cfg>
  __device__ void copy_inputs(unsigned char* smem, int block_row0, int block_col0, int rows_left, int cols_left) const {
    copy_epilogue_inputs<Cfg>(*this, smem, block_row0, block_col0, rows_left, cols_left);
  }

  /// Finishes and stores the block's tile through shared memory (the epilogue hook).
  template <class Cfg, class Acc>
  __device__ void store(const Acc& acc, const BlockTile& t, unsigned char* smem) const {
    staged_store<Cfg>(acc, *this, smem, t);
  }
};

/// out = act(acc + bias) + residual in registers, with bias and residual prefetched into shared
/// memory (the Prefetch area). Launched only where that prefetch applies (`vector`, and the area
/// fits beside the pipeline: fused_gemm.cu's run_fused), and stored as whole bf16x2 pairs;
/// other calls take the staged epilogue. The activation is the template argument, so the kernel
/// holds one activation's code.
template <Activation kActivation>
struct RegisterBiasActivationResidual {
  /// Bias and residual copied once the last K slice is issued (gemm_bf16_mainloop.cuh says why).
  static constexpr InputCopies input_copies = InputCopies::with_last_slices;
  const __nv_bfloat16* bias;      ///< [n] or null
  const __nv_bfloat16* residual;  ///< [m, n] or null; may be c
  int n;                          ///< columns of C (and of the residual)
  bool vector;                    ///< n % 8 == 0 and c, bias, residual 16-byte aligned
  bool prefetched = false;        ///< vector, and the launch added Prefetch<Cfg>::bytes of shared memory

  /// Finishes the pair (x, y) at (tile_row, tile_col) and (tile_row, tile_col + 1) of the block's
  /// tile, right before its store, in the thread that holds it. `smem` is the kernel's shared
  /// memory: the Prefetch area follows the pipeline's buffers, and holds zeros where there is no
  /// bias or no residual (copy_inputs), so that the code has no branch on them: with
  /// one, ptxas compiles every pair's code twice over and the kernel grows past the size at which the
  /// K loop is still scheduled as the plain GEMM's. A missing bias
  /// or residual therefore adds +0.0f, which turns a -0 into +0: the one place where this path and
  /// the staged one can differ. `vector` makes every pair whole and one aligned bf16x2.
  template <class Cfg>
  __device__ void finish_pair(float& x, float& y, int tile_row, int tile_col, const unsigned char* smem) const {
    const unsigned char* area = smem + Prefetch<Cfg>::offset;
    // exercise 4: Read the bias pair (a row of bf16 at area + Prefetch<Cfg>::residual_bytes, indexed by
    // exercise 4: tile_col) and the residual pair (rows of Prefetch<Cfg>::residual_ld bf16 from area, at
    // exercise 4: tile_row, tile_col) as bf16x2, then x = act(x + bias) + residual and the same for y.
    // exercise 4: No branch: zeros stand in for a missing bias or residual.
    // stub: (void)area;
    // stub: (void)tile_row;
    // stub: (void)tile_col;
    const float2 b = __bfloat1622float2(
        *reinterpret_cast<const __nv_bfloat162*>(area + Prefetch<Cfg>::residual_bytes + tile_col * 2));
    const float2 r = __bfloat1622float2(
        *reinterpret_cast<const __nv_bfloat162*>(area + (tile_row * Prefetch<Cfg>::residual_ld + tile_col) * 2));
    x = activate(x + b.x, kActivation) + r.x;
    y = activate(y + b.y, kActivation) + r.y;
    // end exercise 4
  }

  /// Zero-fills the Prefetch area where there is no bias or no residual, then issues the copies of
  /// those there are (the epilogue hook, gemm_bf16_mainloop.cuh).
  template <class Cfg>
  __device__ void copy_inputs(unsigned char* smem, int block_row0, int block_col0, int rows_left, int cols_left) const {
    // Plain stores, visible after the barrier of the K loop's last iteration.
    const int tid = static_cast<int>(threadIdx.x);
    auto zero = [&](int offset, int bytes) {
      for (int q = tid; q < bytes / 16; q += Cfg::threads) {
        *reinterpret_cast<uint4*>(smem + Prefetch<Cfg>::offset + offset + q * 16) = make_uint4(0, 0, 0, 0);
      }
    };
    if (residual == nullptr) zero(0, Prefetch<Cfg>::residual_bytes);
    if (bias == nullptr) zero(Prefetch<Cfg>::residual_bytes, Prefetch<Cfg>::bias_bytes);
    copy_epilogue_inputs<Cfg>(*this, smem, block_row0, block_col0, rows_left, cols_left);
  }

  /// Finishes each pair in the thread that holds it and stores it as one bf16x2 (the epilogue hook).
  /// Launched only on the vector path: N % 8 == 0 and c 16-byte aligned, so every pair exists whole
  /// and is one aligned bf16x2 (store_pair's tests would double the code again).
  template <class Cfg, class Acc>
  __device__ void store(const Acc& acc, const BlockTile& t, unsigned char* smem) const {
    // The copies' group was waited for, and a barrier passed, in the K loop or right after it.
    for_each_pair<Cfg>(acc, t, [&](__nv_bfloat16* out, float x, float y, int row, int col) {
      finish_pair<Cfg>(x, y, row, col, smem);
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(x, y);
    });
  }
};

}  // namespace kc::ch03
