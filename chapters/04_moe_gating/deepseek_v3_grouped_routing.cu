/// @file deepseek_v3_grouped_routing.cu
/// @brief DeepSeek-V3's grouped routing, fused: score = sigmoid(logit), selection on score + bias,
/// experts in n_group groups ranked by the sum of their two best biased scores, only the best
/// topk_group groups competing, weights the unbiased scores of the winners over their sum, times
/// the routed scaling factor. A warp a row, keys on full 32 bits (fused_common.cuh).
#include <cstdint>
#include <type_traits>

#include "fused_launch.cuh"

namespace kc::ch04::fused {

namespace {

// The top-2 merge of two sorted key pairs (hi >= lo each): four min/max, no ids (a group's score
// is the sum of its two best keys' values, whoever holds them).
__device__ __forceinline__ void merge_top2(unsigned& hi, unsigned& lo, unsigned other_hi, unsigned other_lo) {
  lo = max(min(hi, other_hi), max(lo, other_lo));
  hi = max(hi, other_hi);
}

// A group's selection key from its two best keys (top2 = kTakenKey for a group of one expert): the
// sum of the two biased scores, NaN (kNanKey) when either is NaN.
__device__ __forceinline__ unsigned group_key_of(unsigned top1, unsigned top2, bool one_expert) {
  if (one_expert) return top1;
  return top2 <= kNanKey ? kNanKey : detail::order_key(detail::key_value(top1) + detail::key_value(top2));
}

// Padded so that lanes scanning different groups (32 apart) hit different banks.
__device__ __forceinline__ int padded(int e) { return e + e / 32; }

// DeepSeek-V3: a warp per row (L = 32). Group keys, two ways:
//   - butterfly (DeepSeek-V3's own shape, 256 experts in 8 groups of 32, and any group of V * 2^i
//     experts): a lane's V-vector lies inside one group and a group is lanes_per_group neighbouring
//     lanes, so each lane takes the top-2 of its vector and log2(lanes_per_group) xor-shuffle steps
//     merge them (3 steps for groups of 32 fp32 experts), all in registers;
//   - any other group size: through shared memory, lane g < n_group scans group g (E / n_group
//     dependent reads).
//
// Blocks an SM must be able to hold (the second number of __launch_bounds__, which caps the
// registers): 32 warps an SM for fp32 logits in 16-byte vectors at E <= 256, i.e. 64 registers, so
// that DeepSeek-V3's T = 4096 rows are one pass (at 80 registers 24 warps fit and a third of the
// warps ran a second row). ptxas for sm_90 reaches 64 there without spilling; the other instances
// (bf16, unaligned rows, E > 256), and sm_80's code, would spill, so they keep no minimum.
template <typename T, int N, int V, int W>
constexpr int deepseek_min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 1;
#else
  return std::is_same_v<T, float> && N == 8 && V == 4 ? 32 / W : 1;
#endif
}

// DeepSeek-V3's wide blocks: warps a block (one row a warp) where the grid is large. Every block
// flushes its histogram of 256 counts as 8 requests (one a line of counts) however many rows it
// ran, so 16 warps a block halve the grid's flush: at T = 4096, 256 blocks send 2048 requests
// instead of 4096. Clusters, which cut the softmax kernels' flush, do not fit here: the occupancy
// query gives 62 clusters of 8 blocks of 8 warps, and T = 4096 needs 64. Wide blocks are used only where there are
// enough rows to give every SM one (dispatch_deepseek): below that they would put twice the rows on half the SMs.
constexpr int kDeepSeekWideWarps = 16;

template <typename T, int N, int V, int W>
__global__ void __launch_bounds__(W * 32, deepseek_min_blocks<T, N, V, W>())
    fused_deepseek_v3(const T* __restrict__ logits, DeepSeekArgs a) {
  // The kernel behind this one may launch now (as start_as_dependent); the wait for the kernel
  // before comes only after the prologue below, which reads nothing that kernel writes.
  allow_dependent_launch();
  constexpr int L = 32;
  constexpr int kChunks = N / V;  // V-vectors a lane holds
  __shared__ int histogram[kMaxExperts];
  __shared__ unsigned staged[W][N * 32 + N];
  clear_histogram(histogram, a.num_experts);

  const int lane = static_cast<int>(threadIdx.x) % 32;
  unsigned* row_keys = staged[threadIdx.x / 32];
  const int group_size = a.num_experts / a.n_group;
  const int lanes_per_group = group_size / V;
  // A group must be whole V-vectors on a power-of-two number of lanes, at most the warp.
  const bool butterfly = group_size % V == 0 && lanes_per_group <= L && (lanes_per_group & (lanes_per_group - 1)) == 0;
  const int groups_per_chunk = butterfly ? L / lanes_per_group : 1;
  // e / group_size as a multiply and a shift: exact for e, group_size <= 512 (error < 512 / 2^20).
  const unsigned group_reciprocal = ((1u << 20) + static_cast<unsigned>(group_size) - 1) / group_size;
  // The bias, the same for every row, in shared memory rather than N registers a lane: at 64
  // registers 32 warps fit on an SM, and DeepSeek-V3's 4096 rows are one row a warp. It is a model
  // parameter: gating_after's contract puts something other than a kernel between any kernel that
  // writes it and this launch, so it is read before the wait. Its latency and the barrier's are
  // then spent while the kernel before is still running, not on every row's path
  //.
  __shared__ float bias_of[kMaxExperts];
  for (int e = static_cast<int>(threadIdx.x); e < a.num_experts; e += blockDim.x) {
    bias_of[e] = a.bias != nullptr ? a.bias[e] : 0.0f;
  }
  __syncthreads();
  const float* lane_bias = bias_of + lane * V;  // value j of this lane: lane_bias[(j / V) * L * V + j % V]
  wait_for_previous_grid();                     // the logits (and, through zero_counts, the zeroed counts) are ready

  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * W + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * W;
  float x[N];  // the next row's logits, loaded one iteration ahead (see fused_softmax_topk)
  load_row<T, L, N, V>(logits + warp * a.num_experts, warp < a.num_tokens, a.num_experts, lane, x);
  for (std::int64_t row = warp; row < a.num_tokens; row += warps) {
    // The selection key sigmoid(logit) + bias; padding stays taken.
    unsigned key[N];
    to_keys<L, N, V>(
        x, true, a.num_experts, lane,
        [&](float v, int j) { return sigmoid_fast(v) + lane_bias[(j / V) * L * V + j % V]; }, key);
    const std::int64_t next = row + warps;
    load_row<T, L, N, V>(logits + next * a.num_experts, next < a.num_tokens, a.num_experts, lane, x);

    unsigned group_key = kTakenKey;  // lane g < n_group: group g's key
    if (butterfly) {
      unsigned hi[kChunks], lo[kChunks], chunk_key[kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        hi[c] = key[c * V];
        lo[c] = kTakenKey;
#pragma unroll
        for (int v = 1; v < V; ++v) merge_top2(hi[c], lo[c], key[c * V + v], kTakenKey);
      }
      for (int offset = 1; offset < lanes_per_group; offset *= 2) {  // the same count in every lane
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const unsigned other_hi = __shfl_xor_sync(kFullMask, hi[c], offset);
          const unsigned other_lo = __shfl_xor_sync(kFullMask, lo[c], offset);
          merge_top2(hi[c], lo[c], other_hi, other_lo);
        }
      }
      // Group g is chunk g / groups_per_chunk, lanes (g % groups_per_chunk) * lanes_per_group + ...
#pragma unroll
      for (int c = 0; c < kChunks; ++c) chunk_key[c] = group_key_of(hi[c], lo[c], group_size == 1);
      const int source = (lane % groups_per_chunk) * lanes_per_group;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const unsigned held = __shfl_sync(kFullMask, chunk_key[c], source);
        if (lane / groups_per_chunk == c) group_key = held;
      }
      if (lane >= a.n_group) group_key = kTakenKey;
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const int e = expert_of<L, V>(j, lane);
        if (e < a.num_experts) row_keys[padded(e)] = key[j];
      }
      __syncwarp();
      if (lane < a.n_group) {
        unsigned top1 = kTakenKey, top2 = kTakenKey;
        for (int e = lane * group_size; e < (lane + 1) * group_size; ++e)
          merge_top2(top1, top2, row_keys[padded(e)], kTakenKey);
        group_key = group_key_of(top1, top2, group_size == 1);
      }
      __syncwarp();  // row_keys is rewritten by the next row
    }
    // Rank of my group: groups with a larger key, or an equal key and a lower index, come first.
    int ahead = 0;
    for (int h = 0; h < a.n_group; ++h) {
      const unsigned other = __shfl_sync(kFullMask, group_key, h);
      ahead += (other > group_key || (other == group_key && h < lane)) ? 1 : 0;
    }
    const unsigned kept = __ballot_sync(kFullMask, lane < a.n_group && ahead < a.topk_group);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const unsigned group = (static_cast<unsigned>(expert_of<L, V>(j, lane)) * group_reciprocal) >> 20;
      if (((kept >> (group & 31u)) & 1u) == 0u) key[j] = kTakenKey;  // excluded, not zeroed
    }

    // The same rounds as fused_softmax_topk. Lane r keeps round r's winner.
    int my_id = 0;
    select_top_k<L, N, V>(key, lane, a.k, [&](int r, Candidate best) {
      if (lane == r) my_id = best.id;
    });
    // The weight is the unbiased score. The slot's lane recomputes it from its logit (a cache hit:
    // the row was just read), which gives the same bits as the score the key was made from.
    float my_weight = 0.0f;
    if (lane < a.k) {
      const float s = sigmoid_fast(detail::to_float(logits[row * a.num_experts + my_id]));
      my_weight = s != s ? 0.0f : s;  // a NaN score weighs 0
    }
    const float sum = segment_sum<L>(my_weight);
    // Rows are sorted by weight (the unbiased score), not by the biased selection key.
    int position = 0;
    // Four steps an iteration: one step an iteration spent 6 of its 13 instructions on the loop and
    // the shuffles' divergence test (sm_90 SASS; 37 for four steps).
#pragma unroll 4
    for (int j = 0; j < a.k; ++j) {
      const float wj = __shfl_sync(kFullMask, my_weight, j);
      const int idj = __shfl_sync(kFullMask, my_id, j);
      position += (wj > my_weight || (wj == my_weight && idj < my_id)) ? 1 : 0;
    }
    if (lane < a.k) {
      const std::int64_t out = row * a.k + position;
      a.weights[out] = sum > 0.0f ? my_weight / sum * a.scale : 0.0f;
      a.ids[out] = my_id;
      if (a.counts != nullptr) atomicAdd(histogram + my_id, 1);
    }
  }
  flush_histogram(histogram, a.num_experts, a.counts);
}

}  // namespace

template <typename T, int V>
void launch_deepseek_v3(const T* logits, const DeepSeekArgs& a, const LaunchOn& on) {
  static OccupancyCache occupancy8, occupancy_wide, occupancy16;
  if (a.num_experts <= 256) {
    // The wide blocks need the 64-register instance (fp32 in 16-byte vectors, sm_90), whose 32 warps
    // an SM they keep: 2 blocks of 16 warps instead of 4 of 8.
    if constexpr (std::is_same_v<T, float> && V == 4) {
      if (on.gpu.sm90_or_later && a.num_tokens >= static_cast<std::int64_t>(kDeepSeekWideWarps) * on.gpu.sms) {
        constexpr int W = kDeepSeekWideWarps;
        const auto kernel = fused_deepseek_v3<T, 8, V, W>;
        launch_gating_kernel(kernel, gating_grid(kernel, a.num_tokens, W, 0, 0, on, occupancy_wide, W * 32), on, logits,
                             a);
        return;
      }
    }
    constexpr int W = kWarpsPerBlock;
    const auto kernel = fused_deepseek_v3<T, 8, V, W>;
    launch_gating_kernel(kernel, gating_grid(kernel, a.num_tokens, W, 0, 0, on, occupancy8, W * 32), on, logits, a);
  } else {
    constexpr int W = kWarpsPerBlock;
    const auto kernel = fused_deepseek_v3<T, 16, V, W>;
    launch_gating_kernel(kernel, gating_grid(kernel, a.num_tokens, W, 0, 0, on, occupancy16, W * 32), on, logits, a);
  }
}

template void launch_deepseek_v3<float, 4>(const float*, const DeepSeekArgs&, const LaunchOn&);
template void launch_deepseek_v3<float, 1>(const float*, const DeepSeekArgs&, const LaunchOn&);
template void launch_deepseek_v3<__nv_bfloat16, 8>(const __nv_bfloat16*, const DeepSeekArgs&, const LaunchOn&);
template void launch_deepseek_v3<__nv_bfloat16, 1>(const __nv_bfloat16*, const DeepSeekArgs&, const LaunchOn&);

}  // namespace kc::ch04::fused
