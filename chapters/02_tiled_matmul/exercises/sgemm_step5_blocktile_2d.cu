// EXERCISE (Chapter 2): finish step 5, the 2D register-blocked SGEMM.
//
// This file replaces sgemm_step5_blocktile_2d.cu when you configure with -DKC_EXERCISES=ON
// (`cmake --workflow --preset exercises` or `cmake --preset exercises`). The chapter's tests then
// run against your code:  ctest --preset exercises -L ch02
// Fill in the four TODOs. Until you do, the tests of step5_blocktile_2d fail (that is the point).
// Hints are next to each TODO; the lesson (README.md) walks through the solution, and steps 4 and
// 6 (sgemm_step4_blocktile_1d.cu, sgemm_step6_vectorized.cu) do the same things in other ways.
//
// The idea: each of the 256 threads computes an 8 x 8 tile of C. At every step along K the block
// copies a 128 x 8 tile of A and an 8 x 128 tile of B into shared memory (TODO 1 and 2); then at
// each p every thread loads 8 values of A's tile (its 8 rows, column p) and 8 of B's (row p, its
// 8 columns) into registers (TODO 3) and does all 8 x 8 multiply-adds between them (TODO 4): 16
// floats from shared memory feed 64 FMAs.
#include "kc/check.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02::detail {

namespace {
constexpr int kBM = 128;                             // block tile: rows of C
constexpr int kBN = 128;                             // block tile: columns of C
constexpr int kBK = 8;                               // step along K
constexpr int kTM = 8;                               // thread tile: rows
constexpr int kTN = 8;                               // thread tile: columns
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);  // 256
constexpr int kALoads = kBM * kBK / kThreads;        // elements of A's tile each thread copies: 4
constexpr int kBLoads = kBK * kBN / kThreads;        // ... and of B's: 4
static_assert(kALoads * kThreads == kBM * kBK && kBLoads * kThreads == kBK * kBN, "tiles split evenly");

// (kThreads, 2): at most 128 registers per thread, so two blocks (16 warps) share an SM and one
// computes while the other waits at __syncthreads. The 64 sums take half of them.
__global__ void __launch_bounds__(kThreads, 2)
    sgemm_blocktile_2d(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k) {
  __shared__ float a_tile[kBM][kBK];  // [row][p]
  __shared__ float b_tile[kBK][kBN];  // [p][col]

  const TileOrigin tile = tile_origin(n, kBM, kBN);
  const int t = static_cast<int>(threadIdx.x);
  const int thread_row = t / (kBN / kTN);  // this thread's outputs: rows thread_row * kTM + i ...
  const int thread_col = t % (kBN / kTN);  // ... and columns thread_col * kTN + j

  // The tile copy: each thread copies 4 consecutive elements of a row of A's tile (row a_r,
  // columns a_p .. a_p + 3) and 4 of a row of B's tile (row b_p, columns b_c .. b_c + 3), so its
  // 4 loads are one pointer plus 0, 1, 2, 3. Two threads cover one 8-float row of A's tile; a warp
  // covers 16 rows of A (16 full 32-byte sectors) and one 128-float row of B (four full lines).
  const int a_r = t / (kBK / kALoads), a_p = t % (kBK / kALoads) * kALoads;
  const int b_p = t / (kBN / kBLoads), b_c = t % (kBN / kBLoads) * kBLoads;
  const float* a_src = a + (tile.row + a_r) * k + a_p;  // moves kBK columns right per step
  const float* b_src = b + b_p * n + tile.col + b_c;    // moves kBK rows down per step
  const bool a_row_inside = tile.row + a_r < m;
  const std::int64_t b_cols_inside = n - (tile.col + b_c);  // columns b_c + l inside B: l < this

  float acc[kTM][kTN] = {};
  float a_frag[kTM];
  float b_frag[kTN];
  for (std::int64_t k0 = 0; k0 < k; k0 += kBK) {
    // TODO 1: copy this thread's 4 elements of A's tile: for l in [0, kALoads), a_tile[a_r][a_p + l]
    // gets a_src[l], or 0.0f when that element lies outside A: its row is past M (a_row_inside
    // tells) or its column k0 + a_p + l is past K. Why 0 and not "skip it"? The multiply-add loop
    // below runs over all kBK values of p without checks; a padded p must add exactly 0.
    (void)a_src;  // the (void) lines only keep the compiler quiet: delete them
    (void)a_row_inside;
    // TODO 2: the same for B's tile: b_tile[b_p][b_c + l] gets b_src[l], or 0.0f when column
    // b_c + l is past N (l < b_cols_inside tells) or row k0 + b_p is past K.
    (void)b_src;
    (void)b_cols_inside;
    a_src += kBK;
    b_src += kBK * n;
    __syncthreads();

#pragma unroll
    for (int p = 0; p < kBK; ++p) {
      // TODO 3: load this thread's 8 values of A's tile at column p into a_frag (rows
      // thread_row * kTM + i) and its 8 values of B's tile at row p into b_frag (columns
      // thread_col * kTN + j). Hint: two short loops of plain assignments.
      (void)a_tile[0][0];  // the (void) lines only keep the compiler quiet: delete them
      (void)b_tile[0][0];
      // TODO 4: the outer product: for every i < kTM and j < kTN, acc[i][j] += a_frag[i] * b_frag[j].
      // Each loaded value is used 8 times: that reuse is what this step is about. Hint: nested
      // loops with #pragma unroll, so that acc, a_frag and b_frag stay in registers (an array
      // indexed by a counter the compiler cannot unroll lands in local memory).
      (void)a_frag[0];
      (void)b_frag[0];
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const std::int64_t row = tile.row + thread_row * kTM + i;
    if (row >= m) break;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const std::int64_t col = tile.col + thread_col * kTN + j;
      if (col < n) c[row * n + col] = acc[i][j];
    }
  }
}
}  // namespace

void sgemm_step5_blocktile_2d(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream) {
  const unsigned blocks = tile_grid(shape, kBM, kBN);
  sgemm_blocktile_2d<<<blocks, kThreads, 0, stream>>>(a, b, c, shape.m, shape.n, shape.k);
  check_launch();
}

}  // namespace kc::ch02::detail
