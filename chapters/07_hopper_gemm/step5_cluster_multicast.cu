// Step 5: clusters of two CTAs that share each W tile through TMA multicast.
//
// What changed from step 4:
//   - Clusters. The launch (cudaLaunchKernelEx with a cluster-dimension attribute) groups CTAs in
//     pairs that the hardware schedules together on one GPC and that can reach each other's shared
//     memory. A pair takes a 256 × 256 cluster tile: rank 0 the upper 128 rows, rank 1 the lower, the
//     same 256 columns. Both need the same W tile.
//   - Multicast. Each CTA loads its own A box (128 rows, 16 KiB) and half of the W tile (128 rows,
//     16 KiB), and its half goes to both CTAs at once (cp.async.bulk.tensor ... .multicast::cluster
//     with CTA mask 0b11): the half lands at the same offset in both shared memories and counts bytes
//     on the full barrier at the same offset in both. Each CTA's full barrier still expects its whole
//     stage (48 KiB: its A box, its own W half, its peer's W half). Per CTA, L2 now delivers 32 KiB a
//     stage instead of 48: a third less L2 traffic for the same math.
//   - The empty barrier spans the cluster. A producer's W half goes into its peer's stage too, so it
//     may refill stage s only when the consumers of BOTH CTAs are done with it. Each consumer warp
//     therefore arrives on empty[s] in both CTAs (mapa + mbarrier.arrive.shared::cluster), and each
//     empty barrier counts 2 × 8 arrivals.
//   - Cluster barriers at start and end. No peer may multicast into a barrier before it is
//     initialised, and no CTA may exit while its peer can still arrive on its barriers: both ends of
//     the kernel are barrier.cluster.arrive + wait, by every thread.
//   - Odd tile counts. When M has an odd number of 128-row tiles, the last cluster row's rank 1 has
//     no rows of C. It still runs the protocol (its peer multicasts into it and waits for its
//     releases): it loads its W half and no A, waits for every stage, multiplies nothing, releases
//     every stage, stores nothing. Likewise, a W half that starts past the last row of W (N ends in
//     the tile's first half) is not loaded, and neither CTA expects its bytes (cluster_stage_bytes).
// What stays: the epilogue still stores from registers while the tensor cores idle; step 6 changes
// that. The kernel itself is in cluster_gemm_kernel.cuh, shared with step 6 (which differs only in
// its epilogue): cluster_gemm_kernel<Step5Cluster> is this step.
#include "cluster_gemm_kernel.cuh"

namespace kc::ch07::detail {

void launch_step5(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int /*tiles*/,
                  cudaStream_t stream) {
  launch_cluster_gemm<Step5Cluster>(a_map, w_map, CUtensorMap{} /* no C map: stores from registers */, out, stream);
}

}  // namespace kc::ch07::detail
