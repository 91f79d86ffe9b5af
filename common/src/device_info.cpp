#include "kc/device_info.hpp"

#include <cuda_runtime.h>

#include "kc/check.hpp"

namespace kc {

std::optional<std::string> no_gpu_reason(int min_major, int min_minor) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so later checks do not see a stale error
    return std::string("no usable CUDA GPU (cudaGetDeviceCount: ") + cudaGetErrorString(status) + ")";
  }
  if (count == 0) return std::string("no CUDA GPU found");
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return std::string("cannot query CUDA device 0");
  if (prop.major < min_major || (prop.major == min_major && prop.minor < min_minor)) {
    return std::string(prop.name) + " is sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
           "; this needs sm_" + std::to_string(min_major) + std::to_string(min_minor) + " or newer";
  }
  return std::nullopt;
}

DeviceInfo query_device(int device) {
  if (device < 0) check(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device));
  auto attribute = [device](cudaDeviceAttr what) {
    int value = 0;
    check(cudaDeviceGetAttribute(&value, what, device));
    return value;
  };
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  info.smem_per_sm = prop.sharedMemPerMultiprocessor;
  info.max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
  info.max_blocks_per_sm = prop.maxBlocksPerMultiProcessor;
  // CUDA 13 removed the clock fields from cudaDeviceProp; the attributes remain (in kHz).
  info.sm_clock_max_mhz = attribute(cudaDevAttrClockRate) / 1000;
  info.mem_clock_max_mhz = attribute(cudaDevAttrMemoryClockRate) / 1000;
  info.mem_bus_bits = attribute(cudaDevAttrGlobalMemoryBusWidth);
  info.global_mem_bytes = prop.totalGlobalMem;
  check(cudaDriverGetVersion(&info.driver_api_version));
  check(cudaRuntimeGetVersion(&info.runtime_version));
  return info;
}

}  // namespace kc
