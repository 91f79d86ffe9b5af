/// @file grouped_launch.hpp
/// @brief Internal: what the host side (grouped_host.cpp) hands the kernels of Chapter 8, and the
/// launchers that live with them (expert_prefix.cu, stepN_*.cu). A build without sm_90 links stand-ins
/// (kernels_unavailable.cu) that only say what they need.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "hopper_grouped_gemm.hpp"
// Angle brackets: the exercise build puts the skeleton's grouped_tiles.hpp first on the include path.
#include <grouped_tiles.hpp>

namespace kc::ch08::detail {

/// Everything a grouped kernel reads besides its tensor maps.
struct GroupedArgs {
  __nv_bfloat16* c = nullptr;                 ///< [m_total, n_out] (step 1 stores through it)
  const std::int32_t* offsets = nullptr;      ///< [E + 1] device row offsets
  const std::int32_t* tile_prefix = nullptr;  ///< [E + 1] m-tile prefix, written by the prefix kernel
  const CUtensorMap* expert_maps = nullptr;   ///< [E] store maps, written by the prefix kernel (step 2)
  const float* row_scale = nullptr;           ///< [m_total] or null (no scaling)
  const std::int32_t* gather_rows = nullptr;  ///< [m_total] the gathering kernel's rows of X (A[r] = X[gather_rows[r]])
  int m_total = 0;                            ///< rows of A and C
  int n = 0;                                  ///< W rows per expert
  int k = 0;                                  ///< the reduction length
  int experts = 0;                            ///< E
  int n_out = 0;                              ///< columns of C
  int tiles_n = 0;                            ///< n-tiles (grouped_tiles_n)
  int group_m = kGroupM;                      ///< band height of the tile order (1: row-major)
  bool paired_stores = false;                 ///< step 1: store bf16 pairs as 4-byte words
};

/// Where a launch's workspace puts its pieces: the tile prefix first, then the experts' store maps
/// (each 128 bytes, 128-byte aligned).
struct WorkspaceLayout {
  /// Bytes of the tile prefix region: E + 1 int32, rounded up to 128.
  static constexpr std::size_t prefix_bytes(int experts) {
    return (static_cast<std::size_t>(experts + 1) * sizeof(std::int32_t) + 127) / 128 * 128;
  }
  /// Bytes of the whole workspace.
  static constexpr std::size_t bytes(int experts) {
    return prefix_bytes(experts) + static_cast<std::size_t>(experts) * sizeof(CUtensorMap);
  }
};
static_assert(sizeof(CUtensorMap) == 128, "a tensor map is 128 bytes");

/// grouped_gemm_hopper_step with the band height of the tile order inside each expert as an argument:
/// @p group_m m-tiles (the API's order is kGroupM; 1 walks each expert's tiles row by row). The
/// benchmark's `order_row_major` variant measures with it what the grouped order saves. Throws
/// kc::InvalidArgument when @p group_m < 1, besides grouped_gemm_hopper_step's rules.
void grouped_gemm_hopper_ordered(GroupedStep step, int group_m, const GroupedGemmShape& shape, const __nv_bfloat16* a,
                                 const __nv_bfloat16* w, __nv_bfloat16* c, const std::int32_t* offsets,
                                 const GroupedEpilogue& epilogue, void* workspace, std::size_t workspace_bytes,
                                 cudaStream_t stream);

/// Enqueues the prefix kernel: tile_prefix from the offsets and, when @p expert_maps is not null, each
/// non-empty expert's store map, made from @p c_map (the rank-2 store map of C [m_total, n_out] at
/// @p c) with the expert's first row as address and its row count as rows.
void launch_expert_prefix(const std::int32_t* offsets, int experts, int m_total, std::int32_t* tile_prefix,
                          const CUtensorMap& c_map, const __nv_bfloat16* c, int n_out, CUtensorMap* expert_maps,
                          cudaStream_t stream);

/// Enqueues the grouped GEMM kernel of @p step on @p stream, a persistent grid of at most one block
/// per SM and at most @p tile_bound blocks (the most tiles any group sizes could give), or for step 5
/// @p tile_bound blocks. @p c_map is steps 3 to 5's rank-3 ragged map (ignored by steps 1 and 2).
/// @p swiglu picks the SwiGLU epilogue.
void launch_grouped(GroupedStep step, bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map,
                    const CUtensorMap& c_map, const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream);

/// Step 1's launcher (step1_masked_store.cu), as launch_grouped.
void launch_step1(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const GroupedArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream);
/// Step 2's launcher (step2_device_tensor_maps.cu), as launch_grouped.
void launch_step2(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const GroupedArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream);
/// Step 3's launcher (step3_ragged_tensor_map.cu), as launch_grouped; @p c_map is the ragged map.
void launch_step3(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream);

/// Step 4's launcher (step4_a_evict_last.cu), as launch_step3.
void launch_step4(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream);

/// Step 5's launcher (step5_block_per_tile.cu), as launch_step3: a block per tile.
void launch_step5(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream);

/// The gathering kernel's launcher (gather_rows.cu): step 4's kernel with A's rows loaded one by one
/// from X through args.gather_rows; @p x_map is X's map in one-row boxes.
void launch_gather(bool swiglu, const CUtensorMap& x_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                   const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream);

/// True in the build with kernels, false in the stub build.
bool kernels_built();

}  // namespace kc::ch08::detail
