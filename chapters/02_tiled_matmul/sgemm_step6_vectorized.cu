// Step 6, vectorized: step 5 with 16-byte loads everywhere the data allows them.
//
// What changed vs step 5:
//   1. Global loads: the 4 consecutive floats a thread copies from a row of A (and of B) are one
//      float4 load (LDG.128) instead of four scalar ones. When the rows are a multiple of 4 floats
//      long and the matrix is 16-byte aligned, a float4 lies wholly inside the matrix or wholly
//      outside (then it reads as zeros); otherwise a float4 could straddle two rows or sit off a
//      16-byte boundary, and the copy falls back to scalar loads (load_float4_masked in
//      sgemm_steps.cuh).
//   2. A's tile is stored transposed, a_tile[p][row]. A thread's 8 rows at one p are then 8
//      consecutive floats, two float4 shared loads (LDS.128), and the two thread rows of a warp
//      read them side by side: one pass. Step 5's compiled code also used 16-byte shared loads,
//      but along p (32 registers of A at a time, 2 passes per read); here the layout guarantees
//      the 16-byte reads instead of leaving them to the compiler. At each p: 4 shared load
//      instructions for 64 multiply-adds.
//   3. C is written with float4 stores where the row allows.
// Arithmetic intensity is step 5's (32 FLOP per global byte, 0.5 shared bytes per FLOP): the same
// bytes, moved by fewer instructions (global loads: 2 instead of 8 per thread and tile) in fewer
// shared-memory passes. What is left: the reads of B's tile still collide in banks (a warp's 16
// thread columns read 16-byte pieces 32 bytes apart, so each bank serves 4 of them), the
// transposing store collides 2-way, and a block waits at __syncthreads while its next tile loads.
// Step 7.
#include "kc/check.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02::detail {

namespace {
constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kBK = 8;
constexpr int kTM = 8;
constexpr int kTN = 8;
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);  // 256
static_assert(kBM * kBK == 4 * kThreads && kBK * kBN == 4 * kThreads, "one float4 of each tile per thread");

__global__ void __launch_bounds__(kThreads, 2)
    sgemm_vectorized(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
                     bool a_aligned, bool b_aligned, bool c_aligned) {
  alignas(16) __shared__ float a_tile[kBK][kBM];  // transposed: [p][row]
  alignas(16) __shared__ float b_tile[kBK][kBN];  // [p][col]

  const TileOrigin tile = tile_origin(n, kBM, kBN);
  const int t = static_cast<int>(threadIdx.x);
  const int thread_row = t / (kBN / kTN);
  const int thread_col = t % (kBN / kTN);

  // The float4 of each tile this thread copies: row a_r of A's tile at columns a_p .. a_p + 3,
  // row b_p of B's tile at columns b_c .. b_c + 3.
  const int a_r = t / (kBK / 4), a_p = t % (kBK / 4) * 4;
  const int b_p = t / (kBN / 4), b_c = t % (kBN / 4) * 4;
  const float* a_src = a + (tile.row + a_r) * k + a_p;
  const float* b_src = b + b_p * n + tile.col + b_c;
  const bool a_row_inside = tile.row + a_r < m;
  const std::int64_t b_cols_inside = n - (tile.col + b_c);

  float acc[kTM][kTN] = {};
  for (std::int64_t k0 = 0; k0 < k; k0 += kBK) {
    const float4 a4 = load_float4_masked(a_src, a_row_inside ? k - (k0 + a_p) : 0, a_aligned);
    const float4 b4 = load_float4_masked(b_src, k0 + b_p < k ? b_cols_inside : 0, b_aligned);
    a_tile[a_p + 0][a_r] = a4.x;  // the transpose: one column of a_tile per element
    a_tile[a_p + 1][a_r] = a4.y;
    a_tile[a_p + 2][a_r] = a4.z;
    a_tile[a_p + 3][a_r] = a4.w;
    *reinterpret_cast<float4*>(&b_tile[b_p][b_c]) = b4;
    a_src += kBK;
    b_src += kBK * n;
    __syncthreads();

#pragma unroll
    for (int p = 0; p < kBK; ++p) {
      float a_frag[kTM], b_frag[kTN];
#pragma unroll
      for (int i = 0; i < kTM; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(&a_tile[p][thread_row * kTM + i]);
        a_frag[i] = v.x, a_frag[i + 1] = v.y, a_frag[i + 2] = v.z, a_frag[i + 3] = v.w;
      }
#pragma unroll
      for (int j = 0; j < kTN; j += 4) {
        const float4 v = *reinterpret_cast<const float4*>(&b_tile[p][thread_col * kTN + j]);
        b_frag[j] = v.x, b_frag[j + 1] = v.y, b_frag[j + 2] = v.z, b_frag[j + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += a_frag[i] * b_frag[j];
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const std::int64_t row = tile.row + thread_row * kTM + i;
    if (row >= m) break;
#pragma unroll
    for (int j = 0; j < kTN; j += 4) {
      const std::int64_t col = tile.col + thread_col * kTN + j;
      float* dst = c + row * n + col;
      if (c_aligned && col + 3 < n) {
        *reinterpret_cast<float4*>(dst) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
      } else {
        for (int e = 0; e < 4 && col + e < n; ++e) dst[e] = acc[i][j + e];
      }
    }
  }
}
}  // namespace

void sgemm_step6_vectorized(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream) {
  // float4 access to a matrix needs every row to start on a 16-byte boundary: the matrix itself
  // does and its row length is a multiple of 4 floats.
  const bool a_aligned = shape.k % 4 == 0 && aligned_16(a);
  const bool b_aligned = shape.n % 4 == 0 && aligned_16(b);
  const bool c_aligned = shape.n % 4 == 0 && aligned_16(c);
  const unsigned blocks = tile_grid(shape, kBM, kBN);
  sgemm_vectorized<<<blocks, kThreads, 0, stream>>>(a, b, c, shape.m, shape.n, shape.k, a_aligned, b_aligned,
                                                    c_aligned);
  check_launch();
}

}  // namespace kc::ch02::detail
