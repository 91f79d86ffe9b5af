// Chapter 2's bf16 GEMM on tensor cores, host side: picks the tile, validates, and launches
// gemm_bf16_kernel (gemm_bf16_kernel.cuh) with a plain store (gemm_bf16_store.cuh). The tile's
// mma.sync pipeline is explained in gemm_bf16_mainloop.cuh.
#include <string>
#include <type_traits>

#include "gemm_bf16.hpp"
#include "gemm_bf16_kernel.cuh"
#include "gemm_bf16_store.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"
#include "kc/validate.hpp"

namespace kc::ch02 {

namespace {

using namespace block;  // the tile configurations, the stores and the kernel

std::int64_t ceil_div(std::int64_t x, std::int64_t y) { return (x + y - 1) / y; }

// The large tile stores C through shared memory, a warp writing whole 256-byte rows (measured
// faster there than the store from registers); the other tiles store from registers.
template <class Cfg>
inline constexpr bool kStagedStore = Cfg::block_n == LargeTile4::block_n;

// Queries the current device and raises the kernels' shared-memory limits the first time it is
// seen; afterwards only reads the cache (no CUDA call but cudaGetDevice), so captured launches
// stay cheap and legal.
DeviceLimits current_device_limits() {
  return cached_per_device([](int device) {
    const DeviceLimits limits = query_device_limits(device);
    for_each_tile_config([&](auto cfg) {
      using Cfg = decltype(cfg);
      using Store = std::conditional_t<kStagedStore<Cfg>, StagedStore, NoEpilogue>;
      allow_shared_memory<Cfg, Store>(Cfg::smem_bytes, limits.smem_per_block_optin);
    });
    return limits;
  });
}

template <class Cfg>
GemmBf16TileInfo info_of(std::size_t smem_per_block_optin) {
  GemmBf16TileInfo info;
  info.block_m = Cfg::block_m;
  info.block_n = Cfg::block_n;
  info.block_k = kBlockK;
  info.warps = Cfg::warps;
  info.stages = Cfg::stages;
  info.smem_bytes = static_cast<std::size_t>(Cfg::smem_bytes);
  info.fits = info.smem_bytes <= smem_per_block_optin;
  return info;
}

}  // namespace

const char* to_string(GemmBf16Tile tile) {
  switch (tile) {
    case GemmBf16Tile::large: return "large";
    case GemmBf16Tile::medium: return "medium";
    case GemmBf16Tile::small: return "small";
    case GemmBf16Tile::narrow: return "narrow";
    case GemmBf16Tile::small_deep: return "small_deep";
    case GemmBf16Tile::narrow_deep: return "narrow_deep";
  }
  return "unknown";
}

GemmBf16TileInfo gemm_bf16_tile_info(GemmBf16Tile tile, std::size_t smem_per_block_optin) {
  const auto t = static_cast<int>(tile);
  if (t < 0 || t > static_cast<int>(GemmBf16Tile::narrow_deep)) {
    throw InvalidArgument("tile (" + std::to_string(t) + ") is not a GemmBf16Tile");
  }
  GemmBf16TileInfo info;
  with_tile_config(tile, smem_per_block_optin, [&](auto cfg) { info = info_of<decltype(cfg)>(smem_per_block_optin); });
  return info;
}

GemmBf16Tile choose_gemm_bf16_tile(GemmShape shape, int sm_count, std::size_t smem_per_block_optin) {
  validate_gemm_shape(shape);
  if (sm_count < 1) throw InvalidArgument("sm_count (" + std::to_string(sm_count) + ") must be >= 1");
  auto blocks = [&](GemmBf16Tile tile) {
    const GemmBf16TileInfo info = gemm_bf16_tile_info(tile, smem_per_block_optin);
    return ceil_div(shape.m, info.block_m) * ceil_div(shape.n, info.block_n);
  };
  auto fits = [&](GemmBf16Tile tile) { return gemm_bf16_tile_info(tile, smem_per_block_optin).fits; };
  // A small or narrow grid of at most one block per SM is a single wave: the deep version of the
  // tile, where the GPU has its shared memory, keeps twice the bytes in flight.
  auto single_wave = [&](GemmBf16Tile tile, GemmBf16Tile deep) {
    return blocks(tile) <= sm_count && fits(deep) ? deep : tile;
  };
  // Largest first: bigger tiles reuse each loaded byte more (compute-bound shapes), smaller ones
  // spread a small problem over more SMs (memory-bound shapes, such as M = 128 in the MoE chapters).
  for (GemmBf16Tile tile : {GemmBf16Tile::large, GemmBf16Tile::medium}) {
    if (fits(tile) && blocks(tile) >= sm_count) return tile;
  }
  // Nothing larger fills the GPU. The narrow tile doubles the small tile's blocks but reads more
  // shared memory per mma: worth it only when the small tile would leave more than half the SMs
  // idle (M = 16, N = 4096: 64 blocks for 132 SMs), not at M = 128 (128 blocks).
  if (fits(GemmBf16Tile::small) && 2 * blocks(GemmBf16Tile::small) >= sm_count) {
    return single_wave(GemmBf16Tile::small, GemmBf16Tile::small_deep);
  }
  return single_wave(GemmBf16Tile::narrow, GemmBf16Tile::narrow_deep);  // 96 KiB: fits wherever small does
}

void validate_gemm_bf16_operands(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c,
                                 GemmShape shape, std::int64_t c_columns) {
  validate_gemm_shape(shape);
  if (shape.k % 8 != 0) {
    throw InvalidArgument("shape.k (" + std::to_string(shape.k) +
                          ") must be a multiple of 8 (16-byte rows for cp.async)");
  }
  // One block per tile, numbered in blockIdx.x: even the smallest tile must number below 2^31.
  const std::int64_t tiles = ceil_div(shape.m, kSmallestBlockM) * ceil_div(shape.n, kSmallestBlockN);
  if (tiles > 0x7FFFFFFF) {
    throw InvalidArgument("shape.m x shape.n (" + std::to_string(shape.m) + " x " + std::to_string(shape.n) +
                          ") must need at most 2^31 - 1 tiles of 64 x 32");
  }
  if (a == nullptr) throw InvalidArgument("a must not be null");
  if (w == nullptr) throw InvalidArgument("w must not be null");
  if (c == nullptr) throw InvalidArgument("c must not be null");
  if (!aligned_to(a, 16)) throw InvalidArgument("a must be 16-byte aligned (16-byte rows for cp.async)");
  if (!aligned_to(w, 16)) throw InvalidArgument("w must be 16-byte aligned (16-byte rows for cp.async)");
  if (!aligned_to(c, alignof(__nv_bfloat16))) throw InvalidArgument("c must be 2-byte aligned (the alignment of bf16)");
  const std::uint64_t bf16 = sizeof(__nv_bfloat16);
  const auto m = static_cast<std::uint64_t>(shape.m);
  const auto n = static_cast<std::uint64_t>(shape.n);
  const auto k = static_cast<std::uint64_t>(shape.k);
  const auto c_bytes = m * static_cast<std::uint64_t>(c_columns) * bf16;
  // Other blocks still read A and W while C is written: no in-place product.
  if (overlaps(c, c_bytes, a, m * k * bf16)) throw InvalidArgument("c must not overlap a");
  if (overlaps(c, c_bytes, w, n * k * bf16)) throw InvalidArgument("c must not overlap w");
}

void validate_gemm_bf16(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape) {
  validate_gemm_bf16_operands(a, w, c, shape, shape.n);
}

namespace {

// The launch path after validation: no allocation, no synchronisation.
void run(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, GemmBf16Tile tile,
         const DeviceLimits& limits, cudaStream_t stream) {
  const GemmBf16TileInfo info = gemm_bf16_tile_info(tile, limits.smem_per_block_optin);
  if (!info.fits) {
    throw InvalidArgument(std::string("tile ") + to_string(tile) + " needs " + std::to_string(info.smem_bytes) +
                          " bytes of shared memory per block; this GPU allows " +
                          std::to_string(limits.smem_per_block_optin));
  }
  // bf16x2 stores need 4-byte aligned pairs: N even and c itself 4-byte aligned.
  const bool paired = shape.n % 2 == 0 && aligned_to(c, 4);
  with_tile_config(tile, limits.smem_per_block_optin, [&](auto cfg) {
    using Cfg = decltype(cfg);
    if constexpr (kStagedStore<Cfg>) {
      launch_tiles<Cfg>(a, w, c, shape, paired, StagedStore::for_output(static_cast<int>(shape.n), c), Cfg::smem_bytes,
                        stream);
    } else {
      launch_tiles<Cfg>(a, w, c, shape, paired, NoEpilogue{}, Cfg::smem_bytes, stream);
    }
  });
  check_launch();
}

}  // namespace

void gemm_bf16(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, cudaStream_t stream) {
  validate_gemm_bf16(a, w, c, shape);
  const DeviceLimits limits = current_device_limits();
  run(a, w, c, shape, choose_gemm_bf16_tile(shape, limits.sm_count, limits.smem_per_block_optin), limits, stream);
}

void gemm_bf16_with_tile(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                         GemmBf16Tile tile, cudaStream_t stream) {
  validate_gemm_bf16(a, w, c, shape);
  run(a, w, c, shape, tile, current_device_limits(), stream);
}

}  // namespace kc::ch02
