/// @file persistent_gemm.hpp
/// @brief Chapter 6: Chapter 5's grouped GEMM on a persistent grid (SMs × blocks per SM blocks that
/// loop over the tiles), with a static round-robin, a dynamic (atomic ticket) or a Stream-K
/// scheduler. Same problem, layout and rules as Chapter 5 (grouped_gemm.hpp): A [M_total, K], W
/// [E, N, K], offsets [E + 1] on the device, C [M_total, N], bf16 in and out, fp32 accumulation.
///
/// Results. The static and dynamic schedulers run Chapter 5's block tile on the same tiles with the
/// same K order: their C is bitwise Chapter 5's. Stream-K computes a split tile as fp32 partial sums
/// of K ranges added in a fixed order and rounded once: equal to Chapter 5's within rounding, and
/// bitwise identical from run to run on one GPU (the split depends on the grid, so on the GPU's SM
/// count, never on timing).
///
/// Launch paths neither allocate nor synchronise (CUDA-graph capturable). The first call on a device
/// raises the kernels' shared-memory limit and queries their occupancy once (not allowed during
/// capture): call once outside capture first, as Chapters 2 and 5 do; persistent_slots() and
/// grouped_gemm_persistent_workspace_bytes() do that first call too.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grouped_gemm.hpp"
// Angle brackets: the exercise build puts the skeleton's schedule.hpp first on the include path.
#include <schedule.hpp>

namespace kc::ch06 {

using ch05::GroupedGemmShape;

/// How the persistent grid's blocks find their tiles.
enum class Scheduler {
  static_round_robin,  ///< block b takes tiles b, b + grid, b + 2·grid, ... (grouped order)
  dynamic_atomic,      ///< block b takes tile b, then claims the next tile from an atomic counter
  stream_k,            ///< round-robin whole tiles, then the last wave's tiles split along K (schedule.hpp)
  split_k_tail,        ///< as stream_k, but each last-wave tile cut into equal K pieces, one per block
};

/// The number of Scheduler values (for validation and per-scheduler tables).
inline constexpr int kSchedulers = 4;

/// The chapter's default for StreamK's tail threshold: no Stream-K when the last wave is fuller.
inline constexpr int kDefaultMaxTailPercent = 90;

/// Options of the persistent launch.
struct PersistentOptions {
  Scheduler scheduler = Scheduler::stream_k;               ///< the scheduler
  int group_m = ch05::kDefaultGroupM;                      ///< grouped order's band height, >= 1
  int stream_k_max_tail_percent = kDefaultMaxTailPercent;  ///< Stream-K only below this last-wave fill, [0, 100]
};

/// Blocks of the persistent grid on the current device for @p scheduler: SMs × the kernel's
/// blocks per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor), queried once per device and
/// cached. Host-only; the first call per device must be outside graph capture.
int persistent_slots(Scheduler scheduler);

/// The grid the launch uses: min(persistent_slots(scheduler), Chapter 5's tile bound for @p shape)
/// (at least 1). Host-only.
int persistent_grid(const GroupedGemmShape& shape, Scheduler scheduler);

/// Device workspace for a launch on @p grid blocks, pure arithmetic (CPU-tested): the schedulers'
/// counters (workspace_counter_bytes(), first, the same for every shape), one copy of the m-tile
/// prefix per block (grid × (E + 1) int32, each row rounded up to 256 bytes), and the Stream-K
/// partial tiles (grid × 128 × 128 fp32: one per block). Throws kc::InvalidArgument for a bad
/// shape.experts or a grid outside [1, kMaxPersistentGrid].
std::size_t persistent_workspace_bytes(const GroupedGemmShape& shape, int grid);

/// Bytes at the start of every workspace that hold the schedulers' counters
/// (counter_words() int32, rounded up to 256 bytes): the part that must be zero before a launch.
std::size_t workspace_counter_bytes();

/// Bytes of one block's copy of the m-tile prefix in the workspace: @p experts + 1 int32, rounded
/// up to 256 bytes (the rows follow the counters, one per block).
std::size_t workspace_prefix_row_bytes(int experts);

/// Checks what grouped_gemm_persistent_workspace_init() needs: a non-null, 16-byte aligned
/// workspace of at least workspace_counter_bytes() bytes. Host-only; throws kc::InvalidArgument
/// naming the argument and rule.
void validate_workspace_init(const void* workspace, std::size_t workspace_bytes);

/// Zeroes a new workspace's counters (one cudaMemsetAsync on @p stream). Call it once, after
/// allocating the workspace and before its first grouped_gemm_persistent(): every launch leaves the
/// counters at zero again, so the launches themselves need nothing in front of them.
/// @param workspace device scratch of grouped_gemm_persistent_workspace_bytes(shape)
/// @param workspace_bytes its size
/// @param stream the stream to enqueue on
void grouped_gemm_persistent_workspace_init(void* workspace, std::size_t workspace_bytes,
                                            cudaStream_t stream = nullptr);

/// Workspace grouped_gemm_persistent() needs on the current device, for any scheduler (the largest
/// grid of the four). Host-only.
std::size_t grouped_gemm_persistent_workspace_bytes(const GroupedGemmShape& shape);

/// Checks the options alone, with no CUDA call (grouped_gemm_persistent() calls it before it asks
/// the device anything): options.scheduler a Scheduler, options.group_m >= 1,
/// options.stream_k_max_tail_percent in [0, 100]. Host-only; throws kc::InvalidArgument naming the
/// option and rule.
void validate_persistent_options(const PersistentOptions& options);

/// Checks what grouped_gemm_persistent() needs beyond Chapter 5's validate_grouped_gemm(): the
/// options (above), and a workspace of at least persistent_workspace_bytes(shape, @p grid) bytes,
/// 16-byte aligned, not overlapping c. Host-only; throws kc::InvalidArgument naming the argument and
/// rule.
void validate_persistent_options(const GroupedGemmShape& shape, const __nv_bfloat16* c,
                                 const PersistentOptions& options, const void* workspace, std::size_t workspace_bytes,
                                 int grid);

/// The grouped GEMM on a persistent grid, in one launch. Each block turns the device offsets into
/// its own copy of the m-tile prefix, then loops over the tiles with @p options.scheduler; the
/// launch leaves the schedulers' counters at zero for the next one. Validates first (Chapter 5's
/// rules and the options above), before any CUDA call but the device query that sizes the grid,
/// and launches nothing on bad input; with M_total = 0 it launches nothing and queries nothing. The workspace must have
/// been zeroed once by grouped_gemm_persistent_workspace_init(), and two launches that run at the same time (on two
/// streams) need two workspaces.
/// @param shape sizes
/// @param a [M_total, K] permuted tokens
/// @param w [E, N, K] expert weights
/// @param c [M_total, N] output
/// @param offsets [E + 1] device row offsets
/// @param workspace device scratch of grouped_gemm_persistent_workspace_bytes(shape), 16-byte aligned,
/// initialised once (grouped_gemm_persistent_workspace_init)
/// @param workspace_bytes its size
/// @param options scheduler, tile order, Stream-K threshold
/// @param stream the stream to enqueue on
void grouped_gemm_persistent(const GroupedGemmShape& shape, const __nv_bfloat16* a, const __nv_bfloat16* w,
                             __nv_bfloat16* c, const std::int32_t* offsets, void* workspace,
                             std::size_t workspace_bytes, const PersistentOptions& options = {},
                             cudaStream_t stream = nullptr);

// ---------------------------------------------------------------------- the lesson's arithmetic

/// Tiles of the launch for host group sizes: Σ_e ceil(M_e / 128) · ceil(N / 128). Validates
/// @p host_offsets as Chapter 5's validate_host_offsets does.
std::int64_t grouped_tiles(const GroupedGemmShape& shape, std::span<const std::int32_t> host_offsets);

/// One benchmark case of the chapter (Chapter 5's kind: the benchmark, the tests and the lesson's
/// table share them).
using BenchCase = ch05::GroupedCase;

/// The benchmark's cases: Chapter 5's eight, the two poor-last-wave `tail_*` cases (144 and 192
/// tiles: 1.09 and 1.45 waves on 132 slots). No label is a prefix of another.
std::vector<BenchCase> benchmark_cases();

/// The lesson's table row of a case on @p slots slots: tiles, waves, last-wave utilisation, and the
/// predicted time in waves of Chapter 5's kernel (waves) against Stream-K's (tiles / slots, the
/// lower bound when the tail is split evenly). Markdown, one line.
std::string wave_table_row(const BenchCase& bench_case, int slots);

}  // namespace kc::ch06
