/// @file step3_batched_epilogue.cu
/// @brief Step 3, the chapter's `after` for the common routing (fp32, 129 to 256 experts, k = 8,
/// renormalised weights): the epilogue of four rows at once. Step 2 finishes each row with k = 8 of
/// the warp's 32 lanes busy: read the winners back, reload their logits, exp, a 32-lane sum, the
/// reciprocal, the stores, the histogram (about 67 of a row's 242 SASS instructions on sm_90). This
/// kernel selects kBatchRows = 32 / k rows first, each leaving its k + 1 winners in its own rows of
/// the winners table, and then finishes them together: lane k * b + r takes row b's winner r, so one
/// epilogue pass serves four rows, and its sum is an 8-lane butterfly.
///
/// With k a compile-time constant the rounds are unrolled too: a rolled round was 12 SASS
/// instructions, 4 of them for the loop; unrolled, each round's store has a constant offset.
///
/// A warp batches only rows it owns: rows first_row, first_row + stride, ... (the grid stride). So
/// batches exist only when the launch gives a warp more than one row, i.e. more rows than one wave
/// holds; below that gating_after() runs step 2, where a batch would be one row plus the
/// bookkeeping.
#include <atomic>
#include <cstdint>

#include "fused_launch.cuh"
#include "packed_keys.cuh"

namespace kc::ch04::fused {

namespace {

constexpr int kFixedK = 8;
constexpr int kBatchRows = 32 / kFixedK;

// The k rounds on packed keys plus round k (the (k+1)-th, for the prefix check), unrolled. Round r
// stores its winner to row r of the lane's column (`column[r * 32]`: a constant offset); every lane
// stores the same value to its own column, so a later read of the lane's own column needs no
// barrier (as step 2).
template <int N, int kK>
__device__ __forceinline__ void select_top_k_packed_unrolled(const unsigned (&packed)[N], unsigned* column) {
  // exercise 1: Run the k rounds plus one more (the (k+1)-th winner, for the prefix check). Each lane
  // exercise 1: starts from its best two packed keys (top2_packed); a round's winner is the warp's
  // exercise 1: largest c1 (one __reduce_max_sync), stored to row r of the lane's column
  // exercise 1: (column[r * 32]); then advance_after_round moves the winning lane's c2 up.
  // stub: (void)packed;
  // stub: (void)column;
  unsigned c1, c2;
  top2_packed<0, N>(packed, c1, c2);
#pragma unroll
  for (int r = 0; r <= kK; ++r) {
    const unsigned best = __reduce_max_sync(kFullMask, c1);
    column[r * 32] = best;
    if (r == kK) break;
    advance_after_round(packed, best, c1, c2);
  }
  // end exercise 1
}

// The epilogue of a batch (one call for up to kBatchRows rows): lane k * b + r finishes
// winner r of batch row b, reading rows r and r + 1 of that row's part of its own column
// (`my_winners`). `first_row` is the batch's first row; its rows are
// `stride_rows` apart. Rows whose consecutive winners share a prefix are redone exactly, by the
// whole warp (step 2's fallback), one row at a time; lane k * b + r takes winner r from lane r.
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
  // exercise 2: Read this lane's winner (my_winners[0]) and the next one (my_winners[32]). The id is
  // exercise 2: in the low bits of the packed key, stored as 2^b - 1 - id (kIdMask is 2^b - 1); the
  // exercise 2: row needs the exact redo when the two keys agree above those bits.
  // stub: (void)my_winners;
  // stub: (void)kIdMask;
  if (active) {
    const unsigned mine = my_winners[0];
    const unsigned next = my_winners[32];  // the (k+1)-th for r = k - 1
    id = static_cast<int>(~mine & kIdMask);
    shared_prefix = (mine ^ next) <= kIdMask;
  }
  // end exercise 2
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
  // exercise 3: The softmax of the row's k winners: the row's largest logit is winner 0's (the lane
  // exercise 3: `rank` places to the left); each lane's mass is softmax_mass_fast(value, row_max,
  // exercise 3: row_max > -Inf); the row's k lanes sum their masses with a kK-lane xor butterfly; the
  // exercise 3: reciprocal of max(sum, 1) makes a row with no finite logit weigh 0.
  // stub: const float mass = value;
  // stub: const float reciprocal = 1.0f;
  const float row_max = __shfl_sync(kFullMask, value, lane - rank);  // winner 0: the row's largest
  const float mass = softmax_mass_fast(value, row_max, row_max > -__int_as_float(0x7f800000));
  float total = mass;
#pragma unroll
  for (int offset = kK / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(kFullMask, total, offset);
  const float reciprocal = rcp_ftz(fmaxf(total, 1.0f));  // as step 2: 0 or at least 1
  // end exercise 3
  // exercise 4: Store this lane's weight and id at output element my_row * k + rank (active lanes
  // exercise 4: only), and count the id in the block's shared histogram.
  // stub: (void)mass;
  // stub: (void)reciprocal;
  // stub: (void)histogram;
  // stub: (void)my_row;
  if (active) {
    const int out = my_row * kK + rank;
    a.weights[out] = mass * reciprocal;
    a.ids[out] = id;
    atomicAdd(histogram + id, 1);  // flushed only when counts are wanted
  }
  // end exercise 4
}

// Step 3's kernel: a warp a row (L = 32), k = kK, the renormalised (or top-k-then-softmax) weights, rows
// and outputs counted in 32 bits (gating_rows_fit_int32()). The second number of __launch_bounds__
// keeps 5 blocks an SM (48 registers): without it ptxas took 52 registers on sm_90, 4 blocks.
// Asking L2 for the row after next made it 5 % slower
//: it does not wait on DRAM latency.
// The row loop has step 2's shape, one row an iteration (with the batch's rows as an inner loop,
// ptxas could no longer tell that the warp is converged and put a BRA.DIV before every round's
// redux.sync); every kBatchRows rows, and after the warp's last row, finish_batch runs.
// Measured and not kept: the NaN test after the tournament (7
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
  float x[N] = {};  // the row being selected, loaded one row ahead (step 2's software pipeline)
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

}  // namespace

bool launch_batched_epilogue(const float* logits, const SoftmaxArgs& a, const LaunchOn& on) {
  constexpr int kRowsPerBlock = kWarpsPerBlock;  // a warp a row
  if (a.num_experts <= 128 || a.num_experts > 256 || a.k != kFixedK || a.full_softmax) return false;
  static std::atomic<int> batched_blocks_per_sm[kCachedDevices];
  const auto kernel = fused_softmax_topk_batched<float, 8, 4, kFixedK>;
  const unsigned blocks =
      grid_for(a.num_tokens, kRowsPerBlock, blocks_per_sm(kernel, batched_blocks_per_sm, on.gpu), on.gpu);
  const std::int64_t rows = static_cast<std::int64_t>(blocks) * kRowsPerBlock;
  if (rows >= a.num_tokens) return false;  // one row a warp: step 2 runs it
  // Never in clusters: each block flushes its own counts (a wave of whole clusters that sum theirs
  // first measured 7 % slower here).
  launch_gating_kernel(kernel, KernelShape{blocks, kThreads}, on, logits, a,
                       GridStride{rows, rows * a.num_experts, rows * a.k});
  return true;
}

}  // namespace kc::ch04::fused
