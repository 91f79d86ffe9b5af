/// @file timer.hpp
/// @brief CUDA-event timing of one launch, a batch of launches, or a captured graph.
#pragma once

#include <cuda_runtime.h>

#include "kc/check.hpp"

namespace kc {

/// Enqueues on @p stream a one-thread kernel that spins for @p microseconds of GPU time (common/src/
/// gpu_hold.cu): the work queued behind it waits that long, while the host goes on enqueueing.
void hold_stream(cudaStream_t stream, unsigned microseconds);

/// Times GPU work on a stream with a pair of CUDA events.
///
/// Events measure when the GPU reached each point in the stream, so host-side launch cost is not
/// counted unless the GPU waits for it. It would wait for the first launch of every batch: the stream
/// is idle when the start event is recorded, so the start fires at once and the GPU then sits idle
/// while the host validates, encodes and enqueues that launch (several microseconds; a whole share of
/// a batch of one or two long launches). So each timing first enqueues a short GPU-side hold
/// (hold_stream, kHoldMicroseconds) and records the start event behind it: by the time the hold ends
/// and the start fires, the first launches are already queued. A kernel of a few microseconds is
/// shorter than the events' useful resolution (about 0.5 us): time a batch of launches and divide by
/// the count.
class EventTimer {
 public:
  /// The hold in front of each start event: well above one launch's host cost (a few to tens of
  /// microseconds), short against a benchmark's run time.
  static constexpr unsigned kHoldMicroseconds = 100;

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

  /// Holds @p stream (hold_stream), records the start event, calls @p launch(i) for i in
  /// [0, count), records the stop event and waits for it. Returns milliseconds per launch.
  template <typename LaunchFn>
  double time_launches(cudaStream_t stream, int count, LaunchFn&& launch) {
    hold_stream(stream, kHoldMicroseconds);
    check(cudaEventRecord(start_, stream));
    for (int i = 0; i < count; ++i) launch(i);
    check(cudaEventRecord(stop_, stream));
    return elapsed_ms() / count;
  }

  /// Replays an instantiated graph @p replays times between the events. Returns milliseconds per replay.
  double time_graph(cudaGraphExec_t graph, cudaStream_t stream, int replays) {
    hold_stream(stream, kHoldMicroseconds);
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
