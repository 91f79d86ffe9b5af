/// @file warp_primitives.hpp
/// @brief Chapter 4: what a cross-lane instruction costs. A microbenchmark that repeats one warp
/// primitive (`shfl.sync`, `redux.sync`, `vote.sync`, or an `ffma` for scale) and times it with the
/// SM's own cycle counter, in two ways:
/// - latency: one warp, one chain in which every instruction needs the previous one's result, so
///   the cycles per instruction are the time from issue to result;
/// - throughput: every SM full of warps, each with several independent chains, so the cycles are
///   set by how many of these instructions an SM can retire per clock.
///
/// The lesson's instruction budget for the router (how many shuffles or reductions a row may spend)
/// is these two numbers times the count per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

namespace kc::ch04 {

/// The instruction the microbenchmark repeats.
enum class WarpPrimitive {
  shfl_xor,   ///< `shfl.sync.bfly.b32` with lane mask 1 (SHFL.BFLY)
  redux_max,  ///< `redux.sync.max.u32` over the warp (REDUX, plus the move of its uniform result
              ///< back to a lane register that the next one reads)
  vote_any,   ///< `vote.sync.any.pred` on a predicate (VOTE.ANY, predicate to predicate)
  ffma,       ///< `fma.rn.f32`, a plain arithmetic instruction, for scale
};

/// Latency (one warp, one dependent chain) or throughput (full SMs, independent chains).
enum class PrimitiveMode { latency, throughput };

/// One launch of the microbenchmark.
struct WarpPrimitiveConfig {
  WarpPrimitive primitive = WarpPrimitive::redux_max;  ///< the instruction repeated
  PrimitiveMode mode = PrimitiveMode::throughput;      ///< what is measured
  int warps_per_block = 8;  ///< throughput: warps per block, in [1, 32] (latency runs one warp)
  int blocks_per_sm = 4;    ///< throughput: blocks per SM, in [1, 8]; all of them must be resident at once
  int iterations = 1024;    ///< loop trips, >= 1; each trip is kOpsPerChainPerIteration per chain
};

/// Instructions each chain runs per loop trip (one inline-assembly block of dependent instructions).
inline constexpr int kOpsPerChainPerIteration = 16;
/// Independent chains per warp in throughput mode (latency mode runs one).
inline constexpr int kThroughputChains = 4;

/// What one block of a launch reports: its SM's cycle counter (clock64) just before the loop and
/// just after it, each read behind a block barrier, the SM it ran on, and a checksum of its chains.
/// The counter is the SM's own, so the samples of blocks that shared an SM are on one time line.
struct PrimitiveSample {
  long long start = 0;    ///< the SM's cycle counter when the block's loop began
  long long stop = 0;     ///< ... and when it ended (stop - start: the block's loop in SM cycles)
  unsigned sm = 0;        ///< the SM the block ran on (%smid)
  unsigned checksum = 0;  ///< the chains' final values, combined (expected_primitive_checksum())
};

/// Throws kc::InvalidArgument naming the first broken rule of @p config (see WarpPrimitiveConfig:
/// a known primitive and mode, warps_per_block in [1, 32], blocks_per_sm in [1, 8], at most 64
/// warps an SM, iterations >= 1), of @p sm_count (>= 1) or of @p samples (not null). Host-only.
void validate_warp_primitive(const WarpPrimitiveConfig& config, int sm_count, const PrimitiveSample* samples);

/// Blocks one launch runs, and samples it writes: 1 for latency, sm_count × blocks_per_sm for
/// throughput. Validates like validate_warp_primitive (samples not checked).
std::int64_t warp_primitive_blocks(const WarpPrimitiveConfig& config, int sm_count);

/// Instructions of the primitive one warp executes in one launch: iterations ×
/// kOpsPerChainPerIteration × chains (1 for latency, kThroughputChains for throughput).
std::int64_t warp_primitive_ops_per_warp(const WarpPrimitiveConfig& config);

/// Launches the microbenchmark on @p stream: warp_primitive_blocks() blocks, each writing its
/// PrimitiveSample. Allocates and synchronises nothing.
/// @param config what to repeat and how
/// @param sm_count the GPU's SM count (kc::DeviceInfo::sm_count)
/// @param samples warp_primitive_blocks() samples in device memory
/// @param stream the stream to enqueue on
void warp_primitive(const WarpPrimitiveConfig& config, int sm_count, PrimitiveSample* samples,
                    cudaStream_t stream = nullptr);

/// The checksum every block of a correct launch reports (host-side, from the chains' arithmetic),
/// so a test can tell that the instructions ran and computed what they should.
/// @param config the launch (validated)
unsigned expected_primitive_checksum(const WarpPrimitiveConfig& config);

/// Latency mode: SM cycles per instruction of the chain, from the one sample of a launch (its
/// stop - start over warp_primitive_ops_per_warp). Throws kc::InvalidArgument if @p config is not
/// latency mode or @p samples does not hold exactly one sample with stop > start.
double primitive_cycles_per_op(const WarpPrimitiveConfig& config, std::span<const PrimitiveSample> samples);

/// Throughput mode: warp instructions of the primitive an SM retires per clock, the median over the
/// SMs that ran blocks. The block scheduler need not give every SM blocks_per_sm blocks (it may put
/// more on one SM and fewer on another), so each SM is measured on its own: its work is the blocks
/// it ran × warps_per_block × warp_primitive_ops_per_warp, its time from its first block's start to
/// its last block's stop. Throws kc::InvalidArgument if @p config is not throughput mode or
/// @p samples does not hold warp_primitive_blocks() samples, each with stop > start and sm below
/// @p sm_count.
double primitive_ops_per_sm_clock(const WarpPrimitiveConfig& config, int sm_count,
                                  std::span<const PrimitiveSample> samples);

/// The printable name of @p primitive ("shfl_xor", "redux_max", "vote_any", "ffma").
const char* to_string(WarpPrimitive primitive);

}  // namespace kc::ch04
