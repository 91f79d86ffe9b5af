/// @file fused_common.cuh
/// @brief Device pieces every fused gating kernel of the chapter shares: the row layout and its
/// 16-byte loads, selection on full 32-bit keys (the exact path), the early launch, the per-block
/// expert histogram, and fast exp / reciprocal. Internal to the chapter.
///
/// Layout. A row of E experts is spread over L lanes (a "segment"); each lane holds N values in
/// V-wide vectors: value j of segment lane s is expert ((j / V) * L + s) * V + j % V, so one load
/// instruction of the warp reads L * V consecutive experts (coalesced). E <= 8 uses one thread per
/// row (L = 1, no shuffles at all), E <= 64 eight lanes, E <= 128 sixteen; E = 256 a warp per row
/// with 8 values per lane; E = 512 16 values per lane.
///
/// Bytes in flight. Each kernel runs a grid-stride loop over one wave of blocks (as many as fit,
/// asked from the occupancy API), and each warp issues the loads of its next row before it selects
/// on the current one: a row is always in flight per warp.
///
/// Selection on full keys. A value becomes an unsigned key with the order we want
/// (gating_device.cuh: larger value = larger key, NaN below -Inf, taken experts 0). One round finds
/// the segment's best key and, among lanes holding that key, the lowest expert id: that is the tie
/// rule, and it makes the order total, so every run and every path agrees bit for bit. Each lane
/// keeps its two best untaken experts (c1, c2); only c1 competes in a round; the winning lane moves
/// c2 up, and only a lane that wins a second time with no c2 left makes the warp rescan.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "gating_device.cuh"
#include "moe_gating.hpp"

namespace kc::ch04::fused {

using detail::kFullMask;
using detail::kNanKey;
using detail::kTakenKey;

inline constexpr int kWarpsPerBlock = 8;              ///< warps in a block of every fused kernel
inline constexpr int kThreads = kWarpsPerBlock * 32;  ///< threads in a block of every fused kernel

/// The unsigned type of @p kBytes bytes that load_vector reads in one instruction.
template <int kBytes>
struct RawVector;
/// 16 bytes: one LDG.128.
template <>
struct RawVector<16> {
  using type = uint4;  ///< four 32-bit words
};
/// 4 bytes: one fp32, or two bf16.
template <>
struct RawVector<4> {
  using type = unsigned;  ///< one 32-bit word
};
/// 2 bytes: one bf16.
template <>
struct RawVector<2> {
  using type = unsigned short;  ///< one 16-bit half-word
};

/// V consecutive logits in one load instruction (LDG.128 when V * sizeof(T) == 16), widened to fp32.
template <typename T, int V>
__device__ __forceinline__ void load_vector(const T* p, float (&out)[V]) {
  using Raw = typename RawVector<sizeof(T) * V>::type;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  T values[V];
  memcpy(values, &raw, sizeof raw);
#pragma unroll
  for (int v = 0; v < V; ++v) out[v] = detail::to_float(values[v]);
}

/// The expert of value @p j of segment lane @p seg_lane in the row layout above (L lanes a
/// segment, V-wide vectors): ((j / V) * L + seg_lane) * V + j % V.
template <int L, int V>
__device__ __forceinline__ int expert_of(int j, int seg_lane) {
  return ((j / V) * L + seg_lane) * V + j % V;
}

/// A lane's (or a segment's) best remaining expert. The order is total: a larger key first, and
/// among equal keys the lower id. kNone (key kTakenKey) loses to every expert.
struct Candidate {
  unsigned key;  ///< the expert's ordered key (larger wins; kTakenKey: none)
  int id;        ///< the expert's id (or, inside tournament_top2, its index j in the lane's keys)
};
constexpr Candidate kNone{kTakenKey, 0x7FFFFFFF};  ///< no candidate: loses to every expert

/// The best two of the lane's keys u[kFirst, kFirst + kCount), by a tournament: halves, then one
/// merge of two sorted pairs. Candidate ids here are indices j into u, and every index of the first
/// half is lower than every index of the second, so an equal key keeps the first half's candidate
/// (the lower id) with one unsigned compare, no id compare. About 6 instructions a key, against ~11
/// for inserting the keys one by one into a sorted pair.
template <int kFirst, int kCount, int N>
__device__ __forceinline__ void tournament_top2(const unsigned (&u)[N], Candidate& c1, Candidate& c2) {
  if constexpr (kCount == 1) {
    c1 = {u[kFirst], kFirst};
    c2 = kNone;
  } else {
    Candidate a1, a2, b1, b2;
    tournament_top2<kFirst, kCount / 2>(u, a1, a2);
    tournament_top2<kFirst + kCount / 2, kCount - kCount / 2>(u, b1, b2);
    const bool b_leads = b1.key > a1.key;
    c1 = b_leads ? b1 : a1;
    // The runner-up is the better of the leader's partner and the other pair's best.
    const Candidate early = b_leads ? a1 : a2;  // from the first half: wins a tie
    const Candidate late = b_leads ? b2 : b1;
    c2 = late.key > early.key ? late : early;
  }
}

/// The lane's two best experts among all its keys (c1 first, c2 second), the first scan of a row;
/// lane_top2 rescans after some winners. Ids leave as expert ids; kNone's id is meaningless (every
/// user checks the key first).
template <int L, int N, int V>
__device__ __forceinline__ void lane_top2_all(const unsigned (&key)[N], int seg_lane, Candidate& c1, Candidate& c2) {
  tournament_top2<0, N>(key, c1, c2);
  c1.id = expert_of<L, V>(c1.id, seg_lane);
  c2.id = expert_of<L, V>(c2.id, seg_lane);
}

/// The lane's two best experts among those that come after @p last in the order (key descending, id
/// ascending). The winners so far are exactly the experts up to and including @p last, so this is
/// "the best two not yet taken" without marking anything: the keys are never written.
template <int L, int N, int V>
__device__ __forceinline__ void lane_top2(const unsigned (&key)[N], int seg_lane, Candidate last, Candidate& c1,
                                          Candidate& c2) {
  // "After last" as one compare: a key below last.key, or equal to it with a larger id. Written
  // as a per-value limit (two selects) so that it compiles without branches.
  unsigned u[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const unsigned limit = expert_of<L, V>(j, seg_lane) > last.id ? last.key : last.key - 1u;  // last.key >= 1
    u[j] = key[j] <= limit ? key[j] : kTakenKey;  // taken: can never beat kNone
  }
  lane_top2_all<L, N, V>(u, seg_lane, c1, c2);
}

/// The best candidate of the segment (L lanes), known to all its lanes.
template <int L>
__device__ __forceinline__ Candidate segment_best(Candidate c) {
  if constexpr (L == 32) {
    const unsigned key = __reduce_max_sync(kFullMask, c.key);
    const unsigned id = __reduce_min_sync(kFullMask, c.key == key ? static_cast<unsigned>(c.id) : 0xFFFFFFFFu);
    return {key, static_cast<int>(id)};
  } else if constexpr (L == 1) {
    return c;
  } else {
    // Lower id must win among equal keys: pack the complement of the id under the key.
    unsigned long long packed = (static_cast<unsigned long long>(c.key) << 32) | (0xFFFFFFFFu - c.id);
#pragma unroll
    for (int offset = L / 2; offset > 0; offset /= 2) {
      const unsigned long long other = __shfl_xor_sync(kFullMask, packed, offset);
      packed = other > packed ? other : packed;
    }
    return {static_cast<unsigned>(packed >> 32), static_cast<int>(0xFFFFFFFFu - static_cast<unsigned>(packed))};
  }
}

/// The sum of @p x over the segment's L lanes, known to all of them. An xor butterfly: every lane
/// adds the same two partial sums at each step, so all lanes end with the same bits (the run-to-run
/// determinism the tests check).
template <int L>
__device__ __forceinline__ float segment_sum(float x) {
#pragma unroll
  for (int offset = L / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

/// Issues the loads of one row's values into registers. Padding and rows past the end are NaN, which
/// to_keys turns into kTakenKey. Nothing here waits for the data: the registers are first read by
/// to_keys, one row later.
template <typename T, int L, int N, int V>
__device__ __forceinline__ void load_row(const T* row_logits, bool active, int num_experts, int seg_lane,
                                         float (&x)[N]) {
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
    const int first = expert_of<L, V>(c * V, seg_lane);
    float v[V];
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = __int_as_float(0x7FC00000);
    if (active && first < num_experts) load_vector<T, V>(row_logits + first, v);  // E % V == 0
#pragma unroll
    for (int i = 0; i < V; ++i) x[c * V + i] = v[i];
  }
}

/// The key of each value, through `score` (identity for softmax, sigmoid + bias for DeepSeek-V3).
/// One select per value handles NaN, padding and rows past the end together: a NaN gets kNanKey
/// inside the row and kTakenKey outside it (load_row made padding NaN).
template <int L, int N, int V, typename Score>
__device__ __forceinline__ void to_keys(const float (&x)[N], bool active, int num_experts, int seg_lane, Score score,
                                        unsigned (&key)[N]) {
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
    const bool valid = active && expert_of<L, V>(c * V, seg_lane) < num_experts;
    const unsigned nan_key = valid ? kNanKey : kTakenKey;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float s = score(x[c * V + v], c * V + v);
      key[c * V + v] = s != s ? nan_key : detail::order_bits(s);
    }
  }
}

/// The k rounds on full keys (DeepSeek-V3's kernel). Each lane keeps its two best untaken experts (c1, c2); only
/// c1 competes. The winning lane moves c2 up; a lane that wins with no c2 left makes the warp
/// rescan (rare: a lane has to win twice, and the rescan refreshes every lane's pair). A round is
/// the dependent chain redux (max key) -> redux (min id) -> compare -> vote: no per-round scan of
/// the keys and no exp. on_win(r, best) runs in every lane after round r with the same `best`.
template <int L, int N, int V, typename OnWin>
__device__ __forceinline__ void select_top_k(const unsigned (&key)[N], int seg_lane, int k, OnWin on_win) {
  Candidate c1, c2;
  lane_top2_all<L, N, V>(key, seg_lane, c1, c2);
  // A runtime loop, not unrolled: the body stays small (instruction cache) and k is a runtime value.
#pragma unroll 1
  for (int r = 0;; ++r) {
    const Candidate best = segment_best<L>(c1);
    on_win(r, best);
    if (r + 1 == k) break;
    const bool won = c1.key != kTakenKey && c1.id == best.id;
    const bool dry = won && c2.key == kTakenKey;  // no second candidate known
    c1 = won ? c2 : c1;
    c2.key = won ? kTakenKey : c2.key;
    if (__any_sync(kFullMask, dry)) lane_top2<L, N, V>(key, seg_lane, best, c1, c2);
  }
}

// Programmatic dependent launch (sm_90 on). A kernel launched with
// the attribute "programmatic stream serialization" may start as soon as every block of the kernel
// before it has run griddepcontrol.launch_dependents (or exited), instead of after that kernel has
// finished; it runs griddepcontrol.wait before it touches anything the kernel before it writes,
// which returns once that kernel has finished and its stores are visible. Both are no-ops when no
// launch asked for it, and compile to nothing before sm_90.

/// griddepcontrol.launch_dependents: the kernel after this one on the stream may start now.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/// griddepcontrol.wait: returns once the kernel before this one has finished and its stores are visible.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// The first two instructions of every gating kernel (launched early, as its predecessor's
/// programmatic dependent: launch_gating_kernel). The kernel behind this one may launch now; then
/// wait for the kernel before this one, which may still be writing the logits (or, for zero_counts,
/// reading the counts it is about to zero) — the wait is where the launch's head start ends.
__device__ __forceinline__ void start_as_dependent() {
  allow_dependent_launch();
  wait_for_previous_grid();
}

// Shared-memory histogram of a block's choices, flushed to counts with at most E atomics.
//
// A warp's atomics on 32 neighbouring counters travel as one request to the L2, and every request
// on one cache line of counts is served in turn there: a grid flushes blocks x E / 32 requests
// onto E / 32 lines. At T = 4096, E = 256 (512 blocks ending together) that cost about 3 us.
// So a kernel counting on sm_90 is launched in clusters
// (gating_grid): the blocks of a cluster first sum their histograms through distributed shared
// memory, and each flushes a slice of whole lines of the sum, so the grid sends kFlushClusterBlocks
// times fewer requests.
constexpr unsigned kFlushClusterBlocks = 8;  ///< blocks a cluster when a kernel flushes in clusters

// The cluster operations in PTX (sm_90), for the clustered flush and the separate counting
// cluster: cooperative_groups' cluster_group does the same through 64-bit generic addresses, and in
// the flush its code cost the selection loop of several kernels registers (one spilled), although
// it runs once, at the end.

/// Where a block is in its cluster.
struct ClusterPlace {
  unsigned blocks = 1;  ///< the cluster's size in blocks (1 when not launched in clusters, and before sm_90)
  unsigned rank = 0;    ///< this block's rank in its cluster, in [0, blocks)
};

/// This block's ClusterPlace, read from `%cluster_nctarank` and `%cluster_ctarank` (sm_90 on).
__device__ __forceinline__ ClusterPlace my_cluster_place() {
  ClusterPlace place;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(place.blocks));
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(place.rank));
#endif
  return place;
}

/// Every thread of every block of the cluster arrives; the release and acquire make each block's
/// shared-memory writes before the barrier visible to the others' reads after it.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/// Reads the int at `address` (this block's shared memory) in the shared memory of block `rank` of
/// the cluster: mapa maps the address, ld.shared::cluster reads through distributed shared memory.
__device__ __forceinline__ int load_from_cluster_block(const int* address, unsigned rank) {
  int value = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto local = static_cast<unsigned>(__cvta_generic_to_shared(address));
  unsigned remote = 0;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(value) : "r"(remote) : "memory");
#endif
  return value;
}

/// Adds the block's shared-memory @p histogram of E = @p num_experts counters to @p counts (skipped
/// when @p counts is null), one atomic per nonzero counter. In a cluster of kFlushClusterBlocks blocks
/// each block first sums one slice of whole 32-counter lines over the cluster and flushes only that.
/// Every thread of the block calls it after its last histogram update.
__device__ __forceinline__ void flush_histogram(const int* histogram, int num_experts, std::int32_t* counts) {
  const ClusterPlace place = my_cluster_place();
  if (place.blocks == kFlushClusterBlocks) {  // otherwise 1: not launched in clusters
    cluster_barrier();                        // every block's histogram is complete and visible to the cluster
    constexpr int kBlocks = kFlushClusterBlocks;
    const int lines_per_block = ((num_experts + 31) / 32 + kBlocks - 1) / kBlocks;
    const int first = static_cast<int>(place.rank) * lines_per_block * 32;
    const int end = min(num_experts, first + lines_per_block * 32);
    for (int e = first + static_cast<int>(threadIdx.x); e < end; e += blockDim.x) {
      int sum = 0;
#pragma unroll
      for (unsigned r = 0; r < kBlocks; ++r) sum += load_from_cluster_block(histogram + e, r);
      if (sum != 0 && counts != nullptr) atomicAdd(counts + e, sum);
    }
    cluster_barrier();  // no block exits (its shared memory gone) before the others have read it
    return;
  }
  __syncthreads();
  if (counts == nullptr) return;
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) {
    if (histogram[e] != 0) atomicAdd(counts + e, histogram[e]);
  }
}

/// Zeroes the block's shared-memory @p histogram of @p num_experts counters, then syncs the block.
__device__ __forceinline__ void clear_histogram(int* histogram, int num_experts) {
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) histogram[e] = 0;
  __syncthreads();
}

/// The arguments of the fused softmax kernels (steps 1 to 3), passed by value.
struct SoftmaxArgs {
  float* weights;           ///< [T, k] routing weights out
  std::int32_t* ids;        ///< [T, k] expert ids out
  std::int32_t* counts;     ///< [E] tokens per expert, added to with atomics; null: do not count here
  std::int64_t num_tokens;  ///< T, rows of logits
  int num_experts;          ///< E, logits a row
  int k;                    ///< experts chosen a row
  bool full_softmax;        ///< softmax_then_topk without renormalisation: denominator over all E
};

/// The exact fallback for rows where packed keys cannot decide: k rounds on the full 32-bit keys,
/// each a scan of the lane's keys for its best (a strict > keeps the lower id on ties), the two
/// redux.sync of segment_best (max key, then min id among the lanes holding it), and the winner
/// marked taken. About four times the instructions of a packed round and few registers, for about
/// one row in a hundred. Round r's winner goes to segment lane r % L, slot r / L of @p id.
template <int L, int N, int V, int kSlots>
__device__ __forceinline__ void select_top_k_exact(unsigned (&key)[N], int seg_lane, int k, int (&id)[kSlots]) {
#pragma unroll 1
  for (int r = 0; r < k; ++r) {
    Candidate mine = kNone;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (key[j] > mine.key) mine = {key[j], expert_of<L, V>(j, seg_lane)};
    }
    const Candidate best = segment_best<L>(mine);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (r == s * L + seg_lane) id[s] = best.id;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (expert_of<L, V>(j, seg_lane) == best.id) key[j] = kTakenKey;
    }
  }
}

/// Issues the loads of one row, if it exists, from lane_logits (the row's start plus the lane's
/// first expert): vector c is at a constant offset, c * L * V. Padding vectors and rows past the end
/// load nothing and keep the registers' old values (fix_packed_keys makes padding kTakenKey; rows
/// past the end are never stored), so there is no NaN fill and no clamped address.
template <typename T, int L, int N, int V>
__device__ __forceinline__ void load_row_if(const T* lane_logits, bool row_exists, int num_experts, int seg_lane,
                                            float (&x)[N]) {
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
    if (row_exists && expert_of<L, V>(c * V, seg_lane) < num_experts) {
      float v[V];
      load_vector<T, V>(lane_logits + c * L * V, v);
#pragma unroll
      for (int i = 0; i < V; ++i) x[c * V + i] = v[i];
    }
  }
}

/// 2^x with a denormal result flushed to 0: one MUFU.EX2. __expf / exp2f keep denormal results
/// exact, which costs four more instructions a value (a range test and two multiplies) for weights
/// below 1.2e-38, far below the tests' 1e-5.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// 1/x for x in [1, 512]: one MUFU.RCP, the same bits as __fdividef's reciprocal without its range
/// test and scaling (needed only for |x| above 2^126 or below 2^-126).
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// DeepSeek-V3's score in the fused kernel: sigmoid(x) = 1 / (1 + 2^(-x log2(e))), one multiply,
/// two MUFU and an add. detail::sigmoid (expf with its exact range, the correctly rounded
/// reciprocal with its slow-path branch) takes about 20 instructions a value: with it the row loop
/// of fused_deepseek_v3 (sm_90, fp32, E <= 256) is 1000 SASS instructions, with this 820, and at a
/// warp a row the kernel is bound by instruction issue.
/// Same policy: NaN stays NaN, +Inf gives 1, -Inf (and x below about -87, where 1 + 2^(-x log2 e)
/// passes 2^126) gives 0. Error against the exact sigmoid: below 3e-7 for |x| <= 16 (ex2.approx
/// 2^-22 relative, the rounded product |x| 2^-24 more, rcp.approx 2^-23), against decision gaps of
/// about 2e-6 in the tests' DeepSeek-V3 inputs. Both the selection keys and the recomputed weights
/// use it, so a winner's weight is the score its key was made from.
__device__ __forceinline__ float sigmoid_fast(float x) { return rcp_ftz(1.0f + exp2_ftz(x * -1.44269504f)); }

/// Softmax numerator exp(x - m) of logit x under the row's largest non-NaN logit m, with the
/// chapter's policy and no branch. `m_ok` is m > -Inf. x == m (and m_ok) weighs exactly 1, which
/// also gives each +Inf logit 1 when m is +Inf (where x - m would be NaN). Every other NaN of
/// x - m (x NaN, m NaN, both -Inf) becomes -Inf through fmaxf and weighs 0; so does x = -Inf.
__device__ __forceinline__ float softmax_mass_fast(float x, float m, bool m_ok) {
  const float d = (x == m && m_ok) ? 0.0f : x - m;
  return exp2_ftz(fmaxf(d * 1.44269504f, -__int_as_float(0x7f800000)));
}

/// How far the grid-stride loop moves on, in rows and in elements of the logits and of the outputs.
/// The launch computes it from its grid, so the kernel adds it from constant memory: no registers,
/// no 64-bit multiplies in the loop.
struct GridStride {
  std::int64_t rows;     ///< rows: blocks * rows per block
  std::int64_t logits;   ///< logits: rows * E
  std::int64_t outputs;  ///< weights and ids: rows * k
};

}  // namespace kc::ch04::fused
