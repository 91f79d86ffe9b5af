// Tests of the shared harness (common/). Everything host-side runs on the CPU; the rest skips
// without a GPU.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kc/bench.hpp"
#include "kc/check.hpp"
#include "kc/compare.hpp"
#include "kc/device_buffer.hpp"
#include "kc/random.hpp"
#include "kc/reference.hpp"
#include "kc/sm_clock.hpp"
#include "kc/test_support.hpp"
#include "kc/timer.hpp"
#include "kc/validate.hpp"

namespace {

// ---------------------------------------------------------------- CPU

TEST(Random, SameSeedSameValuesAndIndependentOfSplit) {
  std::vector<float> whole(1000), first(400), second(600);
  kc::fill_uniform(std::span<float>(whole), 42);
  kc::fill_uniform(std::span<float>(first), 42);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), whole.begin()));
  std::vector<float> other(1000);
  kc::fill_uniform(std::span<float>(other), 43);
  EXPECT_NE(other, whole);
}

TEST(Random, ValuesInRangeNotConstantNotZero) {
  std::vector<double> v(100000);
  kc::fill_uniform(std::span<double>(v), 7, -2.0, 3.0);
  double lo = 1e9, hi = -1e9, sum = 0;
  for (double x : v) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    sum += x;
  }
  EXPECT_GE(lo, -2.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_LT(lo, -1.9);
  EXPECT_GT(hi, 2.9);
  EXPECT_NEAR(sum / v.size(), 0.5, 0.05);
}

TEST(Random, SeedFromEnvironment) {
  setenv("KC_SEED", "12345", 1);
  EXPECT_EQ(kc::random_seed(), 12345u);
  unsetenv("KC_SEED");
}

TEST(Compare, ExactMatch) {
  const std::vector<float> got = {1.0f, -2.0f, 3.5f};
  const std::vector<double> ref = {1.0, -2.0, 3.5};
  const kc::Comparison c = kc::compare<float>(got, ref);
  EXPECT_TRUE(c.passes(0.0)) << c.summary();
  EXPECT_EQ(c.max_abs_error, 0.0);
}

TEST(Compare, RelativeFrobeniusAndMaxAbs) {
  const std::vector<float> got = {3.0f, 4.5f};
  const std::vector<double> ref = {3.0, 4.0};
  const kc::Comparison c = kc::compare<float>(got, ref);
  EXPECT_DOUBLE_EQ(c.rel_frobenius, 0.5 / 5.0);
  EXPECT_DOUBLE_EQ(c.max_abs_error, 0.5);
  EXPECT_EQ(c.max_abs_index, 1u);
  EXPECT_TRUE(c.passes(0.11));
  EXPECT_FALSE(c.passes(0.09));
}

TEST(Compare, NanNeverPasses) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> got = {1.0f, nan, 2.0f};
  const std::vector<double> ref = {1.0, 5.0, 2.0};
  const kc::Comparison c = kc::compare<float>(got, ref);
  EXPECT_EQ(c.nonfinite_mismatches, 1u);
  EXPECT_EQ(c.first_bad_index, 1u);
  EXPECT_FALSE(c.passes(1e30)) << "a NaN must fail at any tolerance";
}

TEST(Compare, InfMustMatchItsSign) {
  const float inf = std::numeric_limits<float>::infinity();
  const double dinf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(kc::compare<float>(std::vector<float>{inf}, std::vector<double>{dinf}).passes(0.0));
  EXPECT_FALSE(kc::compare<float>(std::vector<float>{-inf}, std::vector<double>{dinf}).passes(0.0));
  EXPECT_FALSE(kc::compare<float>(std::vector<float>{1.0f}, std::vector<double>{dinf}).passes(0.0));
  const double dnan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(kc::compare<float>(std::vector<float>{std::nanf("")}, std::vector<double>{dnan}).passes(0.0))
      << "an expected NaN (e.g. a documented NaN policy) matches a NaN";
}

TEST(Compare, DetectsUnwrittenPoison) {
  std::vector<float> got(4, 1.0f);
  std::memset(&got[2], 0xFF, sizeof(float));
  const std::vector<double> ref(4, 1.0);
  const kc::Comparison c = kc::compare<float>(got, ref, 0xFF);
  EXPECT_EQ(c.unwritten, 1u);
  EXPECT_EQ(c.first_bad_index, 2u);
  EXPECT_FALSE(c.passes(1.0));
  EXPECT_EQ(kc::count_poisoned(std::span<const float>(got), 0xFF), 1u);
}

TEST(Compare, Bf16Widening) {
  const std::vector<__nv_bfloat16> got = {__float2bfloat16(1.5f), __float2bfloat16(-0.25f)};
  const std::vector<double> ref = {1.5, -0.25};
  EXPECT_TRUE(kc::compare<__nv_bfloat16>(got, ref).passes(0.0));
}

TEST(Compare, LengthMismatchFails) {
  const kc::Comparison c = kc::compare<float>(std::vector<float>(3), std::vector<double>(4));
  EXPECT_FALSE(c.passes(1e30));
}

TEST(Reference, MatmulNtAndNnAgreeOnAKnownProduct) {
  // A = [[1, 2, 3], [4, 5, 6]] (2x3), W = [[1, 0, 1], [0, 1, 0]] (2x3): A·Wᵀ = [[4, 2], [10, 5]].
  const std::vector<double> a = {1, 2, 3, 4, 5, 6};
  const std::vector<double> w = {1, 0, 1, 0, 1, 0};
  EXPECT_EQ(kc::ref::matmul_nt(a, w, 2, 2, 3), (std::vector<double>{4, 2, 10, 5}));
  // The same product through matmul_nn with B = Wᵀ (3x2).
  const std::vector<double> b = {1, 0, 0, 1, 1, 0};
  EXPECT_EQ(kc::ref::matmul_nn(a, b, 2, 2, 3), (std::vector<double>{4, 2, 10, 5}));
  EXPECT_EQ(kc::ref::matmul_nt_element(a, w, 3, 1, 0), 10.0);
}

TEST(Reference, WidenAndRoundToFloat) {
  const std::vector<float> x = {0.1f, -3.5f};
  const std::vector<double> wide = kc::ref::widen<float>(x);
  EXPECT_EQ(wide[0], static_cast<double>(0.1f));
  const std::vector<double> exact = {0.1, 1.0 + 1e-12};
  const std::vector<double> rounded = kc::ref::round_to_float(exact);
  EXPECT_EQ(rounded[0], static_cast<double>(0.1f));
  EXPECT_EQ(rounded[1], 1.0);
}

TEST(Check, ThrowsWithFileLineAndErrorName) {
  try {
    kc::check(cudaErrorInvalidValue);
    FAIL() << "check() did not throw";
  } catch (const kc::CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("common_test.cu:"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
    EXPECT_EQ(e.error(), cudaErrorInvalidValue);
  }
  EXPECT_NO_THROW(kc::check(cudaSuccess));
}

TEST(BenchHelpers, RotationSetsExceedTwiceL2) {
  kc::DeviceInfo h200;
  h200.l2_bytes = 60u << 20;
  EXPECT_EQ(kc::bench::rotation_sets(1u << 20, h200, std::size_t{8} << 30), 120u);
  EXPECT_EQ(kc::bench::rotation_sets(std::size_t{3} << 30, h200, std::size_t{8} << 30), 1u);
  EXPECT_EQ(kc::bench::rotation_sets(1u << 20, h200, 10u << 20), 10u) << "capped by the memory budget";
  EXPECT_EQ(kc::bench::rotation_sets(0, h200, 1), 1u);
}

TEST(BenchHelpers, CaseLabelsAreNeverPrefixes) {
  EXPECT_NO_THROW(kc::bench::check_case_labels({"fp32_T1_E8_k2", "fp32_T16_E8_k2", "fp32_dsv3_T01"}));
  EXPECT_NO_THROW(kc::bench::check_case_labels({}));
  try {
    kc::bench::check_case_labels({"fp32_dsv3_T16", "fp32_dsv3_T1"});
    ADD_FAILURE() << "a prefix label was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "case label fp32_dsv3_T1 is a prefix of fp32_dsv3_T16");
  }
}

TEST(BenchHelpers, BatchForBytes) {
  EXPECT_EQ(kc::bench::batch_for_bytes(3.0 * (1u << 30)), 1);
  EXPECT_EQ(kc::bench::batch_for_bytes(1u << 20), 256);
  EXPECT_EQ(kc::bench::batch_for_bytes(16), 1024);
}

TEST(BenchHelpers, MedianClock) {
  EXPECT_EQ(kc::bench::median_mhz({}), 0.0);
  EXPECT_EQ(kc::bench::median_mhz({1980}), 1980.0);
  EXPECT_EQ(kc::bench::median_mhz({1755, 1980, 1500}), 1755.0);
  EXPECT_EQ(kc::bench::median_mhz({1980, 1500, 1700, 1600}), 1650.0);
}

TEST(BenchHelpers, ClockSamplerWithoutNvmlOrDeviceSaysSo) {
  // An ordinal no machine has: the sampler is unavailable and reports 0, on any machine.
  kc::bench::SmClockSampler sampler(1 << 20);
  EXPECT_FALSE(sampler.available());
  EXPECT_EQ(sampler.stop(), 0.0);
}

TEST(NoGpu, AnUnreachableArchitectureAlwaysGivesAReason) {
  // Without a GPU the reason names the failed query; with one, sm_99.0 is never met and the reason
  // names what is needed. Either way the caller gets a sentence, never an exception.
  const auto reason = kc::no_gpu_reason(99, 0);
  ASSERT_TRUE(reason.has_value());
  const bool names_cause = reason->find("GPU") != std::string::npos || reason->find("sm_990") != std::string::npos;
  EXPECT_TRUE(names_cause) << *reason;
}

// ---------------------------------------------------------------- GPU

class HarnessGpu : public kc::test::GpuTest {};

TEST_F(HarnessGpu, DeviceQueryIsSane) {
  const kc::DeviceInfo& d = device();
  EXPECT_FALSE(d.name.empty());
  EXPECT_GE(d.cc_major, 8);
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GT(d.l2_bytes, 0u);
  EXPECT_GE(d.smem_per_block_optin, 48u * 1024);
  EXPECT_GT(d.sm_clock_max_mhz, 0);
  EXPECT_GT(d.driver_api_version, 0);
}

TEST_F(HarnessGpu, DeviceBufferRoundTrip) {
  std::vector<float> host(1000);
  kc::fill_uniform(std::span<float>(host), kc::test::test_seed());
  kc::DeviceBuffer<float> buffer(host);
  EXPECT_EQ(buffer.to_host(), host);
  kc::DeviceBuffer<float> moved = std::move(buffer);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(moved.to_host(), host);
}

__global__ void spin_kernel(float* out, int iterations) {
  float x = threadIdx.x;
  for (int i = 0; i < iterations; ++i) x = x * 0.999f + 1.0f;
  if (threadIdx.x == 0) out[blockIdx.x] = x;
}

TEST_F(HarnessGpu, ClockSamplerReadsTheSmClockWhileWorkRuns) {
  kc::bench::SmClockSampler sampler(0);
  if (!sampler.available()) GTEST_SKIP() << "NVML (libnvidia-ml.so.1) does not answer for device 0";
  kc::DeviceBuffer<float> out(1);
  spin_kernel<<<1, 32>>>(out.data(), 20000000);
  kc::check(cudaDeviceSynchronize());
  const double mhz = sampler.stop();
  EXPECT_GT(mhz, 100.0);
  EXPECT_LE(mhz, 1.05 * static_cast<double>(device().sm_clock_max_mhz));
}

TEST_F(HarnessGpu, EventTimerMeasuresBatchesAndGraphs) {
  kc::DeviceBuffer<float> out(1);
  kc::EventTimer timer;
  timer.time_launches(nullptr, 2, [&](int) { spin_kernel<<<1, 32>>>(out.data(), 100000); });  // warm-up: module load
  const double one = timer.time_launches(nullptr, 1, [&](int) { spin_kernel<<<1, 32>>>(out.data(), 100000); });
  const double batch = timer.time_launches(nullptr, 10, [&](int) { spin_kernel<<<1, 32>>>(out.data(), 100000); });
  EXPECT_GT(one, 0.0);
  EXPECT_NEAR(batch / one, 1.0, 0.5) << "per-launch time of a batch should match one launch";

  cudaStream_t stream;
  kc::check(cudaStreamCreate(&stream));
  // The hold in front of the start event is not timed, and it does delay the stream: 100 µs of hold
  // plus nothing measures about 0 between the events, while the whole span is at least the hold.
  cudaEvent_t before, after;
  kc::check(cudaEventCreate(&before));
  kc::check(cudaEventCreate(&after));
  kc::check(cudaEventRecord(before, stream));
  const double empty = timer.time_launches(stream, 1, [](int) {});
  kc::check(cudaEventRecord(after, stream));
  kc::check(cudaEventSynchronize(after));
  float span_ms = 0.0f;
  kc::check(cudaEventElapsedTime(&span_ms, before, after));
  EXPECT_LT(empty, 0.02) << "an empty batch behind the hold measures (nearly) nothing";
  EXPECT_GE(span_ms, kc::EventTimer::kHoldMicroseconds * 1e-3 * 0.9) << "the hold held the stream";
  cudaEventDestroy(before);
  cudaEventDestroy(after);
  cudaGraph_t graph;
  kc::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  spin_kernel<<<1, 32, 0, stream>>>(out.data(), 100000);
  kc::check(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  kc::check(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_GT(timer.time_graph(exec, stream, 5), 0.0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// "DeliberateApiError": the sanitizer runs skip tests that provoke CUDA API errors on purpose.
TEST_F(HarnessGpu, GraphHelperCatchesASynchronisingLaunchPath_DeliberateApiError) {
  kc::DeviceBuffer<float> out(1);
  kc::test::LaunchUnderTest bad{[&](cudaStream_t s) {
                                  spin_kernel<<<1, 32, 0, s>>>(out.data(), 10);
                                  kc::check(cudaStreamSynchronize(s));  // not allowed while capturing
                                },
                                [&] { out.fill_bytes(0xFF); }, [&] { return std::vector<unsigned char>(); }};
  EXPECT_NONFATAL_FAILURE(kc::test::expect_graph_capturable(bad), "");
  kc::check(cudaDeviceSynchronize());
}

__global__ void racy_sum(float* out, const float* in, int n) {
  // Order-dependent float atomics: the classic source of run-to-run differences.
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(out, in[i]);
}

TEST_F(HarnessGpu, RepeatabilityHelperPassesDeterministicWork) {
  std::vector<float> host(1 << 16);
  kc::fill_uniform(std::span<float>(host), kc::test::test_seed());
  kc::DeviceBuffer<float> in(host), out(1);
  kc::test::LaunchUnderTest run{[&](cudaStream_t s) {
                                  kc::check(cudaMemsetAsync(out.data(), 0, sizeof(float), s));
                                  racy_sum<<<1, 1, 0, s>>>(out.data(), in.data(), 1);  // one thread: deterministic
                                },
                                [&] { out.fill_bytes(0xFF); },
                                [&] {
                                  const float v = out.to_host()[0];
                                  const auto* b = reinterpret_cast<const unsigned char*>(&v);
                                  return std::vector<unsigned char>(b, b + sizeof v);
                                }};
  kc::test::expect_bitwise_repeatable(run, 4);
}

TEST_F(HarnessGpu, DeviceFillMatchesHostFill) {
  const std::size_t n = 100003;
  const std::uint64_t seed = kc::test::test_seed();
  std::vector<float> host_f(n);
  std::vector<__nv_bfloat16> host_b(n);
  kc::fill_uniform(std::span<float>(host_f), seed, -2.0, 3.0);
  kc::fill_uniform(std::span<__nv_bfloat16>(host_b), seed, -2.0, 3.0);
  kc::DeviceBuffer<float> dev_f(n);
  kc::DeviceBuffer<__nv_bfloat16> dev_b(n);
  kc::fill_uniform_device(dev_f.data(), n, seed, -2.0, 3.0);
  kc::fill_uniform_device(dev_b.data(), n, seed, -2.0, 3.0);
  EXPECT_EQ(dev_f.to_host(), host_f);
  const std::vector<__nv_bfloat16> got_b = dev_b.to_host();
  EXPECT_EQ(std::memcmp(got_b.data(), host_b.data(), n * sizeof(__nv_bfloat16)), 0);
}

TEST_F(HarnessGpu, L2FlusherRuns) {
  kc::bench::L2Flusher flusher(device());
  flusher.flush(nullptr);
  kc::check(cudaDeviceSynchronize());
}

}  // namespace

TEST(Validate, OverlapsSharesAByte) {
  alignas(16) char buffer[64] = {};
  EXPECT_TRUE(kc::overlaps(buffer, 16, buffer + 15, 16));
  EXPECT_FALSE(kc::overlaps(buffer, 16, buffer + 16, 16));
  EXPECT_FALSE(kc::overlaps(buffer + 16, 16, buffer, 16));
  EXPECT_TRUE(kc::overlaps(buffer, 64, buffer + 8, 4));
  EXPECT_FALSE(kc::overlaps(buffer, 0, buffer, 16));  // an empty range overlaps nothing
  EXPECT_FALSE(kc::overlaps(nullptr, 0, buffer, 16));
  EXPECT_TRUE(kc::aligned_to(buffer, 16));
  EXPECT_FALSE(kc::aligned_to(buffer + 4, 16));
  EXPECT_TRUE(kc::aligned_to(buffer + 4, 4));
}
