// EXERCISE: activation.cuh with its key lines replaced by TODOs. Fill them in here.
// Generated from ../activation.cuh by tools/exercises.py (do not edit the solution's copy).
// Build and test this file in place of the solution:
//   cmake --preset exercises && cmake --build --preset exercises && ctest --preset exercises -L ch03
// Until every TODO is done the chapter's tests fail; the lesson (README.md) explains the solution.

/// @file activation.cuh
/// @brief The activations of the fused epilogue, in fp32, callable on the host and the device, so
/// that the fused kernel, the separate elementwise kernels and the CPU tests share one definition
/// (the fused and unfused paths then differ only by where they round to bf16).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "fused_epilogue.hpp"

namespace kc::ch03 {

/// SiLU, x · sigmoid(x). Written as x / (1 + e^-x): for very negative x, e^-x overflows to +inf
/// and the quotient is -0, the right limit, instead of the NaN that x · (1 / (1 + inf)) · ... risks.
/// On the GPU with the fast intrinsics (__expf: ex2.approx; __fdividef: a reciprocal and a
/// multiply), about 4 instructions instead of ~25, with errors far below bf16's rounding step; for
/// x below about -88, e^-x is +inf, the reciprocal 0 and the result -0 as before.
__host__ __device__ inline float silu(float x) {
#ifdef __CUDA_ARCH__
  return __fdividef(x, 1.0f + __expf(-x));
#else
  return x / (1.0f + expf(-x));
#endif
}

/// tanh for an epilogue whose output is bf16. On the GPU, the hardware's tanh.approx.f32 (one
/// instruction, relative error below 2^-10.9 per the PTX ISA) instead of tanhf's ~20 instructions:
/// its error is 8 times smaller than bf16's rounding step (2^-8), and GELU(tanh) on every output of
/// a 4096 x 4096 tile would otherwise cost a few percent of the GEMM. On the host, std::tanh.
__host__ __device__ inline float fast_tanh(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::tanh(x);
#endif
}

/// @p x through @p activation in fp32 (see Activation for the formulas). The switch is on a value
/// every thread of the launch shares, so on the GPU it costs a uniform branch, not divergence.
__host__ __device__ inline float activate(float x, Activation activation) {
  switch (activation) {
    case Activation::none: return x;
    case Activation::relu: return x < 0.0f ? 0.0f : x;  // NaN < 0 is false: NaN stays NaN, as in PyTorch
    case Activation::gelu_erf: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::gelu_tanh: {
      // TODO 1: GELU, tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in fp32, with
      // fast_tanh (the hardware's tanh.approx on the GPU, std::tanh on the host).
      return x;
    }
    case Activation::silu: return silu(x);
  }
  return x;
}

}  // namespace kc::ch03
