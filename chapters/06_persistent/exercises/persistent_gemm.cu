// EXERCISE: persistent_gemm.cu with its key lines replaced by TODOs. Fill them in here.
// Generated from ../persistent_gemm.cu by tools/exercises.py (do not edit the solution's copy).
// Build and test this file in place of the solution:
//   cmake --preset exercises && cmake --build --preset exercises && ctest --preset exercises -L ch06
// Until every TODO is done the chapter's tests fail; the lesson (README.md) explains the solution.

// Persistent grouped GEMM: a grid of SMs × blocks-per-SM blocks that loop over Chapter 5's tiles,
// in one launch and no kernel in front of it.
//
//   - Every block first computes its own copy of the m-tile prefix over experts from the device
//     offsets (Chapter 5 computes it once, in a kernel of its own, before the GEMM).
//   - The schedulers' counters are left at zero by every launch: the thread that draws a counter's
//     last ticket, and each owner warp once its partners are in, set their words back to zero. So
//     nothing has to zero them in front of the next launch; a workspace is zeroed once, when it is
//     new (grouped_gemm_persistent_workspace_init).
//   - persistent_kernel<Cfg, scheduler>: every block loops over tiles in Chapter 5's grouped order
//     and runs Chapter 2's block tile on each, with a __syncthreads() between two tiles (the next
//     tile's copies overwrite the shared memory the last one read).
//        static:   tiles blockIdx.x, + gridDim.x, ...                       (schedule.hpp)
//        dynamic:  tile blockIdx.x, then one atomicAdd per tile on a counter
//        stream_k: whole tiles round-robin, then ranges of the last wave's k-slices claimed
//                  from a counter; a split tile's partners store fp32 partials, its owner adds
//                  them in a fixed order and stores C (stream_k_unit, below).
#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <string>

#include "gemm_bf16_mainloop.cuh"
#include "gemm_bf16_store.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"
#include "persistent_gemm.hpp"
#include "schedule.hpp"
#include "split_k_epilogue.cuh"
#include "tile_map.hpp"

namespace kc::ch06 {

namespace {

using ch02::block::MediumTile3;
using ch02::block::MediumTile4;
using ch02::block::NoEpilogue;
using ch05::kBlockM;
using ch05::kBlockN;

constexpr int kTileFloats = kBlockM * kBlockN;  // one fp32 partial tile

// Where the parts of the workspace are. The sizes are the host's (workspace_counter_bytes,
// workspace_prefix_row_bytes), the same ones persistent_workspace_bytes adds up and the CPU tests check.
struct WorkspaceLayout {
  std::int32_t* counters;  // counter_words(): [0] ticket counter; [1 + 8·s + w] warp w's arrivals at Stream-K tile s
  std::int32_t* prefixes;  // [grid][prefix_stride]: block b's copy of the m-tile prefix ([E + 1]) in row b
  int prefix_stride;       // int32 from one copy to the next (a multiple of 64: 256-byte rows)
  float* partials;         // [grid][128 × 128]: block b's partial in slot b (partial_slot)
};

WorkspaceLayout layout_of(void* workspace, int experts, int grid) {
  auto* base = static_cast<unsigned char*>(workspace);
  const std::size_t counter_bytes = workspace_counter_bytes();
  const std::size_t prefix_row = workspace_prefix_row_bytes(experts);
  const std::size_t prefix_bytes = static_cast<std::size_t>(grid) * prefix_row;
  return {reinterpret_cast<std::int32_t*>(base), reinterpret_cast<std::int32_t*>(base + counter_bytes),
          static_cast<int>(prefix_row / sizeof(std::int32_t)),
          reinterpret_cast<float*>(base + counter_bytes + prefix_bytes)};
}

struct Problem {
  const __nv_bfloat16* a;
  const __nv_bfloat16* w;
  __nv_bfloat16* c;
  const std::int32_t* offsets;
  std::int32_t* counters;  // WorkspaceLayout::counters: zero at the start of a launch, and again at its end
  std::int32_t* prefixes;  // WorkspaceLayout::prefixes: each block writes and reads its own row
  int prefix_stride;
  float* partials;
  int experts, m_total, n, k, tiles_n, group_m, max_tail_percent;
  bool paired;
};

// This block's copy of the m-tile prefix (its row of the workspace).
__device__ __forceinline__ std::int32_t* prefix_of_block(const Problem& p) {
  return p.prefixes + static_cast<std::int64_t>(blockIdx.x) * p.prefix_stride;
}

// Chapter 5's m-tile prefix over experts (tile_prefix_of), computed by the whole block into its own
// row: thread t takes experts kPerThread·t ... kPerThread·t + kPerThread - 1, and one block-wide
// scan adds them up. Every block computes the same numbers; since each one reads only what it wrote,
// no block waits for another, and no kernel has to run first. Returns the m-tile count.
template <int kThreads>
__device__ int compute_tile_prefix(const Problem& p) {
  constexpr int kPerThread = (ch05::kMaxExperts + kThreads - 1) / kThreads;
  using Scan = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;  // a few words of shared memory
  __shared__ typename Scan::TempStorage scratch;
  std::int32_t* prefix = prefix_of_block(p);
  const int first = static_cast<int>(threadIdx.x) * kPerThread;
  int tiles[kPerThread];
  for (int i = 0; i < kPerThread; ++i) {
    tiles[i] = 0;
    if (first + i < p.experts) {
      int begin = 0, end = 0;
      ch05::expert_rows(p.offsets, first + i, p.m_total, begin, end);
      tiles[i] = ch05::m_tiles_of(end - begin, kBlockM);
    }
  }
  int m_tiles = 0;
  Scan(scratch).InclusiveSum(tiles, tiles, m_tiles);
  for (int i = 0; i < kPerThread; ++i) {
    if (first + i < p.experts) prefix[first + i + 1] = tiles[i];
  }
  if (threadIdx.x == 0) prefix[0] = 0;
  __syncthreads();  // the row is complete, and its stores are visible to every thread of the block
  return m_tiles;
}

// Where linear tile `tile` lies: its expert's A rows and W, C's rows and columns.
struct TilePlace {
  const __nv_bfloat16* w_expert;
  int row0, col0, rows_left, cols_left;
};

__device__ TilePlace place_of(const Problem& p, int tile) {
  const std::int32_t* prefix = prefix_of_block(p);
  const ch05::TileCoord coord =
      ch05::tile_in_order(ch05::TileOrder::grouped, tile, prefix, p.experts, p.tiles_n, p.group_m);
  const ch05::TileRows rows = ch05::locate(p.offsets, prefix, p.experts, p.m_total, kBlockM, coord.m_tile);
  const int col0 = coord.n_tile * kBlockN;
  return {p.w + static_cast<std::int64_t>(rows.expert) * p.n * p.k, rows.row0, col0, rows.rows_left, p.n - col0};
}

template <class Cfg>
__device__ __forceinline__ void whole_tile(const Problem& p, int tile) {
  const TilePlace t = place_of(p, tile);
  ch02::block::gemm_bf16_block<Cfg>(p.a, t.w_expert, p.c, p.n, p.k, t.row0, t.col0, t.rows_left, t.cols_left, p.paired,
                                    NoEpilogue{});
}

// One contributor's unit of a split tile. @p block is the plan's block the unit belongs to (its
// partial slot and its place among the tile's contributors): the plan block whose range this block
// claimed, not blockIdx.x.
//
// The tile's last contributor (highest k) owns it: its own part stays in registers, it waits for the
// others' partials, adds them in contributor order and stores C. Every other contributor stores its
// part as an fp32 partial in its slot, and each of its warps counts itself on the tile's counter for
// that warp once its part is stored. No wait forms a cycle: a partner part never waits, and an owner
// waits only for the partner parts of lower plan blocks, claimed before its own (schedule.hpp says why).
template <class Cfg>
__device__ void stream_k_unit(const Problem& p, const StreamKPlan& plan, const WorkUnit& unit, int block) {
  static_assert(Cfg::threads / 32 == kArrivalsPerTile, "one arrival counter per warp of the block tile");
  const TilePlace t = place_of(p, unit.tile);
  const int sk_tile = unit.tile - plan.dp_tiles;
  int* arrivals = p.counters + 1 + static_cast<std::int64_t>(sk_tile) * kArrivalsPerTile;
  if (owns(plan, block, unit)) {
    const int first = first_contributor(plan, sk_tile), last = last_contributor(plan, sk_tile);
    const AddPartials owner{p.partials + static_cast<std::int64_t>(partial_slot(first)) * kTileFloats,
                            static_cast<std::int64_t>(kTileFloats), last - first, arrivals};
    ch02::block::gemm_bf16_block_k_range<Cfg>(p.a, t.w_expert, p.c, p.n, p.k, t.row0, t.col0, t.rows_left, t.cols_left,
                                              p.paired, owner, unit.k_begin, unit.k_end);
    // Every partner's warp w has counted itself in, and lane 0 of this warp w has seen it: no one
    // touches counter w again in this launch, so it goes back to zero for the next one.
    if (threadIdx.x % 32 == 0) arrivals[threadIdx.x / 32] = 0;
    return;
  }
  float* mine = p.partials + static_cast<std::int64_t>(partial_slot(block)) * kTileFloats;
  ch02::block::gemm_bf16_block_k_range<Cfg>(p.a, t.w_expert, p.c, p.n, p.k, t.row0, t.col0, t.rows_left, t.cols_left,
                                            p.paired, Fp32Partial{mine, arrivals}, unit.k_begin, unit.k_end);
}

// Plan block @p plan_block's units from @p first_unit on: whole tiles directly, split parts through
// stream_k_unit, with a barrier after each (the next unit's copies overwrite shared memory).
template <class Cfg>
__device__ void run_units(const Problem& p, const StreamKPlan& plan, int plan_block, int first_unit) {
  const int units = units_of_block(plan, plan_block);
  for (int u = first_unit; u < units; ++u) {
    const WorkUnit unit = unit_of_block(plan, plan_block, u);
    if (is_whole(plan, unit)) {
      whole_tile<Cfg>(p, unit.tile);
    } else {
      stream_k_unit<Cfg>(p, plan, unit, plan_block);
    }
    __syncthreads();
  }
}

template <class Cfg, Scheduler kScheduler>
__global__ void __launch_bounds__(Cfg::threads) persistent_kernel(const Problem p) {
  const int m_tiles = compute_tile_prefix<Cfg::threads>(p);  // the real m-tile count, known only on the device
  const int tiles = m_tiles * p.tiles_n;                     // <= Chapter 5's grid bound <= 2^31 - 1 (validated)
  const int block = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);

  if constexpr (kScheduler == Scheduler::static_round_robin) {
    // TODO 3: Loop over this block's tiles (block, block + grid, ...): run whole_tile<Cfg> on
    // each, and make the block wait between two tiles before it reuses shared memory.
    if (block < tiles) whole_tile<Cfg>(p, block);
  } else if constexpr (kScheduler == Scheduler::dynamic_atomic) {
    __shared__ int claimed;
    int tile = block;
    while (tile < tiles) {
      whole_tile<Cfg>(p, tile);
      if (threadIdx.x == 0) {
        const int ticket = atomicAdd(&p.counters[0], 1);
        if (ticket == dynamic_tickets(tiles) - 1) atomicExch(&p.counters[0], 0);  // the launch's last ticket
        claimed = dynamic_tile_of_ticket(grid, ticket);
      }
      __syncthreads();  // `claimed` is visible, and shared memory is free
      tile = claimed;
      __syncthreads();  // every thread has read `claimed` before thread 0 writes the next one
    }
  } else {
    const int k_tiles = (p.k - 1) / ch02::block::kBlockK + 1;
    const StreamKPlan plan = kScheduler == Scheduler::stream_k
                                 ? stream_k_plan(tiles, k_tiles, grid, p.max_tail_percent)
                                 : split_k_tail_plan(tiles, k_tiles, grid, p.max_tail_percent);
    // This block's whole tiles, then the tail's ranges in ticket order: ticket r names plan block
    // r's range (its one split-K unit, or its one or two Stream-K units), so the blocks whose whole
    // tiles finish first take the tail, and the slowest, when there are fewer ranges than blocks,
    // take none. The units, partials and sums are those of the plan.
    const int whole = static_tile_count(plan.dp_tiles, grid, block);
    for (int u = 0; u < whole; ++u) {
      whole_tile<Cfg>(p, static_tile(grid, block, u));
      __syncthreads();
    }
    __shared__ int claimed;
    while (true) {
      if (threadIdx.x == 0) {
        claimed = atomicAdd(&p.counters[0], 1);
        if (claimed == claimed_tail_tickets(plan) - 1) atomicExch(&p.counters[0], 0);  // the launch's last ticket
      }
      __syncthreads();
      const int plan_block = claimed;
      __syncthreads();  // every thread has read `claimed` before thread 0 writes the next one
      if (plan_block >= plan.sk_blocks) break;
      run_units<Cfg>(p, plan, plan_block, static_tile_count(plan.dp_tiles, grid, plan_block));
    }
  }
}

// --------------------------------------------------------------------------------------- host side

struct DeviceLimits {
  std::size_t smem_per_block_optin = 0;
  int sms = 0;
  bool medium4 = false;         // MediumTile4 fits (else MediumTile3)
  int slots[kSchedulers] = {};  // SMs × blocks per SM, per Scheduler
};

template <class Cfg, Scheduler kScheduler>
int prepare_kernel(int sms) {
  const auto kernel = persistent_kernel<Cfg, kScheduler>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::smem_bytes));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::threads, Cfg::smem_bytes));
  return std::max(1, per_sm) * sms;
}

template <class Cfg>
void prepare_kernels(DeviceLimits& limits) {
  limits.slots[0] = prepare_kernel<Cfg, Scheduler::static_round_robin>(limits.sms);
  limits.slots[1] = prepare_kernel<Cfg, Scheduler::dynamic_atomic>(limits.sms);
  limits.slots[2] = prepare_kernel<Cfg, Scheduler::stream_k>(limits.sms);
  limits.slots[3] = prepare_kernel<Cfg, Scheduler::split_k_tail>(limits.sms);
}

// Queried once per device; later calls only read the cache (no attribute or occupancy calls
// inside a capture).
DeviceLimits current_device_limits() {
  return cached_per_device([](int device) {
    DeviceLimits limits;
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    check(cudaDeviceGetAttribute(&limits.sms, cudaDevAttrMultiProcessorCount, device));
    limits.smem_per_block_optin = static_cast<std::size_t>(optin);
    if (static_cast<std::size_t>(MediumTile4::smem_bytes) <= limits.smem_per_block_optin) {
      limits.medium4 = true;
      prepare_kernels<MediumTile4>(limits);
    } else if (static_cast<std::size_t>(MediumTile3::smem_bytes) <= limits.smem_per_block_optin) {
      prepare_kernels<MediumTile3>(limits);
    } else {
      throw InvalidArgument("this GPU allows " + std::to_string(limits.smem_per_block_optin) +
                            " bytes of shared memory per block; the 128 x 128 tile needs " +
                            std::to_string(MediumTile3::smem_bytes));
    }
    return limits;
  });
}

template <class Cfg>
void launch_persistent(Scheduler scheduler, int grid, const Problem& p, cudaStream_t stream) {
  switch (scheduler) {
    case Scheduler::static_round_robin:
      persistent_kernel<Cfg, Scheduler::static_round_robin><<<grid, Cfg::threads, Cfg::smem_bytes, stream>>>(p);
      break;
    case Scheduler::dynamic_atomic:
      persistent_kernel<Cfg, Scheduler::dynamic_atomic><<<grid, Cfg::threads, Cfg::smem_bytes, stream>>>(p);
      break;
    case Scheduler::stream_k:
      persistent_kernel<Cfg, Scheduler::stream_k><<<grid, Cfg::threads, Cfg::smem_bytes, stream>>>(p);
      break;
    case Scheduler::split_k_tail:
      persistent_kernel<Cfg, Scheduler::split_k_tail><<<grid, Cfg::threads, Cfg::smem_bytes, stream>>>(p);
      break;
  }
}

}  // namespace

int persistent_slots(Scheduler scheduler) {
  const int index = static_cast<int>(scheduler);
  if (index < 0 || index >= kSchedulers) {
    throw InvalidArgument("scheduler (" + std::to_string(index) + ") is not a Scheduler");
  }
  return current_device_limits().slots[index];
}

std::size_t grouped_gemm_persistent_workspace_bytes(const GroupedGemmShape& shape) {
  int grid = 1;
  for (Scheduler s :
       {Scheduler::static_round_robin, Scheduler::dynamic_atomic, Scheduler::stream_k, Scheduler::split_k_tail}) {
    grid = std::max(grid, persistent_grid(shape, s));
  }
  return persistent_workspace_bytes(shape, grid);
}

void grouped_gemm_persistent_workspace_init(void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  validate_workspace_init(workspace, workspace_bytes);
  check(cudaMemsetAsync(workspace, 0, workspace_counter_bytes(), stream));
}

int persistent_grid(const GroupedGemmShape& shape, Scheduler scheduler) {
  const std::int64_t bound = ch05::grouped_gemm_grid_blocks(shape);
  if (bound == 0) return 1;  // M_total = 0: no tile, and no need to ask the device
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(persistent_slots(scheduler), bound)));
}

void grouped_gemm_persistent(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                             __nv_bfloat16* c, const std::int32_t* offsets, void* workspace,
                             std::size_t workspace_bytes, const PersistentOptions& options, cudaStream_t stream) {
  // Every rule that needs no device first, so that bad input names its rule even without a GPU.
  ch05::validate_grouped_gemm(shape, a, w, c, offsets);
  validate_persistent_options(options);
  const int grid = persistent_grid(shape, options.scheduler);  // queries the device unless M_total = 0
  validate_persistent_options(shape, c, options, workspace, workspace_bytes, grid);
  if (shape.m_total == 0) return;  // no rows: nothing to compute or write
  const DeviceLimits limits = current_device_limits();
  const WorkspaceLayout layout = layout_of(workspace, shape.experts, grid);
  const Problem p{a, w, c, offsets, layout.counters, layout.prefixes, layout.prefix_stride, layout.partials,
                  shape.experts, static_cast<int>(shape.m_total), static_cast<int>(shape.n), static_cast<int>(shape.k),
                  ch05::ceil_div_int(static_cast<int>(shape.n), kBlockN), options.group_m,
                  options.stream_k_max_tail_percent,
                  // bf16x2 stores need 4-byte aligned pairs: N even and c itself 4-byte aligned.
                  shape.n % 2 == 0 && reinterpret_cast<std::uintptr_t>(c) % 4 == 0};
  if (limits.medium4) {
    launch_persistent<MediumTile4>(options.scheduler, grid, p, stream);
  } else {
    launch_persistent<MediumTile3>(options.scheduler, grid, p, stream);
  }
  check_launch();
}

}  // namespace kc::ch06
