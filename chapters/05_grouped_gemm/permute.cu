// The permutation: Chapter 4's routing (expert ids [T, k]) → the grouped GEMM's layout (each
// expert's rows contiguous), and back.
//
// A counting sort of the T·k (token, slot) pairs by expert, stable in pair order, so that every run
// gives the same rows (atomics decide counts, never an order):
//
//   1. chunk_count_kernel: warp c counts the experts of pairs [256c, 256c + 256) in its own
//      shared-memory histogram and writes it as row c of chunk_counts [chunks, E].
//   2. offsets_kernel (one block, a thread per expert): walks its expert's column of chunk_counts,
//      replacing each count by the pairs of that expert in earlier chunks (an exclusive scan down
//      the column); the column's total is counts[e]; a block-wide scan over experts gives offsets;
//      adding offsets[e] to the column makes chunk_counts[c][e] the first row chunk c's pairs of
//      expert e go to.
//   3. scatter_kernel: warp c walks its 256 pairs again, 32 at a time, in order. __match_any_sync
//      finds the lanes holding the same expert; a lane's rank among them (lanes below it) plus the
//      chunk's running row for that expert is its row. The lowest lane of each group advances the
//      running row. Then the warp copies the 32 token rows X[t] → A[row], 16 bytes per lane.
//
//     ids (T = 3, k = 2):  t0: 2 0   t1: 0 2   t2: 2 1      counts = 2 1 3, offsets = 0 2 3 6
//     rows of A:           0: t0(slot 1)  1: t1(slot 0) | 2: t2(slot 1) | 3: t0  4: t1  5: t2
//
// The combine step (unpermute_combine_kernel) runs after the experts: y[t] = Σ_j weight[t, j] ·
// C[row_of_pair[t, j]], in slot order, in fp32.
#include <string>

#include "grouped_gemm.hpp"
#include "kc/check.hpp"
#include "scan.cuh"

namespace kc::ch05 {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRounds = kPairsPerChunk / 32;
static_assert(kPairsPerChunk % 32 == 0, "a chunk is whole rounds of 32 pairs");

__device__ __forceinline__ bool valid_expert(int id, int experts) { return id >= 0 && id < experts; }

// 1. One warp per chunk: count its pairs per expert.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    chunk_count_kernel(const std::int32_t* __restrict__ ids, int pairs, int experts, int chunks,
                       std::int32_t* __restrict__ chunk_counts) {
  extern __shared__ int hist_all[];  // [kWarpsPerBlock][E]
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int chunk = static_cast<int>(blockIdx.x) * kWarpsPerBlock + warp;
  if (chunk >= chunks) return;  // the whole warp leaves together
  int* hist = hist_all + warp * experts;
  for (int e = lane; e < experts; e += 32) hist[e] = 0;
  __syncwarp();
  for (int r = 0; r < kRounds; ++r) {
    const int p = chunk * kPairsPerChunk + r * 32 + lane;
    const int id = p < pairs ? ids[p] : -1;
    if (valid_expert(id, experts)) atomicAdd(&hist[id], 1);
  }
  __syncwarp();
  std::int32_t* row = chunk_counts + static_cast<std::int64_t>(chunk) * experts;
  for (int e = lane; e < experts; e += 32) row[e] = hist[e];
}

// 2. One block, a thread per expert: column scans, counts, offsets, and each chunk's first rows.
__global__ void __launch_bounds__(detail::kScanThreads)
    offsets_kernel(std::int32_t* __restrict__ chunk_counts, int experts, int chunks, std::int32_t* __restrict__ counts,
                   std::int32_t* __restrict__ offsets) {
  const int e = static_cast<int>(threadIdx.x);
  int total = 0;
  if (e < experts) {
    for (int c = 0; c < chunks; ++c) {
      std::int32_t& cell = chunk_counts[static_cast<std::int64_t>(c) * experts + e];
      const int here = cell;
      cell = total;  // pairs of expert e in chunks before c
      total += here;
    }
    counts[e] = total;
  }
  const int inclusive = detail::block_inclusive_scan(total);
  if (e < experts) {
    const int first_row = inclusive - total;
    offsets[e] = first_row;
    if (e == experts - 1) offsets[experts] = inclusive;
    for (int c = 0; c < chunks; ++c) chunk_counts[static_cast<std::int64_t>(c) * experts + e] += first_row;
  }
}

// 3. One warp per chunk: each pair's row, the two index maps, and the row copies.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    scatter_kernel(const std::int32_t* __restrict__ ids, const std::int32_t* __restrict__ chunk_rows,
                   const uint4* __restrict__ x, int pairs, int k, int experts, int chunks, int row_vectors,
                   std::int32_t* __restrict__ row_of_pair, std::int32_t* __restrict__ token_of_row,
                   uint4* __restrict__ a) {
  extern __shared__ int next_all[];  // [kWarpsPerBlock][E]: the next row of each expert for this chunk
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int chunk = static_cast<int>(blockIdx.x) * kWarpsPerBlock + warp;
  if (chunk >= chunks) return;
  int* next = next_all + warp * experts;
  const std::int32_t* first = chunk_rows + static_cast<std::int64_t>(chunk) * experts;
  for (int e = lane; e < experts; e += 32) next[e] = first[e];
  __syncwarp();
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int r = 0; r < kRounds; ++r) {
    const int p = chunk * kPairsPerChunk + r * 32 + lane;
    const int id = p < pairs ? ids[p] : -1;
    const bool valid = valid_expert(id, experts);
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, valid ? id : -1);
    int row = -1;
    if (valid) row = next[id] + __popc(peers & lanes_below);
    __syncwarp();  // every lane has read next[] before the leaders advance it
    if (valid && (peers & lanes_below) == 0) next[id] += __popc(peers);
    __syncwarp();
    const int token = p / k;
    if (p < pairs) row_of_pair[p] = row;
    if (valid) token_of_row[row] = token;
    // Copy the round's token rows, one row at a time by the whole warp (coalesced 16-byte vectors).
    // Without a (a kernel that gathers through token_of_row), the index maps are all.
    for (int j = 0; a != nullptr && j < 32; ++j) {
      const int dst = __shfl_sync(0xFFFFFFFFu, row, j);
      const int src = __shfl_sync(0xFFFFFFFFu, token, j);
      if (dst < 0) continue;  // uniform across the warp
      const uint4* from = x + static_cast<std::int64_t>(src) * row_vectors;
      uint4* to = a + static_cast<std::int64_t>(dst) * row_vectors;
#pragma unroll 4
      for (int v = lane; v < row_vectors; v += 32) to[v] = from[v];
    }
  }
}

// The combine: y[t, col] = Σ_j weights[t, j] · C[row_of_pair[t, j], col], a block per token.
__global__ void __launch_bounds__(256)
    unpermute_combine_kernel(const __nv_bfloat16* __restrict__ c, const float* __restrict__ weights,
                             const std::int32_t* __restrict__ row_of_pair, int k, int n,
                             __nv_bfloat16* __restrict__ y) {
  const std::int64_t t = blockIdx.x;
  for (int col = static_cast<int>(threadIdx.x); col < n; col += static_cast<int>(blockDim.x)) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int row = row_of_pair[t * k + j];
      if (row >= 0) sum += weights[t * k + j] * __bfloat162float(c[static_cast<std::int64_t>(row) * n + col]);
    }
    y[t * n + col] = __float2bfloat16_rn(sum);
  }
}

}  // namespace

void permute_tokens(const PermuteShape& shape, const std::int32_t* ids, const __nv_bfloat16* x,
                    const PermuteOutputs& out, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  validate_permute(shape, ids, x, out);
  const std::size_t needed = permute_workspace_bytes(shape);
  if (workspace == nullptr) throw InvalidArgument("workspace must not be null");
  if (reinterpret_cast<std::uintptr_t>(workspace) % 4 != 0) throw InvalidArgument("workspace must be 4-byte aligned");
  if (workspace_bytes < needed) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) +
                          ") must be >= " + std::to_string(needed) + " (permute_workspace_bytes)");
  }
  const auto pairs = static_cast<int>(shape.tokens * shape.k);
  const int chunks = (pairs + kPairsPerChunk - 1) / kPairsPerChunk;
  const int blocks = (chunks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const std::size_t smem = static_cast<std::size_t>(kWarpsPerBlock) * shape.experts * sizeof(int);  // <= 32 KiB
  auto* chunk_counts = static_cast<std::int32_t*>(workspace);
  if (chunks > 0) {
    chunk_count_kernel<<<blocks, kWarpsPerBlock * 32, smem, stream>>>(ids, pairs, shape.experts, chunks, chunk_counts);
    check_launch();
  }
  offsets_kernel<<<1, detail::kScanThreads, 0, stream>>>(chunk_counts, shape.experts, chunks, out.counts, out.offsets);
  check_launch();
  if (chunks > 0) {
    scatter_kernel<<<blocks, kWarpsPerBlock * 32, smem, stream>>>(
        ids, chunk_counts, reinterpret_cast<const uint4*>(x), pairs, shape.k, shape.experts, chunks,
        static_cast<int>(shape.hidden / 8), out.row_of_pair, out.token_of_row, reinterpret_cast<uint4*>(out.a));
    check_launch();
  }
}

void unpermute_combine(std::int64_t tokens, int k, std::int64_t n, const __nv_bfloat16* c, const float* weights,
                       const std::int32_t* row_of_pair, __nv_bfloat16* y, cudaStream_t stream) {
  if (tokens < 0 || tokens > 0x7FFFFFFF) {
    throw InvalidArgument("tokens (" + std::to_string(tokens) + ") must be in [0, 2^31 - 1]");
  }
  if (k < 1 || k > 32) throw InvalidArgument("k (" + std::to_string(k) + ") must be in [1, 32]");
  if (n < 1 || n > 0x7FFFFFFF) throw InvalidArgument("n (" + std::to_string(n) + ") must be in [1, 2^31 - 1]");
  if (c == nullptr) throw InvalidArgument("c must not be null");
  if (weights == nullptr) throw InvalidArgument("weights must not be null");
  if (row_of_pair == nullptr) throw InvalidArgument("row_of_pair must not be null");
  if (y == nullptr) throw InvalidArgument("y must not be null");
  if (reinterpret_cast<std::uintptr_t>(y) % 2 != 0 || reinterpret_cast<std::uintptr_t>(c) % 2 != 0) {
    throw InvalidArgument("c and y must be 2-byte aligned");
  }
  if (y == c) throw InvalidArgument("y must not be c");
  if (tokens == 0) return;
  unpermute_combine_kernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(c, weights, row_of_pair, k,
                                                                              static_cast<int>(n), y);
  check_launch();
}

}  // namespace kc::ch05
