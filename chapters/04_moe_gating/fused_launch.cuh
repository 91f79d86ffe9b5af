/// @file fused_launch.cuh
/// @brief Host side of the fused gating kernels: the device facts a launch needs, one-wave grids
/// sized from the occupancy API (asked once per device), the early launch (programmatic dependent
/// launch) and clusters, and the launch functions each kernel file defines. Internal to the chapter.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "fused_common.cuh"
#include "kc/check.hpp"

namespace kc::ch04::fused {

inline constexpr int kCachedDevices = 16;  ///< devices whose occupancy the launch functions remember

/// What a launch needs to know about the current device, asked once a launch (gating_after_impl).
struct Gpu {
  int device = 0;              ///< the current device's ordinal
  int sms = 1;                 ///< its streaming multiprocessors
  bool sm90_or_later = false;  ///< compute capability 9.0 or later: griddepcontrol and clusters
};

/// The current device's Gpu facts: three runtime queries, no synchronisation.
inline Gpu current_gpu() {
  Gpu gpu;
  int major = 0;
  check(cudaGetDevice(&gpu.device));
  check(cudaDeviceGetAttribute(&gpu.sms, cudaDevAttrMultiProcessorCount, gpu.device));
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu.device));
  gpu.sm90_or_later = major >= 9;
  return gpu;
}

/// Blocks for @p rows rows at @p rows_per_block a block, capped at one wave: at most @p per_sm blocks
/// on each SM of @p gpu (a grid-stride loop does the rest). A grid of 8 blocks per SM for a kernel of
/// which only 6 fit runs as 1.33 waves, its last third on a quarter of the machine.
inline unsigned grid_for(std::int64_t rows, int rows_per_block, int per_sm, const Gpu& gpu) {
  const std::int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  const std::int64_t resident = static_cast<std::int64_t>(gpu.sms) * (per_sm > 0 ? per_sm : 1);
  return static_cast<unsigned>(wanted < resident ? wanted : resident);
}

/// Blocks of `kernel` that fit on one SM with `dynamic_shared_bytes` each, asked once per device and
/// kept in the caller's `cache` (one per kernel instance): the launch path stays a few cheap host calls.
template <typename Kernel>
int blocks_per_sm(Kernel kernel, std::atomic<int> (&cache)[kCachedDevices], const Gpu& gpu,
                  std::size_t dynamic_shared_bytes = 0, int threads = kThreads) {
  const int device = gpu.device;
  if (device < kCachedDevices && cache[device].load(std::memory_order_relaxed) > 0) {
    return cache[device].load(std::memory_order_relaxed);
  }
  int blocks = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_shared_bytes));
  if (device < kCachedDevices) cache[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

/// Where a fused kernel is launched: its stream, whether as its predecessor's programmatic
/// dependent, and whether in clusters that sum their counts before flushing them (flush_histogram).
struct LaunchOn {
  cudaStream_t stream;     ///< the stream every kernel of the call goes on
  bool early;              ///< programmatic dependent launch (Launching::early on sm_90 or later)
  bool flush_in_clusters;  ///< the kernel counts (fused) on sm_90, E > 128 (moe_gating_after.cu):
                           ///< gating_grid may use clusters
  Gpu gpu;                 ///< the current device; DeepSeek-V3's wide blocks need gpu.sm90_or_later:
                           ///< the 64-register instance (deepseek_min_blocks) is only in sm_90's code
};

/// The shape of a launch: blocks, threads a block, dynamic shared memory, and blocks a cluster (1: no
/// clusters; more needs sm_90).
struct KernelShape {
  unsigned blocks;               ///< blocks in the grid (a multiple of cluster_blocks)
  unsigned threads;              ///< threads a block
  std::size_t shared_bytes = 0;  ///< dynamic shared memory a block, in bytes
  unsigned cluster_blocks = 1;   ///< blocks a cluster along x (1: no clusters)
};

/// Launches `kernel`, as the programmatic dependent of the kernel before it on `stream` when
/// `dependent` (the attribute "programmatic stream serialization"; see allow_dependent_launch).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), const KernelShape& shape, cudaStream_t stream, bool dependent,
                   Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (dependent) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (shape.cluster_blocks > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = shape.cluster_blocks;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(shape.blocks);
  config.blockDim = dim3(shape.threads);
  config.dynamicSmemBytes = shape.shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

/// The fewest blocks a grid needs to flush its counts in clusters: below that the flush sends few
/// requests anyway (chosen, not measured on its own).
constexpr std::int64_t kFlushClustersFromBlocks = 64;

/// Clusters of kFlushClusterBlocks blocks of `kernel` (with `dynamic_shared_bytes` each) that fit on
/// the GPU at once, asked once per device and kept in `cache`, as blocks_per_sm does.
template <typename Kernel>
int flush_clusters_resident(Kernel kernel, std::atomic<int> (&cache)[kCachedDevices], const Gpu& gpu,
                            std::size_t dynamic_shared_bytes, int threads) {
  const int device = gpu.device;
  if (device < kCachedDevices && cache[device].load(std::memory_order_relaxed) > 0) {
    return cache[device].load(std::memory_order_relaxed);
  }
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kFlushClusterBlocks;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kFlushClusterBlocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = dynamic_shared_bytes;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  check(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  if (device < kCachedDevices) cache[device].store(clusters, std::memory_order_relaxed);
  return clusters;
}

/// Per-kernel answers to the occupancy questions of gating_grid, asked once per device.
struct OccupancyCache {
  std::atomic<int> blocks_per_sm[kCachedDevices];   ///< by device: blocks an SM (0: not asked yet)
  std::atomic<int> flush_clusters[kCachedDevices];  ///< by device: resident flush clusters (0: not asked yet)
};

/// The launch shape of a gating kernel over `rows` rows, `rows_per_block` a block: one wave at most
/// (grid_for; a grid-stride loop does the rest). When the kernel counts on sm_90
/// (`on.flush_in_clusters`) and the grid has kFlushClustersFromBlocks blocks or more, it becomes whole
/// clusters of kFlushClusterBlocks, if they all fit at once. A launch too large for one wave keeps no
/// clusters: its blocks end at different times, so their flushes do not meet.
template <typename Kernel>
KernelShape gating_grid(Kernel kernel, std::int64_t rows, int rows_per_block, std::size_t shared_bytes,
                        std::size_t occupancy_shared_bytes, const LaunchOn& on, OccupancyCache& cache,
                        int threads = kThreads) {
  const unsigned blocks =
      grid_for(rows, rows_per_block,
               blocks_per_sm(kernel, cache.blocks_per_sm, on.gpu, occupancy_shared_bytes, threads), on.gpu);
  const std::int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  if (on.flush_in_clusters && wanted >= kFlushClustersFromBlocks && wanted <= blocks) {
    const std::int64_t clusters = (wanted + kFlushClusterBlocks - 1) / kFlushClusterBlocks;
    if (clusters <= flush_clusters_resident(kernel, cache.flush_clusters, on.gpu, occupancy_shared_bytes, threads)) {
      return KernelShape{static_cast<unsigned>(clusters * kFlushClusterBlocks), static_cast<unsigned>(threads),
                         shared_bytes, kFlushClusterBlocks};
    }
  }
  return KernelShape{blocks, static_cast<unsigned>(threads), shared_bytes};
}

/// Launches one fused kernel with `shape`, early when `on.early`: the GPU may then schedule its
/// blocks while the kernel before it is still running (each block waits at its top,
/// start_as_dependent), so the launch's own latency is hidden behind that kernel instead of added
/// after it.
template <typename... Params, typename... Args>
void launch_gating_kernel(void (*kernel)(Params...), const KernelShape& shape, const LaunchOn& on, Args&&... args) {
  launch_kernel(kernel, shape, on.stream, on.early, std::forward<Args>(args)...);
}

/// DeepSeek-V3's arguments (deepseek_v3_grouped_routing.cu), passed by value.
struct DeepSeekArgs {
  const float* bias;        ///< [E] correction bias added to the scores for selection, or null (zero)
  float* weights;           ///< [T, k] routing weights out
  std::int32_t* ids;        ///< [T, k] expert ids out
  std::int32_t* counts;     ///< [E] tokens per expert, added to with atomics; null: do not count here
  std::int64_t num_tokens;  ///< T, rows of logits
  int num_experts;          ///< E, logits a row
  int k;                    ///< experts chosen a row
  int n_group;              ///< equal groups the E experts form
  int topk_group;           ///< groups kept per token
  float scale;              ///< routed scaling factor applied to the normalised weights
};

// The launch functions of the kernel files. Each validates nothing (gating_after() has) and picks
// the kernel instance for the row layout: T is the logits' type, V the logits a load (16 / sizeof(T)
// when every row starts 16-byte aligned, else 1).

/// Step 1 (step1_packed_keys.cu): packed keys, 64-bit row counters; any T.
template <typename T, int V>
void launch_packed_keys(const T* logits, const SoftmaxArgs& a, const LaunchOn& on);

/// Step 2 (step2_lean_rounds.cu): the lean rounds; T · E <= 2^30 (gating_rows_fit_int32()).
template <typename T, int V>
void launch_lean_rounds(const T* logits, const SoftmaxArgs& a, const LaunchOn& on);

/// Step 3 (step3_batched_epilogue.cu): the batched epilogue where it applies (fp32 rows of 129 to
/// 256 experts in 16-byte vectors, k = 8, renormalised weights, more rows than one wave holds);
/// returns false, launching nothing, elsewhere.
bool launch_batched_epilogue(const float* logits, const SoftmaxArgs& a, const LaunchOn& on);

/// DeepSeek-V3's grouped routing (deepseek_v3_grouped_routing.cu).
template <typename T, int V>
void launch_deepseek_v3(const T* logits, const DeepSeekArgs& a, const LaunchOn& on);

/// Expert counts (expert_counts.cu): zeroes counts[0, E) for the fused kernels' atomics.
void launch_zero_counts(std::int32_t* counts, int num_experts, const LaunchOn& on);

/// Expert counts (expert_counts.cu): the separate counting kernel(s) over ids[0, count).
void launch_count_experts(const std::int32_t* ids, std::int64_t count, int num_experts, std::int32_t* counts,
                          const LaunchOn& on);

}  // namespace kc::ch04::fused
