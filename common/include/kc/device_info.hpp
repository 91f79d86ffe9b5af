/// @file device_info.hpp
/// @brief What the GPU offers: SMs, L2, shared memory, clocks; and whether there is a usable GPU at all.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "kc/check.hpp"

namespace kc {

/// The properties the chapters size their launches and tiles from. Never assume the H200's.
struct DeviceInfo {
  int index = 0;                         ///< CUDA device ordinal
  std::string name;                      ///< e.g. "NVIDIA H200"
  int cc_major = 0;                      ///< compute capability, major
  int cc_minor = 0;                      ///< compute capability, minor
  int sm_count = 0;                      ///< streaming multiprocessors
  std::size_t l2_bytes = 0;              ///< L2 cache size
  std::size_t smem_per_block_optin = 0;  ///< shared memory a block may opt in to (227 KB on sm_90)
  std::size_t smem_per_sm = 0;           ///< shared memory per SM
  int max_threads_per_sm = 0;            ///< resident threads per SM
  int max_blocks_per_sm = 0;             ///< resident blocks per SM
  int sm_clock_max_mhz = 0;              ///< maximum SM clock
  int mem_clock_max_mhz = 0;             ///< maximum memory clock
  int mem_bus_bits = 0;                  ///< memory bus width
  std::size_t global_mem_bytes = 0;      ///< device memory
  int driver_api_version = 0;            ///< CUDA version the driver supports, e.g. 13000
  int runtime_version = 0;               ///< CUDA runtime linked in, e.g. 13000

  /// "sm_90" style architecture name.
  std::string arch() const { return "sm_" + std::to_string(cc_major) + std::to_string(cc_minor); }
};

/// Why there is no usable GPU, or std::nullopt when device 0 exists and has compute capability of
/// at least @p min_major.@p min_minor. Any failure of cudaGetDeviceCount (with no driver it often
/// says "insufficient driver", not "no device") counts as "no GPU".
std::optional<std::string> no_gpu_reason(int min_major = 8, int min_minor = 0);

/// Queries @p device (default: the current device). Throws kc::CudaError on failure.
DeviceInfo query_device(int device = -1);

/// Calls @p make with the current device's ordinal the first time this call site sees that device
/// and returns the cached result on every later call: one cudaGetDevice and a lookup. Launch paths
/// use it for per-device setup (kernel attributes, occupancy queries) that must not run inside a
/// CUDA graph capture: the first, uncaptured call does the work. Thread-safe; each call site (each
/// @p Make type, e.g. a lambda) has its own cache.
template <class Make>
auto cached_per_device(Make make) -> decltype(make(0)) {
  using Value = decltype(make(0));
  static std::mutex mutex;
  static std::map<int, Value> cache;
  int device = 0;
  check(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = cache.find(device); found != cache.end()) return found->second;
  return cache.emplace(device, make(device)).first->second;
}

}  // namespace kc
