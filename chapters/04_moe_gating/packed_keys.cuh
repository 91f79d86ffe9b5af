/// @file packed_keys.cuh
/// @brief Packed keys: the expert id inside the selection key, so one unsigned max a round finds
/// the winner, tie rule included. Used by every fused softmax kernel (steps 1 to 3). Internal to
/// the chapter.
#pragma once

#include "fused_common.cuh"

namespace kc::ch04::fused {

// Packed keys
//
// Selection on full keys, with a separate id, costs ~473 SASS instructions a row at E = 256, k = 8:
// a round was two dependent redux.sync plus the bookkeeping of a separate id next to every key.
// Step 1 puts the id inside the key. A packed key is one unsigned number,
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
// once more to find the (k+1)-th, and such a row is redone exactly with the full keys (the full-key kernel's
// select_top_k). For random fp32 rows that is about one row in a hundred; tie-heavy rows always
// take it, and stay exact. bf16 logits have 16 zero low bits: their prefix is the whole key, so
// they never need it. The weights are computed from the winners' logits reloaded by id (a cache
// hit: the row was just read), never from the shortened keys.

/// Bits of a packed key that hold the id, b = log2(L * N): the segment holds L * N experts (a power of two).
template <int L, int N>
__host__ __device__ constexpr int id_bits() {
  int b = 0;
  while ((1 << b) < L * N) ++b;
  return b;
}

/// The packed key of value j of segment lane seg_lane (its expert is expert_of<L, V>(j, seg_lane)).
/// Four instructions: a shift, a LOP3, two adds. Taking the two's complement of the sign-magnitude
/// float (xor with the sign mask, subtract it) sends -0 and +0 to the same number, without the
/// x + 0.0f of order_bits. NaN and padding are fixed afterwards by fix_packed_keys (rare).
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

/// The slow path of the keys, for a warp where some lane holds a NaN or padding: a NaN gets the
/// prefix of kNanKey (below -Inf, all NaNs equal, so the id decides), padding gets 0, which loses
/// to every expert. The id bits of a NaN's key are already right. Padding is whole vectors
/// (E % V == 0), so it is tested once a vector.
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

/// The packed keys of a lane's values (steps 2 and 3), and whether they may hold a NaN: a sum of
/// the values (N - 1 adds on the FMA pipe, in two chains, then one compare) is NaN iff some value is
/// NaN, or +Inf and -Inf (or overflows of both signs) meet, which only costs the slow path
/// (fix_packed_keys).
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

/// The largest two of u[kFirst, kFirst + kCount): pairs, then merges of sorted pairs, all unsigned
/// max/min (one instruction each): the ids ride inside the keys. 20 instructions for 8 keys.
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

/// The segment's largest packed key, known to all its lanes.
template <int L>
__device__ __forceinline__ unsigned segment_max(unsigned key) {
  if constexpr (L == 32) {
    return __reduce_max_sync(kFullMask, key);
  } else {
#pragma unroll
    for (int offset = L / 2; offset > 0; offset /= 2) key = max(key, __shfl_xor_sync(kFullMask, key, offset));
    return key;
  }
}

/// After a round whose winning key is `best`: the lane that held it moves its second candidate up,
/// and if a lane won with no second known (c1 == c2), the warp rescans for each lane's best two
/// below `best` (the winners so far are exactly the keys >= best). Every packed-key kernel calls it.
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

/// The k rounds on packed keys, plus one to learn the (k+1)-th. Each lane keeps its best two
/// untaken keys (c1, c2); c1 == c2 marks "no second known". Round r's winner goes to segment lane
/// r % L, slot r / L. Returns true when two consecutive winners share a prefix (see above).
/// kWinnersInShared (L = 32 only; step 2): every round
/// stores its winner to shared memory (one store, on the memory pipe) instead of each lane testing
/// "is this my slot?" (a compare and a select on the ALU pipe, which bounds the kernel); after the
/// rounds each lane reads its slot and the next one. Each lane stores into its own column
/// (`column[r * 32]`, round r; the warp's 32 columns side by side, so a round's 32 stores hit 32
/// banks) and reads back only its own stores: no lane reads what another wrote, so there is nothing
/// to order and no barrier. A single row that every lane stores (the same value) and reads needs
/// one: a __syncwarp (it costs the gain) or relaxed atomics (compute-sanitizer reports them).
template <int L, int N, int kIdBits, int kSlots, bool kWinnersInShared = false>
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
    best = segment_max<L>(c1);
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

}  // namespace kc::ch04::fused
