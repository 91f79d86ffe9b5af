/// @file sm_clock.hpp
/// @brief The SM clock a benchmark ran at: NVML's current SM clock, sampled on a thread of its own
/// while the timed launches run. Heavy kernels run at the power limit, below the clock a GPU reports
/// as its maximum, and a rate compared with a peak measured at another clock misleads.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace kc::bench {

/// Median of @p samples (MHz); 0 when there are none.
double median_mhz(std::vector<unsigned> samples);

/// Samples the SM clock of one CUDA device every @p period, from construction to stop().
///
/// NVML is opened at run time (libnvidia-ml.so.1, installed with the driver), so programs build and
/// start on machines without it; there, and when the device is not found, available() is false and
/// stop() returns 0.
class SmClockSampler {
 public:
  /// Starts sampling CUDA device @p device (an ordinal, matched to NVML's device by PCI bus id).
  explicit SmClockSampler(int device, std::chrono::microseconds period = std::chrono::microseconds(2000));
  ~SmClockSampler();
  SmClockSampler(const SmClockSampler&) = delete;
  SmClockSampler& operator=(const SmClockSampler&) = delete;

  /// True when NVML answered for the device.
  bool available() const { return device_ != nullptr; }
  /// Stops sampling and returns the samples' median in MHz (0 when not available or no sample).
  double stop();
  /// The samples (MHz), once stopped.
  const std::vector<unsigned>& samples() const { return samples_; }

 private:
  void* device_ = nullptr;  // nvmlDevice_t
  std::atomic<bool> running_{false};
  std::vector<unsigned> samples_;
  std::thread thread_;
};

}  // namespace kc::bench
