/// @file tensor_map_ptx.cuh
/// @brief The instructions Chapter 8 adds to Chapter 7's (hopper_ptx.cuh): a rank-3 TMA store, the
/// three that write a tensor map on the device and hand it to the copy engine, and a TMA load with an
/// L2 eviction policy. One wrapper each, the PTX instruction and nothing else (PTX ISA 9.0:
/// tensormap.replace, fence.proxy.tensormap, createpolicy).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "hopper_ptx.cuh"

namespace kc::ch08::ptx {

using namespace ch07::ptx;  // Chapter 7's wrappers: mbarriers, TMA loads, wgmma, the staged store

/// Copies the box staged at @p src to element coordinates (@p col, @p x, @p y) of @p map's rank-3
/// tensor in global memory; box elements outside the tensor are not written. Joins this thread's
/// current bulk group (bulk_commit_group closes it).
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int col, int x, int y) {
  const auto map_address = reinterpret_cast<std::uint64_t>(map);
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(map_address),
      "r"(smem_address(src)), "r"(col), "r"(x), "r"(y)
      : "memory");
}

/// Sets the global address of the 128-byte tensor map at @p map (global memory, 128-byte aligned) to
/// @p address (16-byte aligned). The other fields stay as they are.
__device__ __forceinline__ void tensormap_set_address(CUtensorMap* map, const void* address) {
  asm volatile("tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;" ::"l"(map), "l"(address) : "memory");
}

/// Sets the size of dimension 1 (the rows) of the tensor map at @p map (global memory) to @p rows.
__device__ __forceinline__ void tensormap_set_rows(CUtensorMap* map, int rows) {
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 1, %1;" ::"l"(map), "r"(rows) : "memory");
}

/// The writer's half of the hand-over: this thread's earlier writes to tensor maps (ordinary stores
/// and tensormap.replace, the generic proxy) are ordered before anything the tensormap proxy (the
/// copy engine reading a map) does after a matching acquire, at GPU scope.
__device__ __forceinline__ void fence_tensormap_release() {
  asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
}

/// The reader's half: before TMA uses the 128-byte map at @p map, written through the generic proxy,
/// make those writes visible to the tensormap proxy. Without it the copy engine may use a stale copy
/// of the map (the wrong expert's address or rows).
__device__ __forceinline__ void fence_tensormap_acquire(const CUtensorMap* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map) : "memory");
}

/// An L2 cache policy for bytes that other blocks read again later: evict-last over the whole access
/// (fraction 1.0). The L2 replaces lines loaded under it after lines of the default policy.
__device__ __forceinline__ std::uint64_t l2_evict_last_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

/// tma_load_2d, with the L2 cache policy @p policy (from createpolicy) for the bytes it reads.
__device__ __forceinline__ void tma_load_2d_hinted(void* dst, const CUtensorMap* map, std::uint64_t* bar, int col,
                                                   int row, std::uint64_t policy) {
  const auto map_address = reinterpret_cast<std::uint64_t>(map);
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      :
      : "r"(smem_address(dst)), "l"(map_address), "r"(smem_address(bar)), "r"(col), "r"(row), "l"(policy)
      : "memory");
}

}  // namespace kc::ch08::ptx
