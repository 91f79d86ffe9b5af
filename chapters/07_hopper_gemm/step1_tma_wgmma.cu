// Step 1: the three Hopper pieces, and nothing else.
//
//   TMA      one thread asks the copy engine for a 64 × 64 box of A and a 128 × 64 box of W; the
//            engine writes them into shared memory in the 128-byte swizzled layout and counts the
//            bytes on an mbarrier. No thread computes an address or issues a load per element.
//   mbarrier the 128 threads wait on it until all 24 KiB have landed (expect_tx told it how many).
//   wgmma    the four warps of the warpgroup issue one 64 × 128 × 16 multiply per k16 slice, with
//            both operands read by the tensor cores straight from shared memory (no ldmatrix, no
//            fragments in registers); only the 64 accumulators per thread live in registers.
//
// Against Chapter 2's mma.sync kernel this is slow on purpose: one buffer, so the copy engine and the
// tensor cores take turns (load, wait, multiply, wait, load, ...), and a 64-row tile that reads every
// W tile twice as often as a 128-row one. Step 2 fixes both.
#include "hopper_ptx.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"

namespace kc::ch07::detail {

namespace {

constexpr TileConfig kTile = kStep1Tile;  // 64 × 128, one warpgroup, one buffer

__global__ void __launch_bounds__(kTile.threads())
    step1_tma_wgmma_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                           const Output out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  auto* a_tile = reinterpret_cast<__nv_bfloat16*>(smem);                        // [64 rows][64 k], swizzled
  auto* w_tile = reinterpret_cast<__nv_bfloat16*>(smem + kTile.a_box_bytes());  // [128 rows][64 k], swizzled
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kTile.stage_bytes());

  // exercise 1: The tile of C this block computes: blocks are numbered row by row over tiles of
  // exercise 1: kTile.block_m × kTile.block_n, out.tiles_n to a row (tile_origin in hopper_tiles.hpp).
  // stub: const TileOrigin tile{0, 0};
  const TileOrigin tile = tile_origin(static_cast<int>(blockIdx.x), out.tiles_n, kTile.block_m, kTile.block_n);
  // end exercise 1
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(full, 1);  // one arrival (thread 0's expect_tx) plus the bytes
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  float acc[kTile.block_n / 2] = {};  // this thread's share of the 64 × 128 fp32 tile
  const std::uint64_t a_desc = ptx::descriptor_of(a_tile), w_desc = ptx::descriptor_of(w_tile);
  const int k_tiles = (out.k + kBlockK - 1) / kBlockK;
  for (int kt = 0; kt < k_tiles; ++kt) {
    // exercise 2: Thread 0 only: tell the barrier how many bytes this stage receives (the whole
    // exercise 2: boxes, zero-filled parts included), then ask TMA for A's box at (k, row) =
    // exercise 2: (kt · kBlockK, tile.m0) and W's at (kt · kBlockK, tile.n0). Do TODOs 2 and 3
    // exercise 2: together: a wait for bytes nobody asked for never returns.
    // stub: (void)a_map;
    // stub: (void)w_map;
    if (threadIdx.x == 0) {
      ptx::mbarrier_arrive_expect_tx(full, kTile.stage_bytes());
      ptx::tma_load_2d(a_tile, &a_map, full, kt * kBlockK, tile.m0);
      ptx::tma_load_2d(w_tile, &w_map, full, kt * kBlockK, tile.n0);
    }
    // end exercise 2
    // exercise 3: Every thread waits until the stage's bytes have landed. The single buffer's
    // exercise 3: barrier completes once per trip round the loop: which phase parity is trip kt?
    ptx::mbarrier_wait(full, kt & 1);  // round kt of the single buffer is phase kt
    // end exercise 3

    // exercise 4: Fence, then one wgmma_m64n128k16 per 16 of the stage's 64 K, then commit. A
    // exercise 4: descriptor counts in 16-byte units, and the next k16 slice of a 128-byte row starts
    // exercise 4: 32 bytes further.
    // stub: (void)a_desc;
    // stub: (void)w_desc;
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      // The next k16 slice starts 32 bytes further along each 128-byte row: +2 in the descriptor.
      ptx::wgmma_m64n128k16(acc, a_desc + 2 * kk, w_desc + 2 * kk);
    }
    ptx::wgmma_commit_group();
    // end exercise 4
    ptx::wgmma_wait_group<0>();
    // Every warp's wgmma has finished reading the tiles before thread 0 lets TMA overwrite them.
    __syncthreads();
  }
  ptx::fence_accumulators(acc);
  ptx::store_accumulators(acc, out, tile.m0, tile.n0);
}

}  // namespace

void launch_step1(const CUtensorMap& a_map, const CUtensorMap& w_map, const Output& out, int tiles,
                  cudaStream_t stream) {
  // 25 KiB is under the 48 KiB default; raising the limit anyway keeps the three launchers alike.
  cached_per_device([](int) {
    check(cudaFuncSetAttribute(step1_tma_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kTile.smem_bytes())));
    return true;
  });
  step1_tma_wgmma_kernel<<<tiles, kTile.threads(), kTile.smem_bytes(), stream>>>(a_map, w_map, out);
  check_launch();
}

}  // namespace kc::ch07::detail
