// EXERCISE: the fused gating kernel with its key lines removed. Fill in each TODO; the chapter's
// tests (ctest --preset exercises -L ch04) say when it is right. Hints are in README.md, Exercises.
// After: one fused kernel per routing function. Each row's logits are read once, 16 bytes per load,
// straight into registers; the k winners are found with warp-wide reductions over 32-bit keys; the
// weights are normalised in registers and each output element is stored once.
//
// Layout. A row of E experts is spread over L lanes (a "segment"); each lane holds N values in V-wide
// vectors: value j of segment lane s is expert ((j / V) * L + s) * V + j % V, so one load instruction
// of the warp reads L * V consecutive experts (coalesced). E = 8 uses one thread per row (L = 1, no
// shuffles at all); E = 256 a warp per row with 8 values per lane; E = 512 16 values per lane.
//
// Selection. A value becomes an unsigned key with the order we want (gating_device.cuh: larger
// value = larger key, NaN below -Inf, taken experts 0). One round finds the segment's best key and,
// among lanes holding that key, the lowest expert id: that is the tie rule, and it makes the order
// total, so every run and every path agrees bit for bit.
//   - L = 32: two redux.sync per round (a max over keys, then a min over the ids holding that max).
//     redux.sync reduces a 32-bit integer across the warp in one instruction. For k = 8 that is 16,
//     plus one for the row max: 17 warp-wide operations a row, against ~90 shuffles for a
//     butterfly over packed 64-bit (key, id) pairs (5 steps x 2 shuffles x k rounds + the softmax).
//   - L < 32: a log2(L)-step butterfly of __shfl_xor_sync over a packed 64-bit (key, ~id): 2 shuffles
//     per step (E = 64: 3 steps, 6 shuffles a round).
// After a round the owning lane marks its value taken and every lane rescans its N keys (N compares).
//
// Softmax. The ranking of probabilities is the ranking of logits, so selection runs on logits. The
// full softmax denominator (softmax_then_topk without renormalisation) needs exp over all E values
// and one segment sum (5 shuffles at L = 32); renormalised softmax and topk_then_softmax need only
// the k winners' exps, which every lane can add up itself because every lane sees each winner's key.
#include <cstdint>
#include <cstring>
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
constexpr int kBlocksPerSm = 8;

template <int kBytes>
struct RawVector;
template <>
struct RawVector<16> {
  using type = uint4;
};
template <>
struct RawVector<4> {
  using type = unsigned;
};
template <>
struct RawVector<2> {
  using type = unsigned short;
};

// V consecutive logits in one load instruction (LDG.128 when V * sizeof(T) == 16), widened to fp32.
template <typename T, int V>
__device__ __forceinline__ void load_vector(const T* p, float (&out)[V]) {
  using Raw = typename RawVector<sizeof(T) * V>::type;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  T values[V];
  memcpy(values, &raw, sizeof raw);
#pragma unroll
  for (int v = 0; v < V; ++v) out[v] = detail::to_float(values[v]);
}

template <int L, int V>
__device__ __forceinline__ int expert_of(int j, int seg_lane) {
  return ((j / V) * L + seg_lane) * V + j % V;
}

// A lane's (or a segment's) best remaining expert.
struct Candidate {
  unsigned key;
  int id;
};

// Strict '>' keeps the first of equal keys: values are stored in increasing expert order.
template <int L, int N, int V>
__device__ __forceinline__ Candidate local_best(const unsigned (&key)[N], int seg_lane) {
  Candidate best{key[0], expert_of<L, V>(0, seg_lane)};
#pragma unroll
  for (int j = 1; j < N; ++j) {
    if (key[j] > best.key) best = {key[j], expert_of<L, V>(j, seg_lane)};
  }
  return best;
}

// The best candidate of the segment, known to all its lanes.
template <int L>
__device__ __forceinline__ Candidate segment_best(Candidate c) {
  if constexpr (L == 32) {
    // TODO(1): the warp's largest key with one __reduce_max_sync, then the lowest id among the lanes
    // holding that key with one __reduce_min_sync (lanes without it contribute 0xFFFFFFFF).
    // Hint: two instructions; this is the whole tie rule for a warp per row.
    return c;
  } else {
    // Lower id must win among equal keys: pack the complement of the id under the key.
    unsigned long long packed = (static_cast<unsigned long long>(c.key) << 32) | (0xFFFFFFFFu - c.id);
#pragma unroll
    for (int offset = L / 2; offset > 0; offset /= 2) {
      // TODO(2): exchange `packed` with the lane `offset` away (__shfl_xor_sync) and keep the larger.
      (void)offset;
    }
    return {static_cast<unsigned>(packed >> 32), static_cast<int>(0xFFFFFFFFu - static_cast<unsigned>(packed))};
  }
}

// xor butterfly: every lane adds the same two partial sums at each step, so all lanes end with the
// same bits (the run-to-run determinism the tests check).
template <int L>
__device__ __forceinline__ float segment_sum(float x) {
#pragma unroll
  for (int offset = L / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Loads one row's values (kTakenKey for padding and for rows past the end).
template <typename T, int L, int N, int V>
__device__ __forceinline__ void load_keys(const T* row_logits, bool active, int num_experts, int seg_lane,
                                          unsigned (&key)[N]) {
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
    const int first = expert_of<L, V>(c * V, seg_lane);
    float x[V];
    const bool valid = active && first < num_experts;  // E % V == 0: a vector is all in or all out
    if (valid) load_vector<T, V>(row_logits + first, x);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      // TODO(3): the key of x[v] (detail::order_key) for valid values, kTakenKey for padding.
      key[c * V + v] = kTakenKey;
      (void)x[v];
    }
  }
}

template <int L, int N, int V>
__device__ __forceinline__ void mark_taken(unsigned (&key)[N], int id, int seg_lane) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (expert_of<L, V>(j, seg_lane) == id) key[j] = kTakenKey;
  }
}

// Shared-memory histogram of a block's choices, flushed to counts with at most E atomics.
__device__ __forceinline__ void flush_histogram(const int* histogram, int num_experts, std::int32_t* counts) {
  __syncthreads();
  if (counts == nullptr) return;
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) {
    if (histogram[e] != 0) atomicAdd(counts + e, histogram[e]);
  }
}

__device__ __forceinline__ void clear_histogram(int* histogram, int num_experts) {
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) histogram[e] = 0;
  __syncthreads();
}

struct SoftmaxArgs {
  float* weights;
  std::int32_t* ids;
  std::int32_t* counts;  // null: do not count here
  std::int64_t num_tokens;
  int num_experts;
  int k;
  bool full_softmax;  // softmax_then_topk without renormalisation: denominator over all E
};

template <typename T, int L, int N, int V>
__global__ void __launch_bounds__(kThreads) fused_softmax_topk(const T* __restrict__ logits, SoftmaxArgs a) {
  constexpr int kRounds = 32 < L * N ? 32 : L * N;  // k <= min(E, 32) <= L * N
  constexpr int kSlots = kRounds / L;               // output slots a lane stores
  __shared__ int histogram[kMaxExperts];
  clear_histogram(histogram, a.num_experts);

  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int seg_lane = lane % L;
  constexpr int kRowsPerWarp = 32 / L;
  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock * kRowsPerWarp;

  // The loop bound is the same for the whole warp, so every lane reaches every shuffle.
  for (std::int64_t first_row = warp * kRowsPerWarp; first_row < a.num_tokens; first_row += row_stride) {
    const std::int64_t row = first_row + lane / L;
    const bool active = row < a.num_tokens;
    unsigned key[N];
    load_keys<T, L, N, V>(logits + row * a.num_experts, active, a.num_experts, seg_lane, key);

    Candidate best = segment_best<L>(local_best<L, N, V>(key, seg_lane));
    const float row_max = best.key > kNanKey ? detail::key_value(best.key) : -__int_as_float(0x7f800000);
    float denominator = 0.0f;
    if (a.full_softmax) {
      float partial = 0.0f;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (key[j] > kNanKey) partial += detail::softmax_mass(detail::key_value(key[j]), row_max);
      }
      denominator = segment_sum<L>(partial);
    }

    float slot_mass[kSlots];
    int slot_id[kSlots];
    float chosen_sum = 0.0f;  // every lane adds the same winners in the same order
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      if (r >= a.k) break;
      if (r > 0) best = segment_best<L>(local_best<L, N, V>(key, seg_lane));
      mark_taken<L, N, V>(key, best.id, seg_lane);
      const float mass = best.key > kNanKey ? detail::softmax_mass(detail::key_value(best.key), row_max) : 0.0f;
      chosen_sum += mass;
      if (r % L == seg_lane) {
        slot_mass[r / L] = mass;
        slot_id[r / L] = best.id;
      }
    }
    // TODO(4): renormalised softmax and topk_then_softmax divide by the sum of the k chosen masses.
    (void)chosen_sum;

    if (active) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int r = s * L + seg_lane;
        if (r >= a.k) break;
        const std::int64_t out = row * a.k + r;
        a.weights[out] = denominator > 0.0f ? slot_mass[s] / denominator : 0.0f;
        a.ids[out] = slot_id[s];
        if (a.counts != nullptr) atomicAdd(histogram + slot_id[s], 1);
      }
    }
  }
  flush_histogram(histogram, a.num_experts, a.counts);
}

struct DeepSeekArgs {
  const float* bias;  // [E] or null
  float* weights;
  std::int32_t* ids;
  std::int32_t* counts;
  std::int64_t num_tokens;
  int num_experts;
  int k;
  int n_group;
  int topk_group;
  float scale;
};

// Padded so that lanes scanning different groups (32 apart) hit different banks.
__device__ __forceinline__ int padded(int e) { return e + e / 32; }

// DeepSeek-V3: a warp per row (L = 32). Group scores go through shared memory: lane g < n_group
// scans group g for its top-2 (E / n_group reads), which works for any group size.
template <typename T, int N, int V>
__global__ void __launch_bounds__(kThreads) fused_deepseek_v3(const T* __restrict__ logits, DeepSeekArgs a) {
  constexpr int L = 32;
  __shared__ int histogram[kMaxExperts];
  __shared__ unsigned staged[kWarpsPerBlock][kMaxExperts + kMaxExperts / 32];
  clear_histogram(histogram, a.num_experts);

  const int lane = static_cast<int>(threadIdx.x) % 32;
  unsigned* row_keys = staged[threadIdx.x / 32];
  const int group_size = a.num_experts / a.n_group;
  // e / group_size as a multiply and a shift: exact for e, group_size <= 512 (error < 512 / 2^20).
  const unsigned group_reciprocal = ((1u << 20) + static_cast<unsigned>(group_size) - 1) / group_size;
  // Per lane and the same for every row: the bias of each held expert.
  float bias[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int e = expert_of<L, V>(j, lane);
    bias[j] = (a.bias != nullptr && e < a.num_experts) ? a.bias[e] : 0.0f;
  }

  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t row = warp; row < a.num_tokens; row += warps) {
    unsigned key[N];
    float score[N];
    load_keys<T, L, N, V>(logits + row * a.num_experts, true, a.num_experts, lane, key);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      // key held the logit; now it becomes the selection key sigmoid(logit) + bias.
      score[j] = detail::sigmoid(detail::key_value(key[j]));
      if (key[j] != kTakenKey) {
        key[j] = detail::order_key(score[j] + bias[j]);
        row_keys[padded(expert_of<L, V>(j, lane))] = key[j];
      }
    }
    __syncwarp();
    unsigned group_key = kTakenKey;
    if (lane < a.n_group) {
      unsigned top1 = kTakenKey, top2 = kTakenKey;
      for (int e = lane * group_size; e < (lane + 1) * group_size; ++e) {
        const unsigned u = row_keys[padded(e)];
        if (u > top1) {
          top2 = top1;
          top1 = u;
        } else if (u > top2) {
          top2 = u;
        }
      }
      const bool one = group_size == 1;
      if (one) {
        group_key = top1;
      } else {
        group_key = top2 <= kNanKey ? kNanKey : detail::order_key(detail::key_value(top1) + detail::key_value(top2));
      }
    }
    __syncwarp();  // row_keys is rewritten by the next row
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

    float my_weight = 0.0f, sum = 0.0f;
    int my_id = 0;
    // Not unrolled: unrolling these runtime-length loops made ptxas spill on sm_80.
#pragma unroll 1
    for (int r = 0; r < a.k; ++r) {
      const Candidate best = segment_best<L>(local_best<L, N, V>(key, lane));
      float owned = 0.0f;
      bool owner = false;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (expert_of<L, V>(j, lane) == best.id) {
          owned = score[j];
          owner = true;
          key[j] = kTakenKey;
        }
      }
      const unsigned owners = __ballot_sync(kFullMask, owner);
      const float s = __shfl_sync(kFullMask, owned, owners != 0u ? __ffs(owners) - 1 : 0);
      const float w = s != s ? 0.0f : s;  // a NaN score weighs 0
      sum += w;
      if (lane == r) {
        my_weight = w;
        my_id = best.id;
      }
    }
    // Rows are sorted by weight (the unbiased score), not by the biased selection key.
    int position = 0;
#pragma unroll 1
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

unsigned grid_for(std::int64_t rows, int rows_per_block) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device));
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  const std::int64_t resident = static_cast<std::int64_t>(sms) * kBlocksPerSm;
  return static_cast<unsigned>(wanted < resident ? wanted : resident);
}

template <typename T, int L, int N, int V>
void launch_softmax(const T* logits, const SoftmaxArgs& a, cudaStream_t stream) {
  const unsigned blocks = grid_for(a.num_tokens, kWarpsPerBlock * (32 / L));
  fused_softmax_topk<T, L, N, V><<<blocks, kThreads, 0, stream>>>(logits, a);
}

template <typename T, int V>
void dispatch_softmax(const T* logits, const SoftmaxArgs& a, cudaStream_t stream) {
  // The smallest layout that holds E: one thread per row for E <= 8, a warp per row from 129 on.
  const int e = a.num_experts;
  if (e <= 8) {
    launch_softmax<T, 1, 8, V>(logits, a, stream);
  } else if (e <= 32) {
    launch_softmax<T, 4, 8, V>(logits, a, stream);
  } else if (e <= 64) {
    launch_softmax<T, 8, 8, V>(logits, a, stream);
  } else if (e <= 128) {
    launch_softmax<T, 16, 8, V>(logits, a, stream);
  } else if (e <= 256) {
    launch_softmax<T, 32, 8, V>(logits, a, stream);
  } else {
    launch_softmax<T, 32, 16, V>(logits, a, stream);
  }
}

template <typename T, int V>
void dispatch_deepseek(const T* logits, const DeepSeekArgs& a, cudaStream_t stream) {
  const unsigned blocks = grid_for(a.num_tokens, kWarpsPerBlock);
  if (a.num_experts <= 256) {
    fused_deepseek_v3<T, 8, V><<<blocks, kThreads, 0, stream>>>(logits, a);
  } else {
    fused_deepseek_v3<T, 16, V><<<blocks, kThreads, 0, stream>>>(logits, a);
  }
}

template <typename T>
void gating_after_impl(const GatingParams& p, const T* logits, const float* bias, const GatingOutputs& out,
                       cudaStream_t stream, CountMode count_mode) {
  validate_gating(p, logits, bias, out);
  if (count_mode != CountMode::fused_atomics && count_mode != CountMode::separate_kernel) {
    throw InvalidArgument("count_mode (" + std::to_string(static_cast<int>(count_mode)) +
                          ") must be a CountMode value");
  }
  if (p.num_tokens == 0) return;
  if (out.counts != nullptr) {
    check(cudaMemsetAsync(out.counts, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t), stream));
  }
  std::int32_t* kernel_counts = count_mode == CountMode::fused_atomics ? out.counts : nullptr;

  // 16-byte vectors when every row starts 16-byte aligned; otherwise one element per load.
  constexpr int kVector = 16 / sizeof(T);
  const bool vector = p.num_experts % kVector == 0 && reinterpret_cast<std::uintptr_t>(logits) % 16 == 0;
  if (p.scoring == Scoring::deepseek_v3) {
    const DeepSeekArgs a{bias,          out.weights, out.ids,   kernel_counts, p.num_tokens,
                         p.num_experts, p.k,         p.n_group, p.topk_group,  p.routed_scaling_factor};
    vector ? dispatch_deepseek<T, kVector>(logits, a, stream) : dispatch_deepseek<T, 1>(logits, a, stream);
  } else {
    const SoftmaxArgs a{out.weights,
                        out.ids,
                        kernel_counts,
                        p.num_tokens,
                        p.num_experts,
                        p.k,
                        p.scoring == Scoring::softmax_then_topk && !p.renormalize};
    vector ? dispatch_softmax<T, kVector>(logits, a, stream) : dispatch_softmax<T, 1>(logits, a, stream);
  }
  check_launch();
  if (out.counts != nullptr && count_mode == CountMode::separate_kernel) {
    const std::int64_t count = p.num_tokens * p.k;
    const unsigned blocks = grid_for(count, kThreads);
    count_experts<<<blocks, kThreads, 0, stream>>>(out.ids, count, p.num_experts, out.counts);
    check_launch();
  }
}

}  // namespace

void gating_after(const GatingParams& params, const float* logits, const float* correction_bias,
                  const GatingOutputs& out, cudaStream_t stream, CountMode count_mode) {
  gating_after_impl(params, logits, correction_bias, out, stream, count_mode);
}

void gating_after(const GatingParams& params, const __nv_bfloat16* logits, const float* correction_bias,
                  const GatingOutputs& out, cudaStream_t stream, CountMode count_mode) {
  gating_after_impl(params, logits, correction_bias, out, stream, count_mode);
}

}  // namespace kc::ch04
