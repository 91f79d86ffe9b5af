// Step 2, coalesced: the same kernel with the roles of threadIdx.x and threadIdx.y swapped.
//
// What changed: threadIdx.x now picks the column j, so the 32 threads of a warp hold one row i and
// 32 consecutive columns. At every p the warp reads B[p][j .. j + 31], 128 consecutive bytes (one
// fully used line: coalesced), and A[i][p], one address for the whole warp (a broadcast). The
// store of C is one 128-byte line too. Same arithmetic, same bytes requested, but 5 sectors per
// warp and step of p instead of 33.
//
// Arithmetic intensity is unchanged on paper, 4 bytes per FLOP requested. What improved is how
// those bytes are fetched: each warp-wide load is one or four sectors instead of 32, and the 8
// warps of a block read the same 32 columns of B, which the L1 serves after the first. The next
// limit is the load instructions themselves: two loads for every multiply-add. Step 3 reuses
// each loaded element many times from shared memory.
#include "kc/check.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02::detail {

namespace {
constexpr int kTileN = 32;  // threadIdx.x: 32 columns of C per block, one warp per row
constexpr int kTileM = 8;   // threadIdx.y: 8 rows, so 256 threads per block
constexpr int kThreads = kTileM * kTileN;

__global__ void __launch_bounds__(kThreads)
    sgemm_coalesced(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k) {
  const TileOrigin tile = tile_origin(n, kTileM, kTileN);
  const std::int64_t row = tile.row + threadIdx.y;
  const std::int64_t col = tile.col + threadIdx.x;
  if (row >= m || col >= n) return;

  const float* a_row = a + row * k;
  float sum = 0.0f;
  for (std::int64_t p = 0; p < k; ++p) sum += a_row[p] * b[p * n + col];
  c[row * n + col] = sum;
}
}  // namespace

void sgemm_step2_coalesced(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream) {
  const unsigned blocks = tile_grid(shape, kTileM, kTileN);
  sgemm_coalesced<<<blocks, dim3(kTileN, kTileM), 0, stream>>>(a, b, c, shape.m, shape.n, shape.k);
  check_launch();
}

}  // namespace kc::ch02::detail
