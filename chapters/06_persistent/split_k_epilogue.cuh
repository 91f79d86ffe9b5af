/// @file split_k_epilogue.cuh
/// @brief The two epilogues of a split tile, whose K range several blocks share: a contributor
/// stores its fp32 accumulators as a partial (Fp32Partial), the owner adds the partners' partials
/// to its own before storing C (AddPartials). Both plug into Chapter 2's main loop
/// (kc::ch02::block::gemm_bf16_block_k_range) through its epilogue hook. Device code only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm_bf16_mainloop.cuh"
#include "gemm_bf16_store.cuh"

namespace kc::ch06 {

using ch02::block::BlockTile;
using ch02::block::cp_async_16;
using ch02::block::cp_async_commit;
using ch02::block::cp_async_wait;
using ch02::block::NoEpilogue;
using ch02::block::shared_address;

/// Where thread tid's accumulators of m16 tile mt and n8 tile nt sit in a partial ("fragment
/// order"): consecutive threads, consecutive float4s.
template <class Cfg>
__device__ __forceinline__ int fragment_index(int mt, int nt) {
  return (mt * (Cfg::warp_n / 8) + nt) * Cfg::threads + static_cast<int>(threadIdx.x);
}

/// A split tile, a contributor's part: the block's fp32 accumulators of a K range, stored
/// unrounded in the block's own register order ("fragment order": thread t's accumulators of m16
/// tile mt and n8 tile nt are the float4 at index (mt · n8 tiles per warp + nt) · threads + t), rows
/// and columns past C included (they hold zeros). Only AddPartials, in a block of the same
/// configuration, reads it back, so the layout is the one that stores fastest: each warp instruction
/// writes 512 contiguous bytes straight from registers, with no pass through shared memory.
struct Fp32Partial {
  float* partial;  ///< block_m · block_n floats, 16-byte aligned
  /// One counter per warp (or null): once warp w's part of the partial is stored, its lane 0 adds 1
  /// to arrivals[w]. Thread t of the owner reads only what thread t stored, so the owner's warp w
  /// needs nothing but warp w's counter: no block-wide barrier on either side.
  int* arrivals = nullptr;

  /// Stores the block's accumulators as the partial, fragment order, and publishes each warp's part
  /// (the epilogue hook of gemm_bf16_mainloop.cuh).
  template <class Cfg, class Acc>
  __device__ void store(const Acc& acc, const BlockTile&, unsigned char*) const {
    float4* out = reinterpret_cast<float4*>(partial);
#pragma unroll
    for (int mt = 0; mt < Cfg::warp_m / 16; ++mt) {
#pragma unroll
      for (int nt = 0; nt < Cfg::warp_n / 8; ++nt) {
        // __stcg: to L2 only; the owner reads it from another SM.
        __stcg(out + fragment_index<Cfg>(mt, nt),
               make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]));
      }
    }
    publish();
  }

  /// Called by every thread once its part of the partial is stored: publishes the warp's part.
  __device__ void publish() const {
    if (arrivals == nullptr) return;
    __threadfence();  // this thread's stores, before the warp's count
    __syncwarp();     // every lane's stores and fence, before lane 0's atomic
    if (threadIdx.x % 32 == 0) atomicAdd(&arrivals[threadIdx.x / 32], 1);
  }
};

/// A split tile, the owner's part: the block computes its own K range, waits until
/// @p partners other contributors have published their Fp32Partial, adds their partials to its
/// accumulators, partner 0 first, and stores C as a whole tile would. The order of the additions is
/// fixed (the owner's range, then each partner's in turn), so C has the same bits whichever block
/// finishes first. The owner's own part never leaves its registers: no partial store, no read-back.
struct AddPartials {
  const float* first_partial;   ///< partner 0's Fp32Partial
  std::int64_t partial_stride;  ///< floats from one partner's partial to the next
  int partners;                 ///< how many (1 or more)
  const int* arrivals;          ///< the partners' per-warp counters (Fp32Partial::arrivals)

  /// Every thread of warp w returns once all partners' warp-w parts are visible to it. Lane 0 polls
  /// with acquire loads (paired with the partners' fence-then-atomic); the warp barrier passes that
  /// on to the other lanes.
  __device__ void wait_for_partners() const {
    if (threadIdx.x % 32 == 0) {
      const int* counter = &arrivals[threadIdx.x / 32];
      while (true) {
        int arrived = 0;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(arrived) : "l"(counter) : "memory");
        if (arrived >= partners) break;
        __nanosleep(32);
      }
    }
    __syncwarp();
  }

  /// Adds the partners' partials to the block's accumulators and stores C from registers (the
  /// epilogue hook of gemm_bf16_mainloop.cuh).
  template <class Cfg, class Acc>
  __device__ void store(Acc& acc, const BlockTile& tile, unsigned char* smem) const {
    constexpr int kThreads = Cfg::threads;
    constexpr int kMTiles = Cfg::warp_m / 16;
    constexpr int kNTiles = Cfg::warp_n / 8;
    const int tid = static_cast<int>(threadIdx.x);
    const std::uint32_t smem_base = shared_address(smem);
    // The partners' partials come in through the pipeline's buffers, free now: with cp.async, as
    // many partials at once as the buffers hold (two for the 128 × 128 tile), so a tile with two
    // partners pays one L2 round trip, not two, and the copies hold no registers. Each thread
    // copies, then reads back, only its own float4s (slot [partial][fragment][tid]), so after the
    // barrier that frees the buffers no other barrier is needed.
    constexpr int kFragments = kMTiles * kNTiles;               // float4s a thread holds
    constexpr int kPartialBytes = kFragments * kThreads * 16;   // one partial
    constexpr int kPerBatch = Cfg::smem_bytes / kPartialBytes;  // partials the buffers hold
    static_assert(kPerBatch >= 1, "one fp32 partial fits the pipeline's buffers");
    __syncthreads();  // every warp is done reading the last slice's buffer
    wait_for_partners();
    for (int j0 = 0; j0 < partners; j0 += kPerBatch) {
      const int count = partners - j0 < kPerBatch ? partners - j0 : kPerBatch;
      for (int j = 0; j < count; ++j) {
        const float4* partial =
            reinterpret_cast<const float4*>(first_partial + static_cast<std::int64_t>(j0 + j) * partial_stride);
#pragma unroll
        for (int f = 0; f < kFragments; ++f) {
          cp_async_16(smem_base + ((j * kFragments + f) * kThreads + tid) * 16, partial + f * kThreads + tid, true);
        }
      }
      cp_async_commit();
      cp_async_wait<0>();
      const float4* landed = reinterpret_cast<const float4*>(smem);
      for (int j = 0; j < count; ++j) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const float4 v = landed[(j * kFragments + mt * kNTiles + nt) * kThreads + tid];
            acc[mt][nt][0] += v.x;
            acc[mt][nt][1] += v.y;
            acc[mt][nt][2] += v.z;
            acc[mt][nt][3] += v.w;
          }
        }
      }
    }
    NoEpilogue{}.store<Cfg>(acc, tile, smem);  // the tile is now the sum over all of K
  }
};

}  // namespace kc::ch06
