/// @file tensor_map_ptx.cuh
/// @brief The instructions Chapter 8 adds to Chapter 7's (hopper_ptx.cuh): a rank-3 TMA store, and
/// the three that write a tensor map on the device and hand it to the copy engine. One wrapper each,
/// the PTX instruction and nothing else (PTX ISA 9.0: tensormap.replace, fence.proxy.tensormap).
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

}  // namespace kc::ch08::ptx
