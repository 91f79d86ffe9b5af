// Step 1: every expert in one persistent launch; a tile's loads may run past its expert, its stores
// are masked.
//
// What is new against Chapter 7 (whose step 4 this kernel's roles and pipeline are):
//   - The tiles. A persistent block walks tile ids block, block + grid, ... over all experts' tiles,
//     tile_prefix[E] · tiles_n of them; the count is read on the device, from the prefix kernel's
//     output, so the host never learns the group sizes. The grid is one block per SM, or fewer when
//     no group sizes could give that many tiles (Chapter 5's max_m_tiles bound).
//   - The expert of a tile. Chapter 5's grouped order inside each expert, then a binary search over
//     the tile prefix (grouped_work): the tile's expert, first row, and the expert's end row.
//   - The loads. One tensor map over A [M_total, K] and one over W as [E · N, K]. A tile's A box starts
//     at its first row and takes 128 rows whatever the expert's size: the rows past the expert's end
//     are the next expert's tokens (or zeros past M_total). Its W boxes start at row e · N + n0: past
//     the expert's N they are the next expert's weights. Neither is harmful: rows of A only reach rows
//     of C, columns of W only columns of C, and the store writes neither.
//   - The store: from registers, as Chapter 7's step 4, with each pair masked at the expert's end row
//     and C's last column. The tensor cores wait while it runs, as in Chapter 7 before step 6.
#include "grouped_kernel.cuh"

namespace kc::ch08::detail {

void launch_step1(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const GroupedArgs& args,
                  std::int64_t tile_bound, cudaStream_t stream) {
  // No store map: the kernel's c_map parameter is unused (A's map stands in).
  if (swiglu) {
    launch_grouped_kernel<GroupedStep::masked_store, true>(a_map, w_map, a_map, args, tile_bound, stream);
  } else {
    launch_grouped_kernel<GroupedStep::masked_store, false>(a_map, w_map, a_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch08::detail
