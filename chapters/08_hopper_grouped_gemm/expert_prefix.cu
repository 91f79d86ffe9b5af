// The prefix kernel that runs before every grouped launch: one block, one thread per expert.
//
//   - The tile prefix (every step): expert e's m-tiles from the device offsets, and their exclusive
//     prefix over experts, Chapter 5's tile_prefix_of with Chapter 5's block-wide scan. The GEMM
//     kernel reads tile_prefix[E] for its tile count and binary-searches the prefix for each tile's
//     expert.
//   - Step 2's store maps: each non-empty expert gets a copy of C's store map with the address of
//     its first row and its row count, so TMA clips a store at the expert's last row. The copy is
//     made with ordinary stores and patched with tensormap.replace, both in the generic proxy; the
//     copy engine reads maps through the tensormap proxy. The fence.proxy.tensormap release here and
//     the acquire in the GEMM kernel, before a map's first use, hand the writes over.
#include "grouped_launch.hpp"
// Angle brackets: the exercise build puts the skeleton's grouped_tiles.hpp first on the include path.
#include <grouped_tiles.hpp>

#include "kc/check.hpp"
#include "scan.cuh"  // Chapter 5: block_inclusive_scan
#include "tensor_map_ptx.cuh"
#include "tile_map.hpp"

namespace kc::ch08::detail {

namespace {

__global__ void __launch_bounds__(ch05::detail::kScanThreads)
    expert_prefix_kernel(const std::int32_t* __restrict__ offsets, int experts, int m_total,
                         std::int32_t* __restrict__ tile_prefix, const __grid_constant__ CUtensorMap c_map,
                         const __nv_bfloat16* c, int n_out, CUtensorMap* expert_maps) {
  const int e = static_cast<int>(threadIdx.x);
  int begin = 0, end = 0;
  if (e < experts) ch05::expert_rows(offsets, e, m_total, begin, end);
  const int inclusive = ch05::detail::block_inclusive_scan(ch05::m_tiles_of(end - begin, kTile.block_m));
  if (e < experts) tile_prefix[e + 1] = inclusive;
  if (e == 0) tile_prefix[0] = 0;
  // An empty expert owns no tile: its map is never used, and a map of 0 rows is not a valid map.
  if (expert_maps != nullptr && e < experts && end > begin) {
    CUtensorMap* map = expert_maps + e;
    const auto* from = reinterpret_cast<const uint4*>(&c_map);
    auto* to = reinterpret_cast<uint4*>(map);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(CUtensorMap) / sizeof(uint4)); ++i) to[i] = from[i];
    ptx::tensormap_set_address(map, c + static_cast<std::size_t>(begin) * n_out);
    ptx::tensormap_set_rows(map, end - begin);
    ptx::fence_tensormap_release();
  }
}

}  // namespace

void launch_expert_prefix(const std::int32_t* offsets, int experts, int m_total, std::int32_t* tile_prefix,
                          const CUtensorMap& c_map, const __nv_bfloat16* c, int n_out, CUtensorMap* expert_maps,
                          cudaStream_t stream) {
  expert_prefix_kernel<<<1, ch05::detail::kScanThreads, 0, stream>>>(offsets, experts, m_total, tile_prefix, c_map, c,
                                                                     n_out, expert_maps);
  check_launch();
}

}  // namespace kc::ch08::detail
