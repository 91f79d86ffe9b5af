// Step 4: a persistent grid. One block per SM, each looping over many tiles in a grouped order.
//
// What changed from step 3:
//   - The grid. Step 3 launches one block per tile; each block pays a prologue (the first TMA round
//     trip with the tensor cores idle) and an epilogue (storing 128 × 256 outputs with the tensor
//     cores idle), and the next block on that SM cannot start until this one has left. Step 4
//     launches one block per SM (the count is queried once per device) and each block walks tiles
//     blockIdx.x, blockIdx.x + gridDim.x, ... (a static round-robin, Chapter 6's first scheduler).
//   - The pipeline does not restart at a tile boundary. Producer and consumers each keep one
//     PipelineState (stage, phase) for the whole kernel. When the consumers finish the k-loop of tile
//     t they release its last stage and start storing; the producer, already past the end of tile t,
//     is filling stages with tile t + 1's first slices meanwhile. By the time the stores are issued,
//     up to four slices of the next tile are waiting: the prologue is hidden behind the epilogue.
//   - The order. Tiles are taken in Chapter 5's grouped order (ch05::grouped_tile, bands
//     of 16 m-tiles walked column by column), so the ~132 tiles in flight read about 16 rows of A tiles
//     and 8 columns of W tiles, not 4 rows of A and every column of W (Chapter 5's idea): at 8192³
//     that is ≈ 68 MB of distinct operands per wave instead of ≈ 143 MB, against a 60 MB L2.
//   - scale-d = 0. The first wgmma of each tile ignores the accumulators' old value (the tile before's
//     results), so they need no zeroing between tiles: 128 register moves per tile saved, and no
//     ordinary instruction writes the accumulators between wgmma (which ptxas would answer with
//     serialised wgmma, warning C7515).
// What stays: the consumers still store straight from registers while their tensor cores idle (only
// the producer overlaps), and every block reads its whole W tile from L2 by itself. Step 5 shares W
// between two SMs.
#include "hopper_ptx.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"

namespace kc::ch07::detail {

namespace {

constexpr TileConfig kTile = kStep4Tile;  // step 3's: 128 × 256, producer + two consumers, 4 stages
constexpr int kConsumerWarps = kTile.consumer_warpgroups * kWarpgroupThreads / 32;
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
static_assert(kWarpgroupThreads * (kProducerRegisters + kTile.consumer_warpgroups * kConsumerRegisters) <=
                  65536 / kTile.threads() / 8 * 8 * kTile.threads(),
              "setmaxnreg moves registers between warpgroups; it cannot create them");

__global__ void __launch_bounds__(kTile.threads(), 1)
    step4_persistent_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                            const Output out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  auto stage = [smem](int s) { return smem + s * kTile.stage_bytes(); };
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kTile.stages * kTile.stage_bytes());
  std::uint64_t* empty = full + kTile.stages;

  const int k_tiles = (out.k + kBlockK - 1) / kBlockK;
  const std::int64_t tiles = static_cast<std::int64_t>(out.tiles_m) * out.tiles_n;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  // Both roles walk the same tiles in the same order. 64-bit: tile + gridDim.x must not overflow.
  auto origin_of = [&out](std::int64_t tile) {
    const TileCoord c = ch05::grouped_tile(static_cast<int>(tile), out.tiles_m, out.tiles_n, kGroupM);
    return TileOrigin{c.m_tile * kTile.block_m, c.n_tile * kTile.block_n};
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kTile.stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ------------------------------------------------------------------------------------- producer
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      PipelineState p;
      for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileOrigin at = origin_of(tile);
        for (int kt = 0; kt < k_tiles; ++kt, p.advance(kTile.stages)) {
          // Once round the ring, a stage is reused: wait until the consumers released its last round
          // (the previous parity). The last round may belong to the tile before: that is the point.
          if (p.wrapped) ptx::mbarrier_wait(&empty[p.stage], p.phase ^ 1u);
          ptx::mbarrier_arrive_expect_tx(&full[p.stage], kTile.stage_bytes());
          ptx::tma_load_2d(stage(p.stage), &a_map, &full[p.stage], kt * kBlockK, at.m0);
          ptx::tma_load_2d(stage(p.stage) + kTile.a_box_bytes(), &w_map, &full[p.stage], kt * kBlockK, at.n0);
        }
      }
    }
  } else {
    // ------------------------------------------------------------------------------------ consumers
    ptx::setmaxnreg_inc<kConsumerRegisters>();
    const int consumer = warpgroup - 1;  // rows 64·consumer .. 64·consumer + 63 of each tile
    const bool lane0 = threadIdx.x % 32 == 0;
    float acc[kTile.block_n / 2];  // no zeroing: each tile's first wgmma has scale-d = 0
    PipelineState c;
    int previous_stage = 0;  // the stage of the slice before, released one slice late
    for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const TileOrigin at = origin_of(tile);
      for (int kt = 0; kt < k_tiles; ++kt, c.advance(kTile.stages)) {
        ptx::mbarrier_wait(&full[c.stage], c.phase);
        const std::uint64_t a_desc = ptx::descriptor_of(stage(c.stage) + consumer * 64 * 128);
        const std::uint64_t w_desc = ptx::descriptor_of(stage(c.stage) + kTile.a_box_bytes());
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockK / 16; ++kk) {
          // scale-d = 0 on the tile's very first k16: D = A·B, whatever the registers held.
          ptx::wgmma_m64n256k16(acc, a_desc + 2 * kk, w_desc + 2 * kk, kt > 0 || kk > 0 ? 1 : 0);
        }
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<1>();
        if (kt > 0 && lane0) ptx::mbarrier_arrive(&empty[previous_stage]);
        previous_stage = c.stage;
      }
      // Every group of this tile done: release its last stage now, before the stores, so the producer
      // can refill it with the next tile's slices while these registers go out to C.
      ptx::wgmma_wait_group<0>();
      if (lane0) ptx::mbarrier_arrive(&empty[previous_stage]);
      ptx::fence_accumulators(acc);
      ptx::store_accumulators(acc, out, at.m0 + 64 * consumer, at.n0);
    }
  }
}

}  // namespace

void launch_step4(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream) {
  // Once per device (never inside a graph capture after the first call): the shared-memory opt-in and
  // the SM count, which sizes the grid.
  const int sms = cached_per_device([](int device) {
    check(cudaFuncSetAttribute(step4_persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kTile.smem_bytes())));
    int count = 0;
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  });
  step4_persistent_kernel<<<persistent_grid(tiles, sms), kTile.threads(), kTile.smem_bytes(), stream>>>(a_map, w_map,
                                                                                                        out);
  check_launch();
}

}  // namespace kc::ch07::detail
