// EXERCISE: the fused gating kernel with its key lines removed. Fill in each TODO; the chapter's
// tests (ctest --preset exercises -L ch04) say when it is right. Hints are in README.md, Exercises.
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
// Selection. A value becomes an unsigned key with the order we want (gating_device.cuh: larger
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

// Version 3 of the softmax kernel: selection on full 32-bit keys, two redux.sync a round (a max
// over keys, then a min over the ids holding it). No longer the chapter's `after`: it is kept so
// that the benchmark's tuning cases (KC_TUNE=1, ch04/tune_fused_v3/...) can measure it against
// Version 4 below in the same run. Version 4 also falls back to its selection (select_top_k) for
// the rare rows where packed keys cannot decide.
template <typename T, int L, int N, int V>
__global__ void __launch_bounds__(kThreads) fused_softmax_topk_v3(const T* __restrict__ logits, SoftmaxArgs a) {
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
  // TODO(3): the packed key: `ordered` offset by 2^31 (bit 31 flipped), with 2^b - 1 - id in its
  // low b bits. The three parts of the id (value_part, lane_part) share no bits, so all of it is
  // one xor expression. Hint: kIdMask ^ value_part ^ lane_part is 2^b - 1 - id.
  (void)lane_part;
  (void)value_part;
  return ordered;
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

// The segment's largest packed key, known to all its lanes.
template <int L>
__device__ __forceinline__ unsigned segment_max(unsigned key) {
  if constexpr (L == 32) {
    // TODO(1): the warp's largest packed key with one __reduce_max_sync. Hint: one instruction; the
    // id inside the key makes it the tie rule too.
    return key;
  } else {
#pragma unroll
    for (int offset = L / 2; offset > 0; offset /= 2) {
      const unsigned other = __shfl_xor_sync(kFullMask, key, offset);  // the lane `offset` away
      // TODO(2): keep the larger of `key` and `other`.
      (void)other;
    }
    return key;
  }
}

// The k rounds on packed keys, plus one to learn the (k+1)-th. Each lane keeps its best two
// untaken keys (c1, c2); c1 == c2 marks "no second known". Round r's winner goes to segment lane
// r % L, slot r / L. Returns true when two consecutive winners share a prefix (see above).
template <int L, int N, int kIdBits, int kSlots>
__device__ __forceinline__ bool select_top_k_packed(const unsigned (&packed)[N], int seg_lane, int k,
                                                    unsigned (&slot)[kSlots]) {
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
    asm volatile("" : "+r"(r));
    best = segment_max<L>(c1);
    // L = 32 checks once after the rounds (below): 3 instructions a round saved.
    if constexpr (L < 32) shared_prefix = shared_prefix || (best ^ previous) <= kIdMask;
    if (r == k) break;  // round k only finds the (k+1)-th
    previous = best;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (r == s * L + seg_lane) slot[s] = best;
    }
    const bool won = c1 == best;
    const bool dry = won && c1 == c2;  // won, and no second candidate known
    c1 = won ? c2 : c1;                // after a win c1 == c2: "no second" until a rescan
    if (__any_sync(kFullMask, dry)) {
      // The lane's best two below the last winner: the winners so far are exactly the keys >= best.
      unsigned below[N];
#pragma unroll
      for (int j = 0; j < N; ++j) below[j] = packed[j] < best ? packed[j] : kTakenKey;
      top2_packed<0, N>(below, c1, c2);
    }
  }
  if constexpr (L == 32) {
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

template <typename T, int L, int N, int V>
__global__ void __launch_bounds__(kThreads)
    fused_softmax_topk(const T* __restrict__ logits, SoftmaxArgs a, GridStride stride) {
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
  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  // The lane's last vector is its highest expert: past E means the lane holds padding.
  const bool lane_has_padding = expert_of<L, V>(N - V, seg_lane) >= a.num_experts;

  // Carried from row to row and advanced by the constant stride: no row * E or row * k products in
  // the loop. lane_logits points at the lane's first expert of the row (its vector c is c * L * V
  // further on).
  const std::int64_t first = warp * kRowsPerWarp + lane / L;  // the lane's first row
  const T* lane_logits = logits + first * a.num_experts + lane_first;
  std::int64_t out = first * a.k + seg_lane;  // the lane's first output element of the row

  float x[N] = {};  // the row this iteration works on, loaded one iteration ahead (software pipeline)
  load_row_if<T, L, N, V>(lane_logits, first < a.num_tokens, a.num_experts, seg_lane, x);
  // The loop bound is the same for the whole warp, so every lane reaches every shuffle.
  for (std::int64_t first_row = warp * kRowsPerWarp; first_row < a.num_tokens; first_row += stride.rows) {
    // The warp is converged here (the bound is warp-uniform); saying so lets ptxas drop its
    // "is the warp diverged?" check (BRA.DIV, two instructions) before every redux.sync and vote.
    __syncwarp();
    const std::int64_t row = first_row + lane / L;
    const bool active = row < a.num_tokens;  // false only in a partial last warp at L < 32
    unsigned packed[N];
    bool odd = lane_has_padding;
#pragma unroll
    for (int j = 0; j < N; j += 2) {
      packed[j] = packed_key<L, V, kIdBits>(x[j], j, seg_lane);
      packed[j + 1] = packed_key<L, V, kIdBits>(x[j + 1], j + 1, seg_lane);
      odd = odd || !(x[j] == x[j] && x[j + 1] == x[j + 1]);  // one unordered compare for the pair
    }
    if (__any_sync(kFullMask, odd)) fix_packed_keys<L, N, V, kIdBits>(x, a.num_experts, seg_lane, packed);
    load_row_if<T, L, N, V>(lane_logits + stride.logits, row + stride.rows < a.num_tokens, a.num_experts, seg_lane, x);

    unsigned slot[kSlots] = {};  // lanes past k keep 0 and store nothing
    const bool shared_prefix = select_top_k_packed<L, N, kIdBits>(packed, seg_lane, a.k, slot);
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
      // TODO(4): renormalised softmax and topk_then_softmax divide by the sum of the k chosen masses:
      // add this lane's masses into `partial` (segment_sum adds the lanes up below).
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
    out += stride.outputs;
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
template <typename T, int N, int V>
__global__ void __launch_bounds__(kThreads) fused_deepseek_v3(const T* __restrict__ logits, DeepSeekArgs a) {
  constexpr int L = 32;
  constexpr int kChunks = N / V;  // V-vectors a lane holds
  __shared__ int histogram[kMaxExperts];
  __shared__ unsigned staged[kWarpsPerBlock][kMaxExperts + kMaxExperts / 32];
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
  // Per lane and the same for every row: the bias of each held expert.
  float bias[N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int e = expert_of<L, V>(j, lane);
    bias[j] = (a.bias != nullptr && e < a.num_experts) ? a.bias[e] : 0.0f;
  }

  const std::int64_t warp = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  float x[N];  // the next row's logits, loaded one iteration ahead (see fused_softmax_topk)
  load_row<T, L, N, V>(logits + warp * a.num_experts, warp < a.num_tokens, a.num_experts, lane, x);
  for (std::int64_t row = warp; row < a.num_tokens; row += warps) {
    // The selection key sigmoid(logit) + bias; padding stays taken.
    unsigned key[N];
    to_keys<L, N, V>(
        x, true, a.num_experts, lane, [&](float v, int j) { return detail::sigmoid(v) + bias[j]; }, key);
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
      const float s = detail::sigmoid(detail::to_float(logits[row * a.num_experts + my_id]));
      my_weight = s != s ? 0.0f : s;  // a NaN score weighs 0
    }
    const float sum = segment_sum<L>(my_weight);
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

// One wave: at most as many blocks as fit on the GPU at once (a grid-stride loop does the rest).
// A grid of 8 blocks per SM for a kernel of which only 6 fit ran as 1.33 waves, its last third on a
// quarter of the machine.
unsigned grid_for(std::int64_t rows, int rows_per_block, int per_sm) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device));
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::int64_t wanted = (rows + rows_per_block - 1) / rows_per_block;
  const std::int64_t resident = static_cast<std::int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  return static_cast<unsigned>(wanted < resident ? wanted : resident);
}

// Blocks of `kernel` that fit on one SM, asked once per device and kept in the caller's `cache`
// (one per kernel instance): the launch path stays a few cheap host calls.
template <typename Kernel>
int blocks_per_sm(Kernel kernel, std::atomic<int> (&cache)[kCachedDevices]) {
  int device = 0;
  check(cudaGetDevice(&device));
  if (device < kCachedDevices && cache[device].load(std::memory_order_relaxed) > 0) {
    return cache[device].load(std::memory_order_relaxed);
  }
  int blocks = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
  if (device < kCachedDevices) cache[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

// kVersion3: the previous kernel, for the benchmark's tuning cases only.
template <typename T, int L, int N, int V, bool kVersion3>
void launch_softmax(const T* logits, const SoftmaxArgs& a, cudaStream_t stream) {
  static std::atomic<int> cache[kCachedDevices];
  constexpr int kRowsPerBlock = kWarpsPerBlock * (32 / L);
  if constexpr (kVersion3) {
    const auto kernel = fused_softmax_topk_v3<T, L, N, V>;
    kernel<<<grid_for(a.num_tokens, kRowsPerBlock, blocks_per_sm(kernel, cache)), kThreads, 0, stream>>>(logits, a);
  } else {
    const auto kernel = fused_softmax_topk<T, L, N, V>;
    const unsigned blocks = grid_for(a.num_tokens, kRowsPerBlock, blocks_per_sm(kernel, cache));
    const std::int64_t rows = static_cast<std::int64_t>(blocks) * kRowsPerBlock;
    kernel<<<blocks, kThreads, 0, stream>>>(logits, a, GridStride{rows, rows * a.num_experts, rows * a.k});
  }
}

template <typename T, int V, bool kVersion3>
void dispatch_softmax(const T* logits, const SoftmaxArgs& a, cudaStream_t stream) {
  // The smallest layout that holds E: one thread per row for E <= 8, a warp per row from 129 on.
  const int e = a.num_experts;
  if (e <= 8) {
    launch_softmax<T, 1, 8, V, kVersion3>(logits, a, stream);
  } else if (e <= 64) {
    // E <= 32 too: an L = 4 segment needs 8 output slots a lane (k <= 32), which spilled on sm_80.
    launch_softmax<T, 8, 8, V, kVersion3>(logits, a, stream);
  } else if (e <= 128) {
    launch_softmax<T, 16, 8, V, kVersion3>(logits, a, stream);
  } else if (e <= 256) {
    launch_softmax<T, 32, 8, V, kVersion3>(logits, a, stream);
  } else {
    launch_softmax<T, 32, 16, V, kVersion3>(logits, a, stream);
  }
}

template <typename T, int V>
void dispatch_deepseek(const T* logits, const DeepSeekArgs& a, cudaStream_t stream) {
  static std::atomic<int> cache8[kCachedDevices], cache16[kCachedDevices];
  if (a.num_experts <= 256) {
    const auto kernel = fused_deepseek_v3<T, 8, V>;
    kernel<<<grid_for(a.num_tokens, kWarpsPerBlock, blocks_per_sm(kernel, cache8)), kThreads, 0, stream>>>(logits, a);
  } else {
    const auto kernel = fused_deepseek_v3<T, 16, V>;
    kernel<<<grid_for(a.num_tokens, kWarpsPerBlock, blocks_per_sm(kernel, cache16)), kThreads, 0, stream>>>(logits, a);
  }
}

template <typename T, bool kVersion3 = false>
void gating_after_impl(const GatingParams& p, const T* logits, const float* bias, const GatingOutputs& out,
                       cudaStream_t stream, CountMode count_mode) {
  validate_gating(p, logits, bias, out);
  if (count_mode == CountMode::automatic) count_mode = CountMode::fused_atomics;
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
  if (kVersion3 && p.scoring == Scoring::deepseek_v3) {
    throw InvalidArgument("scoring must be softmax_then_topk or topk_then_softmax for the Version 3 kernel");
  }
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
    vector ? dispatch_softmax<T, kVector, kVersion3>(logits, a, stream)
           : dispatch_softmax<T, 1, kVersion3>(logits, a, stream);
  }
  check_launch();
  if (out.counts != nullptr && count_mode == CountMode::separate_kernel) {
    const std::int64_t count = p.num_tokens * p.k;
    const unsigned blocks = grid_for(count, kThreads, 8);
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

namespace {

// The tuning entry points take softmax scorings only (moe_gating.hpp): refused before anything is
// launched, as the solution does.
void refuse_deepseek(const GatingParams& params) {
  if (params.scoring == Scoring::deepseek_v3) {
    throw InvalidArgument("scoring must be softmax_then_topk or topk_then_softmax for a tuning kernel");
  }
}

// The solution's tuning rows measure its other kernels (the L2 prefetch, Versions 4, 5 and 6 and
// their variants); here each runs the kernel you write, so its test checks your kernel once more.
void run_exercise_kernel(const GatingParams& params, const float* logits, const GatingOutputs& out,
                         cudaStream_t stream) {
  validate_gating(params, logits, nullptr, out);
  refuse_deepseek(params);
  gating_after_impl<float>(params, logits, nullptr, out, stream, CountMode::fused_atomics);
}

}  // namespace

void gating_after_v3(const GatingParams& params, const float* logits, const GatingOutputs& out, cudaStream_t stream) {
  validate_gating(params, logits, nullptr, out);
  refuse_deepseek(params);
  gating_after_impl<float, true>(params, logits, nullptr, out, stream, CountMode::fused_atomics);
}

void gating_after_prefetch_l2(const GatingParams& params, const float* logits, const GatingOutputs& out,
                              cudaStream_t stream) {
  run_exercise_kernel(params, logits, out, stream);
}

void gating_after_v4(const GatingParams& params, const float* logits, const GatingOutputs& out, cudaStream_t stream) {
  run_exercise_kernel(params, logits, out, stream);
}

void gating_after_v5_shuffle_max(const GatingParams& params, const float* logits, const GatingOutputs& out,
                                 cudaStream_t stream) {
  run_exercise_kernel(params, logits, out, stream);
}

void gating_after_v5_ordinary(const GatingParams& params, const float* logits, const GatingOutputs& out,
                              cudaStream_t stream) {
  run_exercise_kernel(params, logits, out, stream);
}

void gating_after_v5(const GatingParams& params, const float* logits, const GatingOutputs& out, cudaStream_t stream) {
  run_exercise_kernel(params, logits, out, stream);
}

}  // namespace tune

}  // namespace kc::ch04
