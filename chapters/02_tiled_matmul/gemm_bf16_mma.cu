// Chapter 2's bf16 GEMM on tensor cores: the kernel launches one block per tile of C and hands it
// to gemm_bf16_block (gemm_bf16_block.cuh, where the tile's mma.sync pipeline is explained); this
// file picks the tile, validates, and launches.
#include <string>
#include <type_traits>

#include "gemm_bf16.hpp"
#include "gemm_bf16_block.cuh"
#include "gemm_bf16_epilogue.hpp"
#include "kc/check.hpp"
#include "kc/device_info.hpp"

namespace kc::ch02 {

namespace {

using namespace block;  // the tile configurations, epilogues and gemm_bf16_block

// One block per tile; consecutive blocks walk along a row of tiles and share its A rows in L2.
template <class Cfg, class Epilogue>
__global__ void __launch_bounds__(Cfg::threads)
    gemm_bf16_kernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w,
                     __nv_bfloat16* __restrict__ c, int m, int n, int k, int tiles_n, bool paired, Epilogue epilogue) {
  const int block_row0 = static_cast<int>(blockIdx.x) / tiles_n * Cfg::block_m;
  const int block_col0 = static_cast<int>(blockIdx.x) % tiles_n * Cfg::block_n;
  gemm_bf16_block<Cfg>(a, w, c, n, k, block_row0, block_col0, m - block_row0, n - block_col0, paired, epilogue);
}

// --------------------------------------------------------------------------------------- host side

std::int64_t ceil_div(std::int64_t x, std::int64_t y) { return (x + y - 1) / y; }

// What the launch path needs to know about a device, queried once per device.
struct DeviceLimits {
  int sm_count = 0;
  std::size_t smem_per_block_optin = 0;
};

// The most dynamic shared memory a launch of this kernel asks for: the pipeline's, plus the
// epilogue's prefetch area where it fits this GPU.
template <class Cfg, class Epilogue>
int smem_bytes_with_prefetch(std::size_t smem_per_block_optin) {
  if constexpr (prefetches_epilogue_inputs<Epilogue>) {
    const int with = Cfg::smem_bytes + Prefetch<Cfg>::bytes;
    if (static_cast<std::size_t>(with) <= smem_per_block_optin) return with;
  }
  return Cfg::smem_bytes;
}

template <class Cfg, class Epilogue>
void allow_dynamic_shared_memory_of(std::size_t smem_per_block_optin) {
  if (static_cast<std::size_t>(Cfg::smem_bytes) > smem_per_block_optin) return;  // never launched here
  // Above 48 KiB a kernel must opt in to its dynamic shared memory. Preferring the largest carveout
  // lets two small blocks (2 × 96 KiB) share an SM on sm_90.
  const auto kernel = gemm_bf16_kernel<Cfg, Epilogue>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem_bytes_with_prefetch<Cfg, Epilogue>(smem_per_block_optin)));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

// Every epilogue's instantiation of the kernel is a kernel of its own, with its own attributes.
template <class Cfg>
void allow_dynamic_shared_memory(std::size_t smem_per_block_optin) {
  allow_dynamic_shared_memory_of<Cfg, NoEpilogue>(smem_per_block_optin);
  allow_dynamic_shared_memory_of<Cfg, BiasActivationResidual>(smem_per_block_optin);
  if constexpr (residual_rows_split_the_tile<Cfg>)
    allow_dynamic_shared_memory_of<Cfg, BiasActivation>(smem_per_block_optin);
  allow_dynamic_shared_memory_of<Cfg, SwiGlu>(smem_per_block_optin);
}

// The small-deep tile's register epilogue: one kernel per activation.
template <Activation kActivation>
void allow_register_epilogue(std::size_t smem_per_block_optin) {
  allow_dynamic_shared_memory_of<SmallDeepTile, RegisterBiasActivationResidual<kActivation>>(smem_per_block_optin);
}

// Queries the current device and raises the kernels' shared-memory limits the first time it is
// seen; afterwards only reads the cache (no CUDA call but cudaGetDevice), so captured launches
// stay cheap and legal.
DeviceLimits current_device_limits() {
  return cached_per_device([](int device) {
    DeviceLimits limits;
    int optin = 0;
    check(cudaDeviceGetAttribute(&limits.sm_count, cudaDevAttrMultiProcessorCount, device));
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    limits.smem_per_block_optin = static_cast<std::size_t>(optin);
    allow_dynamic_shared_memory<LargeTile4>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<LargeTile3>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<MediumTile4>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<MediumTile3>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<SmallTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<NarrowTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<SmallDeepTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<NarrowDeepTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<LargeEarlyTile4>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<LargeEarlyTile3>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<MediumTwoBlocksTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<SmallUnrotatedTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<SmallDeepUnrotatedTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory<NarrowDeepUnrotatedTile>(limits.smem_per_block_optin);
    allow_dynamic_shared_memory_of<LargeTile4, StagedStore>(limits.smem_per_block_optin);  // the plain large tile
    allow_dynamic_shared_memory_of<LargeTile3, StagedStore>(limits.smem_per_block_optin);
    allow_register_epilogue<Activation::none>(limits.smem_per_block_optin);
    allow_register_epilogue<Activation::relu>(limits.smem_per_block_optin);
    allow_register_epilogue<Activation::gelu_erf>(limits.smem_per_block_optin);
    allow_register_epilogue<Activation::gelu_tanh>(limits.smem_per_block_optin);
    allow_register_epilogue<Activation::silu>(limits.smem_per_block_optin);
    return limits;
  });
}

template <class Cfg, class Epilogue>
void launch(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, bool paired,
            const Epilogue& epilogue, std::size_t smem_per_block_optin, cudaStream_t stream) {
  if constexpr (std::is_same_v<Epilogue, BiasActivationResidual> && residual_rows_split_the_tile<Cfg>) {
    if (epilogue.residual == nullptr) {  // the whole tile staged at once: BiasActivation's kernel
      launch<Cfg>(a, w, c, shape, paired, BiasActivation{epilogue}, smem_per_block_optin, stream);
      return;
    }
  }
  const std::int64_t tiles_n = ceil_div(shape.n, Cfg::block_n);
  const std::int64_t blocks = ceil_div(shape.m, Cfg::block_m) * tiles_n;  // <= 2^31 - 1 (validated)
  Epilogue e = epilogue;
  int smem = Cfg::smem_bytes;
  if constexpr (prefetches_epilogue_inputs<Epilogue>) {
    // Prefetch the residual and bias at the start when there is something to fetch, the fast path
    // applies, and the extra shared memory fits (small and narrow tiles everywhere but the 99 KiB
    // parts, medium on sm_80 / sm_90; never the large tile).
    // The register epilogue always reads the area (zeros for a missing bias or residual).
    const bool wanted = has_register_epilogue<Epilogue> || e.bias != nullptr || e.residual != nullptr;
    const int with = smem_bytes_with_prefetch<Cfg, Epilogue>(smem_per_block_optin);
    if (e.vector && wanted && with > Cfg::smem_bytes) {
      e.prefetched = true;
      smem = with;
    }
  }
  gemm_bf16_kernel<Cfg, Epilogue><<<static_cast<unsigned>(blocks), Cfg::threads, smem, stream>>>(
      a, w, c, static_cast<int>(shape.m), static_cast<int>(shape.n), static_cast<int>(shape.k),
      static_cast<int>(tiles_n), paired, e);
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

bool aligned_to(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// True when the byte ranges [x, x + x_bytes) and [y, y + y_bytes) share at least one byte.
bool overlaps(const void* x, std::uint64_t x_bytes, const void* y, std::uint64_t y_bytes) {
  const auto xs = reinterpret_cast<std::uintptr_t>(x);
  const auto ys = reinterpret_cast<std::uintptr_t>(y);
  return xs < ys + y_bytes && ys < xs + x_bytes;
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
    case GemmBf16Tile::large_early_refill: return "large_early_refill";
    case GemmBf16Tile::medium_two_blocks: return "medium_two_blocks";
    case GemmBf16Tile::large_register_store: return "large_register_store";
    case GemmBf16Tile::small_unrotated: return "small_unrotated";
    case GemmBf16Tile::small_deep_unrotated: return "small_deep_unrotated";
    case GemmBf16Tile::narrow_deep_unrotated: return "narrow_deep_unrotated";
  }
  return "unknown";
}

GemmBf16TileInfo gemm_bf16_tile_info(GemmBf16Tile tile, std::size_t smem_per_block_optin) {
  switch (tile) {
    case GemmBf16Tile::large:
    case GemmBf16Tile::large_register_store:
      return LargeTile4::smem_bytes <= smem_per_block_optin ? info_of<LargeTile4>(smem_per_block_optin)
                                                            : info_of<LargeTile3>(smem_per_block_optin);
    case GemmBf16Tile::medium:
      return MediumTile4::smem_bytes <= smem_per_block_optin ? info_of<MediumTile4>(smem_per_block_optin)
                                                             : info_of<MediumTile3>(smem_per_block_optin);
    case GemmBf16Tile::small: return info_of<SmallTile>(smem_per_block_optin);
    case GemmBf16Tile::narrow: return info_of<NarrowTile>(smem_per_block_optin);
    case GemmBf16Tile::small_deep: return info_of<SmallDeepTile>(smem_per_block_optin);
    case GemmBf16Tile::narrow_deep: return info_of<NarrowDeepTile>(smem_per_block_optin);
    case GemmBf16Tile::large_early_refill:
      return LargeEarlyTile4::smem_bytes <= smem_per_block_optin ? info_of<LargeEarlyTile4>(smem_per_block_optin)
                                                                 : info_of<LargeEarlyTile3>(smem_per_block_optin);
    case GemmBf16Tile::medium_two_blocks: return info_of<MediumTwoBlocksTile>(smem_per_block_optin);
    case GemmBf16Tile::small_unrotated: return info_of<SmallUnrotatedTile>(smem_per_block_optin);
    case GemmBf16Tile::small_deep_unrotated: return info_of<SmallDeepUnrotatedTile>(smem_per_block_optin);
    case GemmBf16Tile::narrow_deep_unrotated: return info_of<NarrowDeepUnrotatedTile>(smem_per_block_optin);
  }
  throw InvalidArgument("tile (" + std::to_string(static_cast<int>(tile)) + ") is not a GemmBf16Tile");
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

namespace {

// validate_gemm_bf16 for a C of `c_columns` columns (N, or N / 2 for SwiGLU).
void validate_operands(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape,
                       std::int64_t c_columns) {
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

}  // namespace

void validate_gemm_bf16(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape) {
  validate_operands(a, w, c, shape, shape.n);
}

const char* to_string(Activation activation) {
  switch (activation) {
    case Activation::none: return "none";
    case Activation::relu: return "relu";
    case Activation::gelu_erf: return "gelu_erf";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
  }
  return "unknown";
}

void validate_gemm_bf16_epilogue(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c,
                                 GemmShape shape, const GemmBf16Epilogue& epilogue) {
  const auto activation = static_cast<int>(epilogue.activation);
  if (activation < 0 || activation > static_cast<int>(Activation::silu)) {
    throw InvalidArgument("epilogue.activation (" + std::to_string(activation) + ") is not an Activation");
  }
  if (epilogue.swiglu) {
    validate_gemm_shape(shape);
    if (shape.n % 2 != 0) {
      throw InvalidArgument("shape.n (" + std::to_string(shape.n) +
                            ") must be even in SwiGLU mode (interleaved gate/up rows)");
    }
    if (epilogue.activation != Activation::silu) {
      throw InvalidArgument(std::string("epilogue.activation (") + to_string(epilogue.activation) +
                            ") must be silu in SwiGLU mode");
    }
    if (epilogue.residual != nullptr) throw InvalidArgument("epilogue.residual must be null in SwiGLU mode");
    if (epilogue.bias != nullptr && !aligned_to(epilogue.bias, 4)) {
      throw InvalidArgument("epilogue.bias must be 4-byte aligned in SwiGLU mode (read as gate/up pairs)");
    }
  }
  const std::int64_t c_columns = epilogue_output_columns(shape, epilogue);
  validate_operands(a, w, c, shape, c_columns);
  const std::uint64_t bf16 = sizeof(__nv_bfloat16);
  const auto c_bytes = static_cast<std::uint64_t>(shape.m) * static_cast<std::uint64_t>(c_columns) * bf16;
  if (epilogue.bias != nullptr) {
    if (!aligned_to(epilogue.bias, bf16)) throw InvalidArgument("epilogue.bias must be 2-byte aligned");
    // Every block reads the bias while others write C.
    if (overlaps(c, c_bytes, epilogue.bias, static_cast<std::uint64_t>(shape.n) * bf16)) {
      throw InvalidArgument("epilogue.bias must not overlap c");
    }
  }
  if (epilogue.residual != nullptr) {
    if (!aligned_to(epilogue.residual, bf16)) throw InvalidArgument("epilogue.residual must be 2-byte aligned");
    // The same element is read and written by one thread, in that order; a shifted overlap would
    // let a thread read an element another thread has already overwritten.
    if (epilogue.residual != c && overlaps(c, c_bytes, epilogue.residual, c_bytes)) {
      throw InvalidArgument("epilogue.residual must be c itself or not overlap c at all");
    }
  }
}

namespace {

// The large tile's deepest pipeline that fits (4 stages on sm_90, 3 on sm_80).
template <class Epilogue>
void launch_large(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, bool paired,
                  const Epilogue& epilogue, const GemmBf16TileInfo& info, const DeviceLimits& limits,
                  cudaStream_t stream) {
  if (info.stages == LargeTile4::stages) {
    launch<LargeTile4>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
  } else {
    launch<LargeTile3>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
  }
}

// The launch path after validation: no allocation, no synchronisation.
template <class Epilogue = NoEpilogue>
void run(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, GemmBf16Tile tile,
         const DeviceLimits& limits, cudaStream_t stream, const Epilogue& epilogue = {}) {
  const GemmBf16TileInfo info = gemm_bf16_tile_info(tile, limits.smem_per_block_optin);
  if (!info.fits) {
    throw InvalidArgument(std::string("tile ") + to_string(tile) + " needs " + std::to_string(info.smem_bytes) +
                          " bytes of shared memory per block; this GPU allows " +
                          std::to_string(limits.smem_per_block_optin));
  }
  // bf16x2 stores need 4-byte aligned pairs: N even and c itself 4-byte aligned.
  const bool paired = shape.n % 2 == 0 && aligned_to(c, 4);
  switch (tile) {
    case GemmBf16Tile::large:
      if constexpr (std::is_same_v<Epilogue, NoEpilogue>) {
        // The plain GEMM's C leaves the large tile through shared memory, a warp writing whole
        // 256-byte rows: measured faster than the store from registers (large_register_store).
        launch_large(a, w, c, shape, paired, StagedStore::for_output(static_cast<int>(shape.n), c), info, limits,
                     stream);
      } else {
        launch_large(a, w, c, shape, paired, epilogue, info, limits, stream);
      }
      break;
    case GemmBf16Tile::medium:
      if (info.stages == MediumTile4::stages) {
        launch<MediumTile4>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      } else {
        launch<MediumTile3>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      }
      break;
    case GemmBf16Tile::small:
      launch<SmallTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::narrow:
      launch<NarrowTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::small_deep:
      launch<SmallDeepTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::narrow_deep:
      launch<NarrowDeepTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::large_early_refill:
      if (info.stages == LargeEarlyTile4::stages) {
        launch<LargeEarlyTile4>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      } else {
        launch<LargeEarlyTile3>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      }
      break;
    case GemmBf16Tile::medium_two_blocks:
      launch<MediumTwoBlocksTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::small_unrotated:
      launch<SmallUnrotatedTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::small_deep_unrotated:
      launch<SmallDeepUnrotatedTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::narrow_deep_unrotated:
      launch<NarrowDeepUnrotatedTile>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
      break;
    case GemmBf16Tile::large_register_store:
      if constexpr (Epilogue::staged) {  // Chapter 3's epilogues are staged on every tile
        run(a, w, c, shape, GemmBf16Tile::large, limits, stream, epilogue);
        return;
      } else {  // C from each thread's registers: what the large tile did before its staged store
        launch_large(a, w, c, shape, paired, epilogue, info, limits, stream);
      }
      break;
  }
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

namespace {

// The small-deep tile with bias, activation and residual applied in registers
// (RegisterBiasActivationResidual, gemm_bf16_block.cuh): the kernel of `epilogue.activation`.
void run_small_deep_in_registers(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                                 const GemmBf16Epilogue& epilogue, bool vector, const DeviceLimits& limits,
                                 cudaStream_t stream) {
  const bool paired = shape.n % 2 == 0 && aligned_to(c, 4);  // as run()
  const int n = static_cast<int>(shape.n);
  const auto go = [&](auto activation) {
    const RegisterBiasActivationResidual<decltype(activation)::value> e{epilogue.bias, epilogue.residual, n, vector};
    launch<SmallDeepTile>(a, w, c, shape, paired, e, limits.smem_per_block_optin, stream);
  };
  switch (epilogue.activation) {
    case Activation::none: go(std::integral_constant<Activation, Activation::none>{}); break;
    case Activation::relu: go(std::integral_constant<Activation, Activation::relu>{}); break;
    case Activation::gelu_erf: go(std::integral_constant<Activation, Activation::gelu_erf>{}); break;
    case Activation::gelu_tanh: go(std::integral_constant<Activation, Activation::gelu_tanh>{}); break;
    case Activation::silu: go(std::integral_constant<Activation, Activation::silu>{}); break;
  }
  check_launch();
}

// Picks the epilogue struct for `epilogue` and runs it.
void run_epilogue(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                  const GemmBf16Epilogue& epilogue, GemmBf16Tile tile, const DeviceLimits& limits,
                  cudaStream_t stream) {
  // The staged epilogue's fast path: 16-byte cp.async of bias and residual rows, 8-byte stores.
  const bool vector =
      shape.n % 8 == 0 && aligned_to(c, 16) && aligned_to(epilogue.bias, 16) && aligned_to(epilogue.residual, 16);
  const int n = static_cast<int>(shape.n);
  if (epilogue.swiglu) {
    run(a, w, c, shape, tile, limits, stream, SwiGlu{epilogue.bias, nullptr, n, vector});
  } else if (tile == GemmBf16Tile::small_deep && gemm_bf16_tile_info(tile, limits.smem_per_block_optin).fits &&
             vector &&
             smem_bytes_with_prefetch<SmallDeepTile, RegisterBiasActivationResidual<Activation::none>>(
                 limits.smem_per_block_optin) > SmallDeepTile::smem_bytes) {
    // The register epilogue reads bias and residual from the Prefetch area only: 16-byte aligned
    // rows that fit beside the pipeline. Anything else takes the staged epilogue below.
    run_small_deep_in_registers(a, w, c, shape, epilogue, vector, limits, stream);
  } else {
    run(a, w, c, shape, tile, limits, stream,
        BiasActivationResidual{epilogue.bias, epilogue.residual, n, epilogue.activation, vector});
  }
}

}  // namespace

void gemm_bf16_epilogue(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                        const GemmBf16Epilogue& epilogue, cudaStream_t stream) {
  validate_gemm_bf16_epilogue(a, w, c, shape, epilogue);
  const DeviceLimits limits = current_device_limits();
  const GemmBf16Tile tile = choose_gemm_bf16_tile(shape, limits.sm_count, limits.smem_per_block_optin);
  run_epilogue(a, w, c, shape, epilogue, tile, limits, stream);
}

void gemm_bf16_epilogue_with_tile(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                                  const GemmBf16Epilogue& epilogue, GemmBf16Tile tile, cudaStream_t stream) {
  validate_gemm_bf16_epilogue(a, w, c, shape, epilogue);
  run_epilogue(a, w, c, shape, epilogue, tile, current_device_limits(), stream);
}

}  // namespace kc::ch02
