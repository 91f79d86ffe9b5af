/// @file timer.hpp
/// @brief CUDA-event timing of one launch, a batch of launches, or a captured graph.
#pragma once

#include <cuda_runtime.h>

#include "kc/check.hpp"

namespace kc {

/// Times GPU work on a stream with a pair of CUDA events.
///
/// Events measure when the GPU reached each point in the stream, so host-side launch cost is not
/// counted unless the GPU waits for it. A kernel of a few microseconds is shorter than the
/// events' useful resolution (about 0.5 us): time a batch of launches and divide by the count.
class EventTimer {
 public:
  EventTimer() {
    check(cudaEventCreate(&start_));
    check(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  /// Records the start event, calls @p launch(i) for i in [0, count), records the stop event and
  /// waits for it. Returns milliseconds per launch.
  template <typename LaunchFn>
  double time_launches(cudaStream_t stream, int count, LaunchFn&& launch) {
    check(cudaEventRecord(start_, stream));
    for (int i = 0; i < count; ++i) launch(i);
    check(cudaEventRecord(stop_, stream));
    return elapsed_ms() / count;
  }

  /// Replays an instantiated graph @p replays times between the events. Returns milliseconds per replay.
  double time_graph(cudaGraphExec_t graph, cudaStream_t stream, int replays) {
    check(cudaEventRecord(start_, stream));
    for (int i = 0; i < replays; ++i) check(cudaGraphLaunch(graph, stream));
    check(cudaEventRecord(stop_, stream));
    return elapsed_ms() / replays;
  }

 private:
  double elapsed_ms() {
    check(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace kc
