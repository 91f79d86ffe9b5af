// EXERCISE: step 1 with its main loop removed. Fill in the four TODOs; the chapter's tests
// (ctest --preset exercises -L ch07, on an sm_90 GPU) say when it is right: the step 1 cases of
// HopperGemmGpu, RandomShapes, OddOutputOffsetUsesElementStores and GraphCapturableAndRepeatable.
// Hints are in README.md, Exercises. Until TODOs 1 and 2 are both done, the kernel must not wait on
// the barrier (a wait for bytes nobody sent never returns): the skeleton as given stores zeros, and the
// tests fail without hanging.
//
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
  [[maybe_unused]] auto* a_tile = reinterpret_cast<__nv_bfloat16*>(smem);  // [64 rows][64 k], swizzled
  [[maybe_unused]] auto* w_tile =
      reinterpret_cast<__nv_bfloat16*>(smem + kTile.a_box_bytes());  // [128 rows][64 k], swizzled
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kTile.stage_bytes());

  [[maybe_unused]] const TileOrigin tile =
      tile_origin(static_cast<int>(blockIdx.x), out.tiles_n, kTile.block_m, kTile.block_n);
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(full, 1);  // one arrival (thread 0's expect_tx) plus the bytes
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  float acc[kTile.block_n / 2] = {};  // this thread's share of the 64 × 128 fp32 tile
  [[maybe_unused]] const std::uint64_t a_desc = ptx::descriptor_of(a_tile), w_desc = ptx::descriptor_of(w_tile);
  const int k_tiles = (out.k + kBlockK - 1) / kBlockK;
  for (int kt = 0; kt < k_tiles; ++kt) {
    // TODO 1: thread 0 tells the barrier how many bytes this round brings (the whole stage, zero-filled
    // edges included) and asks TMA for the A box at (column kt · 64, row tile.m0) into a_tile and the
    // W box at (kt · 64, tile.n0) into w_tile, both completing on `full`.

    // TODO 2: every thread waits until this round's bytes have landed. Which parity is round kt of
    // a barrier that completes once per round?

    // TODO 3: the warpgroup multiplies the 64 k of this stage: a fence, one wgmma m64n128k16 per
    // k16 slice (the next slice starts 32 bytes further along each 128-byte row: what does that add
    // to a descriptor?), a commit, and a wait until the group is done.

    // TODO 4: before thread 0 lets TMA overwrite the tiles in the next round, every warp must have
    // finished reading them.
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
