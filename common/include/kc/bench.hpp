/// @file bench.hpp
/// @brief Google Benchmark helpers shared by every chapter: CUDA-event manual time over batches of
/// launches, the course's counters, L2 flushing and rotating inputs, and the run context.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "kc/device_info.hpp"
#include "kc/timer.hpp"

namespace kc::bench {

/// The main() of a chapter's benchmark program.
///
/// Parses Google Benchmark's flags; when there is no GPU of at least sm_@p min_major@p min_minor it
/// prints why and returns 0 (so scripted runs on GPU-less machines succeed and say so). Otherwise it
/// records the context (GPU, SMs, L2, driver, clocks, commit), calls @p register_benchmarks and runs.
int run(int argc, char** argv, const std::function<void(const DeviceInfo&)>& register_benchmarks, int min_major = 8,
        int min_minor = 0);

/// Adds GPU name, SM count, L2 size, CUDA driver/runtime versions, max clocks and the commit to the
/// benchmark context (shown in the console header and in the JSON "context" object).
void add_context(const DeviceInfo& device);

/// Applies the course's settings to a registered benchmark: manual time, microseconds, and the
/// `min` and `max` statistics next to Google Benchmark's mean/median/stddev/cv.
benchmark::internal::Benchmark* configure(benchmark::internal::Benchmark* b);

/// The benchmark loop: each pass times @p batch calls of @p launch(i) between two CUDA events.
/// KeepRunningBatch counts the pass as @p batch iterations and the pass's event time is its manual
/// time, so Google Benchmark reports the time per launch and sizes the run by real GPU time.
/// @p between() runs before each batch, outside the timed region (for example an L2 flush). Use a
/// batch of 1 for launches long enough for events to resolve (hundreds of microseconds), more for
/// short ones.
template <typename LaunchFn, typename BetweenFn>
void time_batches(benchmark::State& state, cudaStream_t stream, int batch, LaunchFn&& launch, BetweenFn&& between) {
  EventTimer timer;
  while (state.KeepRunningBatch(batch)) {
    between();
    const double ms_per_launch = timer.time_launches(stream, batch, launch);
    state.SetIterationTime(ms_per_launch * batch * 1e-3);
  }
}

/// time_batches without work between batches.
template <typename LaunchFn>
void time_batches(benchmark::State& state, cudaStream_t stream, int batch, LaunchFn&& launch) {
  time_batches(state, stream, batch, std::forward<LaunchFn>(launch), [] {});
}

/// Sets the counters every variant of a case shares: bytes_per_second from @p min_bytes (the case's
/// fewest bytes: each input read once, each output written once; only `limit` passes the bytes it
/// really moves) and, when @p flops > 0, a `flops` rate counter. Call after the benchmark loop.
void set_counters(benchmark::State& state, double min_bytes, double flops = 0.0);

/// How many independent input/output sets to rotate through so that together they exceed twice
/// the L2 size, and so every launch reads from device memory, not from the cache.
/// At least 1; at most what fits in @p max_total_bytes.
std::size_t rotation_sets(std::size_t bytes_per_set, const DeviceInfo& device, std::size_t max_total_bytes);

/// Launches per timed batch for a kernel that moves @p bytes_per_launch: enough launches that one
/// batch moves about 256 MB (a few tens of microseconds or more on any GPU), between 1 and 1024.
int batch_for_bytes(double bytes_per_launch);

/// DESIGN.md's naming rule: no case label is a prefix of another (benchmark filters and the
/// results tables match cases by prefix). Throws std::logic_error naming both labels otherwise.
void check_case_labels(const std::vector<std::string>& labels);

/// Evicts the L2 by writing a buffer twice its size. Call between timed regions, not inside them.
class L2Flusher {
 public:
  /// Allocates the scratch buffer (2 x the L2 size of @p device).
  explicit L2Flusher(const DeviceInfo& device);
  ~L2Flusher();
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  /// Enqueues the flush on @p stream.
  void flush(cudaStream_t stream);

 private:
  void* scratch_ = nullptr;
  std::size_t bytes_ = 0;
};

/// The commit this program was built from (set by CMake: KC_COMMIT).
const char* commit();

}  // namespace kc::bench
