/// @file gemm_bf16_block.cuh
/// @brief The tensor-core building block of the course: one block's tile of C = A · Wᵀ (bf16 in,
/// fp32 accumulate, bf16 out) with mma.sync, ldmatrix and a cp.async pipeline, plus the epilogues
/// that store it. Chapter 2's GEMM (gemm_bf16_mma.cu) launches one block per tile; Chapter 3 adds
/// epilogues; Chapter 5's grouped GEMM maps each block to a tile of one expert; Chapter 6's Stream-K
/// runs a K range of a tile and either stores it as an fp32 partial or adds other blocks' partials to
/// it before storing C (gemm_bf16_block_k_range, Fp32Partial, AddPartials). Device code only.
///
/// After, on tensor cores: C = A · Wᵀ in bf16 with mma.sync m16n8k16, fp32 accumulators.
///
/// The same tiling idea as the fp32 ladder (block tile → warp tile → per-thread registers), with the
/// innermost multiply handed to the tensor cores. One mma.sync m16n8k16 makes a whole warp multiply a
/// 16×16 piece of A by a 16×8 piece of W and add it into a 16×8 fp32 tile: 2048 multiply-adds in one
/// instruction. Everything else in this file exists to feed that instruction fast enough.
///
/// Who holds what (g = lane / 4, t = lane % 4; mma_sm80.cuh draws it element by element):
///   A fragment, 4 registers of 2 bf16: rows g and g+8 of the 16×16 piece, columns 2t, 2t+1, 2t+8, 2t+9.
///   B fragment, 2 registers: column g of the 16×8 piece (= row g of W), k = 2t, 2t+1, 2t+8, 2t+9.
///   Accumulator, 4 fp32: rows g and g+8, columns 2t and 2t+1.
/// Both fragments want pairs of neighbouring k in one register. A is [M, K] and W is [N, K], both
/// K-major, so a pair of neighbouring k is one aligned 4-byte word in either matrix: ldmatrix (without
/// .trans) produces both fragments straight from shared memory. That is why nn.Linear's layout is
/// the natural one for mma.
///
/// The levels of tiling (large tile; the others only change the numbers):
///   block 128×256 of C, 8 warps as 2 × 4, each warp 64×64 = 4 m16 tiles × 8 n8 tiles = 32 mma per
///   k16 step, 32 × 4 = 128 fp32 accumulators per thread. A 64×64 warp tile needs 4 + 4 ldmatrix.x4
///   (4 KiB of shared memory reads) per 32 mma; smaller warp tiles read more per mma and run out of
///   shared-memory bandwidth before the tensor cores run out of work.
///
/// The pipeline (global → shared), kStages buffers of one 64-wide K slice of A and W each:
///   cp.async copies 16 bytes global → shared without passing through registers and without making
///   the thread wait. Each thread commits one group of copies per K slice; cp.async.wait_group<S-2>
///   then means "the oldest slice has landed (my part of it)", and the __syncthreads() after it makes
///   every thread's part visible. While the warps multiply slice kt, slices kt+1 … kt+S-2 are in
///   flight and slice kt+S-1 is being issued into the buffer slice kt-1 used:
///
///     buffer:    0        1        2        3         (S = 4)
///              [kt  ]   [kt+1]   [kt+2]   [kt+3 ← issuing now, overwrites kt-1]
///               mma     landing  landing
///
///   One __syncthreads() per slice does two jobs: slice kt+1 is visible, and every warp has finished
///   reading slice kt, whose buffer the next iteration's copy overwrites.
///
/// Registers are double-buffered too: while the mma of k16 step kk run, the ldmatrix of step kk+1
/// are already in flight, so the tensor cores do not wait for shared memory.
///
/// The medium and small tiles change only the numbers: 128×128 with 8 warps of 64×32, and 64×64 with
/// 4 warps of 32×32 (fewer registers, more blocks for small M or N).
///
/// Early refill (the two tuning tiles, Tile<..., true>): the schedule above issues slice kt+S-1 at
/// kk == 0, and ptxas never moves an ldmatrix above an earlier cp.async (both touch shared memory, so
/// it must assume they alias). In the sm_90 SASS of the large tile the 12 cp.async of a slice land
/// among the mma of step 1, the ldmatrix of step 2 wait behind them, and step 2's first mma waits
/// for its ldmatrix: one k16 step in four is not double-buffered, in every warp at once, since the
/// barrier keeps the warps in step. Early refill issues the copies at kk == S-1 instead, after the
/// barrier and the next slice's first ldmatrix, into the buffer every warp has just finished reading
/// (slice kt's, refilled with slice kt+S). The mma of step 3 cover the copies, the mma of step 0
/// cover the ldmatrix that wait behind them, and S slices are in flight, not S-1.
///
/// Shared-memory layout: a tile row is 64 bf16 = 128 bytes = 8 chunks of 16 bytes, the width of all
/// 32 banks. ldmatrix reads the same chunk of 8 consecutive rows at once; unswizzled, those 8 chunks
/// sit in the same 4 banks (an 8-way conflict). Storing chunk c of row r at chunk c ^ (r % 8) spreads
/// them over all 32 banks, for the cp.async writes (4 whole rows per warp) as well as for ldmatrix.
///
/// Boundaries: rows past M or N and the K tail past K are zero-filled by cp.async (source size 0), so
/// they add nothing; the epilogue stores only rows < M and columns < N. K % 8 == 0 makes every 16-byte
/// chunk either wholly inside K or wholly outside it.
///
/// The epilogue hook (Chapter 3): the kernel's Epilogue template argument decides how the fp32
/// accumulators leave. Chapter 2's GEMM uses NoEpilogue: each thread rounds and stores its pairs
/// straight from registers. Chapter 3's epilogues (bias + activation + residual, SwiGLU) are
/// "staged": the accumulators go through shared memory to a short loop that applies them (see
/// "staged epilogues" below for why), except on the small-deep tile, whose single wave finishes
/// bias + activation + residual in registers ("the register epilogue" below says why);
/// gemm_bf16_epilogue.hpp describes what they compute.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "activation.cuh"
#include "gemm_bf16_epilogue.hpp"
#include "mma_sm80.cuh"

namespace kc::ch02::block {

using sm80::cp_async_16;
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::ldmatrix_x4;
using sm80::mma_bf16_16816;
using sm80::shared_address;

constexpr int kBlockK = 64;                                 ///< K per pipeline stage
constexpr int kRowBytes = kBlockK * sizeof(__nv_bfloat16);  ///< one tile row in shared memory: 128 bytes
constexpr int kChunksPerRow = kRowBytes / 16;               ///< 16-byte cp.async / ldmatrix chunks per row
constexpr int kSmallestBlockM = 64;                         ///< smallest block_m below
constexpr int kSmallestBlockN = 32;                         ///< smallest block_n below

/// A block tile: kBlockM × kBlockN of C, computed by kWarpsM × kWarpsN warps, with kStages buffers;
/// kEarlyRefill picks the early-refill schedule (see the top of the file).
template <int kBlockM, int kBlockN, int kWarpsM, int kWarpsN, int kStages, bool kEarlyRefill = false,
          bool kRotateK = false>
struct Tile {
  static constexpr int block_m = kBlockM;             ///< rows of C per block
  static constexpr int block_n = kBlockN;             ///< columns of C per block
  static constexpr int warps_n = kWarpsN;             ///< warps along N (warp w sits at row w / warps_n)
  static constexpr int stages = kStages;              ///< pipeline buffers of one 64-wide K slice each
  static constexpr bool early_refill = kEarlyRefill;  ///< the early-refill schedule
  /// K rotation: the block of n-tile j of T starts its K loop at slice j · slices / T and wraps
  /// around. When M is small, all the blocks of a row of tiles read the same A rows: at M = 128
  /// with the small tile, 64 blocks stream the same 0.9 MB of A, and without rotation they ask for
  /// the same L2 lines at the same moment, which queue at the few L2 slices that hold them. Rotated,
  /// they read different slices of A at any moment. Only the order of the K sum changes.
  static constexpr bool rotate_k = kRotateK;
  static constexpr int warps = kWarpsM * kWarpsN;                      ///< warps per block
  static constexpr int threads = 32 * warps;                           ///< threads per block
  static constexpr int warp_m = kBlockM / kWarpsM;                     ///< rows of C per warp
  static constexpr int warp_n = kBlockN / kWarpsN;                     ///< columns of C per warp
  static constexpr int stage_bytes = (kBlockM + kBlockN) * kRowBytes;  ///< one slice of A and W
  static constexpr int smem_bytes = kStages * stage_bytes;             ///< dynamic shared memory per block
};

/// The instantiations. Four stages where they fit, three on GPUs with less shared memory per block
/// (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on sm_86 / sm_89). The small tile streams memory-bound
/// shapes, so it takes six stages: 80 KiB of copies in flight per block, and still two blocks per SM
/// on sm_90.
using LargeTile4 = Tile<128, 256, 2, 4, 4>;             ///< 192 KiB: sm_90
using LargeTile3 = Tile<128, 256, 2, 4, 3>;             ///< 144 KiB: sm_80
using MediumTile4 = Tile<128, 128, 2, 4, 4>;            ///< 128 KiB: sm_80, sm_90
using MediumTile3 = Tile<128, 128, 2, 4, 3>;            ///<  96 KiB: sm_86 / sm_89
using SmallTile = Tile<64, 64, 2, 2, 6, false, true>;   ///<  96 KiB: all; K rotated (below)
using NarrowTile = Tile<64, 32, 4, 1, 8, false, true>;  ///<  96 KiB: all; K rotated (below)

/// The small and narrow tiles for a single wave (at most one block per SM): one block then has the
/// SM's shared memory to itself, and a memory-bound GEMM that streams W once (M = 16 or 128) needs
/// bytes in flight more than anything else. Twice the stages keep twice the copies in flight per SM
/// (176 KiB instead of 80 KiB for the small tile): by Little's law, twice the bandwidth at the same
/// latency, until DRAM itself is the limit.
using SmallDeepTile = Tile<64, 64, 2, 2, 12, false, true>;   ///< 192 KiB: sm_90; K rotated
using NarrowDeepTile = Tile<64, 32, 4, 1, 16, false, true>;  ///< 192 KiB: sm_90; K rotated

/// Tuning tiles (gemm_bf16_with_tile only), both with early refill. LargeEarly is the large tile
/// with nothing else changed. MediumTwoBlocks gives 4 warps the large tile's 64×64 warp tile (the
/// fewest ldmatrix bytes per mma) in a 128×128 block small enough for two blocks per SM on sm_90
/// (2 × 96 KiB of shared memory, 2 × 128 threads × <= 255 registers), so that one block's barrier
/// waits, prologue and epilogue overlap the other block's mma.
using LargeEarlyTile4 = Tile<128, 256, 2, 4, 4, true>;      ///< 192 KiB: sm_90
using LargeEarlyTile3 = Tile<128, 256, 2, 4, 3, true>;      ///< 144 KiB: sm_80
using MediumTwoBlocksTile = Tile<128, 128, 2, 2, 3, true>;  ///<  96 KiB: two blocks per SM on sm_90

/// Tuning tiles: the small, small-deep and narrow-deep tiles without the K rotation, every block
/// walking K from slice 0. They measure what the rotation buys (docs/notes/ch02.md, Session 12).
using SmallUnrotatedTile = Tile<64, 64, 2, 2, 6>;        ///<  96 KiB
using SmallDeepUnrotatedTile = Tile<64, 64, 2, 2, 12>;   ///< 192 KiB: sm_90
using NarrowDeepUnrotatedTile = Tile<64, 32, 4, 1, 16>;  ///< 192 KiB: sm_90

/// Byte offset of 16-byte chunk `chunk` of tile row `row`, XOR-swizzled (see the top of the file).
__device__ __forceinline__ std::uint32_t swizzled(int row, int chunk) {
  return static_cast<std::uint32_t>(row * kRowBytes + ((chunk ^ (row % 8)) << 4));
}

/// One thread's share of copying kRows × 64 slices of a K-major matrix (rows of k elements) into a
/// shared tile. Thread t copies chunk t % 8 of rows t / 8, t / 8 + kRowsPerPass, ...: each warp
/// instruction moves four whole 128-byte rows, contiguous in global memory and conflict-free in
/// shared memory. kRowsPerPass is a multiple of 8, so every pass has the same swizzle as pass 0.
/// Everything that does not change along K is worked out once, in the constructor.
template <int kRows, int kThreads>
struct SliceCopy {
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;  ///< rows one pass of the block copies
  static constexpr int kPasses = kRows / kRowsPerPass;           ///< passes per slice
  static_assert(kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "equal, equally swizzled passes");

  const __nv_bfloat16* src;   ///< this thread's chunk of slice 0, pass 0
  std::int64_t pass_stride;   ///< elements from one pass's row to the next one's
  std::uint32_t smem_offset;  ///< where that chunk lands in the tile
  int passes_inside;          ///< passes whose row exists (rows past M or N are zero-filled)
  int chunk_k;                ///< the chunk's first column within a slice

  /// `block_src` is row 0 of this block's rows; `rows_left` the rows that exist from there on.
  __device__ SliceCopy(const __nv_bfloat16* block_src, int rows_left, int k, int tid) {
    const int row = tid / kChunksPerRow;
    const int chunk = tid % kChunksPerRow;
    chunk_k = chunk * 8;
    src = block_src + static_cast<std::int64_t>(row) * k + chunk_k;
    pass_stride = static_cast<std::int64_t>(kRowsPerPass) * k;
    smem_offset = swizzled(row, chunk);
    const int rows = rows_left < kRows ? rows_left : kRows;
    passes_inside = rows > row ? (rows - row + kRowsPerPass - 1) / kRowsPerPass : 0;
  }

  /// Starts the copies of the slice at columns k0 … k0 + 63 into `tile`. Out-of-range chunks are
  /// zero-filled (source size 0) from `any_valid`, an address that exists, since none is read.
  __device__ __forceinline__ void issue(std::uint32_t tile, int k0, int k, const __nv_bfloat16* any_valid) const {
    const bool k_inside = chunk_k < k - k0;
    const __nv_bfloat16* from = src + k0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const bool inside = k_inside && pass < passes_inside;
      cp_async_16(tile + smem_offset + pass * kRowsPerPass * kRowBytes, inside ? from : any_valid, inside);
      from += pass_stride;
    }
  }
};

/// Stores two neighbouring outputs (columns col, col+1 of one row), rounded to nearest-even bf16.
/// `room` is how many columns are left in the row from col on. One 4-byte store when both fit and
/// the address is 4-byte aligned (N even and c aligned: `paired`), element by element otherwise.
__device__ __forceinline__ void store_pair(__nv_bfloat16* out, float x, float y, int room, bool paired) {
  if (paired && room >= 2) {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(x, y);
    return;
  }
  if (room >= 1) out[0] = __float2bfloat16_rn(x);
  if (room >= 2) out[1] = __float2bfloat16_rn(y);
}

/// Chapter 2's GEMM: the accumulators are stored as they are, straight from registers.
struct NoEpilogue {
  static constexpr bool staged = false;  ///< stored from registers
};

// ---------------------------------------------------------------------------- staged epilogues
// Chapter 3's epilogues do not work on the accumulators in registers (but on the small-deep tile:
// "the register epilogue" below). A first version did: every
// thread applied bias, activation and residual to each of its 128 accumulators in the kernel's
// last, fully unrolled loop. Correct, but the large tile's kernel grew from 2,560 to 18,048
// instructions (a switch over five activations, inlined 256 times), and straight-line code that
// runs once per tile comes from the instruction cache cold: the 4096^3 GEMM took about twice as
// long (docs/notes/data/ch03_v1_9af0c3a.md).
// So the accumulators go to shared memory (the pipeline's buffers are free by then) and a short
// loop, the same few hundred instructions for every group of outputs, finishes them:
//   1. every warp writes its fp32 accumulators into a row-major tile (rows padded by 8 floats so
//      that the four rows a half-warp writes start 8 banks apart: no conflicts);
//   2. the bias of the tile's columns and the residual's rows are copied in with cp.async, at the
//      same time, so the loop never waits on global memory;
//   3. each thread takes 4 neighbouring outputs of a row at a time: one 16-byte shared load, the
//      epilogue's math in fp32, one 8-byte store; a warp stores 256 contiguous bytes of C. A
//      thread keeps the same 4 columns in every row it visits, so their bias is read once and its
//      next group is a pointer step away.
// When the staging area does not fit the pipeline's shared memory (the large tile: 128 rows x 264
// floats + the residual > 192 KiB), the tile is finished in two halves of rows; without a residual
// (BiasActivation, SwiGlu, StagedStore) the large tile's 132 KiB of staged rows fit at once.
// Odd shapes (N % 8 != 0) and pointers that are not 16-byte aligned take the same loop, but read
// bias and residual element by element from global memory and store element by element.

/// Where the staged epilogue keeps things in shared memory, for a tile configuration Cfg; with
/// kResidualRows false (an epilogue that never reads a residual, StagedStore) no residual rows are
/// kept beside the accumulators, so a larger part of the tile fits at once.
template <class Cfg, bool kResidualRows = true>
struct Staging {
  static constexpr int acc_ld = Cfg::block_n + 8;                                  ///< floats per staged row
  static constexpr int acc_row_bytes = acc_ld * 4;                                 ///< bytes per staged row
  static constexpr int residual_row_bytes = kResidualRows ? Cfg::block_n * 2 : 0;  ///< bytes per residual row
  static constexpr int bias_bytes = Cfg::block_n * 2;                              ///< the tile's bias (bf16)
  /// Shared memory for @p rows staged rows with their residual rows, and the bias.
  static constexpr int bytes_for(int rows) { return rows * (acc_row_bytes + residual_row_bytes) + bias_bytes; }
  /// Rows finished per part: the whole tile, or half of it when that does not fit.
  static constexpr int part_rows = bytes_for(Cfg::block_m) <= Cfg::smem_bytes ? Cfg::block_m : Cfg::block_m / 2;
  static constexpr int parts = Cfg::block_m / part_rows;                                ///< 1 or 2
  static constexpr int residual_offset = part_rows * acc_row_bytes;                     ///< byte offset
  static constexpr int bias_offset = residual_offset + part_rows * residual_row_bytes;  ///< byte offset
  static constexpr int groups_per_row = Cfg::block_n / 4;                               ///< groups of 4 outputs
  static_assert(bytes_for(part_rows) <= Cfg::smem_bytes, "the staging area fits the pipeline's buffers");
  static_assert(part_rows % Cfg::warp_m == 0, "each warp's rows lie in one part");
};

/// Shared memory an epilogue adds after the pipeline's buffers when it prefetches: the whole tile's
/// residual rows, then its bias, copied by cp.async ahead of time so that they have landed before
/// the epilogue needs them (a copy at the end exposes one memory latency per block, which matters
/// when the grid is a single wave: M = 16 or 128). Staged epilogues start the copies at the start
/// of the kernel, the register epilogue once the last K slice is issued (gemm_bf16_block_k_range).
template <class Cfg>
struct Prefetch {
  /// bf16 a prefetched residual row: 16 bytes of padding, so that the 8 rows of a warp's pairs in
  /// the register epilogue (the same columns) start 4 banks apart and are read without conflict.
  static constexpr int residual_ld = Cfg::block_n + 8;
  static constexpr int residual_bytes = Cfg::block_m * residual_ld * 2;  ///< block_m padded rows of bf16
  static constexpr int bias_bytes = Cfg::block_n * 2;                    ///< the tile's bias (bf16)
  static constexpr int bytes = residual_bytes + bias_bytes;              ///< added to Cfg::smem_bytes
  static constexpr int offset = Cfg::smem_bytes;                         ///< residual, then bias
};

/// The activation of four values, with the switch outside the loop over them.
__device__ __forceinline__ void activate4(float (&x)[4], Activation activation) {
  switch (activation) {
    case Activation::none: break;
    case Activation::relu:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::relu);
      break;
    case Activation::gelu_erf:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::gelu_erf);
      break;
    case Activation::gelu_tanh:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::gelu_tanh);
      break;
    case Activation::silu:
#pragma unroll
      for (float& v : x) v = activate(v, Activation::silu);
      break;
  }
}

/// Four bf16 at @p p (8-byte aligned) as floats, with one 8-byte load.
__device__ __forceinline__ void load4(float (&x)[4], const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
}

/// Four floats rounded to bf16 and stored with one 8-byte store at @p out (8-byte aligned).
__device__ __forceinline__ void store4(const float (&x)[4], __nv_bfloat16* out) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x[0], x[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(x[2], x[3]);
  uint2 packed;
  packed.x = *reinterpret_cast<const std::uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const std::uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(out) = packed;
}

/// out = act(acc + bias) + residual, rounded once. residual may be c itself: each element is read
/// (into shared memory, or by the thread that stores it) before it is stored.
struct BiasActivationResidual {
  static constexpr bool staged = true;         ///< finished through shared memory
  static constexpr int outputs_per_group = 4;  ///< C columns per 4 accumulators
  const __nv_bfloat16* bias;                   ///< [n] or null
  const __nv_bfloat16* residual;               ///< [m, n] or null
  int n;                                       ///< columns of C (and of the residual)
  Activation activation;                       ///< applied after the bias
  bool vector;              ///< n % 8 == 0 and c, bias, residual 16-byte aligned: cp.async staging, 8-byte stores
  bool prefetched = false;  ///< vector, and the launch added Prefetch<Cfg>::bytes of shared memory

  /// Four outputs at (row, col..col+3) of C: @p bias4 the bias of those columns (read once per
  /// thread from shared memory), the residual already in shared memory.
  __device__ void finish4(float (&x)[4], const float (&bias4)[4], const __nv_bfloat16* residual4,
                          __nv_bfloat16* out) const {
    if (bias != nullptr) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] += bias4[e];
    }
    activate4(x, activation);
    if (residual != nullptr) {
      float r[4];
      load4(r, residual4);
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] += r[e];
    }
    store4(x, out);
  }

  /// The same, element by element from global memory, for the `count` outputs that exist.
  __device__ void finish_each(float (&x)[4], int count, std::int64_t row, int col, __nv_bfloat16* c) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < count && bias != nullptr) x[e] += __bfloat162float(bias[col + e]);
    }
    activate4(x, activation);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e >= count) break;
      const std::int64_t at = row * n + col + e;
      if (residual != nullptr) x[e] += __bfloat162float(residual[at]);
      c[at] = __float2bfloat16_rn(x[e]);
    }
  }
};

/// Chapter 2's plain store, staged: nothing added, each accumulator rounded once and stored through
/// shared memory, a warp writing whole 256-byte rows of C (step 3 above) where the store from
/// registers writes 16 bytes in each of 8 rows. With no residual rows to keep, the large tile is
/// staged whole, in one part. Chapter 2's large tile stores the plain GEMM with it, and so does
/// Chapter 5's wide tile (the same tile; `GroupedGemmOptions::c_store`).
struct StagedStore {
  static constexpr bool staged = true;                       ///< finished through shared memory
  static constexpr bool residual_rows = false;               ///< Staging keeps no residual rows
  static constexpr int outputs_per_group = 4;                ///< C columns per 4 accumulators
  static constexpr const __nv_bfloat16* bias = nullptr;      ///< none: the staging code's tests fold away
  static constexpr const __nv_bfloat16* residual = nullptr;  ///< none
  int n;                                                     ///< columns of C
  bool vector;                                               ///< n % 8 == 0 and c 16-byte aligned: 8-byte stores
  bool prefetched = false;                                   ///< never: there is nothing to prefetch

  /// The store for C [.., @p n] at @p c: 8-byte stores of whole groups where every row of C starts
  /// 16-byte aligned, else element by element. Host side, at launch.
  static StagedStore for_output(int n, const __nv_bfloat16* c) {
    return StagedStore{n, n % 8 == 0 && reinterpret_cast<std::uintptr_t>(c) % 16 == 0};
  }

  /// Four outputs at (row, col..col+3) of C: rounded, one 8-byte store at @p out.
  __device__ void finish4(float (&x)[4], const float (&)[4], const __nv_bfloat16*, __nv_bfloat16* out) const {
    store4(x, out);
  }

  /// The same element by element, for the `count` outputs that exist.
  __device__ void finish_each(float (&x)[4], int count, std::int64_t row, int col, __nv_bfloat16* c) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < count) c[row * n + col + e] = __float2bfloat16_rn(x[e]);
    }
  }
};

/// BiasActivationResidual for a call whose residual is null: nothing is kept beside the staged
/// accumulators, so the large tile is staged whole, in one part (one barrier pair instead of two),
/// as StagedStore is. The launch picks it where that changes the part count (the large tiles).
struct BiasActivation : BiasActivationResidual {
  static constexpr bool residual_rows = false;  ///< Staging keeps no residual rows: residual is null
};

/// True when a residual's rows split Cfg's staged epilogue into two parts and no residual keeps it
/// whole (the 128 × 256 tiles): where BiasActivation is worth its own kernel.
template <class Cfg>
inline constexpr bool residual_rows_split_the_tile = (Staging<Cfg, true>::parts > Staging<Cfg, false>::parts);

/// False for staged epilogues that never read a residual and say so (StagedStore::residual_rows).
template <class Epilogue>
inline constexpr bool stages_residual_rows = true;
/// An epilogue that declares residual_rows: its own answer.
template <class Epilogue>
requires requires { Epilogue::residual_rows; }
inline constexpr bool stages_residual_rows<Epilogue> = Epilogue::residual_rows;

/// SwiGLU on interleaved gate/up rows: accumulators (2j, 2j+1) are (gate_j, up_j), so 4 staged
/// accumulators give 2 outputs, out_j = silu(gate_j + bias_2j) · (up_j + bias_2j+1). n (even)
/// counts W's rows; C has n / 2 columns.
struct SwiGlu {
  static constexpr bool staged = true;          ///< finished through shared memory
  static constexpr int outputs_per_group = 2;   ///< C columns per 4 accumulators
  const __nv_bfloat16* bias;                    ///< [n] interleaved like W, or null
  static constexpr bool residual_rows = false;  ///< no residual (validated): one part on every tile
  const __nv_bfloat16* residual = nullptr;      ///< never used (validated); keeps the staging code common
  int n;                                        ///< rows of W (columns of the GEMM); C has n / 2
  bool vector;                                  ///< n % 8 == 0 and c, bias 16-byte aligned
  bool prefetched = false;                      ///< vector, and the launch added Prefetch<Cfg>::bytes

  /// Two outputs from the accumulators of W columns col..col+3 (gate, up, gate, up), @p bias4 the
  /// bias of those columns; one 4-byte store at @p out.
  __device__ void finish4(float (&x)[4], const float (&bias4)[4], const __nv_bfloat16*, __nv_bfloat16* out) const {
    if (bias != nullptr) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] += bias4[e];
    }
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(silu(x[0]) * x[1], silu(x[2]) * x[3]);
  }

  /// `count` (even) W columns from col on exist; col is even.
  __device__ void finish_each(float (&x)[4], int count, std::int64_t row, int col, __nv_bfloat16* c) const {
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      if (2 * pair >= count) break;
      float gate = x[2 * pair], up = x[2 * pair + 1];
      if (bias != nullptr) {
        gate += __bfloat162float(bias[col + 2 * pair]);
        up += __bfloat162float(bias[col + 2 * pair + 1]);
      }
      c[row * (n / 2) + col / 2 + pair] = __float2bfloat16_rn(silu(gate) * up);
    }
  }
};

// ------------------------------------------------------------------- the register epilogue
// Where staging loses: a single wave of one 4-warp block per SM (M = 128, the small-deep tile).
// Per-block %globaltimer stamps (docs/notes/ch03.md, Session 21) put the staged epilogue at about
// 2.2 us after the K loop against 0.8 us for the plain store, most of it with no arithmetic at all:
// two barriers, the accumulators through shared memory, and a loop of dependent steps that one
// warp a scheduler walks with nothing to hide them. The activation switch also changed how ptxas
// scheduled the K loop itself (with one activation the staged kernel's loop is the plain GEMM's
// SASS instruction for instruction; with five it is not, and measured slower).
// So the small-deep tile finishes in registers, where the plain store does, with the activation a
// template argument (one kernel per activation, chosen on the host): each thread's 32 outputs are
// independent, fully unrolled straight-line code that ptxas interleaves, so the latencies
// overlap. With 32 accumulators a thread the code stays small (the large tile's 128 made the first
// version's kernel 18,048 instructions, above).

/// out = act(acc + bias) + residual in registers, with bias and residual prefetched into shared
/// memory (the Prefetch area). Launched only where that prefetch applies (`vector`, and the area
/// fits beside the pipeline: gemm_bf16_mma.cu's run_epilogue), and stored as whole bf16x2 pairs;
/// other calls take the staged epilogue. The activation is the template argument, so the kernel
/// holds one activation's code.
template <Activation kActivation>
struct RegisterBiasActivationResidual {
  static constexpr bool staged = false;       ///< finished in registers (finish_pair)
  static constexpr bool in_registers = true;  ///< see has_register_epilogue
  const __nv_bfloat16* bias;                  ///< [n] or null
  const __nv_bfloat16* residual;              ///< [m, n] or null; may be c
  int n;                                      ///< columns of C (and of the residual)
  bool vector;                                ///< n % 8 == 0 and c, bias, residual 16-byte aligned
  bool prefetched = false;                    ///< vector, and the launch added Prefetch<Cfg>::bytes of shared memory

  /// Finishes the pair (x, y) at (tile_row, tile_col) and (tile_row, tile_col + 1) of the block's
  /// tile, right before its store, in the thread that holds it. `smem` is the kernel's shared
  /// memory: the Prefetch area follows the pipeline's buffers, and holds zeros where there is no
  /// bias or no residual (prefetch_epilogue_inputs), so that the code has no branch on them: with
  /// one, ptxas compiled every pair's code twice over and the kernel grew past the size at which the
  /// K loop was still scheduled as the plain GEMM's (docs/notes/ch03.md, Session 21). A missing bias
  /// or residual therefore adds +0.0f, which turns a -0 into +0: the one place where this path and
  /// the staged one can differ. `vector` makes every pair whole and one aligned bf16x2.
  template <class Cfg>
  __device__ void finish_pair(float& x, float& y, int tile_row, int tile_col, const unsigned char* smem) const {
    const unsigned char* area = smem + Prefetch<Cfg>::offset;
    const float2 b = __bfloat1622float2(
        *reinterpret_cast<const __nv_bfloat162*>(area + Prefetch<Cfg>::residual_bytes + tile_col * 2));
    const float2 r = __bfloat1622float2(
        *reinterpret_cast<const __nv_bfloat162*>(area + (tile_row * Prefetch<Cfg>::residual_ld + tile_col) * 2));
    x = activate(x + b.x, kActivation) + r.x;
    y = activate(y + b.y, kActivation) + r.y;
  }
};

/// True for epilogues applied in registers by the thread that stores (RegisterBiasActivationResidual).
template <class Epilogue>
inline constexpr bool has_register_epilogue = requires {
  Epilogue::in_registers;
};

/// True for epilogues that may prefetch bias and residual into the Prefetch area.
template <class Epilogue>
inline constexpr bool prefetches_epilogue_inputs = Epilogue::staged || has_register_epilogue<Epilogue>;

/// Starts the copies of the tile's residual rows and bias into the Prefetch area (16-byte chunks;
/// the vector path guarantees their alignment). Rows and columns outside C are not copied: the
/// epilogue never reads them.
template <class Cfg, class Epilogue>
__device__ __forceinline__ void prefetch_epilogue_inputs(const Epilogue& epilogue, unsigned char* smem, int block_row0,
                                                         int block_col0, int rows_left, int cols_left) {
  constexpr int kChunksPerTileRow = Cfg::block_n / 8;
  const int tid = static_cast<int>(threadIdx.x);
  if constexpr (has_register_epilogue<Epilogue>) {
    // The register epilogue adds bias and residual without asking whether they exist: zeros stand
    // in for a missing one (plain stores, visible after the prologue's barrier).
    auto zero = [&](int offset, int bytes) {
      for (int q = tid; q < bytes / 16; q += Cfg::threads) {
        *reinterpret_cast<uint4*>(smem + Prefetch<Cfg>::offset + offset + q * 16) = make_uint4(0, 0, 0, 0);
      }
    };
    if (epilogue.residual == nullptr) zero(0, Prefetch<Cfg>::residual_bytes);
    if (epilogue.bias == nullptr) zero(Prefetch<Cfg>::residual_bytes, Prefetch<Cfg>::bias_bytes);
  }
  if (epilogue.residual != nullptr) {
    for (int q = tid; q < Cfg::block_m * kChunksPerTileRow; q += Cfg::threads) {
      const int r = q / kChunksPerTileRow, chunk = q % kChunksPerTileRow;
      if (r < rows_left && chunk * 8 < cols_left) {
        const __nv_bfloat16* src =
            epilogue.residual + static_cast<std::int64_t>(block_row0 + r) * epilogue.n + block_col0 + chunk * 8;
        cp_async_16(shared_address(smem + Prefetch<Cfg>::offset + r * Prefetch<Cfg>::residual_ld * 2 + chunk * 16), src,
                    true);
      }
    }
  }
  if (epilogue.bias != nullptr) {
    for (int chunk = tid; chunk < kChunksPerTileRow; chunk += Cfg::threads) {
      if (chunk * 8 < cols_left) {
        cp_async_16(shared_address(smem + Prefetch<Cfg>::offset + Prefetch<Cfg>::residual_bytes + chunk * 16),
                    epilogue.bias + block_col0 + chunk * 8, true);
      }
    }
  }
}

/// Steps 1-3 above for one block. acc is the main loop's accumulator array; `smem` the pipeline's
/// shared memory, free once every warp has passed the barrier at the top of each part.
template <class Cfg, class Epilogue, class Acc>
__device__ __forceinline__ void staged_epilogue(const Acc& acc, const Epilogue& epilogue, unsigned char* smem,
                                                __nv_bfloat16* c, int block_row0, int block_col0, int rows_left,
                                                int cols_left, int warp_row0, int warp_col0) {
  using S = Staging<Cfg, stages_residual_rows<Epilogue>>;
  constexpr int kMTiles = Cfg::warp_m / 16;
  constexpr int kNTiles = Cfg::warp_n / 8;
  constexpr int kChunksPerTileRow = Cfg::block_n / 8;  // 16-byte chunks of a row of bias / residual
  static_assert(Cfg::threads % S::groups_per_row == 0, "the block's threads cover whole staged rows");
  constexpr int kRowsPerStep = Cfg::threads / S::groups_per_row;  // rows the block finishes per step
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  float* staged = reinterpret_cast<float*>(smem);
  // Residual rows and bias: prefetched at the start of the kernel, or copied in below, part by part.
  const auto* residual_base =
      reinterpret_cast<const __nv_bfloat16*>(smem + (epilogue.prefetched ? Prefetch<Cfg>::offset : S::residual_offset));
  const auto* bias_tile = reinterpret_cast<const __nv_bfloat16*>(
      smem + (epilogue.prefetched ? Prefetch<Cfg>::offset + Prefetch<Cfg>::residual_bytes : S::bias_offset));
  const std::int64_t ldc = Epilogue::outputs_per_group == 4 ? epilogue.n : epilogue.n / 2;

#pragma unroll 1
  for (int part = 0; part < S::parts; ++part) {
    const int part_row0 = part * S::part_rows;
    __syncthreads();  // the main loop (or the previous part) is done with shared memory

    // Prefetched rows are indexed from the tile's first row, copied ones from the part's.
    // Prefetched rows are padded (Prefetch::residual_ld); rows copied here are not.
    const int residual_ld = epilogue.prefetched ? Prefetch<Cfg>::residual_ld : Cfg::block_n;
    const __nv_bfloat16* residual_tile = residual_base + (epilogue.prefetched ? part_row0 * residual_ld : 0);
    if (epilogue.vector && !epilogue.prefetched) {
      if (epilogue.residual != nullptr) {
        for (int q = tid; q < S::part_rows * kChunksPerTileRow; q += Cfg::threads) {
          const int r = q / kChunksPerTileRow, chunk = q % kChunksPerTileRow;
          if (part_row0 + r < rows_left && chunk * 8 < cols_left) {
            const __nv_bfloat16* src = epilogue.residual +
                                       static_cast<std::int64_t>(block_row0 + part_row0 + r) * epilogue.n + block_col0 +
                                       chunk * 8;
            cp_async_16(shared_address(smem + S::residual_offset + r * S::residual_row_bytes + chunk * 16), src, true);
          }
        }
      }
      if (part == 0 && epilogue.bias != nullptr) {
        for (int chunk = tid; chunk < kChunksPerTileRow; chunk += Cfg::threads) {
          if (chunk * 8 < cols_left) {
            cp_async_16(shared_address(smem + S::bias_offset + chunk * 16), epilogue.bias + block_col0 + chunk * 8,
                        true);
          }
        }
      }
      cp_async_commit();
    }

    // Step 1: the warps whose rows are in this part write their accumulators: lane (g, t) of an
    // m16n8 tile holds rows g and g+8, columns 2t and 2t+1.
    if (warp_row0 / S::part_rows == part) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = warp_row0 - part_row0 + 16 * mt + lane / 4 + 8 * half;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const int col = warp_col0 + 8 * nt + 2 * (lane % 4);
            *reinterpret_cast<float2*>(&staged[r * S::acc_ld + col]) =
                make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
          }
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Step 3: groups of 4 accumulators of a row. A block's threads cover kRowsPerStep whole rows
    // at a time (consecutive threads on consecutive groups, so a warp stores contiguous bytes), and
    // a thread keeps the same column group in every row it visits: its bias is read once, and
    // moving to its next group is a pointer increment, not an index to divide and multiply out
    // again. At 4096^3 the large tile's epilogue has the SM to itself (8 warps on 4 schedulers,
    // one block), so nothing hides its steps: with the old loop (an index per group) the fused
    // kernel took 3 % longer than the GEMM alone, with this one it is level (docs/notes/ch03.md,
    // Session 35).
    const int col = tid % S::groups_per_row * 4;
    const int first_row = tid / S::groups_per_row;
    const int rows_here = rows_left - part_row0 < S::part_rows ? rows_left - part_row0 : S::part_rows;
    if (col < cols_left) {
      const float* from = staged + first_row * S::acc_ld + col;
      if (epilogue.vector) {  // cols_left is then a multiple of 8: the whole group exists
        float bias4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (epilogue.bias != nullptr) load4(bias4, bias_tile + col);
        const __nv_bfloat16* residual4 = residual_tile + first_row * residual_ld + col;
        __nv_bfloat16* out =
            c + (block_row0 + part_row0 + first_row) * ldc + (block_col0 + col) * Epilogue::outputs_per_group / 4;
#pragma unroll 2  // two groups in flight: the loop is latency-bound at the end of a single-wave grid
        for (int r = first_row; r < rows_here; r += kRowsPerStep) {
          const float4 v = *reinterpret_cast<const float4*>(from);
          float x[4] = {v.x, v.y, v.z, v.w};
          epilogue.finish4(x, bias4, residual4, out);
          from += kRowsPerStep * S::acc_ld;
          residual4 += kRowsPerStep * residual_ld;
          out += kRowsPerStep * ldc;
        }
      } else {
        const int count = cols_left - col < 4 ? cols_left - col : 4;
        for (int r = first_row; r < rows_here; r += kRowsPerStep) {
          const float4 v = *reinterpret_cast<const float4*>(from);
          float x[4] = {v.x, v.y, v.z, v.w};
          epilogue.finish_each(x, count, block_row0 + part_row0 + r, block_col0 + col, c);
          from += kRowsPerStep * S::acc_ld;
        }
      }
    }
  }
}

/// Thread 0 writes %globaltimer to @p stamps[@p i] when @p stamps is not null (Chapter 6's phase
/// stamps, a measurement).
__device__ __forceinline__ void stamp_globaltimer(std::uint64_t* stamps, int i) {
  if (stamps == nullptr || threadIdx.x != 0) return;
  std::uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  stamps[i] = now;
}

/// Chapter 6's split tiles, a contributor's part: the block's fp32 accumulators of a K range, stored
/// unrounded in the block's own register order ("fragment order": thread t's accumulators of m16
/// tile mt and n8 tile nt are the float4 at index (mt · n8 tiles per warp + nt) · threads + t), rows
/// and columns past C included (they hold zeros). Only AddPartials, in a block of the same
/// configuration, reads it back, so the layout is the one that stores fastest: each warp instruction
/// writes 512 contiguous bytes straight from registers, with no pass through shared memory.
struct Fp32Partial {
  static constexpr bool staged = false;       ///< stored from registers
  static constexpr bool fp32_partial = true;  ///< gemm_bf16_block_k_range writes fp32, not bf16
  float* partial;                             ///< block_m · block_n floats, 16-byte aligned
  /// One counter per warp (or null): once warp w's part of the partial is stored, its lane 0 adds 1
  /// to arrivals[w]. Thread t of the owner reads only what thread t stored, so the owner's warp w
  /// needs nothing but warp w's counter: no block-wide barrier on either side.
  int* arrivals = nullptr;
  /// A measurement (Chapter 6's phase stamps), or null: thread 0 writes %globaltimer to [0] once
  /// the first slice has landed and to [1] once the main loop is done (before the partial store).
  std::uint64_t* stamps = nullptr;

  /// Records point @p i when stamps were asked for.
  __device__ void stamp(int i) const { stamp_globaltimer(stamps, i); }

  /// Called by every thread once its part of the partial is stored: publishes the warp's part.
  __device__ void publish() const {
    if (arrivals == nullptr) return;
    __threadfence();  // this thread's stores, before the warp's count
    __syncwarp();     // every lane's stores and fence, before lane 0's atomic
    if (threadIdx.x % 32 == 0) atomicAdd(&arrivals[threadIdx.x / 32], 1);
  }
};

/// Chapter 6's split tiles, the owner's part: the block computes its own K range, waits until
/// @p partners other contributors have published their Fp32Partial, adds their partials to its
/// accumulators, partner 0 first, and stores C as a whole tile would. The order of the additions is
/// fixed (the owner's range, then each partner's in turn), so C has the same bits whichever block
/// finishes first. The owner's own part never leaves its registers: no partial store, no read-back.
struct AddPartials {
  static constexpr bool staged = false;        ///< C stored from registers
  static constexpr bool adds_partials = true;  ///< gemm_bf16_block_k_range adds partials before storing
  const float* first_partial;                  ///< partner 0's Fp32Partial
  std::int64_t partial_stride;                 ///< floats from one partner's partial to the next
  int partners;                                ///< how many (1 or more)
  const int* arrivals;                         ///< the partners' per-warp counters (Fp32Partial::arrivals)
  /// A measurement, or null: [0] first slice landed, [1] main loop done, [2] warp 0's partners in.
  std::uint64_t* stamps = nullptr;

  /// Records point @p i when stamps were asked for.
  __device__ void stamp(int i) const { stamp_globaltimer(stamps, i); }

  /// Every thread of warp w returns once all partners' warp-w parts are visible to it. Lane 0 polls
  /// with acquire loads (paired with the partners' fence-then-atomic); the warp barrier passes that
  /// on to the other lanes.
  __device__ void wait_for_partners() const {
    if (threadIdx.x % 32 == 0) {
      const int* counter = &arrivals[threadIdx.x / 32];
      while (true) {
        int arrived = 0;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(arrived) : "l"(counter) : "memory");
        if (arrived >= partners) break;
        __nanosleep(32);
      }
    }
    __syncwarp();
  }
};

/// True for epilogues that store unrounded fp32 partial tiles (Fp32Partial).
template <class Epilogue>
inline constexpr bool is_fp32_partial = requires {
  Epilogue::fp32_partial;
};

/// True for epilogues that add other blocks' partials before storing C (AddPartials).
template <class Epilogue>
inline constexpr bool adds_partials = requires {
  Epilogue::adds_partials;
};

/// One block's tile of C = epilogue(A · Wᵀ): the whole of Chapter 2's kernel except choosing the
/// tile. The tile's first row and column in C are @p block_row0 and @p block_col0; A's rows and W's
/// rows (C's columns) of the tile are A[block_row0 ...] and W[block_col0 ...]. @p rows_left and
/// @p cols_left say how many of them exist from there on (at least 1 each; more than the tile is
/// fine): rows past them are zero-filled and never stored. C's rows are @p n elements apart.
/// Chapter 2's kernel calls it for tile blockIdx.x; Chapter 5's grouped kernel for the tile of an
/// expert (its A rows, its W, the same C). Every thread of the block must call it, with
/// Cfg::smem_bytes of dynamic shared memory.
/// This is gemm_bf16_block restricted to the 64-wide K slices [@p k_tile_begin, @p k_tile_end)
/// (0 <= begin < end <= ceil(k / 64)): Chapter 6's Stream-K splits a tile's K among blocks.
/// gemm_bf16_block is this function over all slices; with the constant 0 the compiled code of
/// every existing kernel is unchanged (checked: same registers, .text sizes and SASS).
template <class Cfg, class Epilogue>
__device__ __forceinline__ void gemm_bf16_block_k_range(const __nv_bfloat16* __restrict__ a,
                                                        const __nv_bfloat16* __restrict__ w,
                                                        __nv_bfloat16* __restrict__ c, int n, int k, int block_row0,
                                                        int block_col0, int rows_left, int cols_left, bool paired,
                                                        const Epilogue& epilogue, int k_tile_begin, int k_tile_end) {
  constexpr int kThreads = Cfg::threads;
  constexpr int kStages = Cfg::stages;
  constexpr int kMTiles = Cfg::warp_m / 16;  // m16 tiles per warp
  constexpr int kNTiles = Cfg::warp_n / 8;   // n8 tiles per warp
  constexpr int kKSteps = kBlockK / 16;      // k16 steps per stage
  static_assert(kNTiles % 2 == 0, "one ldmatrix.x4 loads the B fragments of two n8 tiles");
  static_assert(kKSteps % 2 == 0, "fragment buffers alternate 0, 1, 0, 1 across stages");

  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t smem_base = shared_address(smem);  // stage s: A slice, then W slice

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const __nv_bfloat16* a_block = a + static_cast<std::int64_t>(block_row0) * k;
  const __nv_bfloat16* w_block = w + static_cast<std::int64_t>(block_col0) * k;

  // This warp's piece of the block tile.
  const int warp_row0 = warp / Cfg::warps_n * Cfg::warp_m;
  const int warp_col0 = warp % Cfg::warps_n * Cfg::warp_n;

  const SliceCopy<Cfg::block_m, kThreads> a_copy(a_block, rows_left, k, tid);
  const SliceCopy<Cfg::block_n, kThreads> w_copy(w_block, cols_left, k, tid);
  // The zero-filled copies need some valid address: the matrices' first elements, which live in
  // the kernel's parameter space. Passing a_block / w_block instead costs two 64-bit registers
  // each for the whole loop, and ptxas then recomputes the copies' addresses every slice: the
  // small tile's loop grew from 157 to 169 instructions and its 128 x 4096 x 7168 GEMM slowed by
  // ~25 % (docs/notes/data/ch02_tune_5762b76.json against ch02_tune_651cfa9.json).
  const int k_tiles = k_tile_end - k_tile_begin;  // slices of this call; k_tile below counts from k_tile_begin
  int k_rotation = 0;                             // slice the loop starts at (Cfg::rotate_k)
  if constexpr (Cfg::rotate_k) {
    const std::int64_t tiles_n = (n + Cfg::block_n - 1) / Cfg::block_n;
    k_rotation = static_cast<int>(static_cast<std::int64_t>(block_col0 / Cfg::block_n) * k_tiles / tiles_n);
  }
  auto issue_copies = [&](int stage, int k_tile) {
    const std::uint32_t stage_base = smem_base + stage * Cfg::stage_bytes;
    int slice = k_tile;
    if constexpr (Cfg::rotate_k)
      slice = k_tile + k_rotation < k_tiles ? k_tile + k_rotation : k_tile + k_rotation - k_tiles;
    a_copy.issue(stage_base, (k_tile_begin + slice) * kBlockK, k, a);
    w_copy.issue(stage_base + Cfg::block_m * kRowBytes, (k_tile_begin + slice) * kBlockK, k, w);
  };

  // This lane's ldmatrix row for k16 step 0. A, one m16 tile: lanes 0-15 give rows 0-15 at k 0-7,
  // lanes 16-31 the same rows at k 8-15, so the four 8×8 matrices arrive as a[0..3] in mma's order.
  // W, two n8 tiles: lanes 0-7 give rows n 0-7 at k 0-7 (b[0] of the first tile), lanes 8-15 the
  // same rows at k 8-15 (its b[1]), lanes 16-31 the same for rows n 8-15 (the second tile).
  // Further m16 tiles and n8 pairs are 16 rows further on: a multiple of 8 rows, so the same swizzle.
  const std::uint32_t a_frag_offset = swizzled(warp_row0 + lane % 16, lane / 16);
  const std::uint32_t w_frag_offset =
      Cfg::block_m * kRowBytes + swizzled(warp_col0 + lane % 8 + lane / 16 * 8, lane / 8 % 2);

  std::uint32_t a_frag[2][kMTiles][4];
  std::uint32_t b_frag[2][kNTiles][2];
  float acc[kMTiles][kNTiles][4] = {};

  auto load_fragments = [&](int buffer, int stage, int kk) {
    // Step kk reads chunk 2·kk + c where step 0 read chunk c (c = 0 or 1). 2·kk and c share no
    // bits, so that is the step-0 offset with the chunk bits XOR-ed by 2·kk: offset ^ (kk << 5).
    const std::uint32_t stage_base = smem_base + stage * Cfg::stage_bytes;
    const std::uint32_t a_row = stage_base + (a_frag_offset ^ (kk << 5));
    const std::uint32_t w_row = stage_base + (w_frag_offset ^ (kk << 5));
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4(a_frag[buffer][mt], a_row + mt * 16 * kRowBytes);
#pragma unroll
    for (int pair = 0; pair < kNTiles / 2; ++pair) {
      std::uint32_t r[4];
      ldmatrix_x4(r, w_row + pair * 16 * kRowBytes);
      b_frag[buffer][2 * pair][0] = r[0];
      b_frag[buffer][2 * pair][1] = r[1];
      b_frag[buffer][2 * pair + 1][0] = r[2];
      b_frag[buffer][2 * pair + 1][1] = r[3];
    }
  };

  // Prologue: slices 0 … S-2 in flight (0 … S-1 with early refill, which fills every buffer). Every
  // thread commits exactly one group per slice, empty ones included, so "kPrologue - 1 groups may
  // still be pending" means "slice 0 landed", and in the loop "S-2" means "slice kt+1 landed".
  constexpr int kPrologue = Cfg::early_refill ? kStages : kStages - 1;
  if constexpr (Epilogue::staged) {
    // One more group, older than every slice's: the first wait below covers it too.
    if (epilogue.prefetched) {
      prefetch_epilogue_inputs<Cfg>(epilogue, smem, block_row0, block_col0, rows_left, cols_left);
      cp_async_commit();
    }
  }
  // The register epilogue copies its bias and residual later, once every slice is issued (below).
  static_assert(!has_register_epilogue<Epilogue> || !Cfg::early_refill,
                "the wait count below assumes the plain schedule");
  for (int s = 0; s < kPrologue; ++s) {
    if (s < k_tiles) issue_copies(s, s);
    cp_async_commit();
  }
  cp_async_wait<kPrologue - 1>();
  __syncthreads();
  if constexpr (is_fp32_partial<Epilogue> || adds_partials<Epilogue>) epilogue.stamp(0);
  load_fragments(0, 0, 0);

  int read_stage = 0;                                     // buffer holding slice kt
  int write_stage = Cfg::early_refill ? 0 : kStages - 1;  // buffer the next copies go to (see below)
  // The register epilogue copies its bias and residual once every slice has been issued, with the
  // last kPrologue slices still to multiply: the copies join the next group, otherwise empty, which
  // the loop's last iteration waits for, behind its barrier. Copied in the prologue instead, they
  // share the first slices' start-up, when every block waits for memory at once; measured, the
  // fused M = 128 kernel took about 0.5 us longer that way (docs/notes/ch03.md, Session 22). The K
  // loop therefore runs in two parts with the copies between them, not with a branch inside it:
  // with the branch, ptxas inlined the copies into the loop and scheduled it anew.
  constexpr int kParts = has_register_epilogue<Epilogue> ? 2 : 1;
  const int first_part_end = kParts == 2 && k_tiles > kPrologue ? k_tiles - kPrologue : 0;
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
    const int part_begin = part == 0 ? 0 : first_part_end;
    const int part_end = part + 1 < kParts ? first_part_end : k_tiles;
    for (int kt = part_begin; kt < part_end; ++kt) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        if (kk == kKSteps - 1) {
          // The next slice's fragments come next: it must have landed, for every thread's copies. The
          // same barrier tells the next copies (issued at the next kk == 0, or just below with early
          // refill) that every warp has read this slice (its last fragments were loaded at the
          // previous kk), so its buffer can be refilled.
          cp_async_wait<kStages - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
        }
        load_fragments((kk + 1) % 2, read_stage, (kk + 1) % kKSteps);

        // Plain: slice kt+S-1 into the buffer slice kt-1 used. Early refill: right after the barrier
        // and the next slice's first ldmatrix, slice kt+S into the buffer every warp has just read.
        if (kk == (Cfg::early_refill ? kKSteps - 1 : 0)) {
          const int next = kt + (Cfg::early_refill ? kStages : kStages - 1);
          if (next < k_tiles) issue_copies(write_stage, next);
          cp_async_commit();
          write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
        }

        const int cur = kk % 2;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
            // Serpentine order: the first mma of a row reuses the B fragment of the last one.
            const int nt = mt % 2 == 0 ? j : kNTiles - 1 - j;
            mma_bf16_16816(acc[mt][nt], a_frag[cur][mt], b_frag[cur][nt]);
          }
        }
      }
    }
    if constexpr (has_register_epilogue<Epilogue>) {
      if (part == 0 && epilogue.prefetched) {
        prefetch_epilogue_inputs<Cfg>(epilogue, smem, block_row0, block_col0, rows_left, cols_left);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be left; leave nothing in flight at exit
  if constexpr (has_register_epilogue<Epilogue>) {
    // A K loop of fewer than kPrologue slices ends before the wait that covers the copies' group.
    if (k_tiles < kPrologue) __syncthreads();
  }

  if constexpr (Epilogue::staged) {
    staged_epilogue<Cfg>(acc, epilogue, smem, c, block_row0, block_col0, rows_left, cols_left, warp_row0, warp_col0);
    return;
  }
  // Chapter 6's split tiles keep one layout for a partial, fragment order: thread tid's accumulators
  // of (mt, nt) are the float4 at fragment_index(mt, nt). Consecutive threads, consecutive float4s.
  const auto fragment_index = [tid](int mt, int nt) { return (mt * kNTiles + nt) * kThreads + tid; };
  if constexpr (is_fp32_partial<Epilogue>) {
    epilogue.stamp(1);
    float4* partial = reinterpret_cast<float4*>(epilogue.partial);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        // __stcg: to L2 only; the owner reads it from another SM.
        __stcg(partial + fragment_index(mt, nt),
               make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]));
      }
    }
    epilogue.publish();
    return;
  }
  if constexpr (adds_partials<Epilogue>) {
    epilogue.stamp(1);
    // The partners' partials come in through the pipeline's buffers, free now: with cp.async, as
    // many partials at once as the buffers hold (two for the 128 × 128 tile), so a tile with two
    // partners pays one L2 round trip, not two, and the copies hold no registers. Each thread
    // copies, then reads back, only its own float4s (slot [partial][fragment][tid]), so after the
    // barrier that frees the buffers no other barrier is needed.
    constexpr int kFragments = kMTiles * kNTiles;               // float4s a thread holds
    constexpr int kPartialBytes = kFragments * kThreads * 16;   // one partial
    constexpr int kPerBatch = Cfg::smem_bytes / kPartialBytes;  // partials the buffers hold
    static_assert(kPerBatch >= 1, "one fp32 partial fits the pipeline's buffers");
    __syncthreads();  // every warp is done reading the last slice's buffer
    epilogue.wait_for_partners();
    epilogue.stamp(2);
    for (int j0 = 0; j0 < epilogue.partners; j0 += kPerBatch) {
      const int count = epilogue.partners - j0 < kPerBatch ? epilogue.partners - j0 : kPerBatch;
      for (int j = 0; j < count; ++j) {
        const float4* partial = reinterpret_cast<const float4*>(
            epilogue.first_partial + static_cast<std::int64_t>(j0 + j) * epilogue.partial_stride);
#pragma unroll
        for (int f = 0; f < kFragments; ++f) {
          cp_async_16(smem_base + ((j * kFragments + f) * kThreads + tid) * 16, partial + f * kThreads + tid, true);
        }
      }
      cp_async_commit();
      cp_async_wait<0>();
      const float4* landed = reinterpret_cast<const float4*>(smem);
      for (int j = 0; j < count; ++j) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const float4 v = landed[(j * kFragments + mt * kNTiles + nt) * kThreads + tid];
            acc[mt][nt][0] += v.x;
            acc[mt][nt][1] += v.y;
            acc[mt][nt][2] += v.z;
            acc[mt][nt][3] += v.w;
          }
        }
      }
    }
    // On to the plain store below: the tile is now the sum over all of K.
  }
  // Store: acc[mt][nt] holds rows g and g+8, columns 2t and 2t+1 of the 16×8 tile at
  // (warp_row0 + 16·mt, warp_col0 + 8·nt). Each pair of columns becomes one bf16x2 store; the four
  // lanes of a row write 16 contiguous bytes and the eight n8 tiles of the warp a 128-byte row.
  __nv_bfloat16* c_block = c + static_cast<std::int64_t>(block_row0) * n + block_col0;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_row0 + 16 * mt + lane / 4 + 8 * half;
      if (row >= rows_left) continue;
      __nv_bfloat16* c_row = c_block + static_cast<std::int64_t>(row) * n;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int col = warp_col0 + 8 * nt + 2 * (lane % 4);
        if (col >= cols_left) continue;
        float x = acc[mt][nt][2 * half], y = acc[mt][nt][2 * half + 1];
        if constexpr (has_register_epilogue<Epilogue>) {
          // The copies' group was waited for, and a barrier passed, in the loop or right after it.
          epilogue.template finish_pair<Cfg>(x, y, row, col, smem);
          // Launched only on the vector path: N % 8 == 0 and c 16-byte aligned, so the pair exists
          // whole and is one aligned bf16x2 (store_pair's tests would double the code again).
          *reinterpret_cast<__nv_bfloat162*>(c_row + col) = __floats2bfloat162_rn(x, y);
          continue;
        }
        store_pair(c_row + col, x, y, cols_left - col, paired);
      }
    }
  }
}

/// One block's tile of C = epilogue(A · Wᵀ) over the whole of K: gemm_bf16_block_k_range over every
/// 64-wide K slice. See gemm_bf16_block_k_range for the parameters.
template <class Cfg, class Epilogue>
__device__ __forceinline__ void gemm_bf16_block(const __nv_bfloat16* __restrict__ a,
                                                const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ c,
                                                int n, int k, int block_row0, int block_col0, int rows_left,
                                                int cols_left, bool paired, const Epilogue& epilogue) {
  // k >= 1; (k + 63) / 64 could overflow int.
  gemm_bf16_block_k_range<Cfg>(a, w, c, n, k, block_row0, block_col0, rows_left, cols_left, paired, epilogue, 0,
                               (k - 1) / kBlockK + 1);
}

}  // namespace kc::ch02::block
