/// @file test_support.hpp
/// @brief GoogleTest helpers every chapter reuses: GPU fixtures that skip with a reason, printed
/// seeds, poisoned outputs with guard regions, and checks that a launch path is graph-capturable
/// and bitwise repeatable.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/device_info.hpp"

namespace kc::test {

/// Fixture for tests that need a GPU of at least sm_80: skips (shown as skipped by ctest) with the
/// reason when there is none.
class GpuTest : public ::testing::Test {
 protected:
  /// Skips the test (GTEST_SKIP with the reason) when no suitable GPU is present.
  void SetUp() override;
  /// The GPU the test runs on (valid only when the test was not skipped).
  const DeviceInfo& device() const;
  /// The compute capability the fixture requires; Hopper fixtures override it.
  virtual int required_major() const { return 8; }
  /// @copydoc required_major
  virtual int required_minor() const { return 0; }
};

/// Fixture for tests of sm_90a kernels (TMA, wgmma): skips on anything but Hopper.
class Sm90Test : public GpuTest {
 protected:
  int required_major() const override { return 9; }
};

/// A fresh seed for this test (KC_SEED overrides it), printed and recorded as a test property so a
/// failure can be reproduced by setting KC_SEED to the printed value.
std::uint64_t test_seed();

/// True when KC_SMALL_TESTS is set (the compute-sanitizer runs set it): tests skip their largest cases.
bool small_tests_only();

/// The byte the tests fill outputs with before a launch. 0xFF makes every float and bf16 a NaN
/// and every int32 a -1.
inline constexpr unsigned char kPoisonByte = 0xFF;

/// A device output of @p count elements followed by a guard region, all poisoned, so a test can
/// see both elements the kernel never wrote and writes past the end.
template <typename T>
class GuardedOutput {
 public:
  /// Allocates count + guard elements and poisons them all.
  explicit GuardedOutput(std::size_t count, std::size_t guard = 64) : count_(count), storage_(count + guard) {
    poison();
  }
  /// Device pointer to the output (guard follows it).
  T* data() { return storage_.data(); }
  /// Number of output elements (without the guard).
  std::size_t size() const { return count_; }
  /// Fills output and guard with kPoisonByte again.
  void poison() { storage_.fill_bytes(kPoisonByte); }
  /// The output elements, copied to the host.
  std::vector<T> to_host() const {
    std::vector<T> all = storage_.to_host();
    all.resize(count_);
    return all;
  }
  /// Number of guard elements that no longer hold the poison: writes past the end.
  std::size_t guard_damage() const {
    const std::vector<T> all = storage_.to_host();
    const std::span<const T> guard(all.data() + count_, all.size() - count_);
    return guard.size() - count_poisoned(guard, kPoisonByte);
  }

 private:
  std::size_t count_;
  DeviceBuffer<T> storage_;
};

/// Asserts that @p result passes at relative tolerance @p rel_tol, printing its summary and @p what.
void expect_close(const Comparison& result, double rel_tol, const std::string& what);

/// A launch path under test: how to launch it on a stream, how to poison its outputs, how to read
/// them back as raw bytes.
struct LaunchUnderTest {
  std::function<void(cudaStream_t)> launch;                  ///< enqueue the work on the stream
  std::function<void()> poison_outputs;                      ///< reset outputs to poison (synchronous)
  std::function<std::vector<unsigned char>()> read_outputs;  ///< outputs as bytes (synchronous)
};

/// Captures @p run.launch into a CUDA graph (global capture mode, so any synchronisation or other
/// capture-unsafe call inside the launch path fails the capture), replays it, and expects the
/// replay's outputs to be bitwise identical to an ordinary launch's.
void expect_graph_capturable(const LaunchUnderTest& run);

/// Runs @p run @p runs times (poisoning in between) and expects bitwise identical outputs each time.
void expect_bitwise_repeatable(const LaunchUnderTest& run, int runs = 3);

/// Expects @p call to throw kc::InvalidArgument whose message contains @p fragment (the rule).
void expect_invalid_argument(const std::function<void()>& call, const std::string& fragment);

}  // namespace kc::test
