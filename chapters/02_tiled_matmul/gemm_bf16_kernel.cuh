/// @file gemm_bf16_kernel.cuh
/// @brief The tensor-core GEMM's kernel, one block per tile of C, for any epilogue, and the host code
/// that launches it: the tile configuration behind a GemmBf16Tile, the kernel's shared-memory opt-in
/// and the launch. gemm_bf16_mma.cu instantiates it with the plain stores (gemm_bf16_store.cuh); an
/// epilogue of another kind is one more instantiation, in the file that defines it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gemm_bf16.hpp"
#include "gemm_bf16_mainloop.cuh"
#include "kc/check.hpp"

namespace kc::ch02::block {

/// One block per tile; consecutive blocks walk along a row of tiles and share its A rows in L2.
template <class Cfg, class Epilogue>
__global__ void __launch_bounds__(Cfg::threads)
    gemm_bf16_kernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w,
                     __nv_bfloat16* __restrict__ c, int m, int n, int k, int tiles_n, bool paired, Epilogue epilogue) {
  const int block_row0 = static_cast<int>(blockIdx.x) / tiles_n * Cfg::block_m;
  const int block_col0 = static_cast<int>(blockIdx.x) % tiles_n * Cfg::block_n;
  gemm_bf16_block<Cfg>(a, w, c, n, k, block_row0, block_col0, m - block_row0, n - block_col0, paired, epilogue);
}

/// What the launch path needs to know about a device, queried once per device.
struct DeviceLimits {
  int sm_count = 0;                      ///< SMs
  std::size_t smem_per_block_optin = 0;  ///< cudaDevAttrMaxSharedMemoryPerBlockOptin
};

/// The current device's limits, uncached (the callers cache them with kc::cached_per_device).
inline DeviceLimits query_device_limits(int device) {
  DeviceLimits limits;
  int optin = 0;
  check(cudaDeviceGetAttribute(&limits.sm_count, cudaDevAttrMultiProcessorCount, device));
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  limits.smem_per_block_optin = static_cast<std::size_t>(optin);
  return limits;
}

/// Lets gemm_bf16_kernel<Cfg, Epilogue> use @p smem_bytes of dynamic shared memory (above 48 KiB a
/// kernel must opt in), when Cfg fits this GPU at all. Preferring the largest carveout lets two
/// small blocks (2 × 96 KiB) share an SM on sm_90.
template <class Cfg, class Epilogue>
void allow_shared_memory(int smem_bytes, std::size_t smem_per_block_optin) {
  if (static_cast<std::size_t>(Cfg::smem_bytes) > smem_per_block_optin) return;  // never launched here
  const auto kernel = gemm_bf16_kernel<Cfg, Epilogue>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

/// Launches gemm_bf16_kernel<Cfg, Epilogue> over every tile of C with @p smem_bytes of dynamic
/// shared memory. Validated arguments only; no allocation, no synchronisation.
template <class Cfg, class Epilogue>
void launch_tiles(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, bool paired,
                  const Epilogue& epilogue, int smem_bytes, cudaStream_t stream) {
  const std::int64_t tiles_n = (shape.n + Cfg::block_n - 1) / Cfg::block_n;
  const std::int64_t blocks = (shape.m + Cfg::block_m - 1) / Cfg::block_m * tiles_n;  // <= 2^31 - 1 (validated)
  gemm_bf16_kernel<Cfg, Epilogue><<<static_cast<unsigned>(blocks), Cfg::threads, smem_bytes, stream>>>(
      a, w, c, static_cast<int>(shape.m), static_cast<int>(shape.n), static_cast<int>(shape.k),
      static_cast<int>(tiles_n), paired, epilogue);
}

/// Calls @p f with a value of the tile configuration behind @p tile on a GPU whose blocks may opt in
/// to @p smem_per_block_optin bytes: the deepest pipeline of the large and medium tiles that fits.
template <class F>
void with_tile_config(GemmBf16Tile tile, std::size_t smem_per_block_optin, F&& f) {
  const auto fits = [&](int bytes) { return static_cast<std::size_t>(bytes) <= smem_per_block_optin; };
  switch (tile) {
    case GemmBf16Tile::large: fits(LargeTile4::smem_bytes) ? f(LargeTile4{}) : f(LargeTile3{}); break;
    case GemmBf16Tile::medium: fits(MediumTile4::smem_bytes) ? f(MediumTile4{}) : f(MediumTile3{}); break;
    case GemmBf16Tile::small: f(SmallTile{}); break;
    case GemmBf16Tile::narrow: f(NarrowTile{}); break;
    case GemmBf16Tile::small_deep: f(SmallDeepTile{}); break;
    case GemmBf16Tile::narrow_deep: f(NarrowDeepTile{}); break;
  }
}

/// Calls @p f with a value of every tile configuration (to set each kernel's attributes once).
template <class F>
void for_each_tile_config(F&& f) {
  f(LargeTile4{}), f(LargeTile3{}), f(MediumTile4{}), f(MediumTile3{});
  f(SmallTile{}), f(NarrowTile{}), f(SmallDeepTile{}), f(NarrowDeepTile{});
}

}  // namespace kc::ch02::block
