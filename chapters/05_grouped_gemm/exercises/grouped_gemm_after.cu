// EXERCISE: grouped_gemm_after.cu with its key lines replaced by TODOs. Fill them in here.
// Generated from ../grouped_gemm_after.cu by tools/exercises.py (do not edit the solution's copy).
// Build and test this file in place of the solution:
//   cmake --preset exercises && cmake --build --preset exercises && ctest --preset exercises -L ch05
// Until every TODO is done the chapter's tests fail; the lesson (README.md) explains the solution.

// After: every expert's GEMM in one launch. Two kernels run back to back on the stream:
//
//   1. tile_prefix_kernel (one block): m-tiles of each expert from the device offsets, and their
//      exclusive prefix over experts, into the caller's workspace. A few microseconds at most.
//   2. grouped_gemm_kernel: a grid sized for the most m-tiles any group sizes could need
//      (max_m_tiles in tile_map.hpp) times the n-tiles. Block b maps its id to a tile in the chosen
//      order (row-major or grouped), finds the expert owning that m-tile by binary search over the
//      prefix, and hands Chapter 2's block tile that expert's rows of A and C and its W. Blocks past
//      the real tile count exit before touching shared memory.
//
// The chapter's `after` runs grouped_gemm_kernel on Chapter 2's 128 × 256 tile (GroupedTile::
// wide_128x256, C stored through shared memory); the square 128 × 128 tile (C from registers) is
// the lesson's step and the tile that fits every GPU.
//
// Why not read the sizes on the host and launch the exact grid? Because that needs a device → host
// copy and a synchronisation before every MoE layer: the GPU drains, and the launch cannot be
// captured in a CUDA graph. The bound costs surplus blocks that exit at once (at most E · (BM-1) /
// BM m-tiles' worth: 254 × 32 blocks for 256 experts of 128 rows, a few µs against milliseconds).
#include <string>

#include "gemm_bf16_mainloop.cuh"
#include "gemm_bf16_store.cuh"
#include "grouped_gemm.hpp"
#include "kc/check.hpp"
#include "kc/device_info.hpp"
#include "scan.cuh"
#include "tile_map.hpp"

namespace kc::ch05 {

namespace {

using ch02::block::LargeTile3;
using ch02::block::LargeTile4;
using ch02::block::MediumTile3;
using ch02::block::MediumTile4;
using ch02::block::NoEpilogue;
using ch02::block::StagedStore;

static_assert(MediumTile4::block_m == kBlockM && MediumTile4::block_n == kBlockN, "the chapter's tile is 128 x 128");
static_assert(MediumTile3::block_m == kBlockM && MediumTile3::block_n == kBlockN, "the chapter's tile is 128 x 128");
static_assert(LargeTile4::block_m == kBlockM && LargeTile4::block_n == block_n_of(GroupedTile::wide_128x256),
              "the wide tile is 128 x 256");
static_assert(LargeTile3::block_m == kBlockM && LargeTile3::block_n == block_n_of(GroupedTile::wide_128x256),
              "the wide tile is 128 x 256");

// tile_prefix[0] = 0, tile_prefix[e + 1] = m-tiles of experts 0..e: tile_prefix_of() on the device.
__global__ void __launch_bounds__(detail::kScanThreads)
    tile_prefix_kernel(const std::int32_t* __restrict__ offsets, int experts, int m_total, int block_m,
                       std::int32_t* __restrict__ tile_prefix) {
  const int e = static_cast<int>(threadIdx.x);
  int tiles = 0;
  if (e < experts) {
    int begin = 0, end = 0;
    expert_rows(offsets, e, m_total, begin, end);
    tiles = m_tiles_of(end - begin, block_m);
  }
  const int inclusive = detail::block_inclusive_scan(tiles);
  if (e < experts) tile_prefix[e + 1] = inclusive;
  if (e == 0) tile_prefix[0] = 0;
}

// One block per tile of C (and surplus blocks that exit): see the top of the file. Store is
// NoEpilogue (C from registers) or StagedStore (C through shared memory): StoreOf<Cfg>.
template <class Cfg, class Store>
__global__ void __launch_bounds__(Cfg::threads)
    grouped_gemm_kernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w,
                        __nv_bfloat16* __restrict__ c, const std::int32_t* __restrict__ offsets,
                        const std::int32_t* __restrict__ tile_prefix, int experts, int m_total, int n, int k,
                        int tiles_n, TileOrder order, int group_m, bool paired, Store store) {
  const int m_tiles = tile_prefix[experts];  // the real m-tile count, known only on the device
  const int tile = static_cast<int>(blockIdx.x);
  if (static_cast<std::int64_t>(tile) >= static_cast<std::int64_t>(m_tiles) * tiles_n) return;  // surplus
  // TODO 3: Map the block's id to its tile of C in `order` (tile_in_order), then find the
  // expert, first row and rows left of that tile's global m-tile (locate).
  const TileCoord coord{};
  const TileRows rows{};
  const int col0 = coord.n_tile * Cfg::block_n;
  // TODO 4: Point at the expert's weights: W is [E, N, K], and expert e's N × K slice starts
  // e · N · K elements in (in 64-bit arithmetic: 256 experts of 4096 × 7168 pass 2^31).
  const __nv_bfloat16* w_expert = w;
  ch02::block::gemm_bf16_block<Cfg>(a, w_expert, c, n, k, rows.row0, col0, rows.rows_left, n - col0, paired, store);
}

// --------------------------------------------------------------------------------------- host side

// How each tile stores C, as Chapter 2 stores the same tile: the wide (large) tile through shared
// memory, the square (medium) tile from registers, where the staged store measured no faster.
template <class Cfg>
auto store_for(int n, const __nv_bfloat16* c) {
  if constexpr (Cfg::block_n == 256) {
    return StagedStore::for_output(n, c);
  } else {
    return NoEpilogue{};
  }
}

template <class Cfg>
using StoreOf = decltype(store_for<Cfg>(0, nullptr));

struct DeviceLimits {
  std::size_t smem_per_block_optin = 0;
};

template <class Cfg>
void allow_dynamic_shared_memory(std::size_t smem_per_block_optin) {
  if (static_cast<std::size_t>(Cfg::smem_bytes) > smem_per_block_optin) return;  // never launched here
  // The staged store needs no more shared memory than the pipeline's (it reuses its buffers).
  const auto kernel = grouped_gemm_kernel<Cfg, StoreOf<Cfg>>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

// Queried once per device; later calls only read the cache (no attribute calls inside a capture).
DeviceLimits current_device_limits() {
  return cached_per_device([](int device) {
    DeviceLimits limits;
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    limits.smem_per_block_optin = static_cast<std::size_t>(optin);
    allow_dynamic_shared_memory<MediumTile4>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<MediumTile3>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<LargeTile4>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<LargeTile3>(limits.smem_per_block_optin);
    return limits;
  });
}

template <class Cfg>
void launch_gemm(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                 const std::int32_t* offsets, const std::int32_t* tile_prefix, const GroupedGemmOptions& options,
                 bool paired, cudaStream_t stream) {
  // <= the square tile's bound <= 2^31 - 1 (validated)
  const auto blocks = static_cast<unsigned>(grouped_gemm_grid_blocks(shape, options.tile));
  const int tiles_n = ceil_div_int(static_cast<int>(shape.n), Cfg::block_n);
  const StoreOf<Cfg> store = store_for<Cfg>(static_cast<int>(shape.n), c);
  grouped_gemm_kernel<Cfg, StoreOf<Cfg>><<<blocks, Cfg::threads, Cfg::smem_bytes, stream>>>(
      a, w, c, offsets, tile_prefix, shape.experts, static_cast<int>(shape.m_total), static_cast<int>(shape.n),
      static_cast<int>(shape.k), tiles_n, options.order, options.group_m, paired, store);
}

// The tile's deepest pipeline that fits this GPU's shared memory per block.
enum class Pipeline { wide4, wide3, square4, square3 };

Pipeline pipeline_for(GroupedTile tile, const DeviceLimits& limits) {
  const auto fits = [&](int smem_bytes) { return static_cast<std::size_t>(smem_bytes) <= limits.smem_per_block_optin; };
  const std::string allows =
      "this GPU allows " + std::to_string(limits.smem_per_block_optin) + " bytes of shared memory per block; ";
  if (tile == GroupedTile::wide_128x256) {
    if (fits(LargeTile4::smem_bytes)) return Pipeline::wide4;
    if (fits(LargeTile3::smem_bytes)) return Pipeline::wide3;
    throw InvalidArgument("options.tile: " + allows + "the 128 x 256 tile needs " +
                          std::to_string(LargeTile3::smem_bytes) + " (GroupedTile::square_128x128 fits)");
  }
  if (fits(MediumTile4::smem_bytes)) return Pipeline::square4;
  if (fits(MediumTile3::smem_bytes)) return Pipeline::square3;
  throw InvalidArgument(allows + "the 128 x 128 tile needs " + std::to_string(MediumTile3::smem_bytes));
}

}  // namespace

bool grouped_tile_supported(GroupedTile tile) {
  const std::size_t optin = current_device_limits().smem_per_block_optin;
  const int smallest = tile == GroupedTile::wide_128x256 ? LargeTile3::smem_bytes : MediumTile3::smem_bytes;
  return static_cast<std::size_t>(smallest) <= optin;
}

void grouped_gemm(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                  const std::int32_t* offsets, void* workspace, std::size_t workspace_bytes,
                  const GroupedGemmOptions& options, cudaStream_t stream) {
  validate_grouped_gemm(shape, a, w, c, offsets);
  validate_grouped_gemm_options(shape, c, options, workspace, workspace_bytes);
  if (shape.m_total == 0) return;  // no rows: nothing to compute or write
  const Pipeline pipeline = pipeline_for(options.tile, current_device_limits());  // may throw: before any launch
  auto* tile_prefix = static_cast<std::int32_t*>(workspace);
  tile_prefix_kernel<<<1, detail::kScanThreads, 0, stream>>>(offsets, shape.experts, static_cast<int>(shape.m_total),
                                                             kBlockM, tile_prefix);
  check_launch();
  // bf16x2 stores need 4-byte aligned pairs: N even and c itself 4-byte aligned.
  const bool paired = shape.n % 2 == 0 && reinterpret_cast<std::uintptr_t>(c) % 4 == 0;
  switch (pipeline) {
    case Pipeline::wide4: launch_gemm<LargeTile4>(shape, a, w, c, offsets, tile_prefix, options, paired, stream); break;
    case Pipeline::wide3: launch_gemm<LargeTile3>(shape, a, w, c, offsets, tile_prefix, options, paired, stream); break;
    case Pipeline::square4:
      launch_gemm<MediumTile4>(shape, a, w, c, offsets, tile_prefix, options, paired, stream);
      break;
    case Pipeline::square3:
      launch_gemm<MediumTile3>(shape, a, w, c, offsets, tile_prefix, options, paired, stream);
      break;
  }
  check_launch();
}

}  // namespace kc::ch05
