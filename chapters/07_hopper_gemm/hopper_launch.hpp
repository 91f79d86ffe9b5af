/// @file hopper_launch.hpp
/// @brief Internal: what the host side (hopper_host.cpp) hands each step's launcher. The launchers
/// live with their kernels (stepN_*.cu); a build without sm_90 links stub launchers instead
/// (kernels_unavailable.cu) that only say what they need.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "hopper_tiles.hpp"

namespace kc::ch07::detail {

/// The output side of a launch: where C is, its size, and whether two adjacent bf16 can be stored as
/// one 4-byte word (N even and c 4-byte aligned).
struct Output {
  __nv_bfloat16* c;        ///< [m, n] row-major
  int m;                   ///< rows of C
  int n;                   ///< columns of C (and the row stride)
  int k;                   ///< the reduction length
  int tiles_m;             ///< tiles per column of C (ceil(m / block_m)): the persistent steps' order needs it
  int tiles_n;             ///< tiles per row of C (ceil(n / block_n))
  bool paired_stores;      ///< store bf16 pairs as 4-byte words
  bool tma_store = false;  ///< step 6: store C through TMA (N a multiple of 8, c 16-byte aligned)
  /// Stream-K (`after` with a workspace): the workspace, split by stream_k_workspace_layout. The
  /// launcher fills in the plan once it knows the grid; null: every tile whole.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;  ///< its size
  StreamKPlan stream_k{};           ///< set by the launcher
};

/// Where Stream-K's flags and partial tiles lie in a workspace: for each cluster, CTA rank and
/// consumer warpgroup, one flag (int32, 0 when no partial is waiting) and one 64 × 256 fp32 partial
/// (64 KiB). The flags come first, in a region of fixed size, so that a flag is always at the same
/// place whatever the grid: every launch leaves them all 0 for the next.
struct StreamKWorkspace {
  static constexpr int kMaxClusters = 256;                 ///< clusters the flag region has room for
  static constexpr int kPerCluster = 4;                    ///< partials (and flags) per cluster: 2 CTAs × 2 consumers
  static constexpr std::size_t kPartialFloats = 64 * 256;  ///< one consumer's accumulators
  /// Bytes of the flag region (a multiple of 16: the partials after it stay float4-aligned).
  static constexpr std::size_t kFlagBytes = kMaxClusters * kPerCluster * sizeof(std::int32_t);
  /// Bytes for a launch of @p clusters clusters (at most kMaxClusters).
  static constexpr std::size_t bytes(int clusters) {
    return kFlagBytes + static_cast<std::size_t>(clusters) * kPerCluster * kPartialFloats * sizeof(float);
  }
  /// Index of the flag and partial of cluster @p cluster, CTA @p rank, consumer @p consumer.
  __host__ __device__ static constexpr int index(int cluster, int rank, int consumer) {
    return (cluster * 2 + rank) * 2 + consumer;
  }
};

/// Step 1's launcher (step1_tma_wgmma.cu). Each launcher raises its kernel's shared-memory limit on first use per
/// device, then enqueues
/// @p tiles blocks on @p stream and checks the launch error.
void launch_step1(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream);
/// Step 2's launcher (step2_pipeline.cu), as launch_step1.
void launch_step2(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream);
/// Step 3's launcher (step3_warp_specialized.cu), as launch_step1.
void launch_step3(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream);

/// Step 4's launcher (step4_persistent.cu): like launch_step1, but it launches one block per SM (at
/// most @p tiles), each looping over tiles; the SM count is queried once per device.
void launch_step4(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream);
/// Step 5's launcher (step5_cluster_multicast.cu): like launch_step4, in clusters of two CTAs along M;
/// the grid is as many clusters as the GPU holds at once (queried once per device), at most one per
/// cluster tile.
void launch_step5(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream);
/// Which kernel step 6 launches.
enum class Step6Kernel {
  own,               ///< step 6 itself: 4 stages, half the tile staged at a time
  dependent_launch,  ///< step 6 launched as a programmatic dependent of the previous kernel (`after`)
  stream_k,          ///< `after` with Stream-K on the last round (needs out.workspace)
};

/// Step 6's launcher (step6_tma_store.cu): like launch_step5, with the TMA-store epilogue, which
/// writes C through @p c_map when out.tma_store (and from registers otherwise); @p kernel picks the
/// variant (out's tile counts and the maps' boxes must be that variant's tile).
void launch_step6(Step6Kernel kernel, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const Output& out, int tiles, cudaStream_t stream);

/// Clusters of the Stream-K kernel the current GPU holds at once: the grid of its launches
/// (step6_tma_store.cu; queried once per device).
int stream_k_resident_clusters();

/// True in the build with kernels, false in the stub build.
bool kernels_built();

}  // namespace kc::ch07::detail
