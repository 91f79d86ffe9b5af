/// @file step2_lean_rounds.cu
/// @brief Step 2: the lean rounds. Step 1's kernel is bound by the instructions it issues, not by
/// bytes, so this one issues fewer a row: at L = 32 each round stores its winner to the lane's own
/// column of shared memory (one store, on the memory pipe) instead of every lane testing "is this my
/// slot?" (a compare and a select on the ALU pipe); the NaN test of the keys is one sum of the
/// values on the FMA pipe; rows and outputs are counted in 32 bits (T · E <= 2^30).
#include <cstddef>
#include <cstdint>

#include "fused_launch.cuh"
#include "packed_keys.cuh"

namespace kc::ch04::fused {

namespace {

// Bytes of the winners table for top-k: each warp of a block keeps k + 1 rows of 32 words (one
// column a lane) in the dynamic shared memory; 33.8 KB at k = 32, 9.2 KB at k = 8.
constexpr std::size_t winners_table_bytes(int k) {
  return static_cast<std::size_t>(kWarpsPerBlock) * static_cast<std::size_t>(k + 1) * 32 * sizeof(unsigned);
}

// The step-2 kernel: step 1's row loop with the winners in shared memory (L = 32), the NaN test by
// a sum and 32-bit row counters.
template <typename T, int L, int N, int V>
__global__ void __launch_bounds__(kThreads)
    fused_softmax_topk_lean(const T* __restrict__ logits, SoftmaxArgs a, GridStride stride) {
  start_as_dependent();
  constexpr bool kWinnersInShared = L == 32;
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
  // Rows and output elements are counted in 32 bits (launched only when T · E <= 2^30, so T · k and
  // a row plus one grid's stride stay far below 2^31), which halves the row bookkeeping.
  using Index = int;
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

  // The winners: the warp's k + 1 rows of 32 words in the dynamic shared memory, this lane's
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
    const bool may_hold_nan = packed_keys_nan_tested<L, N, V, kIdBits>(x, seg_lane, packed);
    odd = odd || may_hold_nan;
    if (__any_sync(kFullMask, odd)) fix_packed_keys<L, N, V, kIdBits>(x, a.num_experts, seg_lane, packed);
    load_row_if<T, L, N, V>(lane_logits + stride.logits, row + stride_rows < tokens, a.num_experts, seg_lane, x);

    unsigned slot[kSlots] = {};  // lanes past k keep 0 and store nothing
    bool shared_prefix = false;
    if constexpr (kWinnersInShared) {
      shared_prefix = select_top_k_packed<L, N, kIdBits, kSlots, true>(packed, seg_lane, a.k, slot, column);
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

template <typename T, int L, int N, int V>
void launch(const T* logits, const SoftmaxArgs& a, const LaunchOn& on) {
  static OccupancyCache occupancy;
  constexpr int kRowsPerBlock = kWarpsPerBlock * (32 / L);
  const auto kernel = fused_softmax_topk_lean<T, L, N, V>;
  // At L = 32 the kernel keeps k + 1 winners a lane in shared memory. The grid is sized for k = 32,
  // the most any launch needs, so the occupancy asked once per device holds for every k.
  constexpr bool kWinnersInShared = L == 32;
  const std::size_t winners_bytes = kWinnersInShared ? winners_table_bytes(a.k) : 0;
  const KernelShape shape = gating_grid(kernel, a.num_tokens, kRowsPerBlock, winners_bytes,
                                        kWinnersInShared ? winners_table_bytes(32) : 0, on, occupancy);
  const std::int64_t rows = static_cast<std::int64_t>(shape.blocks) * kRowsPerBlock;
  launch_gating_kernel(kernel, shape, on, logits, a, GridStride{rows, rows * a.num_experts, rows * a.k});
}

}  // namespace

template <typename T, int V>
void launch_lean_rounds(const T* logits, const SoftmaxArgs& a, const LaunchOn& on) {
  // The smallest layout that holds E: one thread per row for E <= 8, a warp per row from 129 on.
  const int e = a.num_experts;
  if (e <= 8) {
    launch<T, 1, 8, V>(logits, a, on);
  } else if (e <= 64) {
    // E <= 32 too: an L = 4 segment needs 8 output slots a lane (k <= 32), which spilled on sm_80.
    launch<T, 8, 8, V>(logits, a, on);
  } else if (e <= 128) {
    launch<T, 16, 8, V>(logits, a, on);
  } else if (e <= 256) {
    launch<T, 32, 8, V>(logits, a, on);
  } else {
    launch<T, 32, 16, V>(logits, a, on);
  }
}

template void launch_lean_rounds<float, 4>(const float*, const SoftmaxArgs&, const LaunchOn&);
template void launch_lean_rounds<float, 1>(const float*, const SoftmaxArgs&, const LaunchOn&);
template void launch_lean_rounds<__nv_bfloat16, 8>(const __nv_bfloat16*, const SoftmaxArgs&, const LaunchOn&);
template void launch_lean_rounds<__nv_bfloat16, 1>(const __nv_bfloat16*, const SoftmaxArgs&, const LaunchOn&);

}  // namespace kc::ch04::fused
