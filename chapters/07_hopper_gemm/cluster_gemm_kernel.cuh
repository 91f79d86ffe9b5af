/// @file cluster_gemm_kernel.cuh
/// @brief The kernel of steps 5 and 6: persistent clusters of two CTAs along M, each W tile loaded once
/// per cluster and multicast to both CTAs (step5_cluster_multicast.cu explains the cluster protocol).
/// The template parameter, a tile, picks the epilogue: step 5 stores the accumulators from registers
/// while the tensor cores wait; step 6 stages them in shared memory and lets TMA store them
/// (step6_tma_store.cu explains it), so the consumers start their next tile at once.
#pragma once

#include "hopper_ptx.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"

namespace kc::ch07::detail {

// The kernel's template argument is a tile, passed as a type that holds it: nvcc's launch stubs do not
// take a class-type template argument (a TileConfig) directly. The type also carries two launch
// options, off unless `after` turns them on.
/// The options every tile type starts from: an ordinary launch, every tile whole.
struct ClusterKernelOptions {
  static constexpr bool dependent_launch = false;  ///< programmatic stream serialization, griddepcontrol
  static constexpr bool stream_k = false;          ///< Stream-K on the last round (out.stream_k, out.workspace)
};
/// Step 5's tile as a kernel template argument.
struct Step5Cluster : ClusterKernelOptions {
  static constexpr TileConfig tile = kStep5Tile;  ///< 128 × 256, stores from registers
};
/// Step 6's tile as a kernel template argument.
struct Step6Cluster : ClusterKernelOptions {
  static constexpr TileConfig tile = kStep6Tile;  ///< 128 × 256, 4 stages, half the tile staged at a time
};
/// Step 6 launched as a programmatic dependent of the previous kernel in the stream: `after`.
struct Step6DependentLaunchCluster : ClusterKernelOptions {
  static constexpr TileConfig tile = kStep6Tile;  ///< step 6's tile
  static constexpr bool dependent_launch = true;  ///< programmatic stream serialization, griddepcontrol
};
/// `after` with Stream-K on the last round (gemm_bf16_hopper with a workspace): the full rounds of
/// whole tiles, then the last round's tiles shared out by slice over every cluster (StreamKPlan).
struct Step6StreamKCluster : Step6DependentLaunchCluster {
  static constexpr bool stream_k = true;  ///< out.stream_k and out.workspace
};

/// The kernel of steps 5 and 6: a persistent grid of clusters of two CTAs, each with a producer
/// warpgroup (TMA loads, W multicast to both CTAs) and two consumer warpgroups (wgmma, then the
/// epilogue). The tile picks the epilogue: stores from registers without C staging (step 5,
/// kStep5Tile), TMA stores of C staged kTile.c_staging_parts times per tile with it (step 6,
/// kStep6Tile). @p c_map is read only when
/// kTile.c_staging and out.tma_store. @p Tile is one of the tile types above (Tile::tile is the tile).
template <class Tile>
__global__ void __launch_bounds__(Tile::tile.threads(), 1)
    cluster_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                        const __grid_constant__ CUtensorMap c_map, const Output out) {
  constexpr TileConfig kTile = Tile::tile;  // (lambdas below name Tile::tile: nvcc lets them use no local constexpr)
  constexpr bool kTmaStore = kTile.c_staging;
  constexpr int kStoreParts = kTile.c_staging_parts;
  constexpr int kConsumerWarps = kTile.consumer_warpgroups * kWarpgroupThreads / 32;
  constexpr int kProducerRegisters = 40;
  constexpr int kConsumerRegisters = 232;
  constexpr std::uint16_t kAllCtas = (1u << kTile.cluster_m) - 1;  // multicast mask: every CTA of the cluster
  static_assert(kTile.cluster_m == 2 && kTile.consumer_warpgroups == 2 && kTile.producer_warpgroups == 1 &&
                    kTile.block_m == 128 && (kTile.block_n == 128 || kTile.block_n == 256),
                "the cluster kernel's roles: one producer and two consumer warpgroups of 64 rows each, in "
                "clusters of two, N 128 or 256 (one wgmma m64nNk16 per k16)");
  static_assert(kWarpgroupThreads * (kProducerRegisters + kTile.consumer_warpgroups * kConsumerRegisters) <=
                    65536 / kTile.threads() / 8 * 8 * kTile.threads(),
                "setmaxnreg moves registers between warpgroups; it cannot create them");
  constexpr int kPartCols = kTile.block_n / kStoreParts;  // columns of C staged at a time
  static_assert(!kTmaStore || (kTile.c_staging_bytes() / kTile.consumer_warpgroups ==
                               kStoreBoxBytes * (kPartCols / kStoreBoxCols)),
                "each consumer stages its 64 rows as block_n / c_staging_parts / 64 boxes of 64 × 64 at a time");

  extern __shared__ unsigned char smem_raw[];
  // The same layout in both CTAs (same kernel, same dynamic shared memory): a multicast writes one
  // offset in each, so the aligned base must be the same offset too. It is: the runtime places
  // dynamic shared memory identically in every CTA of a launch.
  unsigned char* smem = ptx::align_to_swizzle_atom(smem_raw);
  auto stage = [smem](int s) { return smem + s * Tile::tile.stage_bytes(); };
  unsigned char* staging = smem + kTile.stages * kTile.stage_bytes();  // step 6's C staging (1024-aligned)
  auto* full = reinterpret_cast<std::uint64_t*>(staging + kTile.c_staging_bytes());
  std::uint64_t* empty = full + kTile.stages;

  const int rank = ptx::cluster_rank();                                          // 0: upper 128 rows, 1: lower
  const auto cluster = static_cast<std::int64_t>(blockIdx.x) / kTile.cluster_m;  // clusters are consecutive
  const std::int64_t clusters = gridDim.x / kTile.cluster_m;
  const std::int64_t cluster_tiles = cluster_tile_count(out.tiles_m, out.tiles_n, kTile.cluster_m);
  const int k_tiles = (out.k + kBlockK - 1) / kBlockK;
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  // Both CTAs of a cluster walk the same cluster tiles, so they pass through the same number of
  // slices and their barriers' rounds stay in step.
  //
  // A member tile past the last m-tile has no rows of C (rank 1 in the last row of an odd tiles_m);
  // its origin is kept at row 0 so that no arithmetic on it can overflow.
  struct MemberTile {
    TileOrigin at;
    bool has_rows;
  };
  auto tile_of = [&out, rank](std::int64_t cluster_tile) {
    const TileCoord c = cluster_member_tile(static_cast<int>(cluster_tile), rank, out.tiles_m, out.tiles_n, kGroupM,
                                            Tile::tile.cluster_m);
    const bool has_rows = c.m_tile < out.tiles_m;
    return MemberTile{{has_rows ? c.m_tile * Tile::tile.block_m : 0, c.n_tile * Tile::tile.block_n}, has_rows};
  };

  // The work of this cluster, in units of (cluster tile, slices [k_begin, k_end)): first whole tiles,
  // round-robin over the clusters; then, with Stream-K, the (at most two) pieces of its share of the
  // split tiles. An empty piece is skipped by every role alike.
  // (int: a launch has at most 2^31 - 1 tiles, validated on the host.)
  struct WorkUnit {
    int cluster_tile;
    int k_begin, k_end;
    int split_tile;  // which split tile the piece is of; -1 for a whole tile
  };
  const int whole_tiles = Tile::stream_k ? out.stream_k.dp_tiles : static_cast<int>(cluster_tiles);
  const int whole_units =
      whole_tiles > cluster ? static_cast<int>((whole_tiles - cluster + clusters - 1) / clusters) : 0;
  const int units = whole_units + (Tile::stream_k ? 2 : 0);
  // This cluster's Stream-K pieces and, for the piece it owns, the first cluster holding a piece of
  // the same tile: worked out once, by thread 0 while it sets up the barriers (64-bit divisions,
  // which the consumers have no registers to spare for), and read from shared memory.
  __shared__ ch06::WorkUnit split_pieces[2];
  __shared__ int owned_tile_first_cluster;
  auto unit_of = [&](int u) {
    if (u < whole_units)
      return WorkUnit{static_cast<int>(cluster + static_cast<std::int64_t>(u) * clusters), 0, k_tiles, -1};
    const ch06::WorkUnit piece = split_pieces[u - whole_units];
    return WorkUnit{whole_tiles + piece.tile, piece.k_begin, piece.k_end, piece.tile};
  };

  if (threadIdx.x == 0) {
    if constexpr (Tile::stream_k) {
      owned_tile_first_cluster = static_cast<int>(cluster);
      for (int i = 0; i < 2; ++i) {
        split_pieces[i] = stream_k_piece(out.stream_k, static_cast<int>(cluster), i);
        if (split_pieces[i].k_begin < split_pieces[i].k_end && split_pieces[i].k_end == k_tiles) {
          owned_tile_first_cluster = ch06::first_contributor(out.stream_k, split_pieces[i].tile);
        }
      }
    }
    for (int s = 0; s < kTile.stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);  // this CTA's producer's expect_tx; the bytes come from both
      ptx::mbarrier_init(&empty[s], kConsumerWarps * kTile.cluster_m);  // every consumer warp of the cluster
    }
    ptx::fence_mbarrier_init();  // release at cluster scope: the peer may use them next
  }
  ptx::cluster_sync();  // both CTAs' barriers exist before anyone multicasts or arrives remotely
  if constexpr (Tile::dependent_launch) {
    // Everything above touched only this CTA's shared memory, so it overlapped the previous kernel's
    // last tiles. That kernel may have written A or W, and may still be writing C: wait for it to
    // finish and its writes to be visible. Then let the next kernel's blocks take each SM as this grid's blocks leave
    // it (they can't share one: each needs nearly all of its shared memory).
    ptx::wait_for_previous_grid();
    ptx::allow_next_grid();
  }

  if (warpgroup == 0) {
    // ------------------------------------------------------------------------------------- producer
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      PipelineState p;
      for (int u = 0; u < units; ++u) {
        const WorkUnit unit = unit_of(u);
        if (unit.k_begin == unit.k_end) continue;
        const MemberTile t = tile_of(unit.cluster_tile);
        const bool own_w_slice = w_slice_in_matrix(kTile, rank, t.at.n0, out.n);
        const int w_row = own_w_slice ? t.at.n0 + rank * kTile.w_box_rows() : 0;  // this CTA's half of W
        const int bytes = cluster_stage_bytes(kTile, t.has_rows, t.at.n0, out.n);
        for (int kt = unit.k_begin; kt < unit.k_end; ++kt, p.advance(kTile.stages)) {
          // The refill writes into both CTAs: wait until both CTAs' consumers released the stage.
          if (p.wrapped) ptx::mbarrier_wait(&empty[p.stage], p.phase ^ 1u);
          ptx::mbarrier_arrive_expect_tx(&full[p.stage], static_cast<std::uint32_t>(bytes));
          if (t.has_rows) ptx::tma_load_2d(stage(p.stage), &a_map, &full[p.stage], kt * kBlockK, t.at.m0);
          if (own_w_slice) {
            ptx::tma_load_2d_multicast(stage(p.stage) + kTile.a_box_bytes() + rank * kTile.w_box_bytes(), &w_map,
                                       &full[p.stage], kt * kBlockK, w_row, kAllCtas);
          }
        }
      }
    }
  } else {
    // ------------------------------------------------------------------------------------ consumers
    ptx::setmaxnreg_inc<kConsumerRegisters>();
    const int consumer = warpgroup - 1;  // rows 64·consumer .. 64·consumer + 63 of each tile
    const bool lane0 = threadIdx.x % 32 == 0;
    // Step 6: the thread that issues this warpgroup's TMA stores (bulk groups belong to a thread).
    const bool store_leader = threadIdx.x % kWarpgroupThreads == 0;
    unsigned char* my_staging = staging + consumer * (kTile.c_staging_bytes() / kTile.consumer_warpgroups);
    // A consumer warp is done with a stage: tell the empty barrier of every CTA that wrote into it.
    auto release = [empty, lane0](int s) {
      if (!lane0) return;
      for (int cta = 0; cta < Tile::tile.cluster_m; ++cta) ptx::mbarrier_arrive_cluster(&empty[s], cta);
    };
    float acc[kTile.block_n / 2];  // no zeroing: each tile's first wgmma has scale-d = 0
    PipelineState c;
    int previous_stage = 0;
    // Stream-K, after a piece of a split tile: a piece without the tile's last slice is stored as
    // this consumer's partial for the owner, and a flag says it is there (false: nothing to write).
    // The owner's piece adds the partials of the clusters before it, each once its flag is up (and
    // puts the flag down for the next launch), then goes on to the epilogue (true).
    auto stream_k_fix_up = [&](bool owner) {
      const int thread = static_cast<int>(threadIdx.x % kWarpgroupThreads);
      auto* flags = static_cast<std::int32_t*>(out.workspace);
      auto* partials =
          reinterpret_cast<float4*>(static_cast<unsigned char*>(out.workspace) + StreamKWorkspace::kFlagBytes);
      constexpr int kGroups = kTile.block_n / 2 / 4;  // float4 groups of accumulators per thread
      // Group g of every thread lies together: each warp's access is 512 contiguous bytes.
      auto partial_of = [&](int slot) {
        return partials + static_cast<std::size_t>(slot) * (StreamKWorkspace::kPartialFloats / 4) + thread;
      };
      if (!owner) {
        const int slot = StreamKWorkspace::index(static_cast<int>(cluster), rank, consumer);
        float4* mine = partial_of(slot);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          __stcg(mine + g * kWarpgroupThreads, make_float4(acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]));
        }
        ptx::named_barrier_sync(1 + consumer, kWarpgroupThreads);  // every thread's part is written
        if (store_leader) ptx::flag_release(&flags[slot]);
        return false;
      }
      // Every cluster's share holds a slice (the plan's rule), so every cluster from the first up to
      // this one stored a piece of this tile.
      for (int from = owned_tile_first_cluster; from < cluster; ++from) {
        const int slot = StreamKWorkspace::index(from, rank, consumer);
        if (store_leader) {
          ptx::flag_acquire_wait(&flags[slot]);
          flags[slot] = 0;  // read by no one else in this launch; the next launch runs after this one
        }
        ptx::named_barrier_sync(1 + consumer, kWarpgroupThreads);  // the partial is there for every thread
        const float4* theirs = partial_of(slot);
        // Four loads in flight at a time: all 32 at once would need 128 more registers than the
        // consumers have beside their accumulators (the empty asm keeps ptxas from hoisting them).
        constexpr int kInFlight = 4;
#pragma unroll
        for (int g0 = 0; g0 < kGroups; g0 += kInFlight) {
          float4 v[kInFlight];
#pragma unroll
          for (int i = 0; i < kInFlight; ++i) v[i] = __ldcg(theirs + (g0 + i) * kWarpgroupThreads);
#pragma unroll
          for (int i = 0; i < kInFlight; ++i) {
            acc[4 * (g0 + i)] += v[i].x;
            acc[4 * (g0 + i) + 1] += v[i].y;
            acc[4 * (g0 + i) + 2] += v[i].z;
            acc[4 * (g0 + i) + 3] += v[i].w;
          }
          asm volatile("" ::: "memory");
        }
      }
      return true;
    };
    for (int u = 0; u < units; ++u) {
      const WorkUnit unit = unit_of(u);
      if (unit.k_begin == unit.k_end) continue;
      const MemberTile t = tile_of(unit.cluster_tile);
      for (int kt = unit.k_begin; kt < unit.k_end; ++kt, c.advance(kTile.stages)) {
        ptx::mbarrier_wait(&full[c.stage], c.phase);
        if (t.has_rows) {
          const std::uint64_t a_desc = ptx::descriptor_of(stage(c.stage) + consumer * 64 * 128);
          const std::uint64_t w_desc = ptx::descriptor_of(stage(c.stage) + kTile.a_box_bytes());
          ptx::wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < kBlockK / 16; ++kk) {
            if constexpr (kTile.block_n == 256) {
              ptx::wgmma_m64n256k16(acc, a_desc + 2 * kk, w_desc + 2 * kk, kt > unit.k_begin || kk > 0 ? 1 : 0);
            } else {
              ptx::wgmma_m64n128k16(acc, a_desc + 2 * kk, w_desc + 2 * kk, kt > unit.k_begin || kk > 0 ? 1 : 0);
            }
          }
          ptx::wgmma_commit_group();
        }
        ptx::wgmma_wait_group<1>();
        if (kt > unit.k_begin) release(previous_stage);
        previous_stage = c.stage;
      }
      ptx::wgmma_wait_group<0>();
      release(previous_stage);
      if (!t.has_rows) continue;
      if constexpr (Tile::stream_k) {
        if (unit.split_tile >= 0 && !stream_k_fix_up(unit.k_end == k_tiles)) continue;
      }
      ptx::fence_accumulators(acc);
      const int row0 = t.at.m0 + 64 * consumer;
      if (kTmaStore && out.tma_store) {
        // Step 6. The staging buffer is free once the previous stores have read it (in practice long
        // ago for the first part: a whole tile of math has passed); the barrier tells the other 127
        // threads. With kStoreParts = 2 the second half waits for the first half's read.
#pragma unroll
        for (int part = 0; part < kStoreParts; ++part) {
          if (store_leader) ptx::bulk_wait_group_read<0>();
          ptx::named_barrier_sync(1 + consumer, kWarpgroupThreads);
          ptx::stage_accumulators<kPartCols / 16>(acc, my_staging, part * (kPartCols / 16));
          ptx::fence_proxy_async_shared();  // the stmatrix writes, visible to TMA
          ptx::named_barrier_sync(1 + consumer, kWarpgroupThreads);
          if (store_leader) {
            if (row0 < out.m) {
              for (int box = 0; box < kPartCols / kStoreBoxCols; ++box) {
                const int col = t.at.n0 + part * kPartCols + box * kStoreBoxCols;
                if (col < out.n) ptx::tma_store_2d(&c_map, my_staging + box * kStoreBoxBytes, col, row0);
              }
            }
            ptx::bulk_commit_group();
          }
        }
        // No wait: the warpgroup goes straight on to its next tile while TMA writes this one.
      } else {
        ptx::store_accumulators(acc, out, row0, t.at.n0);
      }
    }
    // Step 6: the staged tiles must have left shared memory (and reached C) before the CTA exits.
    if (kTmaStore && store_leader) ptx::bulk_wait_group<0>();
  }
  // Every thread of both CTAs, whatever its role: the last remote arrivals on this CTA's barriers
  // happen before either CTA leaves.
  ptx::cluster_sync();
}

/// The launch configuration of cluster_gemm_kernel<Tile> without its grid and stream: clusters of
/// cluster_m along x, the block, the dynamic shared memory, and (for the dependent launch) the
/// programmatic stream serialization attribute in @p attributes[1].
template <class Tile>
cudaLaunchConfig_t cluster_launch_config(cudaLaunchAttribute (&attributes)[2]) {
  constexpr TileConfig kTile = Tile::tile;
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kTile.cluster_m;  // pairs of consecutive blockIdx.x
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kTile.cluster_m);  // one cluster, for the occupancy query
  config.blockDim = dim3(kTile.threads());
  config.dynamicSmemBytes = kTile.smem_bytes();
  config.attrs = attributes;
  config.numAttrs = 1;  // the cluster shape only
  return config;
}

/// How many clusters of cluster_gemm_kernel<Tile> the current GPU holds at once, which sizes the
/// grid. Queried once per device, with the shared-memory opt-in (never inside a graph capture after
/// the first call). Clusters must fit in one GPC, so this can be less than SMs / 2 (an odd SM left
/// over in a GPC stays idle).
template <class Tile>
int resident_clusters() {
  return cached_per_device([](int device) {
    cudaLaunchAttribute attributes[2] = {};
    const cudaLaunchConfig_t config = cluster_launch_config<Tile>(attributes);
    check(cudaFuncSetAttribute(cluster_gemm_kernel<Tile>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(Tile::tile.smem_bytes())));
    int clusters = 0;
    check(cudaOccupancyMaxActiveClusters(&clusters, cluster_gemm_kernel<Tile>, &config));
    if (clusters < 1) {  // no answer: fall back to pairs of SMs (the grid stays correct, only less resident)
      int sms = 0;
      check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      clusters = sms / Tile::tile.cluster_m;
    }
    return clusters;
  });
}

/// Launches cluster_gemm_kernel<Tile> on @p stream: as many clusters of two as the GPU holds at once
/// (resident_clusters), at most one per cluster tile. @p c_map is read only when Tile::tile.c_staging
/// and out.tma_store. With Tile::stream_k, the launch's StreamKPlan is made here, for its grid.
template <class Tile>
void launch_cluster_gemm(const CUtensorMap& a_map, const CUtensorMap& w_map, const CUtensorMap& c_map,
                         const Output& out, cudaStream_t stream) {
  constexpr TileConfig kTile = Tile::tile;
  cudaLaunchAttribute attributes[2] = {};
  cudaLaunchConfig_t config = cluster_launch_config<Tile>(attributes);
  config.stream = stream;
  const int grid = cluster_grid(out.tiles_m, out.tiles_n, kTile.cluster_m, resident_clusters<Tile>());
  config.gridDim = dim3(static_cast<unsigned>(grid));
  if constexpr (Tile::dependent_launch) config.numAttrs = 2;  // and programmatic stream serialization
  Output launch_out = out;
  if constexpr (Tile::stream_k) {
    // The host checked the workspace against the most clusters this GPU can hold (SMs / 2); this is
    // the same rule for the grid it got.
    const int clusters = grid / kTile.cluster_m;
    launch_out.stream_k = stream_k_plan(cluster_tile_count(out.tiles_m, out.tiles_n, kTile.cluster_m), clusters,
                                        (out.k + kBlockK - 1) / kBlockK);
    if (launch_out.stream_k.sk_tiles > 0 && (clusters > StreamKWorkspace::kMaxClusters || out.workspace == nullptr ||
                                             out.workspace_bytes < StreamKWorkspace::bytes(clusters))) {
      throw InvalidArgument("workspace_bytes (" + std::to_string(out.workspace_bytes) + ") must be at least " +
                            std::to_string(StreamKWorkspace::bytes(clusters)) + " for a grid of " +
                            std::to_string(clusters) + " clusters (gemm_bf16_hopper_workspace_bytes())");
    }
  }
  check(cudaLaunchKernelEx(&config, cluster_gemm_kernel<Tile>, a_map, w_map, c_map, launch_out));
  check_launch();
}

}  // namespace kc::ch07::detail
