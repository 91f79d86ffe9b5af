/// @file grouped_kernel.cuh
/// @brief The kernel of every step of Chapter 8: Chapter 7's persistent warp-specialized GEMM (step 4's
/// roles, step 6's staged TMA store) walking the tiles of all experts, each tile's expert found on the
/// device. The template arguments pick the step (how a tile's store stops at its expert's end; step
/// 4 also loads the A rows of one-m-tile experts evict-last; step 5 is step 4 launched with a block per
/// tile, so each block's loop runs once) and whether the epilogue is SwiGLU.
///
///   producer warpgroup (one thread)           consumer warpgroups 0 and 1 (64 rows each)
///   for each tile t = block, block + grid, ...:   for each tile, the same t:
///     find its expert and rows                      find its expert and rows
///     for each K slice: wait empty, TMA             for each K slice: wait full, 4 × wgmma
///       A rows row0 .. row0 + 127 (may run            m64n256k16 (none if all 64 rows lie past
///       past the expert: never stored),               the expert), release the slice before
///       W rows of the expert's n-tile                 the epilogue: the producer runs ahead
///                                                   into the next tile
///                                                   epilogue: SwiGLU and/or row scale, then
///                                                   the step's store, clipped at the expert's end
///
/// The pipeline's ring of stages runs on across tiles and across experts: an expert boundary costs
/// nothing but the lookup (a binary search over the tile prefix, in L1 after the first tile).
#pragma once

#include <algorithm>
#include <limits>

#include "grouped_launch.hpp"
// Angle brackets: the exercise build puts the skeleton's grouped_tiles.hpp first on the include path.
#include <grouped_tiles.hpp>

#include "kc/check.hpp"
#include "kc/device_info.hpp"
#include "tensor_map_ptx.cuh"

namespace kc::ch08::detail {

using ch07::FragmentPosition;
using ch07::kBlockK;
using ch07::kStoreBoxBytes;
using ch07::kStoreBoxCols;
using ch07::kWarpgroupThreads;
using ch07::PipelineState;

/// Writes 128 columns of a warpgroup's 64-row output, value(8 · (first_step + s) + r) for s < 8, r < 8,
/// rounded to bf16, into its staging buffer as two swizzled 64 × 64 boxes: Chapter 7's
/// stage_accumulators (same stmatrix rows, same layout), reading values from a function instead of an
/// array. @p first_step must be known after unrolling.
template <class Value>
__device__ __forceinline__ void stage_values(const Value& value, unsigned char* staging, int first_step) {
  const int thread = static_cast<int>(threadIdx.x % kWarpgroupThreads);
  const int warp = thread / 32, lane = thread % 32;
  const std::uint32_t base = ptx::smem_address(staging);
#pragma unroll
  for (int step = 0; step < 8; ++step) {
    const FragmentPosition row = ch07::stmatrix_row(warp, lane, step);
    const int i = 8 * (first_step + step);
    ptx::stmatrix_x4(base + static_cast<std::uint32_t>(ch07::c_staging_offset(row.row, row.col)),
                     ptx::pack_bf16x2(value(i), value(i + 1)), ptx::pack_bf16x2(value(i + 2), value(i + 3)),
                     ptx::pack_bf16x2(value(i + 4), value(i + 5)), ptx::pack_bf16x2(value(i + 6), value(i + 7)));
  }
}

/// The A rows one producer lane loads when the kernel gathers them (kGather): rows lane, lane + 32,
/// lane + 64 and lane + 96 of the tile, each a one-row box of X.
inline constexpr int kGatherRowsPerLane = kTile.block_m / 32;

/// The grouped kernel: see the file's description. @p kStep picks the store, @p kSwiglu the epilogue
/// (silu(gate) · up over the two W boxes' halves of the accumulators); args.row_scale, when not null,
/// scales each row of C. @p kGather: A's row r is row args.gather_rows[r] of the matrix @p a_map maps
/// (X, in one-row boxes): the producer warp's 32 lanes load the tile's 128 rows one by one (TMA
/// swizzles each by its shared-memory address, so they land as one 128-row box would), and no
/// permuted copy of the tokens exists.
template <GroupedStep kStep, bool kSwiglu, bool kGather = false>
__global__ void __launch_bounds__(kTile.threads(), 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                        const __grid_constant__ CUtensorMap c_map, const GroupedArgs args) {
  constexpr bool kTmaStore = uses_tma_store(kStep);
  constexpr bool kKeepA = kStep == GroupedStep::a_evict_last || kStep == GroupedStep::block_per_tile;
  constexpr EpilogueKind kKind = kSwiglu ? EpilogueKind::swiglu : EpilogueKind::plain;
  constexpr int kConsumerWarps = kTile.consumer_warpgroups * kWarpgroupThreads / 32;
  constexpr int kProducerRegisters = 40;
  constexpr int kConsumerRegisters = 232;
  constexpr int kProducerLanes = kGather ? 32 : 1;
  // Output columns per consumer and tile: 256 plain (staged in two parts of 128), 128 SwiGLU (one part).
  constexpr int kOutCols = output_tile_cols(kKind);
  constexpr int kParts = kOutCols / 128;
  constexpr int kOutValues = kOutCols / 2;  // a thread's share of its warpgroup's 64 × kOutCols outputs
  (void)kOutValues;
  static_assert(kWarpgroupThreads * (kProducerRegisters + kTile.consumer_warpgroups * kConsumerRegisters) <=
                    65536 / kTile.threads() / 8 * 8 * kTile.threads(),
                "setmaxnreg moves registers between warpgroups; it cannot create them");

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  auto stage = [smem](int s) { return smem + s * kTile.stage_bytes(); };
  unsigned char* staging = smem + kTile.stages * kTile.stage_bytes();
  auto* full = reinterpret_cast<std::uint64_t*>(staging + kTile.c_staging_bytes());
  std::uint64_t* empty = full + kTile.stages;

  const int k_tiles = (args.k + kBlockK - 1) / kBlockK;
  // The real tile count, known only here: the prefix kernel wrote it before this kernel started.
  const int tiles = args.tile_prefix[args.experts] * args.tiles_n;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  auto work_of = [&args](int tile) {
    return grouped_work(tile, args.offsets, args.tile_prefix, args.experts, args.m_total, args.tiles_n, args.group_m);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kTile.stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ------------------------------------------------------------------------------------- producer
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x < kProducerLanes) {
      const int lane = static_cast<int>(threadIdx.x);
      PipelineState p;
      const std::uint64_t evict_last = ptx::l2_evict_last_policy();
      for (int tile = static_cast<int>(blockIdx.x); tile < tiles; tile += static_cast<int>(gridDim.x)) {
        const GroupedWork work = work_of(tile);
        const WBoxRows w_rows = w_box_rows(work.expert, work.n_tile, args.n, kKind);
        // Step 4: an expert of one m-tile reads each W box once, and its A rows once per n-tile, on
        // other SMs at other times. Its A boxes are loaded evict-last: the L2 keeps them while the
        // weights stream past, until the expert's last n-tile has read them.
        const bool keep_a = kKeepA && args.tile_prefix[work.expert + 1] - args.tile_prefix[work.expert] == 1;
        // Gathering: this lane's rows of X, once per tile. Rows past the expert are never stored: they
        // load its last row again, so every box is whole and in bounds.
        [[maybe_unused]] int source[kGather ? kGatherRowsPerLane : 1];
        if constexpr (kGather) {
#pragma unroll
          for (int j = 0; j < kGatherRowsPerLane; ++j) {
            source[j] = args.gather_rows[min(work.row0 + lane + 32 * j, work.row_end - 1)];
          }
        }
        for (int kt = 0; kt < k_tiles; ++kt, p.advance(kTile.stages)) {
          unsigned char* s = stage(p.stage);
          if (lane == 0) {
            if (p.wrapped) ptx::mbarrier_wait(&empty[p.stage], p.phase ^ 1u);
            // Every box is whole in bytes, zeros included: the stage always receives stage_bytes().
            ptx::mbarrier_arrive_expect_tx(&full[p.stage], kTile.stage_bytes());
            if constexpr (!kGather) {
              if (keep_a) {
                ptx::tma_load_2d_hinted(s, &a_map, &full[p.stage], kt * kBlockK, work.row0, evict_last);
              } else {
                ptx::tma_load_2d(s, &a_map, &full[p.stage], kt * kBlockK, work.row0);
              }
            }
            ptx::tma_load_2d(s + kTile.a_box_bytes(), &w_map, &full[p.stage], kt * kBlockK, w_rows.first);
            ptx::tma_load_2d(s + kTile.a_box_bytes() + kWBoxRows * 128, &w_map, &full[p.stage], kt * kBlockK,
                             w_rows.second);
          }
          if constexpr (kGather) {
            __syncwarp();  // lane 0 has seen the stage empty: every lane may now fill it
#pragma unroll
            for (int j = 0; j < kGatherRowsPerLane; ++j) {
              unsigned char* row = s + (lane + 32 * j) * 128;  // 64 bf16 of K per row
              if (keep_a) {
                ptx::tma_load_2d_hinted(row, &a_map, &full[p.stage], kt * kBlockK, source[j], evict_last);
              } else {
                ptx::tma_load_2d(row, &a_map, &full[p.stage], kt * kBlockK, source[j]);
              }
            }
          }
        }
      }
    }
    return;
  }
  // -------------------------------------------------------------------------------------- consumers
  ptx::setmaxnreg_inc<kConsumerRegisters>();
  const int consumer = warpgroup - 1;  // rows 64·consumer .. 64·consumer + 63 of each tile
  const int thread = static_cast<int>(threadIdx.x % kWarpgroupThreads);
  const bool lane0 = threadIdx.x % 32 == 0;
  const bool store_leader = thread == 0;  // issues this warpgroup's TMA stores (bulk groups are per thread)
  unsigned char* my_staging = staging + consumer * (kTile.c_staging_bytes() / kTile.consumer_warpgroups);
  float acc[kTile.block_n / 2];  // no zeroing: each tile's first wgmma has scale-d = 0
  PipelineState c;
  int previous_stage = 0;
  int acquired_expert = -1;  // step 2: the expert whose store map this warpgroup last acquired
  for (int tile = static_cast<int>(blockIdx.x); tile < tiles; tile += static_cast<int>(gridDim.x)) {
    const GroupedWork work = work_of(tile);
    const int row0 = work.row0 + kWarpgroupRows * consumer;
    // A warpgroup whose 64 rows all lie past the expert (the second half of an expert's last, short
    // m-tile) only passes the slices on: its wgmmas would compute rows that are never stored, and the
    // other warpgroup has the tensor cores to itself.
    const bool idle = warpgroup_idle(work, consumer);
    for (int kt = 0; kt < k_tiles; ++kt, c.advance(kTile.stages)) {
      ptx::mbarrier_wait(&full[c.stage], c.phase);
      if (!idle) {
        const std::uint64_t a_desc = ptx::descriptor_of(stage(c.stage) + consumer * 64 * 128);
        const std::uint64_t w_desc = ptx::descriptor_of(stage(c.stage) + kTile.a_box_bytes());
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockK / 16; ++kk) {
          ptx::wgmma_m64n256k16(acc, a_desc + 2 * kk, w_desc + 2 * kk, kt > 0 || kk > 0 ? 1 : 0);
        }
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<1>();
      }
      if (kt > 0 && lane0) ptx::mbarrier_arrive(&empty[previous_stage]);
      previous_stage = c.stage;
    }
    ptx::wgmma_wait_group<0>();
    if (lane0) ptx::mbarrier_arrive(&empty[previous_stage]);
    if (idle) continue;
    ptx::fence_accumulators(acc);
    const int col0 = work.n_tile * kOutCols;
    // The epilogue's values. A thread holds two rows of its warpgroup's 64 (accumulator_position: lane
    // / 4 and + 8 of its warp's 16), so two scales cover it; register i is in the second when (i >> 1) & 1.
    float scale[2] = {1.0f, 1.0f};
    if (args.row_scale != nullptr) {
      const int r = row0 + 16 * (thread / 32) + (thread % 32) / 4;
      scale[0] = r < args.m_total ? args.row_scale[r] : 0.0f;
      scale[1] = r + 8 < args.m_total ? args.row_scale[r + 8] : 0.0f;
    }
    // Output value i of this thread (i < kOutValues), computed where it is stored: a copy of all of
    // them beside the accumulators would not fit the registers.
    auto value = [&](int i) {
      if constexpr (kSwiglu) {
        // Register i holds gate column j, register i + 64 the up column j (the second W box): same row.
        const float gate = acc[i], up = acc[i + kOutValues];
        return gate / (1.0f + __expf(-gate)) * up * scale[(i >> 1) & 1];
      } else {
        return acc[i] * scale[(i >> 1) & 1];
      }
    };

    if constexpr (!kTmaStore) {
      // Step 1: from registers, each pair of adjacent columns masked at the expert's end and C's width.
#pragma unroll
      for (int i = 0; i < kOutValues; i += 2) {
        const FragmentPosition at = ch07::accumulator_position(thread, i);
        const int row = row0 + at.row, col = col0 + at.col;
        if (row >= work.row_end || col >= args.n_out) continue;
        __nv_bfloat16* dst = args.c + static_cast<std::size_t>(row) * args.n_out + col;
        if (args.paired_stores) {
          *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(value(i), value(i + 1));
        } else {
          dst[0] = __float2bfloat16_rn(value(i));
          if (col + 1 < args.n_out) dst[1] = __float2bfloat16_rn(value(i + 1));
        }
      }
    } else {
      // Steps 2 and 3: stage 128 columns at a time (Chapter 7's step 6), TMA stores clipped by the map.
      const CUtensorMap* map = &c_map;
      if constexpr (kStep == GroupedStep::device_tensor_maps) {
        map = args.expert_maps + work.expert;
        // The prefix kernel wrote this map through the generic proxy: make it visible to the copy
        // engine before its first use here. (Only the leader issues stores, so only it needs it.)
        if (store_leader && work.expert != acquired_expert) ptx::fence_tensormap_acquire(map);
        acquired_expert = work.expert;
      }
#pragma unroll
      for (int part = 0; part < kParts; ++part) {
        if (store_leader) ptx::bulk_wait_group_read<0>();
        ptx::named_barrier_sync(1 + consumer, kWarpgroupThreads);
        stage_values(value, my_staging, part * 8);
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(1 + consumer, kWarpgroupThreads);
        if (store_leader) {
#pragma unroll
          for (int box = 0; box < 128 / kStoreBoxCols; ++box) {
            const int col = col0 + part * 128 + box * kStoreBoxCols;
            if (col >= args.n_out) continue;
            const void* src = my_staging + box * kStoreBoxBytes;
            if constexpr (kStep == GroupedStep::device_tensor_maps) {
              ptx::tma_store_2d(map, src, col, row0 - (work.row_end - work.expert_rows));
            } else {  // steps 3 and 4
              const RaggedCoord at = ragged_coord(row0, work.row_end, work.expert_rows);
              ptx::tma_store_3d(map, src, col, at.x, at.y);
            }
          }
          ptx::bulk_commit_group();
        }
      }
    }
  }
  // The staged tiles must have left shared memory (and reached C) before the block exits.
  if (kTmaStore && store_leader) ptx::bulk_wait_group<0>();
}

/// Enqueues grouped_gemm_kernel<kStep, kSwiglu, kGather>: the shared-memory opt-in and the SM count once
/// per device, then a persistent grid of min(SMs, @p tile_bound) blocks, or for step 5 a block per
/// tile (@p tile_bound blocks; those past the real tile count exit at once).
template <GroupedStep kStep, bool kSwiglu, bool kGather = false>
void launch_grouped_kernel(const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                           const GroupedArgs& args, std::int64_t tile_bound, cudaStream_t stream) {
  const int sms = cached_per_device([](int device) {
    check(cudaFuncSetAttribute(grouped_gemm_kernel<kStep, kSwiglu, kGather>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kTile.smem_bytes())));
    int count = 0;
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  });
  const int grid = kStep == GroupedStep::block_per_tile
                       ? static_cast<int>(std::clamp<std::int64_t>(tile_bound, 1, std::numeric_limits<int>::max()))
                       : ch07::persistent_grid(tile_bound, sms);
  grouped_gemm_kernel<kStep, kSwiglu, kGather>
      <<<grid, kTile.threads(), kTile.smem_bytes(), stream>>>(a_map, w_map, c_map, args);
  check_launch();
}

}  // namespace kc::ch08::detail
