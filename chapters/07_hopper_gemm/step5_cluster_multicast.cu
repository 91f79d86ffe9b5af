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
// What stays: the epilogue still stores from registers while the tensor cores idle (a TMA-store
// epilogue through shared memory, or two consumer warpgroups on alternating tiles, would overlap it).
#include "hopper_ptx.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"

namespace kc::ch07::detail {

namespace {

constexpr TileConfig kTile = kStep5Tile;  // 128 × 256 per CTA, 2 CTAs per cluster along M, 4 stages
constexpr int kConsumerWarps = kTile.consumer_warpgroups * kWarpgroupThreads / 32;
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr std::uint16_t kAllCtas = (1u << kTile.cluster_m) - 1;  // multicast mask: every CTA of the cluster
static_assert(kWarpgroupThreads * (kProducerRegisters + kTile.consumer_warpgroups * kConsumerRegisters) <=
                  65536 / kTile.threads() / 8 * 8 * kTile.threads(),
              "setmaxnreg moves registers between warpgroups; it cannot create them");

__global__ void __launch_bounds__(kTile.threads(), 1)
    step5_cluster_multicast_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                                   const Output out) {
  extern __shared__ unsigned char smem_raw[];
  // The same layout in both CTAs (same kernel, same dynamic shared memory): a multicast writes one
  // offset in each, so the aligned base must be the same offset too. It is: the runtime places
  // dynamic shared memory identically in every CTA of a launch.
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  auto stage = [smem](int s) { return smem + s * kTile.stage_bytes(); };
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kTile.stages * kTile.stage_bytes());
  std::uint64_t* empty = full + kTile.stages;

  const int rank = ptx::cluster_rank();                                          // 0: upper 128 rows, 1: lower
  const auto cluster = static_cast<std::int64_t>(blockIdx.x) / kTile.cluster_m;  // clusters are consecutive
  const std::int64_t clusters = gridDim.x / kTile.cluster_m;
  const std::int64_t cluster_tiles = cluster_tile_count(out.tiles_m, out.tiles_n, kTile.cluster_m);
  const int k_tiles = (out.k + kBlockK - 1) / kBlockK;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  // Both CTAs of a cluster walk the same cluster tiles, so they pass through the same number of
  // slices and their barriers' rounds stay in step.
  //
  // A member tile past the last m-tile has no rows of C (rank 1 in the last row of an odd tiles_m);
  // its origin is kept at row 0 so that no arithmetic on it can overflow.
  struct MemberTile {
    TileOrigin at;
    bool has_rows;
  };
  auto tile_of = [&out, rank](std::int64_t cluster_tile) {
    const TileCoord c =
        cluster_member_tile(static_cast<int>(cluster_tile), rank, out.tiles_m, out.tiles_n, kGroupM, kTile.cluster_m);
    const bool has_rows = c.m_tile < out.tiles_m;
    return MemberTile{{has_rows ? c.m_tile * kTile.block_m : 0, c.n_tile * kTile.block_n}, has_rows};
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kTile.stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);  // this CTA's producer's expect_tx; the bytes come from both
      ptx::mbarrier_init(&empty[s], kConsumerWarps * kTile.cluster_m);  // every consumer warp of the cluster
    }
    ptx::fence_mbarrier_init();  // release at cluster scope: the peer may use them next
  }
  ptx::cluster_sync();  // both CTAs' barriers exist before anyone multicasts or arrives remotely

  if (warpgroup == 0) {
    // ------------------------------------------------------------------------------------- producer
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      PipelineState p;
      for (std::int64_t ct = cluster; ct < cluster_tiles; ct += clusters) {
        const MemberTile t = tile_of(ct);
        const bool own_w_slice = w_slice_in_matrix(kTile, rank, t.at.n0, out.n);
        const int w_row = own_w_slice ? t.at.n0 + rank * kTile.w_box_rows() : 0;  // this CTA's half of W
        const int bytes = cluster_stage_bytes(kTile, t.has_rows, t.at.n0, out.n);
        for (int kt = 0; kt < k_tiles; ++kt, p.advance(kTile.stages)) {
          // The refill writes into both CTAs: wait until both CTAs' consumers released the stage.
          if (p.wrapped) ptx::mbarrier_wait(&empty[p.stage], p.phase ^ 1u);
          ptx::mbarrier_arrive_expect_tx(&full[p.stage], static_cast<std::uint32_t>(bytes));
          if (t.has_rows) ptx::tma_load_2d(stage(p.stage), &a_map, &full[p.stage], kt * kBlockK, t.at.m0);
          if (own_w_slice) {
            ptx::tma_load_2d_multicast(stage(p.stage) + kTile.a_box_bytes() + rank * kTile.w_box_bytes(), &w_map,
                                       &full[p.stage], kt * kBlockK, w_row, kAllCtas);
          }
        }
      }
    }
  } else {
    // ------------------------------------------------------------------------------------ consumers
    ptx::setmaxnreg_inc<kConsumerRegisters>();
    const int consumer = warpgroup - 1;  // rows 64·consumer .. 64·consumer + 63 of each tile
    const bool lane0 = threadIdx.x % 32 == 0;
    // A consumer warp is done with a stage: tell the empty barrier of every CTA that wrote into it.
    auto release = [empty, lane0](int s) {
      if (!lane0) return;
      for (int cta = 0; cta < kTile.cluster_m; ++cta) ptx::mbarrier_arrive_cluster(&empty[s], cta);
    };
    float acc[kTile.block_n / 2];  // no zeroing: each tile's first wgmma has scale-d = 0
    PipelineState c;
    int previous_stage = 0;
    for (std::int64_t ct = cluster; ct < cluster_tiles; ct += clusters) {
      const MemberTile t = tile_of(ct);
      for (int kt = 0; kt < k_tiles; ++kt, c.advance(kTile.stages)) {
        ptx::mbarrier_wait(&full[c.stage], c.phase);
        if (t.has_rows) {
          const std::uint64_t a_desc = ptx::descriptor_of(stage(c.stage) + consumer * 64 * 128);
          const std::uint64_t w_desc = ptx::descriptor_of(stage(c.stage) + kTile.a_box_bytes());
          ptx::wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kBlockK / 16; ++kk) {
            ptx::wgmma_m64n256k16(acc, a_desc + 2 * kk, w_desc + 2 * kk, kt > 0 || kk > 0 ? 1 : 0);
          }
          ptx::wgmma_commit_group();
        }
        ptx::wgmma_wait_group<1>();
        if (kt > 0) release(previous_stage);
        previous_stage = c.stage;
      }
      ptx::wgmma_wait_group<0>();
      release(previous_stage);
      if (t.has_rows) {
        ptx::fence_accumulators(acc);
        ptx::store_accumulators(acc, out, t.at.m0 + 64 * consumer, t.at.n0);
      }
    }
  }
  // Every thread of both CTAs, whatever its role: the last remote arrivals on this CTA's barriers
  // happen before either CTA leaves.
  ptx::cluster_sync();
}

// Once per device (never inside a graph capture after the first call): the shared-memory opt-in, and
// how many clusters of this kernel the GPU holds at once, which sizes the grid. Clusters must fit in
// one GPC, so this can be less than SMs / 2 (an odd SM left over in a GPC stays idle).
int resident_clusters(const cudaLaunchConfig_t& config) {
  return cached_per_device([&config](int device) {
    check(cudaFuncSetAttribute(step5_cluster_multicast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kTile.smem_bytes())));
    int clusters = 0;
    check(cudaOccupancyMaxActiveClusters(&clusters, step5_cluster_multicast_kernel, &config));
    if (clusters < 1) {  // no answer: fall back to pairs of SMs (the grid stays correct, only less resident)
      int sms = 0;
      check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      clusters = sms / kTile.cluster_m;
    }
    return clusters;
  });
}

}  // namespace

void launch_step5(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int /*tiles*/,
                  cudaStream_t stream) {
  cudaLaunchAttribute cluster_dims{};
  cluster_dims.id = cudaLaunchAttributeClusterDimension;
  cluster_dims.val.clusterDim.x = kTile.cluster_m;  // pairs of consecutive blockIdx.x
  cluster_dims.val.clusterDim.y = 1;
  cluster_dims.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kTile.cluster_m);  // one cluster for the occupancy query; the real grid below
  config.blockDim = dim3(kTile.threads());
  config.dynamicSmemBytes = kTile.smem_bytes();
  config.stream = stream;
  config.attrs = &cluster_dims;
  config.numAttrs = 1;
  config.gridDim =
      dim3(static_cast<unsigned>(cluster_grid(out.tiles_m, out.tiles_n, kTile.cluster_m, resident_clusters(config))));
  check(cudaLaunchKernelEx(&config, step5_cluster_multicast_kernel, a_map, w_map, out));
  check_launch();
}

}  // namespace kc::ch07::detail
