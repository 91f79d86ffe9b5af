/// @file swap_kernel.cuh
/// @brief The kernel of every step of Chapter 9: Chapter 8's persistent warp-specialized grouped GEMM
/// with the operands swapped. A tile is 128 weight rows of one expert (wgmma's M side, 64 per consumer
/// warpgroup) times up to kTokens of its tokens (wgmma's N side); the epilogue writes the 128 ×
/// kTokens accumulators of Cᵀ back into C's rows, transposed through shared memory.
///
///   every block: scan the offsets into its tile prefix (token tiles of kTokens rows per expert)
///   producer warpgroup (one thread)             consumer warpgroups 0 and 1 (64 weight rows each)
///   for each tile t = block, block + grid, ...:     for each tile, the same t:
///     find its expert, tokens and n-tile              for each K slice: wait full, 4 × wgmma
///     for each K slice: wait empty, TMA                 m64n{kTokens}k16, release the slice
///       two weight boxes (64 rows each) and         epilogue: accumulators into the staging buffer
///       one token box (kTokens rows; rows past        transposed (token rows), then each thread
///       the expert: never stored)                     stores 8 columns of a token row at a time
///
/// The pipeline's ring of stages runs on across tiles and experts, as in Chapter 8.
#pragma once

#include "block_tile_prefix.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"
#include "swap_launch.hpp"
#include "wgmma_narrow.cuh"
// Angle brackets: the exercise build puts the skeleton's swap_tiles.hpp first on the include path.
#include <swap_tiles.hpp>

namespace kc::ch09::detail {

using ch07::kBlockK;
using ch07::kWarpgroupThreads;
using ch07::PipelineState;

/// Output value @p j (0..7) of the 8 columns at @p from in a token row of the staging buffer: plain,
/// the accumulator; SwiGLU, silu(gate) · up with the up value 64 columns further on (consumer 1's).
template <bool kSwiglu>
__device__ __forceinline__ float output_value(const float* from, int j) {
  if constexpr (kSwiglu) {
    const float gate = from[j], up = from[kWBoxRows + j];
    return gate / (1.0f + __expf(-gate)) * up;
  } else {
    return from[j];
  }
}

/// The swapped kernel: see the file's description. @p kTokens is the token tile, @p kStages the
/// pipeline depth, @p kSwiglu the epilogue; args.row_scale, when not null, scales each row of C.
/// @p kGather: token row r is row args.gather_rows[r] of the matrix @p a_map maps (X, in one-row
/// boxes), loaded by the producer warp's lanes one row each (Chapter 8's gathering kernel, with the
/// token tile's rows).
template <int kTokens, int kStages, bool kSwiglu, bool kGather = false>
__global__ void __launch_bounds__(kSwapThreads, 1)
    swap_ab_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                   const SwapArgs args) {
  constexpr SwapTile kTile{kTokens, kStages};
  constexpr EpilogueKind kKind = kSwiglu ? EpilogueKind::swiglu : EpilogueKind::plain;
  constexpr int kConsumerWarps = 2 * kWarpgroupThreads / 32;
  constexpr int kChunks = swap_out_cols(kKind) / 8;  // 16-byte chunks of 8 columns in a token's row

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  auto stage = [smem](int s) { return smem + s * kTile.stage_bytes(); };
  float* staging = reinterpret_cast<float*>(smem + kStages * kTile.stage_bytes());
  auto* full = reinterpret_cast<std::uint64_t*>(smem + kStages * kTile.stage_bytes() + kTile.staging_bytes());
  std::uint64_t* empty = full + kStages;
  auto* tile_prefix = reinterpret_cast<std::int32_t*>(empty + kStages);
  std::int32_t* chunk_sums = tile_prefix + ch05::kMaxExperts + 1;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  block_tile_prefix(args.offsets, args.experts, args.m_total, kTokens, tile_prefix, chunk_sums);  // syncs

  const int k_tiles = (args.k + kBlockK - 1) / kBlockK;
  const int tiles = tile_prefix[args.experts] * args.tiles_n;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  auto work_of = [&](int tile) {
    return swap_work(tile, args.offsets, tile_prefix, args.experts, args.m_total, args.tiles_n, kTokens);
  };

  if (warpgroup == 0) {
    // ------------------------------------------------------------------------------------- producer
    constexpr int kRowsPerLane = (kTokens + 31) / 32;  // gathering: token rows lane and lane + 32
    if (threadIdx.x < (kGather ? 32 : 1)) {
      const int lane = static_cast<int>(threadIdx.x);
      PipelineState p;
      for (int tile = static_cast<int>(blockIdx.x); tile < tiles; tile += static_cast<int>(gridDim.x)) {
        const SwapWork work = work_of(tile);
        const SwapWRows w_rows = swap_w_rows(work.expert, work.n_tile, args.n, kKind);
        // Gathering: this lane's rows of X, once per tile; rows past the tile's tokens (never stored)
        // load its last token again, so every box is whole and in bounds.
        [[maybe_unused]] int source[kGather ? kRowsPerLane : 1];
        if constexpr (kGather) {
#pragma unroll
          for (int j = 0; j < kRowsPerLane; ++j) {
            source[j] = args.gather_rows[work.row0 + min(lane + 32 * j, work.tokens - 1)];
          }
        }
        for (int kt = 0; kt < k_tiles; ++kt, p.advance(kStages)) {
          unsigned char* s = stage(p.stage);
          if (lane == 0) {
            if (p.wrapped) ptx::mbarrier_wait(&empty[p.stage], p.phase ^ 1u);
            // Every box is whole in bytes, zeros included: the stage always receives stage_bytes().
            ptx::mbarrier_arrive_expect_tx(&full[p.stage], kTile.stage_bytes());
            ptx::tma_load_2d(s, &w_map, &full[p.stage], kt * kBlockK, w_rows.first);
            ptx::tma_load_2d(s + kWBoxBytes, &w_map, &full[p.stage], kt * kBlockK, w_rows.second);
            if constexpr (!kGather)
              ptx::tma_load_2d(s + 2 * kWBoxBytes, &a_map, &full[p.stage], kt * kBlockK, work.row0);
          }
          if constexpr (kGather) {
            __syncwarp();  // lane 0 has seen the stage empty: every lane may now fill it
#pragma unroll
            for (int j = 0; j < kRowsPerLane; ++j) {
              const int row = lane + 32 * j;
              if (row < kTokens) {
                ptx::tma_load_2d(s + 2 * kWBoxBytes + row * 128, &a_map, &full[p.stage], kt * kBlockK, source[j]);
              }
            }
          }
        }
      }
    }
    return;
  }
  // -------------------------------------------------------------------------------------- consumers
  const int consumer = warpgroup - 1;  // weight rows 64·consumer .. 64·consumer + 63 of each tile
  const int thread = static_cast<int>(threadIdx.x % kWarpgroupThreads);
  const int epilogue_thread = static_cast<int>(threadIdx.x) - kWarpgroupThreads;  // 0 .. 255
  const bool lane0 = threadIdx.x % 32 == 0;
  float acc[kTokens / 2];  // no zeroing: each tile's first wgmma has scale-d = 0
  PipelineState c;
  int previous_stage = 0;
  for (int tile = static_cast<int>(blockIdx.x); tile < tiles; tile += static_cast<int>(gridDim.x)) {
    const SwapWork work = work_of(tile);
    for (int kt = 0; kt < k_tiles; ++kt, c.advance(kStages)) {
      ptx::mbarrier_wait(&full[c.stage], c.phase);
      const std::uint64_t w_desc = ptx::descriptor_of(stage(c.stage) + consumer * kWBoxBytes);
      const std::uint64_t token_desc = ptx::descriptor_of(stage(c.stage) + 2 * kWBoxBytes);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        ptx::wgmma_m64nNk16<kTokens>(acc, w_desc + 2 * kk, token_desc + 2 * kk, kt > 0 || kk > 0 ? 1 : 0);
      }
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<1>();
      if (kt > 0 && lane0) ptx::mbarrier_arrive(&empty[previous_stage]);
      previous_stage = c.stage;
    }
    ptx::wgmma_wait_group<0>();
    if (lane0) ptx::mbarrier_arrive(&empty[previous_stage]);
    ptx::fence_accumulators(acc);

    // The transposed store. Both consumers write their accumulators as token rows of the staging
    // buffer (the previous tile's stores have read it: first barrier), then, after the second
    // barrier, each thread stores 8 columns of one token's row as one 16-byte write.
    ptx::named_barrier_sync(1, kEpilogueThreads);
#pragma unroll
    for (int i = 0; i < kTokens / 2; ++i) {
      const TransposedSlot slot = transposed_slot(consumer, thread, i);
      staging[staging_offset(slot.token, slot.column)] = acc[i];
    }
    ptx::named_barrier_sync(1, kEpilogueThreads);
    const int col0 = work.n_tile * swap_out_cols(kKind);
    for (int at = epilogue_thread; at < kTokens * kChunks; at += kEpilogueThreads) {
      const int token = at / kChunks, col = col0 + 8 * (at % kChunks);
      if (token >= work.tokens || col >= args.n_out) continue;  // past the expert's tokens or C's width
      const int row = work.row0 + token;
      const float scale = args.row_scale != nullptr ? args.row_scale[row] : 1.0f;
      const float* from = staging + staging_offset(token, 8 * (at % kChunks));
      uint4 packed;
      packed.x = ptx::pack_bf16x2(output_value<kSwiglu>(from, 0) * scale, output_value<kSwiglu>(from, 1) * scale);
      packed.y = ptx::pack_bf16x2(output_value<kSwiglu>(from, 2) * scale, output_value<kSwiglu>(from, 3) * scale);
      packed.z = ptx::pack_bf16x2(output_value<kSwiglu>(from, 4) * scale, output_value<kSwiglu>(from, 5) * scale);
      packed.w = ptx::pack_bf16x2(output_value<kSwiglu>(from, 6) * scale, output_value<kSwiglu>(from, 7) * scale);
      *reinterpret_cast<uint4*>(args.c + static_cast<std::size_t>(row) * args.n_out + col) = packed;
    }
  }
}

/// Enqueues swap_ab_kernel<kTokens, kStages, kSwiglu, kGather>: the shared-memory opt-in and the SM
/// count once per device, then a persistent grid of min(SMs, @p tile_bound) blocks.
template <int kTokens, int kStages, bool kSwiglu, bool kGather = false>
void launch_swap_kernel(const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                        std::int64_t tile_bound, cudaStream_t stream) {
  constexpr SwapTile kTile{kTokens, kStages};
  static_assert(kTile.smem_bytes() <= ch07::kSm90SmemPerBlock, "the tile fits an sm_90 block");
  static_assert(kTile.stage_bytes() % ch07::kSwizzleAtomBytes == 0, "every box starts on a swizzle atom");
  const int sms = cached_per_device([](int device) {
    check(cudaFuncSetAttribute(swap_ab_kernel<kTokens, kStages, kSwiglu, kGather>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(SwapTile{kTokens, kStages}.smem_bytes())));
    int count = 0;
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  });
  const int grid = ch07::persistent_grid(tile_bound, sms);
  swap_ab_kernel<kTokens, kStages, kSwiglu, kGather>
      <<<grid, kSwapThreads, kTile.smem_bytes(), stream>>>(a_map, w_map, args);
  check_launch();
}

/// launch_swap_kernel with the epilogue picked at run time.
template <int kTokens, int kStages, bool kGather = false>
void launch_swap_kernel(bool swiglu, const CUtensorMap& a_map, const CUtensorMap& w_map, const SwapArgs& args,
                        std::int64_t tile_bound, cudaStream_t stream) {
  if (swiglu) {
    launch_swap_kernel<kTokens, kStages, true, kGather>(a_map, w_map, args, tile_bound, stream);
  } else {
    launch_swap_kernel<kTokens, kStages, false, kGather>(a_map, w_map, args, tile_bound, stream);
  }
}

}  // namespace kc::ch09::detail
