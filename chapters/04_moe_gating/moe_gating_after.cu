// After: one fused kernel per routing function. Each row's logits are read once, 16 bytes per load,
// straight into registers; the k winners are found with warp-wide reductions over 32-bit keys; the
// weights are normalised in registers and each output element is stored once.
//
// Layout. A row of E experts is spread over L lanes (a "segment"); each lane holds N values in V-wide
// vectors: value j of segment lane s is expert ((j / V) * L + s) * V + j % V, so one load instruction
// of the warp reads L * V consecutive experts (coalesced). E <= 8 uses one thread per row (L = 1, no
// shuffles at all), E <= 64 eight lanes, E <= 128 sixteen; E = 256 a warp per row with 8 values per
// lane; E = 512 16 values per lane.
//
// Bytes in flight. A grid-stride loop over one wave of blocks (as many as fit, asked from the
// occupancy API), and each warp issues the loads of its next row before it selects on the current
// one: a row is always in flight per warp, instead of nothing while the warp computes.
//
// Selection (the DeepSeek-V3 kernel, Version 3 of the softmax kernel, and the softmax kernel's
// exact fallback; the softmax kernel itself packs the id into the key, see "Version 4" below).
// A value becomes an unsigned key with the order we want (gating_device.cuh: larger
// value = larger key, NaN below -Inf, taken experts 0). One round finds the segment's best key and,
// among lanes holding that key, the lowest expert id: that is the tie rule, and it makes the order
// total, so every run and every path agrees bit for bit.
//   - Each lane keeps its two best untaken experts (c1, c2), found once per row. Only c1 competes in
//     a round; the winning lane moves c2 up. Only a lane that wins a second time with no c2 left
//     makes the warp rescan (lane_top2: the best two after the last winner). For random rows of
//     E = 256, k = 8 that is about one rescan every other row, where version 1 rescanned N keys and
//     marked the winner taken in every round (~75 SASS instructions a round, now ~20). The pair is
//     built by a tournament (tournament_top2), and every per-value step (keys, the rescan filter)
//     is branch-free: at 496 rows per SM the kernel is limited by instructions issued, not bytes.
//   - L = 32: two redux.sync per round (a max over keys, then a min over the ids holding that max).
//     redux.sync reduces a 32-bit integer across the warp in one instruction.
//   - L < 32: a log2(L)-step butterfly of __shfl_xor_sync over a packed 64-bit (key, ~id): 2 shuffles
//     per step (E = 64: 3 steps, 6 shuffles a round).
//
// Softmax. The ranking of probabilities is the ranking of logits, so selection runs on logits and
// no exp is computed inside the rounds. Afterwards the lane holding slot r computes that winner's
// exp once, and one segment sum (5 shuffles at L = 32) gives the renormalising denominator. The full
// softmax denominator (softmax_then_topk without renormalisation) needs exp over all E values
// instead; topk_then_softmax is the renormalised case.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

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
constexpr int kCachedDevices = 16;  // devices whose occupancy the launch functions remember

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

// A lane's (or a segment's) best remaining expert. The order is total: a larger key first, and
// among equal keys the lower id. kNone (key kTakenKey) loses to every expert.
struct Candidate {
  unsigned key;
  int id;
};
constexpr Candidate kNone{kTakenKey, 0x7FFFFFFF};

// The best two of the lane's keys u[kFirst, kFirst + kCount), by a tournament: halves, then one
// merge of two sorted pairs. Candidate ids here are indices j into u, and every index of the first
// half is lower than every index of the second, so an equal key keeps the first half's candidate
// (the lower id) with one unsigned compare, no id compare. About 6 instructions a key, against ~11
// for inserting the keys one by one into a sorted pair.
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

// The lane's two best experts among those that come after `last` in the order (key descending, id
// ascending). The winners so far are exactly the experts up to and including `last`, so this is
// "the best two not yet taken" without marking anything: the keys are never written. The first
// call per row uses lane_top2_all (no filter). Ids leave as expert ids; kNone's id is meaningless
// (every user checks the key first).
template <int L, int N, int V>
__device__ __forceinline__ void lane_top2_all(const unsigned (&key)[N], int seg_lane, Candidate& c1, Candidate& c2) {
  tournament_top2<0, N>(key, c1, c2);
  c1.id = expert_of<L, V>(c1.id, seg_lane);
  c2.id = expert_of<L, V>(c2.id, seg_lane);
}

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

// The best candidate of the segment, known to all its lanes.
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

// xor butterfly: every lane adds the same two partial sums at each step, so all lanes end with the
// same bits (the run-to-run determinism the tests check).
template <int L>
__device__ __forceinline__ float segment_sum(float x) {
#pragma unroll
  for (int offset = L / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Issues the loads of one row's values into registers. Padding and rows past the end are NaN, which
// to_keys turns into kTakenKey. Nothing here waits for the data: the registers are first read by
// to_keys, one row later.
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

// The key of each value, through `score` (identity for softmax, sigmoid + bias for DeepSeek-V3).
// One select per value handles NaN, padding and rows past the end together: a NaN gets kNanKey
// inside the row and kTakenKey outside it (load_row made padding NaN).
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

// The k rounds shared by both kernels. Each lane keeps its two best untaken experts (c1, c2); only
// c1 competes. The winning lane moves c2 up; a lane that wins with no c2 left makes the warp
// rescan (rare: a lane has to win twice, and the rescan refreshes every lane's pair). A round is
// the dependent chain redux (max key) -> redux (min id) -> compare -> vote: no per-round scan of
// the keys and no exp. on_win(r, best) runs in every lane after round r with the same `best`.
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

// Programmatic dependent launch (sm_90 on; Chapter 7 explains it in full). A kernel launched with
// the attribute "programmatic stream serialization" may start as soon as every block of the kernel
// before it has run griddepcontrol.launch_dependents (or exited), instead of after that kernel has
// finished; it runs griddepcontrol.wait before it touches anything the kernel before it writes,
// which returns once that kernel has finished and its stores are visible. Both are no-ops when no
// launch asked for it, and compile to nothing before sm_90.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The first two instructions of every gating kernel (launched early, as its predecessor's
// programmatic dependent: launch_gating_kernel). The kernel behind this one may launch now; then
// wait for the kernel before this one, which may still be writing the logits (or, for zero_counts,
// reading the counts it is about to zero) — the wait is where the launch's head start ends.
__device__ __forceinline__ void start_as_dependent() {
  allow_dependent_launch();
  wait_for_previous_grid();
}

// Shared-memory histogram of a block's choices, flushed to counts with at most E atomics.
//
// A warp's atomics on 32 neighbouring counters travel as one request to the L2, and every request
// on one cache line of counts is served in turn there: a grid flushes blocks x E / 32 requests
// onto E / 32 lines. At T = 4096, E = 256 (512 blocks ending together) that cost about 3 us
// (docs/notes/ch04.md, Session 16). So a kernel counting on sm_90 is launched in clusters
// (gating_grid): the blocks of a cluster first sum their histograms through distributed shared
// memory, and each flushes a slice of whole lines of the sum, so the grid sends kFlushClusterBlocks
// times fewer requests.
constexpr unsigned kFlushClusterBlocks = 8;  // blocks a cluster when a kernel flushes in clusters

// The cluster operations in PTX (sm_90), for the clustered flush and the separate counting
// cluster: cooperative_groups' cluster_group does the same through 64-bit generic addresses, and in
// the flush its code cost the selection loop of several kernels registers (one spilled), although
// it runs once, at the end.
// Where this block is: its cluster's size in blocks (1 when not launched in clusters, and before
// sm_90) and its rank in it.
struct ClusterPlace {
  unsigned blocks = 1;
  unsigned rank = 0;
};

__device__ __forceinline__ ClusterPlace my_cluster_place() {
  ClusterPlace place;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(place.blocks));
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(place.rank));
#endif
  return place;
}

// Every thread of every block of the cluster arrives; the release and acquire make each block's
// shared-memory writes before the barrier visible to the others' reads after it.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Reads the int at `address` (this block's shared memory) in the shared memory of block `rank` of
// the cluster: mapa maps the address, ld.shared::cluster reads through distributed shared memory.
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

// Zeroes counts[0, E) for the fused kernels' atomics: a kernel, not a cudaMemsetAsync, so that it
// too can be launched early, as its predecessor's programmatic dependent, and let the gating kernel
// launch early behind it (docs/notes/ch04.md, Session 15).
__global__ void zero_counts(std::int32_t* counts, int num_experts) {
  start_as_dependent();
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += blockDim.x) counts[e] = 0;
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

// Version 3 of the softmax kernel: selection on full 32-bit keys, two redux.sync a round (a max
// over keys, then a min over the ids holding it). No longer the chapter's `after`: it is kept so
// that the benchmark's tuning cases (KC_TUNE=1, ch04/tune_fused_v3/...) can measure it against
// Version 4 below in the same run. Version 4 also falls back to its selection (select_top_k) for
// the rare rows where packed keys cannot decide.
template <typename T, int L, int N, int V>
__global__ void __launch_bounds__(kThreads) fused_softmax_topk_v3(const T* __restrict__ logits, SoftmaxArgs a) {
  start_as_dependent();
  constexpr int kRounds = 32 < L * N ? 32 : L * N;  // k <= min(E, 32) <= L * N
  constexpr int kSlots = kRounds / L;               // output slots a lane stores
  __shared__ int histogram[kMaxExperts];
  clear_histogram(histogram, a.num_experts);

  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int seg_lane = lane % L;
  constexpr int kRowsPerWarp = 32 / L;
  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock * kRowsPerWarp;

  // Software pipeline: x holds the row this iteration works on; its loads were issued one
  // iteration earlier, so each warp always has a row in flight while it selects.
  float x[N];
  {
    const std::int64_t row = warp * kRowsPerWarp + lane / L;
    load_row<T, L, N, V>(logits + row * a.num_experts, row < a.num_tokens, a.num_experts, seg_lane, x);
  }
  // The loop bound is the same for the whole warp, so every lane reaches every shuffle.
  for (std::int64_t first_row = warp * kRowsPerWarp; first_row < a.num_tokens; first_row += row_stride) {
    const std::int64_t row = first_row + lane / L;
    const bool active = row < a.num_tokens;
    unsigned key[N];
    to_keys<L, N, V>(
        x, active, a.num_experts, seg_lane, [](float v, int) { return v; }, key);
    const std::int64_t next = row + row_stride;
    load_row<T, L, N, V>(logits + next * a.num_experts, next < a.num_tokens, a.num_experts, seg_lane, x);

    // Round r's winner goes to segment lane r % L, slot r / L. Each slot index is a compile-time
    // constant, so the slots stay in registers.
    Candidate slot[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) slot[s] = kNone;
    select_top_k<L, N, V>(key, seg_lane, a.k, [&](int r, Candidate best) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (r == s * L + seg_lane) slot[s] = best;
      }
    });

    // Softmax of the winners only, one exp per slot, after the rounds. The ranking of probabilities
    // is the ranking of logits, so nothing above needed an exp. Round 0's winner (segment lane 0,
    // slot 0) holds the row's largest key.
    const unsigned top_key = L == 1 ? slot[0].key : __shfl_sync(kFullMask, slot[0].key, lane - seg_lane);
    const float row_max = top_key > kNanKey ? detail::key_value(top_key) : -__int_as_float(0x7f800000);
    float mass[kSlots];
    float partial = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const bool chosen = s * L + seg_lane < a.k && slot[s].key > kNanKey;
      mass[s] = chosen ? detail::softmax_mass(detail::key_value(slot[s].key), row_max) : 0.0f;
      partial += mass[s];
    }
    if (a.full_softmax) {  // the denominator is over all E experts, not the k chosen
      partial = 0.0f;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (key[j] > kNanKey) partial += detail::softmax_mass(detail::key_value(key[j]), row_max);
      }
    }
    const float denominator = segment_sum<L>(partial);

    if (active) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int r = s * L + seg_lane;
        if (r >= a.k) break;
        const std::int64_t out = row * a.k + r;
        a.weights[out] = denominator > 0.0f ? mass[s] / denominator : 0.0f;
        a.ids[out] = slot[s].id;
        if (a.counts != nullptr) atomicAdd(histogram + slot[s].id, 1);
      }
    }
  }
  flush_histogram(histogram, a.num_experts, a.counts);
}

// ---------------------------------------------------------------- Version 4: packed keys
//
// Version 3 spent ~473 SASS instructions a row at E = 256, k = 8 (docs/notes/ch04.md, Session 5):
// a round was two dependent redux.sync plus the bookkeeping of a separate id next to every key.
// Version 4 puts the id inside the key. A packed key is one unsigned number,
//
//     2^31 + (sign * magnitude, its low b bits cleared) + (2^b - 1 - id),       b = log2(L * N),
//
// whose high 32 - b bits (the "prefix") follow the logit's order, -0 and +0 alike, and whose low
// b bits are larger for a lower id. No two experts of a row share a packed key, so the largest
// packed key is the winner, tie rule included: one redux.sync max a round at L = 32 (one shuffle
// and one max per butterfly step at L < 32), and a lane's best two are plain unsigned max/min.
//
// The price: the prefix no longer sees the logit's b lowest bits, so two fp32 logits within 2^b
// ulps of each other can share a prefix and then rank by id. That can only change the answer when
// two consecutive winners (the k-th and the (k+1)-th included) share a prefix, so the rounds run
// once more to find the (k+1)-th, and such a row is redone exactly with the full keys (Version 3's
// select_top_k). For random fp32 rows that is about one row in a hundred; tie-heavy rows always
// take it, and stay exact. bf16 logits have 16 zero low bits: their prefix is the whole key, so
// they never need it. The weights are computed from the winners' logits reloaded by id (a cache
// hit: the row was just read), never from the shortened keys.

// Bits of a packed key that hold the id: the segment holds L * N experts (a power of two).
template <int L, int N>
__host__ __device__ constexpr int id_bits() {
  int b = 0;
  while ((1 << b) < L * N) ++b;
  return b;
}

// The packed key of value j of segment lane seg_lane (its expert is expert_of<L, V>(j, seg_lane)).
// Four instructions: a shift, a LOP3, two adds. Taking the two's complement of the sign-magnitude
// float (xor with the sign mask, subtract it) sends -0 and +0 to the same number, without the
// x + 0.0f of order_bits. NaN and padding are fixed afterwards by fix_packed_keys (rare).
template <int L, int V, int kIdBits>
__device__ __forceinline__ unsigned packed_key(float x, int j, int seg_lane) {
  constexpr unsigned kIdMask = (1u << kIdBits) - 1u;
  const unsigned bits = __float_as_uint(x);
  const unsigned sign = static_cast<unsigned>(static_cast<int>(bits) >> 31);  // all ones if negative
  const unsigned ordered = ((bits & 0x7FFFFFFFu & ~kIdMask) ^ sign) - sign;   // +-magnitude, low b bits 0
  // The id's three parts (vector j / V, lane, element j % V) occupy disjoint bits, so 2^b - 1 - id
  // is an xor, and adding it to `ordered` (low bits 0) is an xor too: one LOP3 with the lane's part.
  const unsigned lane_part = static_cast<unsigned>(expert_of<L, V>(0, seg_lane));
  const unsigned value_part = static_cast<unsigned>(expert_of<L, V>(j, 0));
  return ordered ^ (0x80000000u | kIdMask ^ value_part) ^ lane_part;
}

// The slow path of the keys, for a warp where some lane holds a NaN or padding: a NaN gets the
// prefix of kNanKey (below -Inf, all NaNs equal, so the id decides), padding gets 0, which loses
// to every expert. The id bits of a NaN's key are already right. Padding is whole vectors
// (E % V == 0), so it is tested once a vector.
template <int L, int N, int V, int kIdBits>
__device__ __forceinline__ void fix_packed_keys(const float (&x)[N], int num_experts, int seg_lane,
                                                unsigned (&packed)[N]) {
  constexpr unsigned kIdMask = (1u << kIdBits) - 1u;
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
    const bool padding = expert_of<L, V>(c * V, seg_lane) >= num_experts;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int j = c * V + v;
      const bool nan = (__float_as_uint(x[j]) & 0x7FFFFFFFu) > 0x7F800000u;
      if (nan) packed[j] = (kNanKey << kIdBits) | (packed[j] & kIdMask);
      if (padding) packed[j] = kTakenKey;
    }
  }
}

// The packed keys of a lane's values (Versions 5 and 6), and whether they may hold a NaN: a sum of
// the values (N - 1 adds on the FMA pipe, in two chains, then one compare) is NaN iff some value is
// NaN, or +Inf and -Inf (or overflows of both signs) meet, which only costs the slow path
// (fix_packed_keys).
template <int L, int N, int V, int kIdBits>
__device__ __forceinline__ bool packed_keys_nan_tested(const float (&x)[N], int seg_lane, unsigned (&packed)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) packed[j] = packed_key<L, V, kIdBits>(x[j], j, seg_lane);
  float even = x[0], odd_sum = x[1];
#pragma unroll
  for (int j = 2; j < N; j += 2) {
    even += x[j];
    odd_sum += x[j + 1];
  }
  const float sum = even + odd_sum;
  return sum != sum;
}

// The largest two of u[kFirst, kFirst + kCount): pairs, then merges of sorted pairs, all unsigned
// max/min (one instruction each): the ids ride inside the keys. 20 instructions for 8 keys.
template <int kFirst, int kCount, int N>
__device__ __forceinline__ void top2_packed(const unsigned (&u)[N], unsigned& hi, unsigned& lo) {
  if constexpr (kCount == 1) {
    hi = u[kFirst];
    lo = kTakenKey;
  } else {
    unsigned a_hi, a_lo, b_hi, b_lo;
    top2_packed<kFirst, kCount / 2>(u, a_hi, a_lo);
    top2_packed<kFirst + kCount / 2, kCount - kCount / 2>(u, b_hi, b_lo);
    hi = max(a_hi, b_hi);
    lo = max(min(a_hi, b_hi), max(a_lo, b_lo));  // the loser of the leaders, or the better runner-up
  }
}

// How the rounds of select_top_k_packed run: `after`'s way, or a tuning candidate
// (docs/notes/ch04.md, Session 14).
enum class Rounds {
  redux_top2,    // redux.sync for the warp's max (L = 32), two cached keys a lane: `after`
  shuffle_top2,  // the five-step shuffle butterfly for the max at L = 32 too (five SHFL.BFLY and
                 // five VIMNMX instead of one REDUX): is the REDUX unit what the rounds wait for?
};

// The segment's largest packed key, known to all its lanes.
template <int L, Rounds kSelection = Rounds::redux_top2>
__device__ __forceinline__ unsigned segment_max(unsigned key) {
  if constexpr (L == 32 && kSelection != Rounds::shuffle_top2) {
    return __reduce_max_sync(kFullMask, key);
  } else {
#pragma unroll
    for (int offset = L / 2; offset > 0; offset /= 2) key = max(key, __shfl_xor_sync(kFullMask, key, offset));
    return key;
  }
}

// After a round whose winning key is `best`: the lane that held it moves its second candidate up,
// and if a lane won with no second known (c1 == c2), the warp rescans for each lane's best two
// below `best` (the winners so far are exactly the keys >= best). Versions 5 and 6 both call it.
template <int N>
__device__ __forceinline__ void advance_after_round(const unsigned (&packed)[N], unsigned best, unsigned& c1,
                                                    unsigned& c2) {
  const bool won = c1 == best;
  const bool dry = won && c1 == c2;  // won, and no second candidate known
  c1 = won ? c2 : c1;                // after a win c1 == c2: "no second" until a rescan
  if (__any_sync(kFullMask, dry)) {
    unsigned below[N];
#pragma unroll
    for (int j = 0; j < N; ++j) below[j] = packed[j] < best ? packed[j] : kTakenKey;
    top2_packed<0, N>(below, c1, c2);
  }
}

// The k rounds on packed keys, plus one to learn the (k+1)-th. Each lane keeps its best two
// untaken keys (c1, c2); c1 == c2 marks "no second known". Round r's winner goes to segment lane
// r % L, slot r / L. Returns true when two consecutive winners share a prefix (see above).
// kWinnersInShared (L = 32 only; Version 5: docs/notes/ch04.md, Sessions 12-14): every round
// stores its winner to shared memory (one store, on the memory pipe) instead of each lane testing
// "is this my slot?" (a compare and a select on the ALU pipe, which bounds the kernel); after the
// rounds each lane reads its slot and the next one. Each lane stores into its own column
// (`column[r * 32]`, round r; the warp's 32 columns side by side, so a round's 32 stores hit 32
// banks) and reads back only its own stores: no lane reads what another wrote, so there is nothing
// to order and no barrier. A single row that every lane stores (the same value) and reads needs
// one: a __syncwarp (it cost the gain) or relaxed atomics (compute-sanitizer still reports them).
template <int L, int N, int kIdBits, int kSlots, bool kWinnersInShared = false, Rounds kSelection = Rounds::redux_top2>
__device__ __forceinline__ bool select_top_k_packed(const unsigned (&packed)[N], int seg_lane, int k,
                                                    unsigned (&slot)[kSlots], unsigned* column = nullptr) {
  static_assert(!kWinnersInShared || L == 32, "winners in shared memory: one column per lane (L = 32)");
  constexpr unsigned kIdMask = (1u << kIdBits) - 1u;
  unsigned c1, c2;
  top2_packed<0, N>(packed, c1, c2);
  unsigned best;
  unsigned previous = 0;  // prefix 0: never equal to a winner's, which is a number or NaN
  bool shared_prefix = false;
#pragma unroll 1
  for (int r = 0;; ++r) {
    // An empty asm statement: the optimiser can no longer derive a second counter (r - seg_lane)
    // for the slot test below, so one counter serves the loop and the slot (a round is 12 SASS
    // instructions instead of 13).
    if constexpr (!kWinnersInShared) asm volatile("" : "+r"(r));
    best = segment_max<L, kSelection>(c1);
    if constexpr (kWinnersInShared) column[r * 32] = best;  // the lane's own column: rows 0 .. k
    // L = 32 checks once after the rounds (below): 3 instructions a round saved.
    if constexpr (L < 32) shared_prefix = shared_prefix || (best ^ previous) <= kIdMask;
    if (r == k) break;  // round k only finds the (k+1)-th
    previous = best;
    if constexpr (!kWinnersInShared) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (r == s * L + seg_lane) slot[s] = best;
      }
    }
    advance_after_round(packed, best, c1, c2);
  }
  if constexpr (kWinnersInShared) {
    // Rows 0 .. k of the column hold the k winners and the (k+1)-th, stored by this lane. Lane r < k
    // reads its winner (row r) and the next one (row r + 1, the (k+1)-th for lane k - 1); lanes from
    // k on store no output and read nothing (rows past k are not this warp's).
    slot[0] = 0u;
    if (seg_lane < k) {
      const unsigned mine = column[seg_lane * 32];
      const unsigned next = column[(seg_lane + 1) * 32];
      slot[0] = mine;
      shared_prefix = (mine ^ next) <= kIdMask;
    }
  } else if constexpr (L == 32) {
    // Lane r holds winner r (kSlots == 1): compare it with lane r + 1's, lane k - 1 with the
    // (k+1)-th, which is the last `best`.
    const unsigned right = __shfl_down_sync(kFullMask, slot[0], 1);
    const unsigned next = seg_lane + 1 == k ? best : right;
    shared_prefix = seg_lane < k && (slot[0] ^ next) <= kIdMask;
  }
  return shared_prefix;
}

// The exact fallback for rows where packed keys cannot decide: k rounds on the full 32-bit keys,
// each a scan of the lane's keys for its best (a strict > keeps the lower id on ties), the two
// redux.sync of segment_best (max key, then min id among the lanes holding it), and the winner
// marked taken. About four times the instructions of a packed round and few registers, for about
// one row in a hundred.
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

// Issues the loads of one row, if it exists, from lane_logits (the row's start plus the lane's
// first expert): vector c is at a constant offset, c * L * V. Padding vectors and rows past the end
// load nothing and keep the registers' old values (fix_packed_keys makes padding kTakenKey; rows
// past the end are never stored), so there is no NaN fill and no clamped address.
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

// Asks L2 for the vectors of a row that load_row_if would load (the same lanes, the same addresses):
// one prefetch.global.L2 per vector, which the warp's lanes coalesce into the row's 128-byte lines.
// Nothing comes back to registers, so it costs an instruction per vector and no latency.
template <typename T, int L, int N, int V>
__device__ __forceinline__ void prefetch_row_l2(const T* lane_logits, int num_experts, int seg_lane) {
#pragma unroll
  for (int c = 0; c < N / V; ++c) {
    if (expert_of<L, V>(c * V, seg_lane) < num_experts) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(lane_logits + c * L * V));
    }
  }
}

// 2^x with a denormal result flushed to 0: one MUFU.EX2. __expf / exp2f keep denormal results
// exact, which costs four more instructions a value (a range test and two multiplies) for weights
// below 1.2e-38, far below the tests' 1e-5.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1/x for x in [1, 512]: one MUFU.RCP, the same bits as __fdividef's reciprocal without its range
// test and scaling (needed only for |x| above 2^126 or below 2^-126).
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// DeepSeek-V3's score in the fused kernel: sigmoid(x) = 1 / (1 + 2^(-x log2(e))), one multiply,
// two MUFU and an add. detail::sigmoid (expf with its exact range, the correctly rounded
// reciprocal with its slow-path branch) takes about 20 instructions a value: with it the row loop
// of fused_deepseek_v3 (sm_90, fp32, E <= 256) was 1000 SASS instructions, with this 820, and at a
// warp a row the kernel is bound by instruction issue (docs/notes/ch04.md, Session 16).
// Same policy: NaN stays NaN, +Inf gives 1, -Inf (and x below about -87, where 1 + 2^(-x log2 e)
// passes 2^126) gives 0. Error against the exact sigmoid: below 3e-7 for |x| <= 16 (ex2.approx
// 2^-22 relative, the rounded product |x| 2^-24 more, rcp.approx 2^-23), against decision gaps of
// about 2e-6 in the tests' DeepSeek-V3 inputs. Both the selection keys and the recomputed weights
// use it, so a winner's weight is the score its key was made from.
__device__ __forceinline__ float sigmoid_fast(float x) { return rcp_ftz(1.0f + exp2_ftz(x * -1.44269504f)); }

// Softmax numerator exp(x - m) of logit x under the row's largest non-NaN logit m, with the
// chapter's policy and no branch. `m_ok` is m > -Inf. x == m (and m_ok) weighs exactly 1, which
// also gives each +Inf logit 1 when m is +Inf (where x - m would be NaN). Every other NaN of
// x - m (x NaN, m NaN, both -Inf) becomes -Inf through fmaxf and weighs 0; so does x = -Inf.
__device__ __forceinline__ float softmax_mass_fast(float x, float m, bool m_ok) {
  const float d = (x == m && m_ok) ? 0.0f : x - m;
  return exp2_ftz(fmaxf(d * 1.44269504f, -__int_as_float(0x7f800000)));
}

// How far the grid-stride loop moves on, in rows and in elements of the logits and of the outputs.
// The launch computes it from its grid, so the kernel adds it from constant memory: no registers,
// no 64-bit multiplies in the loop.
struct GridStride {
  std::int64_t rows;     // blocks * rows per block
  std::int64_t logits;   // rows * E
  std::int64_t outputs;  // rows * k
};

// kPrefetchL2: a tuning candidate (KC_TUNE=1, ch04/tune_fused_v4_prefetch; docs/notes/ch04.md,
// Session 8). Each iteration also asks L2 for the row after next, so a warp has two rows on their way
// from DRAM instead of one; `after` runs without it until it is measured.
// kLean: Version 5, `after`'s kernel (Version 4 is kLean = false, kept for launches past 2^30
// logits and for the tuning row ch04/tune_fused_v4). Fewer ALU instructions a row, the pipe that
// bounds the kernel (docs/notes/ch04.md, Sessions 11-14): the rounds' winners go through shared
// memory (L = 32: the dynamic shared memory holds k + 1 rows of 32 words a warp, winners_table_bytes()), the NaN test
// of the keys adds the values on the FMA pipe (a NaN or an Inf - Inf makes the sum NaN; the second only sends the warp
// down the exact slow path), and rows and output elements are counted in 32 bits (gating_rows_fit_int32()).
// kSelection: how the selection rounds run (Rounds; all but redux_top2 are tuning candidates).
template <typename T, int L, int N, int V, bool kPrefetchL2 = false, bool kLean = false,
          Rounds kSelection = Rounds::redux_top2>
__global__ void __launch_bounds__(kThreads)
    fused_softmax_topk(const T* __restrict__ logits, SoftmaxArgs a, GridStride stride) {
  start_as_dependent();
  constexpr bool kWinnersInShared = kLean && L == 32;
  constexpr int kIdBits = id_bits<L, N>();
  constexpr unsigned kIdMask = (1u << kIdBits) - 1u;
  constexpr int kRounds = 32 < L * N ? 32 : L * N;  // k <= min(E, 32) <= L * N
  constexpr int kSlots = kRounds / L;               // output slots a lane stores
  constexpr int kRowsPerWarp = 32 / L;
  // bf16 keys have 16 zero low bits: the prefix is the whole key, so packed keys are always exact.
  constexpr bool kMayShareExactPrefix = sizeof(T) == 4;
  __shared__ int histogram[kMaxExperts];
  clear_histogram(histogram, a.num_experts);

  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int seg_lane = lane % L;
  const int lane_first = expert_of<L, V>(0, seg_lane);  // the lane's first expert
  // Rows and output elements: 32-bit in Version 5 (launched only when T · E <= 2^30, so T · k and a
  // row plus one grid's stride stay far below 2^31), which halves the ALU instructions of the row
  // bookkeeping; 64-bit in Version 4.
  using Index = std::conditional_t<kLean, int, std::int64_t>;
  const Index tokens = static_cast<Index>(a.num_tokens);
  const Index stride_rows = static_cast<Index>(stride.rows);
  const Index warp = static_cast<Index>(blockIdx.x) * kWarpsPerBlock + static_cast<Index>(threadIdx.x / 32);
  // The lane's last vector is its highest expert: past E means the lane holds padding.
  const bool lane_has_padding = expert_of<L, V>(N - V, seg_lane) >= a.num_experts;

  // Carried from row to row and advanced by the constant stride: no row * E or row * k products in
  // the loop. lane_logits points at the lane's first expert of the row (its vector c is c * L * V
  // further on).
  const Index first = warp * kRowsPerWarp + lane / L;  // the lane's first row
  const T* lane_logits = logits + static_cast<std::int64_t>(first) * a.num_experts + lane_first;
  Index out = first * static_cast<Index>(a.k) + seg_lane;  // the lane's first output element of the row

  // Version 5's winners: the warp's k + 1 rows of 32 words in the dynamic shared memory, this lane's
  // column of them (select_top_k_packed).
  unsigned* column = nullptr;
  if constexpr (kWinnersInShared) {
    extern __shared__ unsigned winners_table[];
    column = winners_table + static_cast<int>(threadIdx.x / 32) * (a.k + 1) * 32 + lane;
  }

  float x[N] = {};  // the row this iteration works on, loaded one iteration ahead (software pipeline)
  load_row_if<T, L, N, V>(lane_logits, first < tokens, a.num_experts, seg_lane, x);
  // The loop bound is the same for the whole warp, so every lane reaches every shuffle.
  for (Index first_row = warp * kRowsPerWarp; first_row < tokens; first_row += stride_rows) {
    // The warp is converged here (the bound is warp-uniform); saying so lets ptxas drop its
    // "is the warp diverged?" check (BRA.DIV, two instructions) before every redux.sync and vote.
    __syncwarp();
    const Index row = first_row + lane / L;
    const bool active = row < tokens;  // false only in a partial last warp at L < 32
    unsigned packed[N];
    bool odd = lane_has_padding;
    if constexpr (kLean) {
      const bool may_hold_nan = packed_keys_nan_tested<L, N, V, kIdBits>(x, seg_lane, packed);
      odd = odd || may_hold_nan;
    } else {
#pragma unroll
      for (int j = 0; j < N; j += 2) {
        packed[j] = packed_key<L, V, kIdBits>(x[j], j, seg_lane);
        packed[j + 1] = packed_key<L, V, kIdBits>(x[j + 1], j + 1, seg_lane);
        odd = odd || !(x[j] == x[j] && x[j + 1] == x[j + 1]);  // one unordered compare for the pair
      }
    }
    if (__any_sync(kFullMask, odd)) fix_packed_keys<L, N, V, kIdBits>(x, a.num_experts, seg_lane, packed);
    load_row_if<T, L, N, V>(lane_logits + stride.logits, row + stride_rows < tokens, a.num_experts, seg_lane, x);
    if constexpr (kPrefetchL2) {
      if (row + 2 * stride_rows < tokens) {
        prefetch_row_l2<T, L, N, V>(lane_logits + 2 * stride.logits, a.num_experts, seg_lane);
      }
    }

    unsigned slot[kSlots] = {};  // lanes past k keep 0 and store nothing
    bool shared_prefix = false;
    if constexpr (kWinnersInShared) {
      shared_prefix = select_top_k_packed<L, N, kIdBits, kSlots, true, kSelection>(packed, seg_lane, a.k, slot, column);
    } else {
      shared_prefix = select_top_k_packed<L, N, kIdBits>(packed, seg_lane, a.k, slot);
    }
    int id[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) id[s] = static_cast<int>(~slot[s] & kIdMask);
    if (kMayShareExactPrefix && __any_sync(kFullMask, active && shared_prefix)) {
      // Rare: redo the warp's rows with the full 32-bit keys.
      float y[N];
      load_row<T, L, N, V>(lane_logits - lane_first, active, a.num_experts, seg_lane, y);
      unsigned key[N];
      to_keys<L, N, V>(
          y, active, a.num_experts, seg_lane, [](float v, int) { return v; }, key);
      select_top_k_exact<L, N, V>(key, seg_lane, a.k, id);
    }

    // Weights from the winners' own logits, reloaded by id (a cache hit). Round 0's winner
    // (segment lane 0, slot 0) is the row's largest non-NaN logit whenever the row has one.
    float value[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const bool chosen = active && s * L + seg_lane < a.k;
      value[s] = chosen ? detail::to_float(lane_logits[id[s] - lane_first]) : __int_as_float(0x7FC00000);  // NaN: 0
    }
    const float row_max = L == 1 ? value[0] : __shfl_sync(kFullMask, value[0], lane - seg_lane);
    const bool max_ok = row_max > -__int_as_float(0x7f800000);
    float mass[kSlots];
    float partial = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      mass[s] = softmax_mass_fast(value[s], row_max, max_ok);
      partial = s == 0 ? mass[0] : partial + mass[s];
    }
    if (a.full_softmax) {  // the denominator is over all E experts: reread the row (a cache hit)
      partial = 0.0f;
#pragma unroll
      for (int c = 0; c < N / V; ++c) {
        if (!active || expert_of<L, V>(c * V, seg_lane) >= a.num_experts) continue;  // padding weighs 0
        float v[V];
        load_vector<T, V>(lane_logits + c * L * V, v);
#pragma unroll
        for (int i = 0; i < V; ++i) partial += softmax_mass_fast(v[i], row_max, max_ok);
      }
    }
    // The row's top winner weighs exactly 1 unless nothing does (a row of -Inf and NaN): the sum is
    // 0 or at least 1, so max(sum, 1) makes the 0 case weigh 0 / 1 without a test.
    const float reciprocal = rcp_ftz(fmaxf(segment_sum<L>(partial), 1.0f));

#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (!active || s * L + seg_lane >= a.k) break;
      a.weights[out + s * L] = mass[s] * reciprocal;
      a.ids[out + s * L] = id[s];
      atomicAdd(histogram + id[s], 1);  // flushed only when counts are wanted
    }
    lane_logits += stride.logits;
    out += static_cast<Index>(stride.outputs);
  }
  flush_histogram(histogram, a.num_experts, a.counts);
}

// ---------------------------------------------------------------- Version 6: the epilogue of four rows at once
//
// Version 5's sm_90 SASS (E = 256, k = 8) spends about 67 of a row's 242 instructions on the
// epilogue: read the winners back, reload their logits, exp, the segment sum, the reciprocal, the
// stores, the histogram. It runs with k = 8 of the 32 lanes busy. Version 6 selects kBatchRows = 32
// / k rows first, each leaving its k + 1 winners in its own rows of the winners table, and then
// finishes them together: lane k * b + r takes row b's winner r. One epilogue pass serves four rows.
//
// With k a compile-time constant (kFixedK = 8, the k of most routings with E = 256) the rounds are
// unrolled too: a rolled round was 12 SASS instructions, 4 of them for the loop (counter, compare,
// branch, the store's address); unrolled, each round's store has a constant offset.
//
// A warp batches only rows it owns: rows first_row, first_row + stride, ... (the grid stride). So
// batches exist only when the launch gives a warp more than one row, i.e. more rows than one grid
// holds; below that `after` runs Version 5 (launch_softmax), where a batch would be one row plus
// the bookkeeping.
//
// The sum over a row's k lanes is an 8-lane xor butterfly: Version 5 sums 32 lanes of which the
// other 24 hold +0, and adding +0 changes nothing, so both give the same bits.
constexpr int kFixedK = 8;
constexpr int kBatchRows = 32 / kFixedK;

// The k rounds on packed keys plus round k (the (k+1)-th, for the prefix check), unrolled. Round r
// stores its winner to row r of the lane's column (`column[r * 32]`: a constant offset); every lane
// stores the same value to its own column, so a later read of the lane's own column needs no
// barrier (as Version 5).
template <int N, int kK>
__device__ __forceinline__ void select_top_k_packed_unrolled(const unsigned (&packed)[N], unsigned* column) {
  unsigned c1, c2;
  top2_packed<0, N>(packed, c1, c2);
#pragma unroll
  for (int r = 0; r <= kK; ++r) {
    const unsigned best = __reduce_max_sync(kFullMask, c1);
    column[r * 32] = best;
    if (r == kK) break;
    advance_after_round(packed, best, c1, c2);
  }
}

// The epilogue of a batch of Version 6 (one call for up to kBatchRows rows): lane k * b + r finishes
// winner r of batch row b, reading rows r and r + 1 of that row's part of its own column
// (`my_winners`). `first_row` is the batch's first row; its rows are
// `stride_rows` apart. Rows whose consecutive winners share a prefix are redone exactly, by the
// whole warp (Version 5's fallback), one row at a time; lane k * b + r takes winner r from lane r.
template <typename T, int N, int V, int kK>
__device__ __forceinline__ void finish_batch(const T* __restrict__ logits, const SoftmaxArgs& a, int first_row,
                                             int rows_in_batch, int stride_rows, const unsigned* my_winners,
                                             int* histogram) {
  constexpr int L = 32;
  constexpr unsigned kIdMask = (1u << id_bits<L, N>()) - 1u;
  constexpr bool kMayShareExactPrefix = sizeof(T) == 4;  // bf16: the prefix is the whole key
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int batch_row = lane / kK;
  const int rank = lane % kK;
  const bool active = batch_row < rows_in_batch;
  const int my_row = first_row + batch_row * stride_rows;
  int id = 0;
  bool shared_prefix = false;
  if (active) {
    const unsigned mine = my_winners[0];
    const unsigned next = my_winners[32];  // the (k+1)-th for r = k - 1
    id = static_cast<int>(~mine & kIdMask);
    shared_prefix = (mine ^ next) <= kIdMask;
  }
  if constexpr (kMayShareExactPrefix) {
    const unsigned redo = __ballot_sync(kFullMask, shared_prefix);
#pragma unroll 1
    for (int b = 0; b < rows_in_batch; ++b) {
      if (((redo >> (b * kK)) & ((1u << kK) - 1u)) == 0u) continue;  // warp-uniform
      float y[N];
      load_row<T, L, N, V>(logits + static_cast<std::int64_t>(first_row + b * stride_rows) * a.num_experts, true,
                           a.num_experts, lane, y);
      unsigned key[N];
      to_keys<L, N, V>(
          y, true, a.num_experts, lane, [](float v, int) { return v; }, key);
      int exact[1] = {0};
      select_top_k_exact<L, N, V>(key, lane, kK, exact);
      const int exact_id = __shfl_sync(kFullMask, exact[0], rank);
      if (batch_row == b) id = exact_id;
    }
  }
  const T* const my_row_logits = logits + static_cast<std::int64_t>(my_row) * a.num_experts;
  const float value = active ? detail::to_float(my_row_logits[id]) : __int_as_float(0x7FC00000);  // NaN: 0
  const float row_max = __shfl_sync(kFullMask, value, lane - rank);  // winner 0: the row's largest
  const float mass = softmax_mass_fast(value, row_max, row_max > -__int_as_float(0x7f800000));
  float total = mass;
#pragma unroll
  for (int offset = kK / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(kFullMask, total, offset);
  const float reciprocal = rcp_ftz(fmaxf(total, 1.0f));  // as Version 5: 0 or at least 1
  if (active) {
    const int out = my_row * kK + rank;
    a.weights[out] = mass * reciprocal;
    a.ids[out] = id;
    atomicAdd(histogram + id, 1);  // flushed only when counts are wanted
  }
}

// Version 6: a warp a row (L = 32), k = kK, the renormalised (or top-k-then-softmax) weights, rows
// and outputs counted in 32 bits (gating_rows_fit_int32()). The second number of __launch_bounds__
// keeps 5 blocks an SM (48 registers): without it ptxas took 52 registers on sm_90, 4 blocks.
// Asking L2 for the row after next (Version 4's tuning candidate, kPrefetchL2) made it 5 % slower
// (docs/notes/ch04.md, Session 20): it does not wait on DRAM latency.
// The row loop has Version 5's shape, one row an iteration (with the batch's rows as an inner loop,
// ptxas could no longer tell that the warp is converged and put a BRA.DIV before every round's
// redux.sync); every kBatchRows rows, and after the warp's last row, finish_batch runs.
// Measured and not kept (docs/notes/ch04.md, Session 20): the NaN test after the tournament (7
// instructions a row fewer) and clusters of two blocks summing their counts; both within 0.5 %.
template <typename T, int N, int V, int kK>
__global__ void __launch_bounds__(kThreads, 5)
    fused_softmax_topk_batched(const T* __restrict__ logits, SoftmaxArgs a, GridStride stride) {
  start_as_dependent();
  constexpr int L = 32;
  constexpr int kIdBits = id_bits<L, N>();
  constexpr int kWinnerRows = kK + 1;  // rows of the winners table a batch row needs
  static_assert(kK * kBatchRows == 32, "the epilogue gives each lane one winner of one row");
  __shared__ int histogram[kMaxExperts];
  // Each warp: kBatchRows x (k + 1) rows of 32 words, one column a lane (36 KB a block at k = 8).
  __shared__ unsigned winners_table[kWarpsPerBlock][kBatchRows * kWinnerRows * 32];
  clear_histogram(histogram, a.num_experts);

  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int lane_first = expert_of<L, V>(0, lane);
  const int tokens = static_cast<int>(a.num_tokens);
  const int stride_rows = static_cast<int>(stride.rows);
  const int warp = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  const bool lane_has_padding = expert_of<L, V>(N - V, lane) >= a.num_experts;
  unsigned* const column = &winners_table[threadIdx.x / 32][lane];
  constexpr int kBatchRowWords = kWinnerRows * 32;  // one batch row's part of the table
  // The words this lane reads in finish_batch: winner `rank` of batch row `batch_row`.
  const unsigned* const my_winners = column + (lane / kK) * kBatchRowWords + (lane % kK) * 32;

  const T* lane_logits = logits + static_cast<std::int64_t>(warp) * a.num_experts + lane_first;
  float x[N] = {};  // the row being selected, loaded one row ahead (Version 5's software pipeline)
  load_row_if<T, L, N, V>(lane_logits, warp < tokens, a.num_experts, lane, x);
  int b = 0;  // the row's place in its batch
  for (int row = warp; row < tokens; row += stride_rows) {
    __syncwarp();  // converged (the bound is warp-uniform): no BRA.DIV before redux and votes
    unsigned packed[N];
    const bool may_hold_nan = packed_keys_nan_tested<L, N, V, kIdBits>(x, lane, packed);
    if (__any_sync(kFullMask, lane_has_padding || may_hold_nan)) {
      fix_packed_keys<L, N, V, kIdBits>(x, a.num_experts, lane, packed);
    }
    const bool more = row + stride_rows < tokens;  // warp-uniform
    load_row_if<T, L, N, V>(lane_logits + stride.logits, more, a.num_experts, lane, x);
    select_top_k_packed_unrolled<N, kK>(packed, column + b * kBatchRowWords);
    lane_logits += stride.logits;
    if (++b == kBatchRows || !more) {
      finish_batch<T, N, V, kK>(logits, a, row - (b - 1) * stride_rows, b, stride_rows, my_winners, histogram);
      b = 0;
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
// query gives 62 clusters of 8 blocks of 8 warps, and T = 4096 needs 64 (docs/notes/ch04.md,
// Session 18). Wide blocks are used only where there are enough rows to give every SM one
// (dispatch_deepseek): below that they would put twice the rows on half the SMs.
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
  // (docs/notes/ch04.md, Session 18).
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
// 32 Ki ids (docs/notes/ch04.md, Session 15), most of it in shared-memory atomics.
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

// Bytes of Version 5's winners table for top-k: each warp of a block keeps k + 1 rows of 32 words
// (one column a lane) in the dynamic shared memory; 33.8 KB at k = 32, 9.2 KB at k = 8.
constexpr std::size_t winners_table_bytes(int k) {
  return static_cast<std::size_t>(kWarpsPerBlock) * static_cast<std::size_t>(k + 1) * 32 * sizeof(unsigned);
}

// What a launch needs to know about the current device, asked once a launch (gating_after_impl).
struct Gpu {
  int device = 0;
  int sms = 1;
  bool sm90_or_later = false;  // griddepcontrol (programmatic dependent launch) and clusters
};

Gpu current_gpu() {
  Gpu gpu;
  int major = 0;
  check(cudaGetDevice(&gpu.device));
  check(cudaDeviceGetAttribute(&gpu.sms, cudaDevAttrMultiProcessorCount, gpu.device));
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu.device));
  gpu.sm90_or_later = major >= 9;
  return gpu;
}

// One wave: at most as many blocks as fit on the GPU at once (a grid-stride loop does the rest).
// A grid of 8 blocks per SM for a kernel of which only 6 fit ran as 1.33 waves, its last third on a
// quarter of the machine.
unsigned grid_for(std::int64_t rows, int rows_per_block, int per_sm, const Gpu& gpu) {
  const std::int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  const std::int64_t resident = static_cast<std::int64_t>(gpu.sms) * (per_sm > 0 ? per_sm : 1);
  return static_cast<unsigned>(wanted < resident ? wanted : resident);
}

// Blocks of `kernel` that fit on one SM with `dynamic_shared_bytes` each, asked once per device and
// kept in the caller's `cache` (one per kernel instance): the launch path stays a few cheap host calls.
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

// Where a fused kernel is launched: its stream, whether as its predecessor's programmatic
// dependent, and whether in clusters that sum their counts before flushing them (flush_histogram).
struct LaunchOn {
  cudaStream_t stream;
  bool early;              // programmatic dependent launch (Launching::early on sm_90 or later)
  bool flush_in_clusters;  // the kernel counts (fused) on sm_90, E > kFlushClustersAboveExperts:
                           // gating_grid may use clusters
  Gpu gpu;                 // DeepSeek-V3's wide blocks need gpu.sm90_or_later: the 64-register
                           // instance (deepseek_min_blocks) is only in sm_90's code
};

// The shape of a launch: blocks, threads a block, dynamic shared memory, and blocks a cluster (1: no
// clusters; more needs sm_90).
struct KernelShape {
  unsigned blocks;
  unsigned threads;
  std::size_t shared_bytes = 0;
  unsigned cluster_blocks = 1;
};

// Launches `kernel`, as the programmatic dependent of the kernel before it on `stream` when
// `dependent` (the attribute "programmatic stream serialization"; see allow_dependent_launch).
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

// The fewest blocks a grid needs to flush its counts in clusters: below that the flush sends few
// requests anyway (chosen, not measured on its own).
constexpr std::int64_t kFlushClustersFromBlocks = 64;

// Clusters pay only where the flush is large. A clustered launch of the same grid measured about
// 1.2 to 1.6 us slower at T = 4096 with E = 64 and 128 (2 and 4 lines of counts), with or without
// the early launch and with clusters of 4 or spread over the SMs; at E = 256 (8 lines, 4096
// requests unclustered) it was 1.7 us faster (docs/notes/ch04.md, Session 17). So only routings
// with more experts than this flush in clusters.
constexpr int kFlushClustersAboveExperts = 128;

// Clusters of kFlushClusterBlocks blocks of `kernel` (with `dynamic_shared_bytes` each) that fit on
// the GPU at once, asked once per device and kept in `cache`, as blocks_per_sm does.
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

// Per-kernel answers to the occupancy questions of gating_grid, asked once per device.
struct OccupancyCache {
  std::atomic<int> blocks_per_sm[kCachedDevices];
  std::atomic<int> flush_clusters[kCachedDevices];
};

// The launch shape of a gating kernel over `rows` rows, `rows_per_block` a block: one wave at most
// (grid_for; a grid-stride loop does the rest). When the kernel counts on sm_90
// (`on.flush_in_clusters`) and the grid has kFlushClustersFromBlocks blocks or more, it becomes whole
// clusters of kFlushClusterBlocks, if they all fit at once. A launch too large for one wave keeps no
// clusters: its blocks end at different times, so their flushes do not meet.
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

// Launches one fused kernel with `shape`, early when `on.early`: the GPU may then schedule its
// blocks while the kernel before it is still running (each block waits at its top,
// start_as_dependent), so the launch's own latency is hidden behind that kernel instead of added
// after it.
template <typename... Params, typename... Args>
void launch_gating_kernel(void (*kernel)(Params...), const KernelShape& shape, const LaunchOn& on, Args&&... args) {
  launch_kernel(kernel, shape, on.stream, on.early, std::forward<Args>(args)...);
}

// Which fused softmax kernel a launch runs: `after`'s choice (Version 6 where it applies, else
// Version 5, or Version 4 where 32-bit counters do not reach), or one the benchmark's tuning cases
// measure beside it.
enum class SoftmaxKernel {
  after,                 // version6 when gating_rows_fit_int32(), Version 4 otherwise
  version6,              // the batched epilogue (fp32, 129 <= E <= 256 in 16-byte rows, k = 8, weights
                         // renormalised, more rows than one grid holds), Version 5 otherwise
  version5,              // the lean kernel (kLean): fewer ALU instructions a row, 32-bit rows
  version4,              // the packed-key kernel before it (64-bit rows)
  version3,              // the kernel before that (full 32-bit keys)
  version4_prefetch,     // Version 4 with the row after next prefetched to L2
  version5_shuffle_max,  // Version 5 with the rounds' max by shuffles instead of redux.sync
};

template <typename T, int L, int N, int V, SoftmaxKernel kKernel>
void launch_softmax(const T* logits, const SoftmaxArgs& a, const LaunchOn& on) {
  static OccupancyCache occupancy;
  constexpr int kRowsPerBlock = kWarpsPerBlock * (32 / L);
  if constexpr (kKernel == SoftmaxKernel::version3) {
    const auto kernel = fused_softmax_topk_v3<T, L, N, V>;
    // The tuning row's kernel: never in clusters (its flush takes the one-block path).
    const KernelShape shape{
        grid_for(a.num_tokens, kRowsPerBlock, blocks_per_sm(kernel, occupancy.blocks_per_sm, on.gpu), on.gpu),
        kThreads};
    launch_gating_kernel(kernel, shape, on, logits, a);
  } else {
    constexpr bool kVersion6 = kKernel == SoftmaxKernel::version6;
    if constexpr (kVersion6 && std::is_same_v<T, float> && L == 32 && N == 8 && V == 4) {
      if (a.k == kFixedK && !a.full_softmax) {
        static std::atomic<int> batched_blocks_per_sm[kCachedDevices];
        const auto kernel = fused_softmax_topk_batched<T, N, V, kFixedK>;
        const unsigned blocks =
            grid_for(a.num_tokens, kRowsPerBlock, blocks_per_sm(kernel, batched_blocks_per_sm, on.gpu), on.gpu);
        const std::int64_t rows = static_cast<std::int64_t>(blocks) * kRowsPerBlock;
        if (rows < a.num_tokens) {  // a warp has several rows: one full wave of blocks
          // Never in clusters: each block flushes its own counts (a wave of whole clusters that sum
          // theirs first measured 7 % slower here, docs/notes/ch04.md, Session 20).
          launch_gating_kernel(kernel, KernelShape{blocks, kThreads}, on, logits, a,
                               GridStride{rows, rows * a.num_experts, rows * a.k});
          return;
        }
      }
    }
    constexpr Rounds kSelection =
        kKernel == SoftmaxKernel::version5_shuffle_max ? Rounds::shuffle_top2 : Rounds::redux_top2;
    constexpr bool kLean = kKernel == SoftmaxKernel::version5 || kVersion6 || kSelection != Rounds::redux_top2;
    const auto kernel = fused_softmax_topk<T, L, N, V, kKernel == SoftmaxKernel::version4_prefetch, kLean, kSelection>;
    // Version 5 at L = 32 keeps k + 1 winners a lane in shared memory. The grid is sized for k = 32,
    // the most any launch needs, so the occupancy asked once per device holds for every k.
    constexpr bool kWinnersInShared = kLean && L == 32;
    const std::size_t winners_bytes = kWinnersInShared ? winners_table_bytes(a.k) : 0;
    const KernelShape shape = gating_grid(kernel, a.num_tokens, kRowsPerBlock, winners_bytes,
                                          kWinnersInShared ? winners_table_bytes(32) : 0, on, occupancy);
    const std::int64_t rows = static_cast<std::int64_t>(shape.blocks) * kRowsPerBlock;
    launch_gating_kernel(kernel, shape, on, logits, a, GridStride{rows, rows * a.num_experts, rows * a.k});
  }
}

template <typename T, int V, SoftmaxKernel kKernel>
void dispatch_softmax(const T* logits, const SoftmaxArgs& a, const LaunchOn& on) {
  // The smallest layout that holds E: one thread per row for E <= 8, a warp per row from 129 on.
  const int e = a.num_experts;
  if (e <= 8) {
    launch_softmax<T, 1, 8, V, kKernel>(logits, a, on);
  } else if (e <= 64) {
    // E <= 32 too: an L = 4 segment needs 8 output slots a lane (k <= 32), which spilled on sm_80.
    launch_softmax<T, 8, 8, V, kKernel>(logits, a, on);
  } else if (e <= 128) {
    launch_softmax<T, 16, 8, V, kKernel>(logits, a, on);
  } else if (e <= 256) {
    launch_softmax<T, 32, 8, V, kKernel>(logits, a, on);
  } else {
    launch_softmax<T, 32, 16, V, kKernel>(logits, a, on);
  }
}

template <typename T, int V>
void dispatch_deepseek(const T* logits, const DeepSeekArgs& a, const LaunchOn& on) {
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

// How a launch's kernels are launched.
enum class Launching {
  early,     // `after`: each kernel as its predecessor's programmatic dependent (sm_90 on), the
             // fused counts zeroed by zero_counts
  ordinary,  // the ordinary way, the counts zeroed by cudaMemsetAsync (the tuning rows
             // ch04/tune_fused_v5_ordinary*; Version 5 before Session 15)
};

template <typename T, SoftmaxKernel kKernel = SoftmaxKernel::after, Launching kLaunching = Launching::early>
void gating_after_impl(const GatingParams& p, const T* logits, const float* bias, const GatingOutputs& out,
                       cudaStream_t stream, CountMode count_mode) {
  validate_gating(p, logits, bias, out);
  if (count_mode != CountMode::fused_atomics && count_mode != CountMode::separate_kernel &&
      count_mode != CountMode::automatic) {
    throw InvalidArgument("count_mode (" + std::to_string(static_cast<int>(count_mode)) +
                          ") must be a CountMode value");
  }
  if (kKernel != SoftmaxKernel::after && p.scoring == Scoring::deepseek_v3) {  // before anything is launched
    throw InvalidArgument("scoring must be softmax_then_topk or topk_then_softmax for a tuning kernel");
  }
  if (p.num_tokens == 0) return;
  const Gpu gpu = current_gpu();                  // asked once a launch
  const std::int64_t count = p.num_tokens * p.k;  // ids to count
  if (count_mode == CountMode::automatic) {
    // Measured (docs/notes/ch04.md, Session 17): fused counting is faster than the separate
    // kernel at every benchmark case. The separate cluster is a second kernel that waits for the
    // whole gating grid; it had won only at T = 4096, E = 256, where 512 blocks flushed 4096
    // requests onto 8 lines of counts at once, and the clustered flush (flush_histogram) took that
    // case from it.
    count_mode = CountMode::fused_atomics;
  }
  std::int32_t* kernel_counts = count_mode == CountMode::fused_atomics ? out.counts : nullptr;
  // Separate counting of a small launch: one cluster (sm_90) or one block stores the counts
  // outright, nothing to zero.
  const bool count_small =
      out.counts != nullptr && count_mode == CountMode::separate_kernel && count <= kSmallCountLimit;
  // Programmatic dependent launch needs sm_90 (griddepcontrol); older GPUs run the same kernels one
  // after the other.
  const bool early = kLaunching == Launching::early && gpu.sm90_or_later;
  const LaunchOn on{stream, early, early && kernel_counts != nullptr && p.num_experts > kFlushClustersAboveExperts,
                    gpu};
  if (kernel_counts != nullptr && kLaunching == Launching::early) {
    launch_kernel(zero_counts, KernelShape{1, kThreads}, stream, on.early, kernel_counts, p.num_experts);
  } else if (out.counts != nullptr && !count_small) {
    check(cudaMemsetAsync(out.counts, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t), stream));
  }

  // 16-byte vectors when every row starts 16-byte aligned; otherwise one element per load.
  constexpr int kVector = 16 / sizeof(T);
  const bool vector = p.num_experts % kVector == 0 && reinterpret_cast<std::uintptr_t>(logits) % 16 == 0;
  if (p.scoring == Scoring::deepseek_v3) {
    const DeepSeekArgs a{bias,          out.weights, out.ids,   kernel_counts, p.num_tokens,
                         p.num_experts, p.k,         p.n_group, p.topk_group,  p.routed_scaling_factor};
    vector ? dispatch_deepseek<T, kVector>(logits, a, on) : dispatch_deepseek<T, 1>(logits, a, on);
  } else {
    const SoftmaxArgs a{out.weights,
                        out.ids,
                        kernel_counts,
                        p.num_tokens,
                        p.num_experts,
                        p.k,
                        p.scoring == Scoring::softmax_then_topk && !p.renormalize};
    const auto run = [&](auto kernel_constant) {
      constexpr SoftmaxKernel kRun = decltype(kernel_constant)::value;
      vector ? dispatch_softmax<T, kVector, kRun>(logits, a, on) : dispatch_softmax<T, 1, kRun>(logits, a, on);
    };
    if constexpr (kKernel == SoftmaxKernel::after) {
      // Versions 5 and 6 count rows in 32 bits; beyond 2^30 logits (4 Mi tokens at E = 256) Version 4 runs.
      if (gating_rows_fit_int32(p)) {
        run(std::integral_constant<SoftmaxKernel, SoftmaxKernel::version6>{});
      } else {
        run(std::integral_constant<SoftmaxKernel, SoftmaxKernel::version4>{});
      }
    } else {
      run(std::integral_constant<SoftmaxKernel, kKernel>{});
    }
  }
  check_launch();
  if (count_small) {
    const auto small_ids = static_cast<const std::int32_t*>(out.ids);
    if (gpu.sm90_or_later) {  // clusters too
      launch_kernel(count_experts_cluster, KernelShape{kCountClusterBlocks, kCountThreads, 0, kCountClusterBlocks},
                    stream, on.early, small_ids, static_cast<int>(count), p.num_experts, out.counts);
    } else {
      launch_kernel(count_experts_one_block, KernelShape{1, kCountThreads}, stream, false, small_ids,
                    static_cast<int>(count), p.num_experts, out.counts);
    }
  } else if (out.counts != nullptr && count_mode == CountMode::separate_kernel) {
    const unsigned blocks = grid_for(count, kThreads, 8, gpu);
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

namespace tune {

void gating_after_v3(const GatingParams& params, const float* logits, const GatingOutputs& out, cudaStream_t stream) {
  gating_after_impl<float, SoftmaxKernel::version3>(params, logits, nullptr, out, stream, CountMode::fused_atomics);
}

void gating_after_prefetch_l2(const GatingParams& params, const float* logits, const GatingOutputs& out,
                              cudaStream_t stream) {
  gating_after_impl<float, SoftmaxKernel::version4_prefetch>(params, logits, nullptr, out, stream,
                                                             CountMode::fused_atomics);
}

void gating_after_v4(const GatingParams& params, const float* logits, const GatingOutputs& out, cudaStream_t stream) {
  gating_after_impl<float, SoftmaxKernel::version4>(params, logits, nullptr, out, stream, CountMode::fused_atomics);
}

// A tuning kernel of Version 5 or 6: their rule (at most 2^30 logits) after the common checks.
template <SoftmaxKernel kKernel, Launching kLaunching = Launching::early>
void gating_after_version5_tuning(const GatingParams& params, const float* logits, const GatingOutputs& out,
                                  cudaStream_t stream) {
  validate_gating(params, logits, nullptr, out);
  if (!gating_rows_fit_int32(params)) {
    throw InvalidArgument("params.num_tokens * params.num_experts (" + std::to_string(params.num_tokens) + " * " +
                          std::to_string(params.num_experts) + ") must be at most 2^30 for Versions 5 and 6");
  }
  gating_after_impl<float, kKernel, kLaunching>(params, logits, nullptr, out, stream, CountMode::fused_atomics);
}

void gating_after_v5_shuffle_max(const GatingParams& params, const float* logits, const GatingOutputs& out,
                                 cudaStream_t stream) {
  gating_after_version5_tuning<SoftmaxKernel::version5_shuffle_max>(params, logits, out, stream);
}

void gating_after_v5_ordinary(const GatingParams& params, const float* logits, const GatingOutputs& out,
                              cudaStream_t stream) {
  gating_after_version5_tuning<SoftmaxKernel::version5, Launching::ordinary>(params, logits, out, stream);
}

void gating_after_v5(const GatingParams& params, const float* logits, const GatingOutputs& out, cudaStream_t stream) {
  gating_after_version5_tuning<SoftmaxKernel::version5>(params, logits, out, stream);
}

}  // namespace tune

}  // namespace kc::ch04
