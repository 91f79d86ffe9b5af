/// @file check.hpp
/// @brief CUDA error checks that throw an exception naming the file, line and error.
#pragma once

#include <cuda_runtime.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace kc {

/// Thrown when a CUDA runtime call fails. what() reads "file:line: call failed: <error string>".
class CudaError : public std::runtime_error {
 public:
  /// @param error the CUDA error code
  /// @param message the full, formatted message
  CudaError(cudaError_t error, const std::string& message) : std::runtime_error(message), error_(error) {}
  /// The CUDA error code that caused the exception.
  cudaError_t error() const noexcept { return error_; }

 private:
  cudaError_t error_;
};

/// Throws kc::CudaError when @p error is not cudaSuccess.
///
/// The caller's file and line are captured automatically, so a call reads
/// `kc::check(cudaMalloc(&p, bytes));` and a failure reports where it happened.
/// @param error the value returned by a CUDA runtime call
/// @param where filled in by the compiler: the call site
inline void check(cudaError_t error, std::source_location where = std::source_location::current()) {
  if (error == cudaSuccess) return;
  throw CudaError(error, std::string(where.file_name()) + ":" + std::to_string(where.line()) + ": CUDA error " +
                             cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

/// Checks the error state after a kernel launch (bad configuration, missing kernel image, ...).
///
/// Uses cudaPeekAtLastError so it neither synchronises nor clears a sticky error.
/// @param where filled in by the compiler: the call site
inline void check_launch(std::source_location where = std::source_location::current()) {
  check(cudaPeekAtLastError(), where);
}

/// Thrown by a launch function when an argument breaks a rule, before anything is launched.
/// The message names the argument and the rule, e.g. "n (-1) must be >= 0".
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace kc
