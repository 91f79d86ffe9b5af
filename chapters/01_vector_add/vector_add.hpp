/// @file vector_add.hpp
/// @brief Chapter 1: c = a + b on n floats, three ways.
///
/// Every function validates its arguments first (kc::InvalidArgument names the argument and the
/// rule; nothing is launched on bad input), then enqueues one kernel on @p stream. None of them
/// allocates or synchronises, so they can be captured into a CUDA graph.
///
/// Rules shared by all three: n >= 0; a, b and c may be null only when n == 0; c may be the same
/// array as a or b (in-place add) but must not partly overlap either. Pointers need only the
/// natural 4-byte alignment of float: the vectorized kernel handles any offset (see vector_add_after).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kc::ch01 {

/// Before: one thread per element, one scalar load of a, one of b, one scalar store. Grid of
/// ceil(n / 256) blocks of 256 threads, so n must be below 2^31 * 256.
void vector_add_before(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream = nullptr);

/// Tuning knobs of the vectorized kernel, exposed so the lesson's exercises can measure them.
struct VectorizedConfig {
  int threads_per_block = 256;  ///< block size (a multiple of 32, at most 1024)
  int unroll = 2;               ///< independent float4 loads per array in flight per thread (1, 2 or 4)
  int blocks_per_sm = 2;        ///< blocks per SM the grid is sized for (grid-stride loop)
};

/// After: 16-byte (float4) loads and stores in a grid-stride loop sized to fill the GPU once,
/// @p config.unroll float4 of each input in flight per thread, scalar code for the unaligned head
/// and the tail. When a, b and c sit at different offsets within 16 bytes, no common float4 view
/// exists and it falls back to scalar grid-stride code (still correct, just slower).
void vector_add_after(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream = nullptr,
                      const VectorizedConfig& config = {});

/// Uncoalesced on purpose: each thread adds one contiguous chunk of n / threads elements, the
/// way one would split work between CPU threads. Neighbouring threads then touch addresses a
/// chunk apart, so every warp-wide load needs up to 32 separate memory sectors.
void vector_add_uncoalesced(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream = nullptr);

/// Checks the rules above and throws kc::InvalidArgument naming the first one broken.
/// Host-only; called first by every launch function (and tested on the CPU).
void validate_vector_add(const float* a, const float* b, const float* c, std::int64_t n);

/// Validates @p config for the vectorized kernel; throws kc::InvalidArgument naming the field.
void validate_vectorized_config(const VectorizedConfig& config);

}  // namespace kc::ch01
