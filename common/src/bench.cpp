#include "kc/bench.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kc/check.hpp"

#ifndef KC_COMMIT_STRING
#define KC_COMMIT_STRING "unknown"
#endif
#ifndef KC_GOOGLE_BENCHMARK_VERSION
#define KC_GOOGLE_BENCHMARK_VERSION "unknown"
#endif

namespace kc::bench {

const char* commit() { return KC_COMMIT_STRING; }

void add_context(const DeviceInfo& device) {
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); };
  benchmark::AddCustomContext("gpu", device.name);
  benchmark::AddCustomContext("gpu_arch", device.arch());
  benchmark::AddCustomContext("gpu_sms", std::to_string(device.sm_count));
  benchmark::AddCustomContext("gpu_l2_bytes", std::to_string(device.l2_bytes));
  benchmark::AddCustomContext("gpu_sm_clock_max_mhz", std::to_string(device.sm_clock_max_mhz));
  benchmark::AddCustomContext("gpu_mem_clock_max_mhz", std::to_string(device.mem_clock_max_mhz));
  benchmark::AddCustomContext("cuda_driver", version(device.driver_api_version));
  benchmark::AddCustomContext("cuda_runtime", version(device.runtime_version));
  benchmark::AddCustomContext("commit", commit());
  benchmark::AddCustomContext("google_benchmark", KC_GOOGLE_BENCHMARK_VERSION);
}

benchmark::internal::Benchmark* configure(benchmark::internal::Benchmark* b) {
  return b->UseManualTime()
      ->MinTime(0.2)
      ->Unit(benchmark::kMicrosecond)
      ->ComputeStatistics("min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); })
      ->ComputeStatistics("max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); });
}

void set_counters(benchmark::State& state, double min_bytes, double flops) {
  state.SetBytesProcessed(static_cast<int64_t>(min_bytes * static_cast<double>(state.iterations())));
  if (flops > 0.0) state.counters["flops"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

std::size_t rotation_sets(std::size_t bytes_per_set, const DeviceInfo& device, std::size_t max_total_bytes) {
  if (bytes_per_set == 0) return 1;
  const std::size_t wanted = (2 * device.l2_bytes + bytes_per_set - 1) / bytes_per_set;
  const std::size_t affordable = std::max<std::size_t>(1, max_total_bytes / bytes_per_set);
  return std::clamp<std::size_t>(wanted, 1, affordable);
}

void check_case_labels(const std::vector<std::string>& labels) {
  for (const std::string& a : labels) {
    for (const std::string& b : labels) {
      if (&a != &b && b.starts_with(a)) throw std::logic_error("case label " + a + " is a prefix of " + b);
    }
  }
}

int batch_for_bytes(double bytes_per_launch) {
  const double target = 256.0 * 1024 * 1024;
  const double launches = bytes_per_launch > 0 ? target / bytes_per_launch : 1024.0;
  return static_cast<int>(std::clamp(launches, 1.0, 1024.0));
}

L2Flusher::L2Flusher(const DeviceInfo& device) : bytes_(2 * device.l2_bytes) {
  if (bytes_ > 0) check(cudaMalloc(&scratch_, bytes_));
}

L2Flusher::~L2Flusher() {
  if (scratch_ != nullptr) cudaFree(scratch_);
}

void L2Flusher::flush(cudaStream_t stream) {
  if (bytes_ > 0) check(cudaMemsetAsync(scratch_, 0, bytes_, stream));
}

int run(int argc, char** argv, const std::function<void(const DeviceInfo&)>& register_benchmarks, int min_major,
        int min_minor) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (auto reason = no_gpu_reason(min_major, min_minor)) {
    std::printf("Skipping benchmarks: %s.\n", reason->c_str());
    return 0;
  }
  const DeviceInfo device = query_device(0);
  add_context(device);
  register_benchmarks(device);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace kc::bench
