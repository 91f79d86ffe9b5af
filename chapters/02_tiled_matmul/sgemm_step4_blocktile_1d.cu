// Step 4, 1D register blocking: each thread computes 8 outputs, a column of 8 rows of C, so each
// value it reads from shared memory feeds 8 multiply-adds instead of one.
//
// What changed vs step 3: a block now covers a 64 x 64 tile of C with 512 threads (64 columns x 8
// groups of 8 rows) and walks K in steps of only 8. At every p a thread reads one element of B's
// tile into a register and multiplies it with 8 elements of A's tile, accumulating 8 sums in
// registers. A thread's 8 rows are the same for the whole warp, so those reads of A are
// broadcasts; the reads of B are 32 consecutive floats, free of bank conflicts.
//
// Arithmetic intensity: against global memory the 64 x 64 tile gives 64 * 64 / (2 * 128) = 16
// FLOP per byte (step 3: 8). Against shared memory a thread loads 1 + 8 floats per 8
// multiply-adds, 2.25 bytes per FLOP (step 3: 4): shared memory still supplies more than a float
// per FMA. Step 5 blocks in two dimensions and cuts that to a quarter.
#include "kc/check.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02::detail {

namespace {
constexpr int kBM = 64;                    // block tile: rows of C
constexpr int kBN = 64;                    // block tile: columns of C
constexpr int kBK = 8;                     // step along K
constexpr int kTM = 8;                     // outputs per thread, down a column
constexpr int kThreads = kBM * kBN / kTM;  // 512
static_assert(kThreads == kBM * kBK && kThreads == kBK * kBN, "each thread loads one element of each tile");

__global__ void __launch_bounds__(kThreads)
    sgemm_blocktile_1d(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k) {
  __shared__ float a_tile[kBM][kBK];
  __shared__ float b_tile[kBK][kBN];

  const TileOrigin tile = tile_origin(n, kBM, kBN);
  const int t = static_cast<int>(threadIdx.x);
  const int thread_col = t % kBN;  // a warp: 32 consecutive columns ...
  const int thread_row = t / kBN;  // ... and the same 8 rows

  // The element of each tile this thread loads. A warp reads 4 rows x 8 floats of A (four full
  // 32-byte sectors) and 32 consecutive floats of one row of B.
  const int a_r = t / kBK, a_c = t % kBK;
  const int b_r = t / kBN, b_c = t % kBN;
  const bool a_row_inside = tile.row + a_r < m;
  const bool b_col_inside = tile.col + b_c < n;
  const float* a_src = a + (tile.row + a_r) * k + a_c;  // moves kBK columns right per step
  const float* b_src = b + b_r * n + tile.col + b_c;    // moves kBK rows down per step

  float acc[kTM] = {};
  for (std::int64_t k0 = 0; k0 < k; k0 += kBK) {
    // Outside A or B: store 0, so that a padded p adds exactly 0 (see step 3).
    a_tile[a_r][a_c] = (a_row_inside && k0 + a_c < k) ? *a_src : 0.0f;
    b_tile[b_r][b_c] = (b_col_inside && k0 + b_r < k) ? *b_src : 0.0f;
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kBK; ++p) {
      const float b_value = b_tile[p][thread_col];  // one shared load ...
#pragma unroll
      for (int i = 0; i < kTM; ++i) acc[i] += a_tile[thread_row * kTM + i][p] * b_value;  // ... 8 uses
    }
    __syncthreads();
    a_src += kBK;
    b_src += kBK * n;
  }

  const std::int64_t col = tile.col + thread_col;
  if (col >= n) return;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const std::int64_t row = tile.row + thread_row * kTM + i;
    if (row < m) c[row * n + col] = acc[i];
  }
}
}  // namespace

void sgemm_step4_blocktile_1d(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream) {
  const unsigned blocks = tile_grid(shape, kBM, kBN);
  sgemm_blocktile_1d<<<blocks, kThreads, 0, stream>>>(a, b, c, shape.m, shape.n, shape.k);
  check_launch();
}

}  // namespace kc::ch02::detail
