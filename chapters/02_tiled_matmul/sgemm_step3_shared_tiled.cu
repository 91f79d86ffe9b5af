// Step 3, shared-memory tiling: a block computes a 32 x 32 tile of C and walks K in steps of 32.
// At each step its 1024 threads copy a 32 x 32 tile of A and one of B into shared memory (one
// element each, coalesced), wait, and then every thread reads the row of A's tile and the column
// of B's tile it needs from there.
//
// What it fixes: in step 2 every element of A and B was fetched from the memory system once per
// use. Now each element read from global memory is used 32 times, from shared memory, which sits
// next to the cores and has no cache tags to look up.
// Arithmetic intensity against global memory: per step of 32 along K a block loads
// (32 + 32) x 32 floats = 8 KB and does 32 x 32 x 32 multiply-adds = 64 KFLOP: 8 FLOP per byte
// (in general a BM x BN tile gives BM * BN / (2 * (BM + BN)) FLOP per byte, so it grows with the
// tile). Against shared memory nothing improved: each multiply-add still loads two floats, 4 bytes
// per FLOP, now from shared memory, and that is the new limit. Step 4 keeps values in registers.
#include "kc/check.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02::detail {

namespace {
constexpr int kTile = 32;  // 32 x 32 threads, one output each; also the step along K
constexpr int kThreads = kTile * kTile;

__global__ void __launch_bounds__(kThreads)
    sgemm_shared_tiled(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k) {
  __shared__ float a_tile[kTile][kTile];  // [row][p]
  __shared__ float b_tile[kTile][kTile];  // [p][col]

  const TileOrigin tile = tile_origin(n, kTile, kTile);
  const int tx = static_cast<int>(threadIdx.x);  // column within the tile (along N: coalesced)
  const int ty = static_cast<int>(threadIdx.y);  // row within the tile
  const std::int64_t row = tile.row + ty;
  const std::int64_t col = tile.col + tx;

  float sum = 0.0f;
  for (std::int64_t k0 = 0; k0 < k; k0 += kTile) {
    // Elements outside A or B are stored as 0: then the loop below needs no checks, because a
    // padded p meets a zero in both tiles and adds exactly 0 (no 0 * NaN, no 0 * Inf).
    a_tile[ty][tx] = (row < m && k0 + tx < k) ? a[row * k + k0 + tx] : 0.0f;
    b_tile[ty][tx] = (k0 + ty < k && col < n) ? b[(k0 + ty) * n + col] : 0.0f;
    __syncthreads();  // the whole tile is written before anyone reads it

    // a_tile[ty][p] is one address for the whole warp (a broadcast); b_tile[p][tx] is 32
    // consecutive floats in 32 different banks: no bank conflicts.
#pragma unroll
    for (int p = 0; p < kTile; ++p) sum += a_tile[ty][p] * b_tile[p][tx];
    __syncthreads();  // everyone is done reading before the next step overwrites the tiles
  }
  if (row < m && col < n) c[row * n + col] = sum;
}
}  // namespace

void sgemm_step3_shared_tiled(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream) {
  const unsigned blocks = tile_grid(shape, kTile, kTile);
  sgemm_shared_tiled<<<blocks, dim3(kTile, kTile), 0, stream>>>(a, b, c, shape.m, shape.n, shape.k);
  check_launch();
}

}  // namespace kc::ch02::detail
