// Step 3: warp specialization. One warpgroup only loads, two only multiply.
//
// What changed from step 2:
//   - Roles. Warpgroup 0 is the producer: its thread 0 walks K, waits for a stage to be empty, and
//     asks TMA to fill it. Warpgroups 1 and 2 are consumers: they wait for a stage to be full, issue
//     wgmma, and release it. No thread does both, so a consumer never stops to wait for a refill, and
//     the producer runs up to four stages ahead of the slower consumer.
//   - Registers. The producer needs a few dozen registers, a consumer with a 64 × 256 fp32 tile needs
//     128 for the accumulators alone. All 384 threads start with the launch's share (65536 / 384 →
//     168); setmaxnreg then gives the producer's back (down to 40) and the consumers take them (up
//     to 232): 128 · 40 + 256 · 232 = 64512 <= 384 · 168. ptxas honours setmaxnreg only when it knows
//     the register count at entry; __launch_bounds__(384, 1) states it outright. When it cannot tell,
//     it warns C7508 and drops the instruction (a kernel with __launch_bounds__(384) alone can hit
//     it); our build turns that warning into an error.
//   - Tile 128 × 256 (each consumer runs m64n256k16): each byte of A in shared memory now feeds 256
//     columns, and each wgmma is twice as long for the same issue cost. 4 stages of 48 KiB.
//   - One wgmma group stays in flight: a consumer waits only for the group before the one it just
//     issued (wait_group 1) and releases that group's stage, so the tensor cores always have the
//     next group queued while the warps deal with barriers.
#include "hopper_ptx.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"

namespace kc::ch07::detail {

namespace {

constexpr TileConfig kTile = kStep3Tile;  // 128 × 256, producer + two consumers, 4 stages
constexpr int kConsumerWarps = kTile.consumer_warpgroups * kWarpgroupThreads / 32;
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
static_assert(kWarpgroupThreads * (kProducerRegisters + kTile.consumer_warpgroups * kConsumerRegisters) <=
                  65536 / kTile.threads() / 8 * 8 * kTile.threads(),
              "setmaxnreg moves registers between warpgroups; it cannot create them");

__global__ void __launch_bounds__(kTile.threads(), 1)
    step3_warp_specialized_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                                  const Output out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  // Stage s: A box [128][64] (16 KiB) then W box [256][64] (32 KiB); the barriers after all stages.
  auto stage = [smem](int s) { return smem + s * kTile.stage_bytes(); };
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kTile.stages * kTile.stage_bytes());
  std::uint64_t* empty = full + kTile.stages;

  const TileOrigin tile = tile_origin(static_cast<int>(blockIdx.x), out.tiles_n, kTile.block_m, kTile.block_n);
  const int k_tiles = (out.k + kBlockK - 1) / kBlockK;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kTile.stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: the producer's idle threads leave early

  if (warpgroup == 0) {
    // ------------------------------------------------------------------------------------- producer
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kTile.stages;
        // Round r >= 1 of stage s reuses it: wait until the consumers released round r - 1.
        if (kt >= kTile.stages) ptx::mbarrier_wait(&empty[s], static_cast<std::uint32_t>((kt / kTile.stages - 1) & 1));
        ptx::mbarrier_arrive_expect_tx(&full[s], kTile.stage_bytes());
        ptx::tma_load_2d(stage(s), &a_map, &full[s], kt * kBlockK, tile.m0);
        ptx::tma_load_2d(stage(s) + kTile.a_box_bytes(), &w_map, &full[s], kt * kBlockK, tile.n0);
      }
    }
  } else {
    // ------------------------------------------------------------------------------------ consumers
    ptx::setmaxnreg_inc<kConsumerRegisters>();
    const int consumer = warpgroup - 1;  // rows 64·consumer .. 64·consumer + 63 of the tile
    const bool lane0 = threadIdx.x % 32 == 0;
    float acc[kTile.block_n / 2] = {};  // 128 fp32: this thread's share of 64 × 256
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % kTile.stages;
      ptx::mbarrier_wait(&full[s], static_cast<std::uint32_t>((kt / kTile.stages) & 1));
      const std::uint64_t a_desc = ptx::descriptor_of(stage(s) + consumer * 64 * 128);
      const std::uint64_t w_desc = ptx::descriptor_of(stage(s) + kTile.a_box_bytes());
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) ptx::wgmma_m64n256k16(acc, a_desc + 2 * kk, w_desc + 2 * kk);
      ptx::wgmma_commit_group();
      // The group of slice kt - 1 is done once at most this one is pending: release its stage.
      ptx::wgmma_wait_group<1>();
      if (kt > 0 && lane0) ptx::mbarrier_arrive(&empty[(kt - 1) % kTile.stages]);
    }
    ptx::wgmma_wait_group<0>();
    ptx::fence_accumulators(acc);
    ptx::store_accumulators(acc, out, tile.m0 + 64 * consumer, tile.n0);
  }
}

}  // namespace

void launch_step3(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream) {
  cached_per_device([](int) {  // 193 KiB: above 48 KiB a kernel must opt in to its dynamic shared memory
    check(cudaFuncSetAttribute(step3_warp_specialized_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kTile.smem_bytes())));
    return true;
  });
  step3_warp_specialized_kernel<<<tiles, kTile.threads(), kTile.smem_bytes(), stream>>>(a_map, w_map, out);
  check_launch();
}

}  // namespace kc::ch07::detail
