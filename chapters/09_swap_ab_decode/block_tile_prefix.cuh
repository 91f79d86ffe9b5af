/// @file block_tile_prefix.cuh
/// @brief The tile prefix over experts (Chapter 5's tile_prefix_of), computed by every block of the
/// swapped kernel into its own shared memory instead of by a kernel before it. At decode sizes a whole
/// launch takes tens to hundreds of microseconds, and a second kernel's launch and drain would be part
/// of it; the scan here reads E + 1 offsets that sit in L2 after the first block.
#pragma once

#include <cstdint>

#include "tile_map.hpp"  // Chapter 5: expert_rows, m_tiles_of

namespace kc::ch09::detail {

/// Writes tile_prefix[0..E] into shared memory: tile_prefix[e + 1] = token tiles of @p block_tokens
/// rows of experts 0..e. Every thread of the block calls it (it synchronises the block three times);
/// @p chunk_sums is shared scratch of 32 ints. Warps scan chunks of 32 experts with shuffles, warp 0
/// scans the chunk totals (E <= 1024: at most 32 chunks), and every thread adds its chunk's carry.
__device__ inline void block_tile_prefix(const std::int32_t* offsets, int experts, int m_total, int block_tokens,
                                         std::int32_t* tile_prefix, std::int32_t* chunk_sums) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  const int chunks = (experts + 31) / 32;
  for (int chunk = warp; chunk < chunks; chunk += warps) {
    const int e = 32 * chunk + lane;
    int tiles = 0;
    if (e < experts) {
      int begin = 0, end = 0;
      ch05::expert_rows(offsets, e, m_total, begin, end);
      tiles = ch05::m_tiles_of(end - begin, block_tokens);
    }
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xFFFFFFFFu, tiles, d);
      if (lane >= d) tiles += up;
    }
    if (e < experts) tile_prefix[e + 1] = tiles;  // inclusive within the chunk
    if (lane == 31) chunk_sums[chunk] = tiles;
  }
  __syncthreads();
  if (warp == 0) {
    const int own = lane < chunks ? chunk_sums[lane] : 0;
    int total = own;
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xFFFFFFFFu, total, d);
      if (lane >= d) total += up;
    }
    if (lane < chunks) chunk_sums[lane] = total - own;  // tiles of the chunks before this one
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < experts; e += static_cast<int>(blockDim.x)) {
    tile_prefix[e + 1] += chunk_sums[e / 32];
  }
  if (threadIdx.x == 0) tile_prefix[0] = 0;
  __syncthreads();
}

}  // namespace kc::ch09::detail
