/// @file device_buffer.hpp
/// @brief A typed, move-only owner of device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "kc/check.hpp"

namespace kc {

/// Owns `count` elements of T in device memory (cudaMalloc); frees them when destroyed.
///
/// Meant for tests, benchmarks and examples: the chapters' launch functions take raw device
/// pointers and never allocate.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates @p count elements (uninitialised). A count of 0 allocates nothing.
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ > 0) check(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()));
  }
  /// Allocates and copies @p host into the new buffer.
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { copy_from(host); }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);  // no throw from a destructor
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  /// Takes over @p other's memory; @p other becomes empty.
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  /// Frees this buffer's memory and takes over @p other's.
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }

  /// Device pointer to the first element (nullptr when empty).
  T* data() noexcept { return data_; }
  /// Device pointer to the first element (nullptr when empty).
  const T* data() const noexcept { return data_; }
  /// Number of elements.
  std::size_t size() const noexcept { return count_; }
  /// Size in bytes.
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }

  /// Copies host data into the buffer (synchronous). @p host must hold exactly size() elements.
  /// From pageable memory cudaMemcpy may return once the data is staged, before it reaches the
  /// device, and a cudaStreamNonBlocking stream does not wait for it: hence the synchronisation.
  void copy_from(const std::vector<T>& host) {
    if (host.size() != count_) throw std::invalid_argument("copy_from: host size differs from buffer size");
    if (count_ == 0) return;
    check(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
    check(cudaDeviceSynchronize());
  }
  /// Copies the buffer to a new host vector (synchronous).
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    if (count_ > 0) check(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Sets every byte to @p byte (synchronous). 0xFF makes every float and bf16 a NaN: a poison
  /// that a test can tell apart from any value a kernel writes. cudaMemset on device memory may
  /// return before it is done, and it runs on the legacy default stream, which a stream created
  /// with cudaStreamNonBlocking does not wait for: without the synchronisation a kernel launched
  /// next on such a stream can run first and have its output overwritten by the poison.
  void fill_bytes(unsigned char byte) {
    if (count_ == 0) return;
    check(cudaMemset(data_, byte, bytes()));
    check(cudaDeviceSynchronize());
  }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace kc
