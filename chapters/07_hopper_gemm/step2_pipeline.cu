// Step 2: a bigger tile and a pipeline, so the copy engine works while the tensor cores do.
//
// What changed from step 1:
//   - The tile grows to 128 × 128 on two warpgroups (each multiplies 64 rows by all 128 columns): every
//     byte of W brought into shared memory now feeds 128 rows of A, twice step 1's reuse.
//   - Seven buffers ("stages") of 32 KiB instead of one. Thread 0 fills all of them up front; after
//     that, the moment a stage has been read it is refilled with the slice seven ahead, so the loads
//     for the next stages are in flight while this one is multiplied.
//   - Two mbarriers per stage instead of a __syncthreads:
//       full[s]   "stage s holds its data": thread 0's expect_tx plus TMA's bytes complete it;
//       empty[s]  "stage s has been read": each of the 8 consumer warps arrives once its wgmma are done.
//     A stage is used once per round of seven slices; round r waits for phase parity r & 1.
// What stays slow: thread 0 is also a consumer. When it must refill a stage it waits on empty[s],
// i.e. for the slower warpgroup, and its own warpgroup stops issuing wgmma meanwhile. Step 3 hands
// the loads to warps that do nothing else.
#include "hopper_ptx.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"

namespace kc::ch07::detail {

namespace {

constexpr TileConfig kTile = kStep2Tile;  // 128 × 128, two warpgroups, 7 stages
constexpr int kConsumerWarps = kTile.consumer_warpgroups * kWarpgroupThreads / 32;

__global__ void __launch_bounds__(kTile.threads())
    step2_pipeline_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                          const Output out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  // Stage s: A box [128][64] then W box [128][64], 32 KiB, 1024-byte aligned; the barriers after all stages.
  auto stage = [smem](int s) { return smem + s * kTile.stage_bytes(); };
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kTile.stages * kTile.stage_bytes());
  std::uint64_t* empty = full + kTile.stages;

  const TileOrigin tile = tile_origin(static_cast<int>(blockIdx.x), out.tiles_n, kTile.block_m, kTile.block_n);
  const int k_tiles = (out.k + kBlockK - 1) / kBlockK;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const bool lane0 = threadIdx.x % 32 == 0;

  auto load_slice = [&](int kt) {  // thread 0 only
    const int s = kt % kTile.stages;
    ptx::mbarrier_arrive_expect_tx(&full[s], kTile.stage_bytes());
    ptx::tma_load_2d(stage(s), &a_map, &full[s], kt * kBlockK, tile.m0);
    ptx::tma_load_2d(stage(s) + kTile.a_box_bytes(), &w_map, &full[s], kt * kBlockK, tile.n0);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kTile.stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
    for (int kt = 0; kt < kTile.stages && kt < k_tiles; ++kt) load_slice(kt);  // fill the pipeline
  }
  __syncthreads();

  float acc[kTile.block_n / 2] = {};  // this thread's share of its warpgroup's 64 × 128 rows
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kTile.stages;
    const auto round_parity = static_cast<std::uint32_t>((kt / kTile.stages) & 1);
    ptx::mbarrier_wait(&full[s], round_parity);

    // This warpgroup's 64 rows of the A box start 64 rows × 128 bytes = 8 KiB in.
    const std::uint64_t a_desc = ptx::descriptor_of(stage(s) + warpgroup * 64 * 128);
    const std::uint64_t w_desc = ptx::descriptor_of(stage(s) + kTile.a_box_bytes());
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) ptx::wgmma_m64n128k16(acc, a_desc + 2 * kk, w_desc + 2 * kk);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    if (lane0) ptx::mbarrier_arrive(&empty[s]);  // this warp no longer reads stage s

    // Refill stage s with the slice one round ahead once all 8 warps have read it.
    if (threadIdx.x == 0 && kt + kTile.stages < k_tiles) {
      ptx::mbarrier_wait(&empty[s], round_parity);
      load_slice(kt + kTile.stages);
    }
  }
  ptx::fence_accumulators(acc);
  ptx::store_accumulators(acc, out, tile.m0 + 64 * warpgroup, tile.n0);
}

}  // namespace

void launch_step2(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream) {
  cached_per_device([](int) {  // 225 KiB: above 48 KiB a kernel must opt in to its dynamic shared memory
    check(cudaFuncSetAttribute(step2_pipeline_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kTile.smem_bytes())));
    return true;
  });
  step2_pipeline_kernel<<<tiles, kTile.threads(), kTile.smem_bytes(), stream>>>(a_map, w_map, out);
  check_launch();
}

}  // namespace kc::ch07::detail
