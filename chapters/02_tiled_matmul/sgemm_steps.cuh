/// @file sgemm_steps.cuh
/// @brief Inside Chapter 2's fp32 ladder: one launch function per step, which sgemm() calls after
/// validating, and the small pieces of tile bookkeeping the steps share.
///
/// Call kc::ch02::sgemm() rather than these: they trust their arguments (validate_sgemm has run).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gemm_shape.hpp"
#include "kc/check.hpp"

namespace kc::ch02::detail {

/// The number of blocks in a 1D grid that covers C [M, N] with tiles of @p tile_m × @p tile_n.
///
/// Why 1D: gridDim.y and gridDim.z stop at 65535, gridDim.x at 2^31 - 1, so numbering the tiles
/// along x is what lets M = 1 and N = 10^7 (or the reverse) launch like any other shape. Throws
/// kc::InvalidArgument when even that is too few, which takes a C of terabytes.
inline unsigned tile_grid(const GemmShape& shape, int tile_m, int tile_n) {
  const std::int64_t tiles = ((shape.m + tile_m - 1) / tile_m) * ((shape.n + tile_n - 1) / tile_n);
  if (tiles > 0x7FFFFFFF) {
    throw InvalidArgument("shape.m x shape.n (" + std::to_string(shape.m) + " x " + std::to_string(shape.n) +
                          ") needs " + std::to_string(tiles) + " tiles, more than the 2^31 - 1 blocks of a grid");
  }
  return static_cast<unsigned>(tiles);
}

/// First row and column of C that a block's tile covers.
struct TileOrigin {
  std::int64_t row;  ///< first row of the tile
  std::int64_t col;  ///< first column of the tile
};

/// Where the tile of block blockIdx.x starts. Tiles are numbered row by row, so consecutive blocks
/// (which the GPU runs at the same time) share a row-panel of A and find it in L2.
__device__ inline TileOrigin tile_origin(std::int64_t n, int tile_m, int tile_n) {
  const std::int64_t tiles_n = (n + tile_n - 1) / tile_n;
  const std::int64_t t = blockIdx.x;
  return {t / tiles_n * tile_m, t % tiles_n * tile_n};
}

/// Reads the 4 floats at @p src .. @p src + 3, of which the first @p valid lie inside the matrix
/// (@p valid may be <= 0 or >= 4), one element at a time. Elements past the edge read as 0: a tile
/// that sticks out of the matrix is then padded with zeros and the multiply-add loop needs no
/// checks, because a padded k meets a zero in both A and B and adds exactly 0.
__device__ __forceinline__ float4 load_float4_elementwise(const float* src, std::int64_t valid) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (valid > 0) v.x = src[0];
  if (valid > 1) v.y = src[1];
  if (valid > 2) v.z = src[2];
  if (valid > 3) v.w = src[3];
  return v;
}

/// One 16-byte load of @p src .. @p src + 3 when @p valid > 0, zeros otherwise. Only for matrices
/// whose rows are a multiple of 4 floats long and start 16-byte aligned, read at columns that are
/// multiples of 4: then a float4 is either wholly inside the matrix or wholly outside.
__device__ __forceinline__ float4 load_float4_or_zeros(const float* src, std::int64_t valid) {
  return valid > 0 ? *reinterpret_cast<const float4*>(src) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/// load_float4_or_zeros when @p aligned (the conditions above hold), else load_float4_elementwise.
/// Interior tiles of aligned matrices take the 16-byte path; everything else the scalar one.
__device__ __forceinline__ float4 load_float4_masked(const float* src, std::int64_t valid, bool aligned) {
  return aligned ? load_float4_or_zeros(src, valid) : load_float4_elementwise(src, valid);
}

/// True when @p p sits on a 16-byte boundary (float4 loads and stores need it).
inline bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// Step 1 (sgemm_step1_naive.cu): one thread per output, threadIdx.x along M.
void sgemm_step1_naive(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream);
/// Step 2 (sgemm_step2_coalesced.cu): one thread per output, threadIdx.x along N.
void sgemm_step2_coalesced(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream);
/// Step 3 (sgemm_step3_shared_tiled.cu): 32 × 32 tiles in shared memory.
void sgemm_step3_shared_tiled(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream);
/// Step 4 (sgemm_step4_blocktile_1d.cu): 64 × 64 block tile, 8 outputs per thread in a column.
void sgemm_step4_blocktile_1d(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream);
/// Step 5 (sgemm_step5_blocktile_2d.cu): 128 × 128 block tile, 8 × 8 outputs per thread.
void sgemm_step5_blocktile_2d(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream);
/// Step 6 (sgemm_step6_vectorized.cu): step 5 with 16-byte global and shared loads.
void sgemm_step6_vectorized(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream);

/// The tile shapes step 7 can run with, named kBMxBNxBK_wWMxWN: block tile BM × BN, step BK along
/// K, warp tile WM × WN. The lesson's tuning exercise times them; sgemm() uses kDefaultWarptile.
enum class Warptile : int {
  k128x128x8_w32x64,             ///< 256 threads of 8 × 8 outputs, two blocks per SM: step 6's work per thread
  k128x128x16_w64x64,            ///< 128 threads of 16 × 8 outputs, two blocks per SM
  k128x256x8_w64x64,             ///< 256 threads of 16 × 8 outputs, one block per SM
  k128x128x8_w64x64_by_columns,  ///< 128 threads of 16 × 8 outputs, two blocks per SM, FMAs column by column
};

/// The configuration sgemm() runs for step 7 (sgemm_step7_warptiled.cu says why).
inline constexpr Warptile kDefaultWarptile = Warptile::k128x128x8_w64x64_by_columns;

/// Step 7 (sgemm_step7_warptiled.cu): warp tiling with double-buffered shared memory.
void sgemm_step7_warptiled(const float* a, const float* b, float* c, const GemmShape& shape, cudaStream_t stream,
                           Warptile config = kDefaultWarptile);

}  // namespace kc::ch02::detail
