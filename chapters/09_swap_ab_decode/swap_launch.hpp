/// @file swap_launch.hpp
/// @brief Internal: what the host side (swap_host.cpp) hands Chapter 9's kernels, and the launchers that
/// live with them (stepN_*.cu). A build without sm_90 links stand-ins (kernels_unavailable.cu) that only
/// say what they need.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "swap_ab.hpp"
// Angle brackets: the exercise build puts the skeleton's swap_tiles.hpp first on the include path.
#include <swap_tiles.hpp>

namespace kc::ch09::detail {

/// Everything a swapped kernel reads besides its tensor maps.
struct SwapArgs {
  __nv_bfloat16* c = nullptr;                 ///< [m_total, n_out]
  const std::int32_t* offsets = nullptr;      ///< [E + 1] device row offsets
  const float* row_scale = nullptr;           ///< [m_total] or null (no scaling)
  const std::int32_t* gather_rows = nullptr;  ///< [m_total] the gathering kernel's rows of X
  int m_total = 0;                            ///< rows of A and C
  int n = 0;                                  ///< W rows per expert
  int k = 0;                                  ///< the reduction length
  int experts = 0;                            ///< E
  int n_out = 0;                              ///< columns of C
  int tiles_n = 0;                            ///< n-tiles (swap_tiles_n)
};

/// Enqueues the swapped kernel of @p step with a token tile of @p tokens (steps 1 and 2: 64) on
/// @p stream: a persistent grid of at most one block per SM and at most @p tile_bound blocks (the most
/// tiles any group sizes could give). @p swiglu picks the SwiGLU epilogue. @p a_map's boxes are
/// @p tokens rows, @p w_map's kWBoxRows.
void launch_swapped(SwapStep step, int tokens, bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map,
                    const SwapArgs& args, std::int64_t tile_bound, cudaStream_t stream);

/// Step 1's launcher (step1_swapped_operands.cu): 64 tokens, 4 stages.
void launch_step1(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream);
/// Step 2's launcher (step2_deep_pipeline.cu): 64 tokens, as many stages as fit.
void launch_step2(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream);
/// Step 3's launcher (step3_token_tile.cu): @p tokens (8, 16, 32 or 64) tokens, as many stages as fit.
void launch_step3(int tokens, bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream);

/// The gathering kernel's launcher (gather_tokens.cu): step 3's kernel with the token rows loaded one
/// by one from X through args.gather_rows; @p x_map is X's map in one-row boxes.
void launch_gather(int tokens, bool swiglu, const CUtensorMap& x_map, const CUtensorMap& w_map, const SwapArgs& args,
                   std::int64_t tile_bound, cudaStream_t stream);

/// True in the build with kernels, false in the stub build.
bool kernels_built();

}  // namespace kc::ch09::detail
