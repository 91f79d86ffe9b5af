/// @file expert_counts.cu
/// @brief Tokens per expert. The fused kernels count in a shared-memory histogram per block and
/// flush it with at most E atomics (flush_histogram, fused_common.cuh), into counts zeroed first by
/// zero_counts. CountMode::separate_kernel counts the stored ids instead, with the kernels here.
#include <cstdint>

#include "fused_launch.cuh"

namespace kc::ch04::fused {

namespace {

// Zeroes counts[0, E) for the fused kernels' atomics: a kernel, not a cudaMemsetAsync, so that it
// too can be launched early, as its predecessor's programmatic dependent, and let the gating kernel
// launch early behind it.
__global__ void zero_counts(std::int32_t* counts, int num_experts) {
  start_as_dependent();
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) counts[e] = 0;
}

// The separate counting kernel: the same histogram, fed from the ids the gating kernel stored.
__global__ void __launch_bounds__(kThreads)
    count_experts(const std::int32_t* __restrict__ ids, std::int64_t count, int num_experts, std::int32_t* counts) {
  __shared__ int histogram[kMaxExperts];
  clear_histogram(histogram, num_experts);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    atomicAdd(histogram + ids[i], 1);
  }
  flush_histogram(histogram, num_experts, counts);
}

// The separate counting kernels for small launches (up to kSmallCountLimit ids) store the counts
// outright, so nothing has to zero them first and no atomic leaves the SM. Each is launched as the
// gating kernel's programmatic dependent, so its launch overlaps the gating kernel, and it waits
// for the ids only when it needs them.
constexpr int kCountThreads = 1024;
constexpr std::int64_t kSmallCountLimit = 65536;
// sm_90: a cluster of this many blocks shares out the ids, and block 0 of the cluster sums their
// histograms through distributed shared memory. One block alone spent several microseconds on
// 32 Ki ids, most of it in shared-memory atomics.
constexpr int kCountClusterBlocks = 8;

// Adds ids [begin, end) to a block's shared histogram, eight loads in flight a thread before their
// eight shared-memory atomics.
__device__ __forceinline__ void count_ids(int* histogram, const std::int32_t* __restrict__ ids, int begin, int end) {
  constexpr int kBatch = 8;
  const int step = kBatch * static_cast<int>(blockDim.x);
  for (int base = begin + static_cast<int>(threadIdx.x); base < end; base += step) {
    int id[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = base + j * static_cast<int>(blockDim.x);
      id[j] = i < end ? ids[i] : -1;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (id[j] >= 0) atomicAdd(histogram + id[j], 1);
    }
  }
}

// Before sm_90: one block counts every id.
__global__ void __launch_bounds__(kCountThreads)
    count_experts_one_block(const std::int32_t* __restrict__ ids, int count, int num_experts,
                            std::int32_t* __restrict__ counts) {
  __shared__ int histogram[kMaxExperts];
  allow_dependent_launch();
  clear_histogram(histogram, num_experts);
  wait_for_previous_grid();  // the ids are the gating kernel's output
  count_ids(histogram, ids, 0, count);
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) counts[e] = histogram[e];
}

// sm_90: one cluster of kCountClusterBlocks blocks (launched with that cluster size). Block r counts
// the r-th share of the ids into its own shared histogram; after a cluster barrier block 0 reads the
// other blocks' histograms through distributed shared memory (load_from_cluster_block, as the
// clustered flush does), sums them and stores the counts; a second barrier keeps every block, and so
// its shared memory, alive until block 0 has read it.
__global__ void __launch_bounds__(kCountThreads)
    count_experts_cluster(const std::int32_t* __restrict__ ids, int count, int num_experts,
                          std::int32_t* __restrict__ counts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // launched only on sm_90 (gating_after_impl)
  __shared__ int histogram[kMaxExperts];
  allow_dependent_launch();
  clear_histogram(histogram, num_experts);
  wait_for_previous_grid();  // the ids are the gating kernel's output
  const int rank = static_cast<int>(my_cluster_place().rank);
  const int share = (count + kCountClusterBlocks - 1) / kCountClusterBlocks;
  count_ids(histogram, ids, min(count, rank * share), min(count, (rank + 1) * share));
  cluster_barrier();  // every block's histogram is complete and visible to the cluster
  if (rank == 0) {
    for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) {
      int sum = 0;
#pragma unroll
      for (int r = 0; r < kCountClusterBlocks; ++r)
        sum += load_from_cluster_block(histogram + e, static_cast<unsigned>(r));
      counts[e] = sum;
    }
  }
  cluster_barrier();  // no block exits (its shared memory gone) before block 0 has read it
#endif
}

}  // namespace

void launch_zero_counts(std::int32_t* counts, int num_experts, const LaunchOn& on) {
  launch_kernel(zero_counts, KernelShape{1, kThreads}, on.stream, on.early, counts, num_experts);
}

void launch_count_experts(const std::int32_t* ids, std::int64_t count, int num_experts, std::int32_t* counts,
                          const LaunchOn& on) {
  if (count <= kSmallCountLimit) {
    // One cluster (sm_90) or one block stores the counts outright: nothing to zero.
    if (on.gpu.sm90_or_later) {  // clusters too
      launch_kernel(count_experts_cluster, KernelShape{kCountClusterBlocks, kCountThreads, 0, kCountClusterBlocks},
                    on.stream, on.early, ids, static_cast<int>(count), num_experts, counts);
    } else {
      launch_kernel(count_experts_one_block, KernelShape{1, kCountThreads}, on.stream, false, ids,
                    static_cast<int>(count), num_experts, counts);
    }
  } else {
    check(cudaMemsetAsync(counts, 0, static_cast<std::size_t>(num_experts) * sizeof(std::int32_t), on.stream));
    const unsigned blocks = grid_for(count, kThreads, 8, on.gpu);
    count_experts<<<blocks, kThreads, 0, on.stream>>>(ids, count, num_experts, counts);
    check_launch();
  }
}

}  // namespace kc::ch04::fused
