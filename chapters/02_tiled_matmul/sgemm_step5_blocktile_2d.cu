// Step 5, 2D register blocking: each thread computes an 8 x 8 tile of C, an outer product of 8
// values of A and 8 values of B at every step along K.
//
// What changed vs step 4: a block covers 128 x 128 of C with 256 threads (16 x 16), each owning
// 8 rows x 8 columns. At every p a thread loads 8 floats of A's tile and 8 of B's into registers
// (a_frag, b_frag) and does all 8 x 8 = 64 multiply-adds between them: 16 floats read from shared
// memory feed 64 multiply-adds, where step 4 needed 9 for 8. The 64 sums live in registers.
//
// Arithmetic intensity: against global memory the 128 x 128 tile gives 128 * 128 / (2 * 256) = 32
// FLOP per byte (step 4: 16), so each byte fetched from L2 feeds 32 FLOP. Against shared memory a
// thread loads 16 floats per 64 multiply-adds: 0.5 bytes per FLOP (step 4: 2.25).
// What is left: the global loads are 4-byte instructions (8 per thread and tile). nvcc already
// merges the shared reads into 16-byte ones (the SASS shows 32 LDS.128 per 512 FFMA), but it reads
// A's tile along p, 4 values of p for each of a thread's 8 rows, which costs 32 registers; and the
// reads collide in banks: a warp's two thread rows read A's tile 64 floats apart (the same banks,
// 2 passes), and its 16 thread columns read B's tile in 16-byte pieces 32 bytes apart (4 passes).
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
    // Outside A or B: store 0, so that a padded p adds exactly 0 (see step 3).
    // exercise 1: Copy this thread's 4 elements of A's tile: for l in [0, kALoads),
    // exercise 1: a_tile[a_r][a_p + l] gets a_src[l], or 0.0f when its row is past M (a_row_inside)
    // exercise 1: or its column k0 + a_p + l is past K. The multiply-add loop runs over every p
    // exercise 1: unchecked: a padded p must add exactly 0.
    // stub: (void)a_src;
    // stub: (void)a_row_inside;
#pragma unroll
    for (int l = 0; l < kALoads; ++l) {
      a_tile[a_r][a_p + l] = (a_row_inside && k0 + a_p + l < k) ? a_src[l] : 0.0f;
    }
    // end exercise 1
    // exercise 2: The same for B's tile: b_tile[b_p][b_c + l] gets b_src[l], or 0.0f when column
    // exercise 2: b_c + l is past N (l < b_cols_inside tells) or row k0 + b_p is past K.
    // stub: (void)b_src;
    // stub: (void)b_cols_inside;
#pragma unroll
    for (int l = 0; l < kBLoads; ++l) {
      b_tile[b_p][b_c + l] = (l < b_cols_inside && k0 + b_p < k) ? b_src[l] : 0.0f;
    }
    // end exercise 2
    a_src += kBK;
    b_src += kBK * n;
    __syncthreads();

#pragma unroll
    for (int p = 0; p < kBK; ++p) {
      // 8 + 8 values into registers, then the outer product: each value is used 8 times.
      // exercise 3: Load this thread's 8 values of A's tile at column p into a_frag (rows
      // exercise 3: thread_row * kTM + i) and its 8 values of B's tile at row p into b_frag (columns
      // exercise 3: thread_col * kTN + j). Hint: two short loops of plain assignments.
      // stub: (void)a_tile[0][0];
      // stub: (void)b_tile[0][0];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a_frag[i] = a_tile[thread_row * kTM + i][p];
#pragma unroll
      for (int j = 0; j < kTN; ++j) {
        b_frag[j] = b_tile[p][thread_col * kTN + j];
      }
      // end exercise 3
      // exercise 4: The outer product: for every i < kTM and j < kTN,
      // exercise 4: acc[i][j] += a_frag[i] * b_frag[j]. Use nested loops with #pragma unroll, so
      // exercise 4: that acc, a_frag and b_frag stay in registers.
      // stub: (void)a_frag[0];
      // stub: (void)b_frag[0];
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += a_frag[i] * b_frag[j];
      }
      // end exercise 4
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
