/// @file gemm_bf16_tile.cuh
/// @brief The block tiles of the tensor-core GEMM and the cp.async copy of one K slice into shared
/// memory. Device code only; gemm_bf16_mainloop.cuh runs the pipeline over these pieces.
///
/// The levels of tiling (the large tile; the others change only the numbers):
///   block 128×256 of C, 8 warps as 2 × 4, each warp 64×64 = 4 m16 tiles × 8 n8 tiles = 32 mma per
///   k16 step, 32 × 4 = 128 fp32 accumulators per thread. A 64×64 warp tile needs 4 + 4 ldmatrix.x4
///   (4 KiB of shared-memory reads) per 32 mma; smaller warp tiles read more per mma and run out of
///   shared-memory bandwidth before the tensor cores run out of work.
///
/// Shared-memory layout: a tile row is 64 bf16 = 128 bytes = 8 chunks of 16 bytes, the width of all
/// 32 banks. ldmatrix reads the same chunk of 8 consecutive rows at once; unswizzled, those 8 chunks
/// sit in the same 4 banks (an 8-way conflict). Storing chunk c of row r at chunk c ^ (r % 8) spreads
/// them over all 32 banks, for the cp.async writes (4 whole rows per warp) as well as for ldmatrix.
///
/// Boundaries: rows past M or N and the K tail past K are zero-filled by cp.async (source size 0), so
/// they add nothing; the epilogue stores only rows < M and columns < N. K % 8 == 0 makes every 16-byte
/// chunk either wholly inside K or wholly outside it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mma_sm80.cuh"

namespace kc::ch02::block {

constexpr int kBlockK = 64;                                 ///< K per pipeline stage
constexpr int kRowBytes = kBlockK * sizeof(__nv_bfloat16);  ///< one tile row in shared memory: 128 bytes
constexpr int kChunksPerRow = kRowBytes / 16;               ///< 16-byte cp.async / ldmatrix chunks per row
constexpr int kSmallestBlockM = 64;                         ///< smallest block_m below
constexpr int kSmallestBlockN = 32;                         ///< smallest block_n below

/// A block tile: kBlockM × kBlockN of C, computed by kWarpsM × kWarpsN warps, with kStages buffers
/// of one 64-wide K slice of A and W each.
template <int kBlockM, int kBlockN, int kWarpsM, int kWarpsN, int kStages, bool kRotateK = false>
struct Tile {
  static constexpr int block_m = kBlockM;  ///< rows of C per block
  static constexpr int block_n = kBlockN;  ///< columns of C per block
  static constexpr int warps_n = kWarpsN;  ///< warps along N (warp w sits at row w / warps_n)
  static constexpr int stages = kStages;   ///< pipeline buffers of one 64-wide K slice each
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

/// The tiles. Four stages where they fit, three on GPUs with less shared memory per block (227 KiB
/// on sm_90, 163 KiB on sm_80, 99 KiB on sm_86 / sm_89). The small tile streams memory-bound shapes,
/// so it takes six stages: 80 KiB of copies in flight per block, and still two blocks per SM on sm_90.
using LargeTile4 = Tile<128, 256, 2, 4, 4>;      ///< 192 KiB: sm_90
using LargeTile3 = Tile<128, 256, 2, 4, 3>;      ///< 144 KiB: sm_80
using MediumTile4 = Tile<128, 128, 2, 4, 4>;     ///< 128 KiB: sm_80, sm_90
using MediumTile3 = Tile<128, 128, 2, 4, 3>;     ///<  96 KiB: sm_86 / sm_89
using SmallTile = Tile<64, 64, 2, 2, 6, true>;   ///<  96 KiB: all; K rotated
using NarrowTile = Tile<64, 32, 4, 1, 8, true>;  ///<  96 KiB: all; K rotated

/// The small and narrow tiles for a single wave (at most one block per SM): one block then has the
/// SM's shared memory to itself, and a memory-bound GEMM that streams W once (M = 16 or 128) needs
/// bytes in flight more than anything else. Twice the stages keep twice the copies in flight per SM
/// (176 KiB instead of 80 KiB for the small tile): by Little's law, twice the bandwidth at the same
/// latency, until DRAM itself is the limit.
using SmallDeepTile = Tile<64, 64, 2, 2, 12, true>;   ///< 192 KiB: sm_90; K rotated
using NarrowDeepTile = Tile<64, 32, 4, 1, 16, true>;  ///< 192 KiB: sm_90; K rotated

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
      sm80::cp_async_16(tile + smem_offset + pass * kRowsPerPass * kRowBytes, inside ? from : any_valid, inside);
      from += pass_stride;
    }
  }
};

}  // namespace kc::ch02::block
