// Step 7, warp tiling: the block tile is split into warp tiles and each warp tile into the lanes'
// tiles, so that every shared-memory read of a warp is one conflict-free 128-byte piece; the
// shared tiles are double-buffered; and the tile sizes are tuned so that more issue slots do math.
//
// What changed vs step 6:
//   1. Warp tiles. Each warp owns a WM x WN piece of the block tile, and its 32 lanes form 4 rows
//      x 8 columns. A lane's outputs are (WM / 16) x (WN / 32) pieces of 4 x 4, 16 rows and 32
//      columns apart (step 6: one 8 x 8 block per thread). At each p the 8 lane columns then read
//      8 consecutive float4 of B's tile, 128 contiguous bytes that touch every bank once: one
//      shared-memory pass (step 6: 16 float4 32 bytes apart, 4 passes). The 4 lane rows read 4
//      consecutive float4 of A's tile, each shared by 8 lanes (a broadcast). C is written the same
//      way, 128 contiguous bytes per lane row.
//   2. Double buffering. While the warps multiply out shared stage s, each thread's float4 loads
//      of the next tile are in flight to registers; they go to stage s ^ 1 afterwards. One
//      __syncthreads per tile instead of two, and no wait for global memory in between.
//   3. A's transposed tile has 4 floats of padding per row (BM + 4): the transposing stores spread
//      over the banks (conflict-free at BK = 8, 2-way at BK = 16; without it 2- and 4-way). 4, not
//      1, keeps every row 16-byte aligned for the float4 reads.
//   4. The 16-byte and the scalar global loads are instantiations of the kernel, picked at
//      launch, not a branch per load: the scalar code cost registers that the 16-byte kernel
//      needs (with both in one kernel, ptxas spilled at the 128-register cap of the 8 x 8 tiling).
//      A third drops the masks when the tile divides M, N and K (see Loads below).
//   5. Tuning: Warptile (sgemm_steps.cuh) lists the configurations instantiated here. The default,
//      k128x128x8_w64x64_by_columns, has a 128 x 128 block tile of 4 warps of 64 x 64, 16 x 8
//      outputs per lane and BK = 8. A lane issues 128 FMAs per 6 float4 reads at each p (8 x 8: 64
//      per 4): in the compiled loop (exact loads) 1024 of 1129 instructions are FMAs, 91 %. The
//      price: ~225 registers per lane, so 2 blocks of 128 threads (8 warps) per SM; with 128
//      independent sums per lane that still keeps the FMA pipes busy.
//      Two things the source does not show decide the last few per cent, and both only show in
//      the compiled loop and in a measurement:
//      - the order of the FMAs (FmaOrder above): at BK = 8 column by column is 2 % faster than row
//        by row, at BK = 16 (k128x128x16_w64x64, the former default, 2048 of 2227 FMAs) it is the
//        other way round, and the best of either BK was the BK = 8 column order;
//      - the unmasked store of the exact kernel (the end of the kernel says why).
//      k128x128x8_w32x64 keeps step 6's work per thread (8 x 8, 256 threads, 16 warps per SM) and
//      shows what warp tiling alone gains.
// Arithmetic intensity: against global memory still 32 FLOP per byte (same block tile). Against
// shared memory, per warp and p: 6 float4 reads for 64 x 64 multiply-adds, 4 x 64 + 2 x 128 = 512
// distinct bytes: 0.06 bytes per FLOP (step 6: 0.5 requested, in 4-pass reads). Shared memory is
// no longer a limit; the FMA issue rate is.
//
// Fits every GPU from sm_80: at most 33 KB of static shared memory per block (no opt-in; two
// blocks also fit the 100 KB of an sm_86/sm_89 SM, and the driver sizes the shared-memory carveout
// for them by itself) and at most 255 registers. At 4096^3: 1024 tiles on 132 SMs x 2 = 3.9 waves.
#include <string>

#include "kc/check.hpp"
#include "sgemm_steps.cuh"

namespace kc::ch02::detail {

namespace {

// How a thread loads its float4s of A and B (picked per launch, see launch() below):
//   scalar: element by element, each masked (any shape, any alignment);
//   vector: 16-byte loads, masked per float4 (rows a multiple of 4 floats, 16-byte aligned);
//   exact:  16-byte loads and stores, no masks at all, when M, N and K are multiples of the tile
//           and C is 16-byte aligned too: every tile is an interior one. The masks cost 16 register
//           zeroings and 8 compares per K step of 2,048 FMAs in the vector loop (SASS): about 1 %
//           of its issue slots; the store's masks cost more (see the end of the kernel).
enum class Loads { scalar, vector, exact };

// The order of a lane's kTM x kTN multiply-adds at one p. Every order computes the same sums (each
// acc[i][j] still adds its p in order), so the results are bit for bit the same; what changes is
// the instruction stream ptxas builds from it: which operands an FFMA finds in the reuse cache,
// where the shared-memory loads of the next p land among the FFMAs, which registers hold what.
//   by_rows:    acc[0][0..kTN), acc[1][0..kTN), ...: one A value meets every B value in turn.
//   by_columns: acc[0..kTM)[0], acc[0..kTM)[1], ...: one B value meets every A value in turn.
// Nothing in the source says which is faster for a tile; the compiled loop does, and only a
// measurement tells (by_columns is 2 % faster at BK = 8 and 1.7 % slower at BK = 16, with the same
// 128 x 128 block and 64 x 64 warps).
enum class FmaOrder { by_rows, by_columns };

// BM x BN block tile, BK step along K, WM x WN warp tile; kMinBlocks per SM for
// __launch_bounds__; kOrder and kLoads: see above.
template <int BM, int BN, int BK, int WM, int WN, int kMinBlocks, FmaOrder kOrder, Loads kLoads>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, kMinBlocks)
    sgemm_warptiled(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n, std::int64_t k,
                    bool c_aligned) {
  constexpr int kWarpsN = BN / WN;
  constexpr int kThreads = (BM / WM) * kWarpsN * 32;
  constexpr int kMIters = WM / 16;  // 4 x 4 pieces per lane along M (4 lane rows x 4 rows each)
  constexpr int kNIters = WN / 32;  // ... and along N (8 lane columns x 4 columns each)
  constexpr int kTM = 4 * kMIters;  // a lane's outputs: kTM x kTN
  constexpr int kTN = 4 * kNIters;
  constexpr int kAPad = 4;
  constexpr int kALoads = BM * BK / 4 / kThreads;  // float4 of A's tile per thread and tile
  constexpr int kBLoads = BK * BN / 4 / kThreads;  // ... of B's
  constexpr int kARowStep = kThreads / (BK / 4);   // rows between a thread's float4 of A
  constexpr int kBRowStep = kThreads / (BN / 4);   // ... of B
  static_assert(WM % 16 == 0 && WN % 32 == 0 && BM % WM == 0 && BN % WN == 0, "warp tiles tile the block");
  static_assert(kALoads * 4 * kThreads == BM * BK && kBLoads * 4 * kThreads == BK * BN, "tiles split evenly");
  static_assert(BK % 4 == 0, "A's tile rows are loaded as float4");

  alignas(16) __shared__ float a_tile[2][BK][BM + kAPad];  // transposed: [stage][p][row]
  alignas(16) __shared__ float b_tile[2][BK][BN];          // [stage][p][col]

  const TileOrigin tile = tile_origin(n, BM, BN);
  const int t = static_cast<int>(threadIdx.x);
  const int warp = t / 32, lane = t % 32;
  // This lane's outputs are rows a_frag + 16 i + r and columns b_frag + 32 j + s (r, s < 4) of the
  // block tile; a_frag and b_frag are also where it reads A's and B's shared tiles.
  const int a_frag = (warp / kWarpsN) * WM + (lane / 8) * 4;
  const int b_frag = (warp % kWarpsN) * WN + (lane % 8) * 4;

  // Global -> registers -> shared: the float4s this thread copies, as in step 6. Counters that
  // fit 32 bits are ints (K and N are below 2^31): registers are the scarce resource here.
  const int a_r = t / (BK / 4), a_p = t % (BK / 4) * 4;
  const int b_p = t / (BN / 4), b_c = t % (BN / 4) * 4;
  const float* a_src = a + (tile.row + a_r) * k + a_p;  // moves BK columns right per tile
  const float* b_src = b + b_p * n + tile.col + b_c;    // moves BK rows down per tile
  bool a_row_inside[kALoads];
#pragma unroll
  for (int l = 0; l < kALoads; ++l) a_row_inside[l] = tile.row + a_r + l * kARowStep < m;
  const int b_cols_inside = static_cast<int>(n - (tile.col + b_c));  // may be <= 0
  int a_k_left = static_cast<int>(k) - a_p;                          // columns of A left from a_src on
  int b_k_left = static_cast<int>(k) - b_p;                          // rows of B left from b_src on
  float4 a_next[kALoads], b_next[kBLoads];

  auto load_float4 = [](const float* src, int valid) {
    if constexpr (kLoads == Loads::exact) {
      static_cast<void>(valid);
      return *reinterpret_cast<const float4*>(src);
    } else if constexpr (kLoads == Loads::vector) {
      return load_float4_or_zeros(src, valid);
    } else {
      return load_float4_elementwise(src, valid);
    }
  };
  auto load_global = [&] {
#pragma unroll
    for (int l = 0; l < kALoads; ++l)
      a_next[l] = load_float4(a_src + l * kARowStep * k, a_row_inside[l] ? a_k_left : 0);
#pragma unroll
    for (int l = 0; l < kBLoads; ++l) {
      b_next[l] = load_float4(b_src + l * kBRowStep * n, l * kBRowStep < b_k_left ? b_cols_inside : 0);
    }
    a_src += BK;
    b_src += BK * n;
    a_k_left -= BK;
    b_k_left -= BK;
  };
  auto store_shared = [&](int stage) {
#pragma unroll
    for (int l = 0; l < kALoads; ++l) {
      const int row = a_r + l * kARowStep;
      a_tile[stage][a_p + 0][row] = a_next[l].x;
      a_tile[stage][a_p + 1][row] = a_next[l].y;
      a_tile[stage][a_p + 2][row] = a_next[l].z;
      a_tile[stage][a_p + 3][row] = a_next[l].w;
    }
#pragma unroll
    for (int l = 0; l < kBLoads; ++l) *reinterpret_cast<float4*>(&b_tile[stage][b_p + l * kBRowStep][b_c]) = b_next[l];
  };

  float acc[kTM][kTN] = {};
  // The math of one tile: at each p, kMIters + kNIters float4 reads and kTM x kTN FMAs.
  auto multiply_tile = [&](int stage) {
#pragma unroll
    for (int p = 0; p < BK; ++p) {
      float a_val[kTM], b_val[kTN];
#pragma unroll
      for (int i = 0; i < kMIters; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(&a_tile[stage][p][a_frag + 16 * i]);
        a_val[4 * i] = v.x, a_val[4 * i + 1] = v.y, a_val[4 * i + 2] = v.z, a_val[4 * i + 3] = v.w;
      }
#pragma unroll
      for (int j = 0; j < kNIters; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(&b_tile[stage][p][b_frag + 32 * j]);
        b_val[4 * j] = v.x, b_val[4 * j + 1] = v.y, b_val[4 * j + 2] = v.z, b_val[4 * j + 3] = v.w;
      }
      if constexpr (kOrder == FmaOrder::by_rows) {
#pragma unroll
        for (int i = 0; i < kTM; ++i) {
#pragma unroll
          for (int j = 0; j < kTN; ++j) acc[i][j] += a_val[i] * b_val[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kTN; ++j) {
#pragma unroll
          for (int i = 0; i < kTM; ++i) acc[i][j] += a_val[i] * b_val[j];
        }
      }
    }
  };

  const int k_tiles = static_cast<int>((k + BK - 1) / BK);
  load_global();
  store_shared(0);
  __syncthreads();
  int stage = 0;
  for (int kt = 1; kt < k_tiles; ++kt) {
    load_global();  // tile kt: in flight during the math below
    multiply_tile(stage);
    // Stage s ^ 1 was last read in the previous iteration, before the __syncthreads that ended
    // it, so it is free; the __syncthreads below makes the new tile visible before it is read.
    store_shared(stage ^ 1);
    __syncthreads();
    stage ^= 1;
  }
  multiply_tile(stage);  // the last tile: nothing left to load

  // Write C: row a_frag + 16 (i / 4) + i % 4 of the tile, a float4 at column b_frag + 32 (j / 4).
  const std::int64_t row0 = tile.row + a_frag, col0 = tile.col + b_frag;
  float* c_lane = c + row0 * n + col0;
  if constexpr (kLoads == Loads::exact) {
    // Every output exists and C is 16-byte aligned (launch() checks both): no masks. The masks of
    // the general store below run once, after the loop, yet they changed the loop: with them
    // ptxas gave the default tile 232 registers instead of 224 and a different K loop, and its
    // GEMM took 4 % longer at 4096^3. Not a rule: the 128 x 256 tile got slower without them.
    static_cast<void>(c_aligned);
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int r = 16 * (i / 4) + i % 4;
#pragma unroll
      for (int j = 0; j < kTN; j += 4) {
        *reinterpret_cast<float4*>(c_lane + r * n + 32 * (j / 4)) =
            make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
      }
    }
  } else {
    // rows_left / cols_left: how many of the lane's rows / columns from its first on lie inside C
    // (clamped to fit an int; computed late so that they hold no registers during the loop).
    const int rows_left = static_cast<int>(m - row0 < WM ? m - row0 : WM);
    const int cols_left = static_cast<int>(n - col0 < WN ? n - col0 : WN);
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int r = 16 * (i / 4) + i % 4;
      if (r >= rows_left) continue;
#pragma unroll
      for (int j = 0; j < kTN; j += 4) {
        const int col = 32 * (j / 4);
        float* dst = c_lane + r * n + col;
        if (c_aligned && col + 3 < cols_left) {
          *reinterpret_cast<float4*>(dst) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
        } else {
          for (int e = 0; e < 4 && col + e < cols_left; ++e) dst[e] = acc[i][j + e];
        }
      }
    }
  }
}

template <int BM, int BN, int BK, int WM, int WN, int kMinBlocks, FmaOrder kOrder = FmaOrder::by_rows>
void launch(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream) {
  // float4 loads need every row of A and B to start on a 16-byte boundary: K and N multiples of 4
  // and both matrices 16-byte aligned. Anything else runs the scalar-load instantiation.
  const bool vector_loads = shape.k % 4 == 0 && shape.n % 4 == 0 && aligned_16(a) && aligned_16(b);
  const bool c_aligned = shape.n % 4 == 0 && aligned_16(c);
  constexpr int kThreads = (BM / WM) * (BN / WN) * 32;
  const bool exact = vector_loads && c_aligned && shape.m % BM == 0 && shape.n % BN == 0 && shape.k % BK == 0;
  const unsigned blocks = tile_grid(shape, BM, BN);
  if (exact) {
    sgemm_warptiled<BM, BN, BK, WM, WN, kMinBlocks, kOrder, Loads::exact>
        <<<blocks, kThreads, 0, stream>>>(a, b, c, shape.m, shape.n, shape.k, c_aligned);
  } else if (vector_loads) {
    sgemm_warptiled<BM, BN, BK, WM, WN, kMinBlocks, kOrder, Loads::vector>
        <<<blocks, kThreads, 0, stream>>>(a, b, c, shape.m, shape.n, shape.k, c_aligned);
  } else {
    sgemm_warptiled<BM, BN, BK, WM, WN, kMinBlocks, kOrder, Loads::scalar>
        <<<blocks, kThreads, 0, stream>>>(a, b, c, shape.m, shape.n, shape.k, c_aligned);
  }
}

}  // namespace

void sgemm_step7_warptiled(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream,
                           Warptile config) {
  switch (config) {
    case Warptile::k128x128x8_w32x64: launch<128, 128, 8, 32, 64, 2>(a, b, c, shape, stream); break;
    case Warptile::k128x128x16_w64x64: launch<128, 128, 16, 64, 64, 2>(a, b, c, shape, stream); break;
    case Warptile::k128x256x8_w64x64: launch<128, 256, 8, 64, 64, 1>(a, b, c, shape, stream); break;
    case Warptile::k128x128x8_w64x64_by_columns:
      launch<128, 128, 8, 64, 64, 2, FmaOrder::by_columns>(a, b, c, shape, stream);
      break;
    default:
      throw InvalidArgument("config (" + std::to_string(static_cast<int>(config)) + ") must be a Warptile value");
  }
  check_launch();
}

}  // namespace kc::ch02::detail
