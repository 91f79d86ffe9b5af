/// @file sgemm.hpp
/// @brief Chapter 2, fp32 on CUDA cores: C = A · B in seven steps, from one thread per output to
/// warp tiling, each step its own kernel (sgemm_step1_naive.cu ... sgemm_step7_warptiled.cu).
///
/// Layout: A is [M, K], B is [K, N], C is [M, N], all row-major fp32 with no padding between rows
/// (row i of A starts at a + i * K). Every step computes C = A · B (no alpha, no beta) with fp32
/// multiply-adds, and handles any M, N, K >= 1: tiles that stick out of the matrices are masked.
///
/// Rules (checked by validate_sgemm, first thing in sgemm):
/// - shape: M, N and K each in [1, 2^31 - 1] (validate_gemm_shape);
/// - a, b and c are not null and are 4-byte aligned (the alignment of float). Any further
///   alignment is optional: steps 6 and 7 use 16-byte loads and stores where rows allow them and
///   scalar ones elsewhere;
/// - c must not overlap a or b, not even partly: C is written while A and B are still being read
///   by other blocks, so an in-place product would read half-updated values. a and b may overlap
///   (both are only read; A · A for a square A is fine).
///
/// sgemm() validates, then enqueues one kernel on the stream. It never allocates or synchronises,
/// so it can be captured into a CUDA graph. Results can differ between steps in the last bits
/// (each step sums K products in its own order), never between two runs of the same step.
#pragma once

#include <cuda_runtime.h>

#include <iosfwd>

#include "gemm_shape.hpp"

namespace kc::ch02 {

/// The rungs of the fp32 ladder, in the order the lesson climbs them.
enum class SgemmStep : int {
  kNaive = 1,    ///< one thread per output, threads of a warp walk down a column of C (uncoalesced)
  kCoalesced,    ///< one thread per output, threads of a warp walk along a row of C (coalesced)
  kSharedTiled,  ///< 32 × 32 tiles of A and B staged in shared memory
  kBlocktile1d,  ///< each thread computes a column of 8 outputs (1D register blocking)
  kBlocktile2d,  ///< each thread computes an 8 × 8 tile of outputs (2D register blocking)
  kVectorized,   ///< 16-byte global loads, A stored transposed so shared loads are 16 bytes too
  kWarptiled,    ///< block tile → warp tiles → thread tiles, double-buffered shared memory
};

/// The chapter's fastest fp32 step: its `after` for fp32.
inline constexpr SgemmStep kBestSgemmStep = SgemmStep::kWarptiled;

/// The step's name as benchmarks and tests print it: "step1_naive", "step2_coalesced",
/// "step3_shared_tiled", "step4_blocktile_1d", "step5_blocktile_2d", "step6_vectorized",
/// "step7_warptiled". Throws kc::InvalidArgument for a value outside the enum.
const char* sgemm_step_name(SgemmStep step);

/// Writes sgemm_step_name(@p step) to @p os ("SgemmStep(N)" for a value outside the enum), so that
/// GoogleTest and logs print steps by name.
std::ostream& operator<<(std::ostream& os, SgemmStep step);

/// Checks the rules in this file's description and throws kc::InvalidArgument naming the first one
/// broken (the argument and the rule, e.g. "c must not overlap a"). Host code only: it makes no
/// CUDA call, so it runs (and is tested) without a GPU.
/// @param a device pointer to A [M, K]
/// @param b device pointer to B [K, N]
/// @param c device pointer to C [M, N]
/// @param shape M, N and K
void validate_sgemm(const float* a, const float* b, const float* c, GemmShape shape);

/// C = A · B in fp32 with the kernel of @p step, enqueued on @p stream.
///
/// Validates the step and the arguments first (kc::InvalidArgument, nothing launched), then
/// launches one kernel and checks the launch (kc::CudaError). No allocation, no synchronisation.
/// @param step which rung of the ladder to run
/// @param a device pointer to A [M, K], row-major
/// @param b device pointer to B [K, N], row-major
/// @param c device pointer to C [M, N], row-major; every element is overwritten
/// @param shape M, N and K
/// @param stream the stream to enqueue on
void sgemm(SgemmStep step, const float* a, const float* b, float* c, GemmShape shape, cudaStream_t stream = nullptr);

}  // namespace kc::ch02
