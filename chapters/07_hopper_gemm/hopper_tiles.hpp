/// @file hopper_tiles.hpp
/// @brief The tile of each step of Chapter 7's ladder, and the small index maps that the kernels and
/// the CPU tests share: where an accumulator register lands in C, how a shared-memory matrix
/// descriptor is encoded, which tile of C a block computes. Everything here is constexpr and
/// `__host__ __device__`, so the CPU tests check exactly what the kernels use.
#pragma once

#include <cuda_runtime.h>  // __host__ __device__ (empty for the host compiler)

#include <cstddef>
#include <cstdint>

namespace kc::ch07 {

/// Shared memory an sm_90 block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin, 227 KiB).
inline constexpr std::size_t kSm90SmemPerBlock = 232448;
/// 128-byte swizzle repeats every 8 rows of 128 bytes: each tile buffer starts on a 1024-byte boundary,
/// so the swizzle phase TMA writes is the one wgmma reads (HOPPER_NOTES.md section 1). Dynamic
/// shared memory is only guaranteed 16-byte aligned, so every kernel asks for this much extra and
/// rounds its base up.
inline constexpr int kSwizzleAtomBytes = 1024;
/// One TMA box row with 128-byte swizzle spans at most 128 bytes: 64 bf16 of K.
inline constexpr int kBlockK = 64;
/// A warpgroup: four consecutive warps that issue one wgmma together.
inline constexpr int kWarpgroupThreads = 128;

/// A tile configuration: block tile, warpgroups and pipeline depth. The kernels read these
/// constants at compile time; hopper_step_info() reports them to the host.
struct TileConfig {
  int block_m;              ///< rows of C per block (64 per consumer warpgroup)
  int block_n;              ///< columns of C per block (the wgmma's N)
  int consumer_warpgroups;  ///< warpgroups that issue wgmma
  int producer_warpgroups;  ///< warpgroups that only issue TMA (0: a consumer thread issues it)
  int stages;               ///< shared-memory buffers in the pipeline

  /// Threads per block.
  __host__ __device__ constexpr int threads() const {
    return (consumer_warpgroups + producer_warpgroups) * kWarpgroupThreads;
  }
  /// Bytes of one A box (block_m rows × 64 bf16).
  __host__ __device__ constexpr int a_box_bytes() const { return block_m * kBlockK * 2; }
  /// Bytes of one W box (block_n rows × 64 bf16).
  __host__ __device__ constexpr int w_box_bytes() const { return block_n * kBlockK * 2; }
  /// Bytes one stage receives: what its full barrier expects (out-of-bounds zeros included).
  __host__ __device__ constexpr int stage_bytes() const { return a_box_bytes() + w_box_bytes(); }
  /// Dynamic shared memory: the alignment slack, the stages, a full and an empty barrier per stage.
  __host__ __device__ constexpr std::size_t smem_bytes() const {
    return static_cast<std::size_t>(kSwizzleAtomBytes) + static_cast<std::size_t>(stages) * stage_bytes() +
           static_cast<std::size_t>(stages) * 2 * sizeof(std::uint64_t);
  }
};

/// Stages of @p stage_bytes that fit next to the slack and barriers in an sm_90 block.
constexpr int stages_that_fit(int stage_bytes) {
  return static_cast<int>((kSm90SmemPerBlock - kSwizzleAtomBytes - 256) / static_cast<std::size_t>(stage_bytes));
}

/// Step 1: one warpgroup, a 64 × 128 tile, one buffer: load, wait, multiply, repeat.
inline constexpr TileConfig kStep1Tile{64, 128, 1, 0, 1};
/// Step 2: two warpgroups on a 128 × 128 tile and as many 32 KiB stages as fit (7); thread 0 also
/// issues the TMA loads.
inline constexpr TileConfig kStep2Tile{128, 128, 2, 0, stages_that_fit(2 * 128 * kBlockK * 2)};
/// Step 3: a producer warpgroup and two consumer warpgroups on a 128 × 256 tile, 4 stages of 48 KiB.
inline constexpr TileConfig kStep3Tile{128, 256, 2, 1, stages_that_fit((128 + 256) * kBlockK * 2)};

static_assert(kStep2Tile.stages == 7 && kStep3Tile.stages == 4, "the lesson's stage counts");
static_assert(kStep1Tile.smem_bytes() <= kSm90SmemPerBlock && kStep2Tile.smem_bytes() <= kSm90SmemPerBlock &&
                  kStep3Tile.smem_bytes() <= kSm90SmemPerBlock,
              "every step fits an sm_90 block");
static_assert(kStep1Tile.a_box_bytes() % kSwizzleAtomBytes == 0 && kStep1Tile.w_box_bytes() % kSwizzleAtomBytes == 0 &&
                  kStep3Tile.a_box_bytes() % kSwizzleAtomBytes == 0 &&
                  kStep3Tile.w_box_bytes() % kSwizzleAtomBytes == 0,
              "boxes keep every buffer 1024-byte aligned");
static_assert(kStep3Tile.stage_bytes() < (1 << 20), "an mbarrier phase counts at most 2^20 - 1 bytes");

/// Where accumulator register @p i of thread @p thread (0..127 in its warpgroup) sits in the 64 × N
/// tile of a wgmma m64nNk16 with fp32 accumulators (PTX ISA "wgmma register fragment D"): warp w owns
/// rows 16w..16w+15; registers come in pairs of adjacent columns, four pairs per 8-column step.
struct FragmentPosition {
  int row;  ///< 0..63
  int col;  ///< 0..N-1
};

/// The position in the 64 × N tile of accumulator register @p i of warpgroup thread @p thread (see
/// FragmentPosition).
__host__ __device__ constexpr FragmentPosition accumulator_position(int thread, int i) {
  const int warp = thread / 32, lane = thread % 32;
  return {16 * warp + lane / 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)};
}

/// The 64-bit wgmma descriptor of a K-major bf16 tile in shared memory at byte address
/// @p smem_address, stored as TMA writes it with 128-byte swizzle: rows of 128 bytes (64 bf16 of K),
/// 8-row groups 1024 bytes apart. Fields (PTX ISA "matrix descriptor"): start address >> 4 in bits
/// 0-13, leading byte offset >> 4 in 16-29 (unused by swizzled K-major layouts; 16 by convention),
/// stride byte offset >> 4 in 32-45 (1024: the next 8 rows), swizzle mode in 62-63 (1 = 128 bytes).
/// The next k16 slice of the same rows starts 32 bytes further: add 2 to the descriptor.
__host__ __device__ constexpr std::uint64_t smem_descriptor_sw128(std::uint32_t smem_address) {
  constexpr std::uint64_t leading_byte_offset = 16, stride_byte_offset = 1024, swizzle_128b = 1;
  return ((smem_address & 0x3FFFFu) >> 4) | (leading_byte_offset >> 4) << 16 | (stride_byte_offset >> 4) << 32 |
         swizzle_128b << 62;
}

/// The first row and column of C that block @p block computes when tiles of @p block_m × @p block_n
/// are numbered row by row (@p tiles_n per row): consecutive blocks share A's rows in L2.
struct TileOrigin {
  int m0;  ///< first row of C
  int n0;  ///< first column of C
};

/// The tile of C that block @p block computes (see TileOrigin).
__host__ __device__ constexpr TileOrigin tile_origin(int block, int tiles_n, int block_m, int block_n) {
  return {block / tiles_n * block_m, block % tiles_n * block_n};
}

}  // namespace kc::ch07
