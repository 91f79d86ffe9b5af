// Step 6: a TMA-store epilogue, so the tensor cores do not wait for C to be written.
//
// What changed from step 5:
//   - The store. In step 5, when a tile's last slice is done, both consumer warpgroups spend the
//     epilogue issuing 64 scattered 4-byte stores per thread, and every SM does so at about the same
//     moment (the tiles of a wave finish together): 132 · 64 KiB of C hit the memory system in one
//     burst while no wgmma runs. Here each consumer writes its 64 × 256 accumulators, rounded to bf16,
//     into shared memory with stmatrix (16 instructions per thread, each storing four 8 × 8 matrices),
//     and one thread hands the 64 × 64 boxes to TMA (cp.async.bulk.tensor ... global.shared::cta).
//     The warpgroup then starts its next tile at once; the copy engine writes C behind it, clipping at
//     the edges of C as its loads zero-fill them.
//   - The staging layout. The boxes are staged exactly as a TMA box with 128-byte swizzle looks in
//     shared memory (c_staging_offset), which is also what makes stmatrix conflict-free: the 8 rows one
//     matrix stores fall into 8 different 16-byte chunks, all 32 banks.
//   - The proxy fence. stmatrix writes through the ordinary (generic) proxy and TMA reads through the
//     async proxy: every writing thread runs fence.proxy.async.shared::cta before the warpgroup's
//     barrier, and only then does the leader issue the store.
//   - Reuse of the buffer. Before overwriting its staging buffer for the next tile, the leader waits
//     until the previous stores have read it (cp.async.bulk.wait_group.read 0); the barrier passes
//     that on. Before the CTA exits, it waits for the stores themselves (wait_group 0).
//   - Half a tile at a time. The whole tile would need 64 KiB of staging (128 × 256 bf16), and with it
//     only 3 stages of 48 KiB fit in 227 KiB. Step 6 keeps step 5's 4 stages and stages the tile in
//     two halves of 32 KiB: each consumer stores its left 64 × 128, waits until TMA has read them,
//     then its right half. The fourth stage is worth more than staging the whole tile at once with
//     three (the lesson's "Tried and not kept").
//   - The fallback. TMA needs C's rows to be a multiple of 16 bytes (N a multiple of 8) and C
//     16-byte aligned; otherwise (out.tma_store false) the step stores from registers as step 5 does.
//   - `after`: the same kernel launched as a programmatic dependent of the previous kernel in the
//     stream (Step6DependentLaunchCluster). Each block starts on a free SM while the previous
//     kernel's last tiles still run, initialises its barriers, joins its cluster, and only then
//     waits (griddepcontrol.wait, which returns once that kernel has finished and its writes are
//     visible); right after, it lets the next kernel do the same (griddepcontrol.launch_dependents).
//     On a one-round problem (2048³: 64 cluster tiles for 66 clusters) that start-up is a visible
//     share of the time; on larger ones it is not. With an ordinary kernel
//     before it, the wait returns at once and nothing differs from step 6. With a workspace,
//     `after` also splits the last round by slices where that saves >= 16 slices (Stream-K,
//     Step6StreamKCluster and StreamKPlan; the README's "Stream-K on the last round").
// The kernel is step 5's (cluster_gemm_kernel.cuh) with a tile that stages C (kTile.c_staging).
#include "cluster_gemm_kernel.cuh"

namespace kc::ch07::detail {

// Each variant is its own instantiation of the cluster kernel: step 6 itself, `after` (the same tile
// as a programmatic dependent launch) and `after` with Stream-K on the last round.
void launch_step6(Step6Kernel kernel, const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                  const Output& out, int /*tiles*/, cudaStream_t stream) {
  switch (kernel) {
    case Step6Kernel::own: launch_cluster_gemm<Step6Cluster>(a_map, w_map, c_map, out, stream); return;
    case Step6Kernel::dependent_launch:
      launch_cluster_gemm<Step6DependentLaunchCluster>(a_map, w_map, c_map, out, stream);
      return;
    case Step6Kernel::stream_k: {
      // Where the plan splits nothing, `after` is the whole-tile kernel itself (the same code, so the
      // same time as without a workspace).
      const int clusters =
          cluster_grid(out.tiles_m, out.tiles_n, kStep6Tile.cluster_m, resident_clusters<Step6StreamKCluster>()) /
          kStep6Tile.cluster_m;
      const StreamKPlan plan = stream_k_plan(cluster_tile_count(out.tiles_m, out.tiles_n, kStep6Tile.cluster_m),
                                             clusters, (out.k + kBlockK - 1) / kBlockK);
      if (plan.sk_tiles == 0) {
        launch_cluster_gemm<Step6DependentLaunchCluster>(a_map, w_map, c_map, out, stream);
      } else {
        launch_cluster_gemm<Step6StreamKCluster>(a_map, w_map, c_map, out, stream);
      }
      return;
    }
  }
}

int stream_k_resident_clusters() { return resident_clusters<Step6StreamKCluster>(); }

}  // namespace kc::ch07::detail
