// Step 1, naive: one thread per element of C, the way the formula reads. C[i][j] = sum over p of
// A[i][p] * B[p][j], one thread per (i, j), the row i taken from threadIdx.x.
//
// Why it is slow: the 32 threads of a warp hold 32 consecutive rows i and the same column j. At
// every p they read A[i][p] from 32 different rows, K floats apart, so one warp-wide load touches
// 32 memory sectors for 128 useful bytes (B[p][j] is the same address for the whole warp: a
// broadcast). The store of C is scattered the same way, N floats apart.
//
// Arithmetic intensity: every multiply-add (2 FLOP) loads one float of A and one of B, 8 bytes,
// and nothing is kept on chip on purpose: 4 bytes per FLOP, 0.25 FLOP per byte. The GPU needs
// hundreds of FLOP per byte of DRAM traffic to be compute-bound; only the L1 cache, which happens
// to keep recently read lines of A around, stops this from being far slower still.
// Next step: swap which of i and j follows threadIdx.x.
#include "kc/check.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02::detail {

namespace {
constexpr int kTileM = 32;  // threadIdx.x: 32 rows of C per block, one warp
constexpr int kTileN = 8;   // threadIdx.y: 8 columns, so 256 threads per block
constexpr int kThreads = kTileM * kTileN;

__global__ void __launch_bounds__(kThreads)
    sgemm_naive(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k) {
  const TileOrigin tile = tile_origin(n, kTileM, kTileN);
  const std::int64_t row = tile.row + threadIdx.x;
  const std::int64_t col = tile.col + threadIdx.y;
  if (row >= m || col >= n) return;  // the edge tiles stick out of C: those threads have no output

  // 64-bit offsets: row * k and p * n pass 2^31 once A or B holds more than 2^31 elements
  // (65536 x 32768, say), long before any one dimension does.
  const float* a_row = a + row * k;
  float sum = 0.0f;
  for (std::int64_t p = 0; p < k; ++p) sum += a_row[p] * b[p * n + col];
  c[row * n + col] = sum;
}
}  // namespace

void sgemm_step1_naive(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream) {
  const unsigned blocks = tile_grid(shape, kTileM, kTileN);
  sgemm_naive<<<blocks, dim3(kTileM, kTileN), 0, stream>>>(a, b, c, shape.m, shape.n, shape.k);
  check_launch();
}

}  // namespace kc::ch02::detail
