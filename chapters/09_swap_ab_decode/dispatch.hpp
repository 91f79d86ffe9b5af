/// @file dispatch.hpp
/// @brief Which kernel grouped_gemm_decode runs, and the token tile of the swapped one, from what the
/// host knows without asking the device: M_total and E. constexpr, so the CPU tests check the rule.
#pragma once

#include <cstdint>

// Angle brackets: the exercise build puts the skeleton's swap_tiles.hpp first on the include path.
#include <swap_tiles.hpp>

namespace kc::ch09 {

/// Tokens per expert, on average over all E experts, up to which grouped_gemm_decode runs the swapped
/// kernel; above it Chapter 8's kernel runs. The lesson's crossover table is where it comes from.
inline constexpr std::int64_t kSwapMaxTokensPerExpert = 64;

/// The smallest token tile (8, 16, 32 or 64) that holds @p tokens_per_expert tokens; 64 above that.
__host__ __device__ constexpr int token_tile_for(std::int64_t tokens_per_expert) {
  int tile = 8;
  while (tile < kMaxTokenTile && tile < tokens_per_expert) tile *= 2;
  return tile;
}

/// What grouped_gemm_decode runs.
struct DecodeChoice {
  bool swapped = true;      ///< the swapped kernel (step 3); false: Chapter 8's grouped_gemm_hopper
  int token_tile = 8;       ///< the swapped kernel's tokens per tile
  std::int64_t tokens = 0;  ///< ceil(M_total / E): tokens per expert, on average
};

/// The rule: tokens per expert on average, t = ceil(@p m_total / @p experts); the swapped kernel with
/// the token tile token_tile_for(t) while t <= kSwapMaxTokensPerExpert, Chapter 8's kernel above.
/// An expert with more tokens than the tile gets several token tiles (its weights read again, from
/// L2 while its tiles run side by side). @p experts >= 1.
__host__ __device__ constexpr DecodeChoice decode_choice(std::int64_t m_total, int experts) {
  DecodeChoice choice;
  choice.tokens = (m_total + experts - 1) / experts;
  choice.swapped = choice.tokens <= kSwapMaxTokensPerExpert;
  choice.token_tile = token_tile_for(choice.tokens);
  return choice;
}

}  // namespace kc::ch09
