#include "kc/sm_clock.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>

namespace kc::bench {

namespace {

// The three NVML entry points used, declared as NVML's header declares them (its ABI is stable):
// nvmlReturn_t is an int (0 = success), nvmlDevice_t an opaque pointer, NVML_CLOCK_SM is 1.
using NvmlInit = int (*)();
using NvmlHandleByPciBusId = int (*)(const char*, void**);
using NvmlClockInfo = int (*)(void*, int, unsigned*);
constexpr int kNvmlClockSm = 1;

struct Nvml {
  NvmlHandleByPciBusId handle_by_pci_bus_id = nullptr;
  NvmlClockInfo clock_info = nullptr;
  bool ok = false;
};

// Opened once per process, never closed (the library stays loaded while the process runs).
const Nvml& nvml() {
  static const Nvml loaded = [] {
    Nvml n;
    void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return n;
    auto init = reinterpret_cast<NvmlInit>(dlsym(library, "nvmlInit_v2"));
    n.handle_by_pci_bus_id = reinterpret_cast<NvmlHandleByPciBusId>(dlsym(library, "nvmlDeviceGetHandleByPciBusId_v2"));
    n.clock_info = reinterpret_cast<NvmlClockInfo>(dlsym(library, "nvmlDeviceGetClockInfo"));
    n.ok = init != nullptr && n.handle_by_pci_bus_id != nullptr && n.clock_info != nullptr && init() == 0;
    return n;
  }();
  return loaded;
}

}  // namespace

double median_mhz(std::vector<unsigned> samples) {
  if (samples.empty()) return 0.0;
  const std::size_t middle = samples.size() / 2;
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(middle), samples.end());
  const double upper = samples[middle];
  if (samples.size() % 2 == 1) return upper;
  const double lower = *std::max_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(middle));
  return (lower + upper) / 2.0;
}

SmClockSampler::SmClockSampler(int device, std::chrono::microseconds period) {
  const Nvml& n = nvml();
  char bus_id[32] = {};
  if (!n.ok || cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof(bus_id)), device) != cudaSuccess) {
    cudaGetLastError();  // no device here: leave no error behind for the caller's next check
    return;
  }
  if (n.handle_by_pci_bus_id(bus_id, &device_) != 0) {
    device_ = nullptr;
    return;
  }
  running_ = true;
  thread_ = std::thread([this, period, clock_info = n.clock_info] {
    while (running_.load(std::memory_order_relaxed)) {
      unsigned mhz = 0;
      if (clock_info(device_, kNvmlClockSm, &mhz) == 0) samples_.push_back(mhz);
      std::this_thread::sleep_for(period);
    }
  });
}

SmClockSampler::~SmClockSampler() { stop(); }

double SmClockSampler::stop() {
  running_ = false;
  if (thread_.joinable()) thread_.join();
  return median_mhz(samples_);
}

}  // namespace kc::bench
