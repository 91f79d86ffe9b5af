/// @file random.hpp
/// @brief Seeded, reproducible random inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace kc {

/// The seed for a test or benchmark run: the value of the environment variable KC_SEED when set,
/// otherwise a fresh one from std::random_device. Print it so a failure can be reproduced.
std::uint64_t random_seed();

/// SplitMix64: a tiny, fast, high-quality 64-bit mixer. Counter-based use (hash of seed + index)
/// makes every element independent of how the fill is split across threads or calls.
__host__ __device__ constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A uniform double in [0, 1) for element @p index of stream @p seed.
__host__ __device__ constexpr double uniform01(std::uint64_t seed, std::uint64_t index) {
  return static_cast<double>(splitmix64(seed ^ splitmix64(index)) >> 11) * 0x1.0p-53;
}

/// Fills @p out with values uniform in [lo, hi), element i determined by (seed, i) alone.
void fill_uniform(std::span<float> out, std::uint64_t seed, double lo = -1.0, double hi = 1.0);
/// Fills @p out with doubles uniform in [lo, hi); element i determined by (seed, i) alone.
void fill_uniform(std::span<double> out, std::uint64_t seed, double lo = -1.0, double hi = 1.0);
/// Fills @p out with bf16 values uniform in [lo, hi), rounded to the nearest bf16; element i
/// determined by (seed, i) alone.
void fill_uniform(std::span<__nv_bfloat16> out, std::uint64_t seed, double lo = -1.0, double hi = 1.0);

/// Device-side version of fill_uniform for benchmark inputs too large to fill on the host quickly:
/// element i gets exactly the value fill_uniform would give it. Enqueued on @p stream.
void fill_uniform_device(float* out, std::size_t count, std::uint64_t seed, double lo, double hi,
                         cudaStream_t stream = nullptr);

/// bf16 version of fill_uniform_device: element i gets exactly the value fill_uniform gives it.
void fill_uniform_device(__nv_bfloat16* out, std::size_t count, std::uint64_t seed, double lo, double hi,
                         cudaStream_t stream = nullptr);

}  // namespace kc
