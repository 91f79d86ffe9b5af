// Before: what a framework runs when each step is its own kernel, the way `softmax`, `topk` and a
// divide are separate operators. Three kernels, each reasonable on its own, passing [T, E] and
// [T, k] intermediates through global memory:
//   1. score: a warp per row computes the row max and sum with shuffles and writes the probabilities
//      (softmax), or an elementwise kernel writes sigmoid scores and biased selection scores (DeepSeek);
//   2. top-k: a warp per row stages the row in shared memory and runs k rounds of a warp arg-max
//      (each lane scans E/32 values, then a 5-step butterfly over packed 64-bit keys: 10 shuffles a
//      round, ~90 a row for k = 8 with the softmax's 10);
//   3. normalise and count: a thread per row rescales its k weights; global atomics count experts.
// The costs the fused kernel removes: the [T, E] intermediate is written once and read back once
// (for fp32 logits that triples the bytes), three launches with a gap between them, and the
// shuffle-heavy selection.
//
// The top-k kernel ranks the logits (softmax is strictly increasing, so that is the ranking of the
// probabilities) and then takes the chosen experts' probabilities by id. Ranking the fp32
// probabilities instead would tie every expert whose probability underflows to 0 and break those
// ties by id; ranking logits keeps one contract for every path (moe_gating.hpp).
#include <algorithm>
#include <cstdint>
#include <string>

#include "gating_device.cuh"
#include "kc/check.hpp"
#include "moe_gating.hpp"

namespace kc::ch04 {

namespace {

using detail::kFullMask;
using detail::kNanKey;
using detail::kTakenKey;

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// 1. Softmax, a warp per row: pass 1 the max, pass 2 the sum, pass 3 the probabilities (the row is
// re-read from L1/L2 in passes 2 and 3). fmaxf ignores NaN, which is the policy: NaN weighs 0.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_rows(const T* __restrict__ logits, float* __restrict__ probs, std::int64_t rows, int e) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const T* in = logits + row * e;
  float m = -__int_as_float(0x7f800000);
  for (int i = lane; i < e; i += 32) m = fmaxf(m, detail::to_float(in[i]));
  m = warp_max(m);
  float sum = 0.0f;
  for (int i = lane; i < e; i += 32) sum += detail::softmax_mass(detail::to_float(in[i]), m);
  sum = warp_sum(sum);
  for (int i = lane; i < e; i += 32) {
    probs[row * e + i] = sum > 0.0f ? detail::softmax_mass(detail::to_float(in[i]), m) / sum : 0.0f;
  }
}

// 1'. DeepSeek-V3 scores, elementwise: sigmoid and sigmoid + bias.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sigmoid_scores(const T* __restrict__ logits, const float* __restrict__ bias, float* __restrict__ score,
                   float* __restrict__ choice, std::int64_t count, int e) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float s = detail::sigmoid(detail::to_float(logits[i]));
    score[i] = s;
    choice[i] = s + (bias != nullptr ? bias[i % e] : 0.0f);
  }
}

struct TopkArgs {
  const float* gather;  // values reported for the chosen experts ([T, E]); null: the ranked values
  float* values;        // [T, k] workspace
  std::int32_t* ids;    // [T, k] output
  std::int64_t rows;
  int e;
  int k;
  int n_group;  // > 0: DeepSeek-V3 group limiting and sort by the gathered value
  int topk_group;
};

// 2. Top-k, a warp per row. Ranked values come in as T (logits for topk_then_softmax, probabilities
// or selection scores otherwise).
template <typename T>
__global__ void __launch_bounds__(kThreads) topk_rows(const T* __restrict__ ranked, TopkArgs a) {
  __shared__ unsigned staged[kWarpsPerBlock][kMaxExperts];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.rows) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  unsigned* keys = staged[threadIdx.x / 32];
  for (int i = lane; i < a.e; i += 32) keys[i] = detail::order_key(detail::to_float(ranked[row * a.e + i]));
  __syncwarp();

  if (a.n_group > 0) {
    const int group_size = a.e / a.n_group;
    unsigned group_key = kTakenKey;
    if (lane < a.n_group) {
      unsigned top1 = kTakenKey, top2 = kTakenKey;
      for (int i = lane * group_size; i < (lane + 1) * group_size; ++i) {
        const unsigned u = keys[i];
        if (u > top1) {
          top2 = top1;
          top1 = u;
        } else if (u > top2) {
          top2 = u;
        }
      }
      group_key = group_size == 1   ? top1
                  : top2 <= kNanKey ? kNanKey
                                    : detail::order_key(detail::key_value(top1) + detail::key_value(top2));
    }
    int ahead = 0;
    for (int h = 0; h < a.n_group; ++h) {
      const unsigned other = __shfl_sync(kFullMask, group_key, h);
      ahead += (other > group_key || (other == group_key && h < lane)) ? 1 : 0;
    }
    const unsigned kept = __ballot_sync(kFullMask, lane < a.n_group && ahead < a.topk_group);
    __syncwarp();
    for (int i = lane; i < a.e; i += 32) {
      if (((kept >> (i / group_size)) & 1u) == 0u) keys[i] = kTakenKey;
    }
    __syncwarp();
  }

  float my_value = 0.0f;
  int my_id = 0;
  for (int r = 0; r < a.k; ++r) {
    unsigned long long best = 0;
    for (int i = lane; i < a.e; i += 32) {
      const unsigned long long packed = (static_cast<unsigned long long>(keys[i]) << 32) | (0xFFFFFFFFu - i);
      best = packed > best ? packed : best;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const unsigned long long other = __shfl_xor_sync(kFullMask, best, offset);
      best = other > best ? other : best;
    }
    const int id = static_cast<int>(0xFFFFFFFFu - static_cast<unsigned>(best));
    __syncwarp();
    if (lane == id % 32) keys[id] = kTakenKey;
    __syncwarp();
    if (lane == r) {
      my_id = id;
      my_value = a.gather != nullptr ? a.gather[row * a.e + id] : detail::key_value(static_cast<unsigned>(best >> 32));
    }
  }
  int position = lane;
  if (a.n_group > 0) {  // DeepSeek-V3: sort the k by weight (NaN weighs 0), lower id first on ties
    my_value = my_value != my_value ? 0.0f : my_value;
    position = 0;
    for (int j = 0; j < a.k; ++j) {
      const float vj = __shfl_sync(kFullMask, my_value, j);
      const int idj = __shfl_sync(kFullMask, my_id, j);
      position += (vj > my_value || (vj == my_value && idj < my_id)) ? 1 : 0;
    }
  }
  if (lane < a.k) {
    a.values[row * a.k + position] = my_value;
    a.ids[row * a.k + position] = my_id;
  }
}

enum class Normalise { none, renormalize, softmax_of_logits, deepseek };

// 3. Normalise and count, a thread per row.
__global__ void __launch_bounds__(kThreads)
    normalise_rows(const float* __restrict__ values, const std::int32_t* __restrict__ ids, float* __restrict__ weights,
                   std::int32_t* counts, std::int64_t rows, int k, Normalise mode, float scale) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float* v = values + row * k;
  // topk_then_softmax: the first value is the row's largest logit (NaN ranks last).
  const float m = v[0] != v[0] ? -__int_as_float(0x7f800000) : v[0];
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += mode == Normalise::softmax_of_logits ? detail::softmax_mass(v[j], m) : v[j];
  for (int j = 0; j < k; ++j) {
    float w = v[j];
    if (mode == Normalise::softmax_of_logits) w = sum > 0.0f ? detail::softmax_mass(v[j], m) / sum : 0.0f;
    if (mode == Normalise::renormalize) w = sum > 0.0f ? v[j] / sum : 0.0f;
    if (mode == Normalise::deepseek) w = sum > 0.0f ? v[j] / sum * scale : 0.0f;
    weights[row * k + j] = w;
    if (counts != nullptr) atomicAdd(counts + ids[row * k + j], 1);
  }
}

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

template <typename T>
void gating_before_impl(const GatingParams& p, const T* logits, const float* bias, const GatingOutputs& out,
                        void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  validate_gating(p, logits, bias, out, sizeof(T));
  const std::size_t needed = gating_before_workspace_bytes(p);
  if (p.num_tokens > 0 && workspace == nullptr) throw InvalidArgument("workspace must not be null when num_tokens > 0");
  if (workspace_bytes < needed) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) +
                          ") must be >= gating_before_workspace_bytes(params) (" + std::to_string(needed) + ")");
  }
  if (p.num_tokens == 0) {  // no rows: no kernel, but the counts are written (all zero)
    if (out.counts != nullptr) {
      check(cudaMemsetAsync(out.counts, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t), stream));
    }
    return;
  }
  const std::int64_t t = p.num_tokens;
  const auto te = static_cast<std::size_t>(t) * static_cast<std::size_t>(p.num_experts);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* scores = reinterpret_cast<float*>(base);
  auto* choice = reinterpret_cast<float*>(base + round_up(te * sizeof(float)));
  const std::size_t values_offset =
      p.scoring == Scoring::deepseek_v3 ? 2 * round_up(te * sizeof(float)) : round_up(te * sizeof(float));
  auto* values = reinterpret_cast<float*>(base + values_offset);
  if (out.counts != nullptr) {
    check(cudaMemsetAsync(out.counts, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t), stream));
  }
  const auto warp_blocks = static_cast<unsigned>((t + kWarpsPerBlock - 1) / kWarpsPerBlock);
  TopkArgs a{nullptr, values, out.ids, t, p.num_experts, p.k, 0, 0};
  Normalise mode = Normalise::none;
  if (p.scoring == Scoring::softmax_then_topk) {
    softmax_rows<T><<<warp_blocks, kThreads, 0, stream>>>(logits, scores, t, p.num_experts);
    check_launch();
    // Rank the logits, not the probabilities: softmax is increasing, so the order is the same, but
    // probabilities that underflow to 0 (logits far below the row's largest) would all tie and fall
    // back to id order. The probabilities are gathered by id.
    a.gather = scores;
    topk_rows<T><<<warp_blocks, kThreads, 0, stream>>>(logits, a);
    mode = p.renormalize ? Normalise::renormalize : Normalise::none;
  } else if (p.scoring == Scoring::topk_then_softmax) {
    topk_rows<T><<<warp_blocks, kThreads, 0, stream>>>(logits, a);
    mode = Normalise::softmax_of_logits;
  } else {
    const auto count = static_cast<std::int64_t>(te);
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((count + kThreads - 1) / kThreads, 65535));
    sigmoid_scores<T><<<blocks, kThreads, 0, stream>>>(logits, bias, scores, choice, count, p.num_experts);
    check_launch();
    a.gather = scores;
    a.n_group = p.n_group;
    a.topk_group = p.topk_group;
    topk_rows<float><<<warp_blocks, kThreads, 0, stream>>>(choice, a);
    mode = Normalise::deepseek;
  }
  check_launch();
  const auto row_blocks = static_cast<unsigned>((t + kThreads - 1) / kThreads);
  normalise_rows<<<row_blocks, kThreads, 0, stream>>>(values, out.ids, out.weights, out.counts, t, p.k, mode,
                                                      p.routed_scaling_factor);
  check_launch();
}

}  // namespace

std::size_t gating_before_workspace_bytes(const GatingParams& params) {
  if (params.num_tokens <= 0 || params.num_experts <= 0 || params.k <= 0) return 0;
  const auto t = static_cast<std::size_t>(params.num_tokens);
  const std::size_t scores = round_up(t * static_cast<std::size_t>(params.num_experts) * sizeof(float));
  const std::size_t values = round_up(t * static_cast<std::size_t>(params.k) * sizeof(float));
  return (params.scoring == Scoring::deepseek_v3 ? 2 * scores : scores) + values;
}

void gating_before(const GatingParams& params, const float* logits, const float* correction_bias,
                   const GatingOutputs& out, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  gating_before_impl(params, logits, correction_bias, out, workspace, workspace_bytes, stream);
}

void gating_before(const GatingParams& params, const __nv_bfloat16* logits, const float* correction_bias,
                   const GatingOutputs& out, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  gating_before_impl(params, logits, correction_bias, out, workspace, workspace_bytes, stream);
}

}  // namespace kc::ch04
